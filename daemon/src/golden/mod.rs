//! `inferloopd golden`: llama.cpp and the native forward pass on the same GGUF file and the
//! same tokens, their next-token distributions compared at every position.
//!
//! Each prompt is tokenized by llama.cpp as the daemon does (the model's chat template around
//! the line as a user message, or the line as plain text with `--raw`) and continued greedily
//! by llama.cpp's top-1 for up to `--continue` tokens, stopping at an end-of-generation
//! token. llama.cpp computes the logits of every position of that sequence (the prompt in
//! one batch with logits for all tokens, then one token per decode); the native model is fed
//! the same tokens, teacher-forced, and returns the logits of every position too. The
//! comparison per position: whether both put the same token first, KL(p_llama ‖ p_native)
//! with both softmaxes in f64, and the largest absolute logit difference.
//!
//! `--noise-floor` measures what those numbers mean: llama.cpp's own two attention paths
//! (flash attention, which accumulates V in f16, and the plain one) on the same tokens,
//! compared the same way. On the default model they differ at a few percent of positions
//! (near ties, where any rounding decides): agreement with llama.cpp cannot be judged finer
//! than llama.cpp agrees with itself.
//!
//! `--kv-type` compares llama.cpp with itself instead: the reference with its default f16
//! KV cache, the candidate with the KV cells in the given types (q8_0, q4_0), both with
//! flash attention, fed the same tokens the way the daemon feeds them (the prompt in one
//! batch, then one token per decode, each reading the cached rows). The native pass is not
//! run, so the model need not be Q8_0.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use crate::config::KvTypes;
use crate::engine::backend::llama::with_kv_types;
use crate::engine::chat::ChatTurn;
use crate::engine::chat::Limit;
use crate::engine::native::{self, BatchToken, NativeError};
use crate::engine::{open_native, Device, EngineError, LoadedModel};

mod compare;
mod error;
mod report;
#[cfg(test)]
mod tests;

use compare::{argmax, Stats};
pub use error::GoldenError;
pub use report::{NoiseFloor, Report, Worst};

/// One `golden` run.
#[derive(Debug, Clone)]
pub struct Request {
    pub model: PathBuf,
    /// The file llama.cpp reads instead of `model` (same vocabulary): e.g. the same weights
    /// dequantized to F32, which separates llama.cpp's own activation quantization from
    /// differences in the forward pass.
    pub reference: Option<PathBuf>,
    /// One prompt per line; blank lines and lines starting with `#` are skipped.
    pub prompts: PathBuf,
    /// Most tokens of greedy continuation after each prompt.
    pub continue_tokens: usize,
    /// Tokenize each line as plain text instead of a chat user message.
    pub raw: bool,
    /// Threads for llama.cpp and for the native matmuls alike.
    pub threads: usize,
    /// What the native linear layers multiply with: Q8 (llama.cpp's numerics on Q8_0
    /// weights) or F32 (its numerics on f32 weights, for `reference`).
    pub activations: native::Activations,
    /// Also compare llama.cpp with flash attention against llama.cpp without it.
    pub noise_floor: bool,
    /// Where the native forward runs: the CPU twins or the first CUDA GPU.
    pub device: Device,
    /// Compare llama.cpp with these KV types against llama.cpp with f16 KV, instead of
    /// the native pass against llama.cpp.
    pub kv_type: Option<KvTypes>,
}

/// What the reference is compared with.
enum Candidate<'m> {
    Native(native::Model<'static>),
    /// llama.cpp with quantized KV cells.
    KvType(LlamaContext<'m>),
}

/// A prompt line and the number of the line it came from (1-based, for messages).
struct Line {
    number: usize,
    text: String,
}

/// Runs both engines over every prompt and compares them.
pub fn run(req: &Request) -> Result<Report, GoldenError> {
    let lines = read_prompts(&req.prompts)?;
    let id = req
        .model
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let llama = LoadedModel::load(req.reference.as_deref().unwrap_or(&req.model), id)?;
    let n_vocab = llama.info().n_vocab as usize;

    // Tokenize everything first: the contexts are sized for the longest sequence.
    let ctx_limit = llama.info().n_ctx_train.max(1);
    let limit = Limit::for_context(ctx_limit);
    let gone = AtomicBool::new(false);
    let mut prompts = Vec::with_capacity(lines.len());
    for line in &lines {
        let prompt = if req.raw {
            llama.text_prompt(&line.text, false, limit, &gone)
        } else {
            let turn = ChatTurn {
                role: "user".into(),
                content: line.text.clone(),
                ..ChatTurn::default()
            };
            llama.chat_prompt(&[turn], None, limit, &gone)
        }
        .map_err(|e| GoldenError::Tokenize {
            path: req.prompts.clone(),
            line: line.number,
            why: e.to_string(),
        })?;
        prompts.push(prompt.tokens);
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let n_ctx = (longest + req.continue_tokens).clamp(1, ctx_limit as usize);

    let threads = i32::try_from(req.threads).unwrap_or(i32::MAX);
    let n_ctx_u32 = u32::try_from(n_ctx).unwrap_or(u32::MAX);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx_u32))
        .with_n_seq_max(1)
        .with_n_batch(n_ctx_u32)
        .with_n_ubatch(n_ctx_u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    // The candidate first: with the native pass, a model that is not Q8_0 fails here.
    let mut candidate = match req.kv_type {
        None => Candidate::Native(open_candidate_native(req, n_ctx, n_vocab)?),
        Some(types) => Candidate::KvType(
            llama
                .llama()
                .new_context(llama.backend(), with_kv_types(params.clone(), types))
                .map_err(|e| EngineError::Context(e.to_string()))?,
        ),
    };
    // The reference keeps llama.cpp's default (flash attention where the CPU backend has it);
    // the noise floor's context turns it off.
    let mut floor_ctx = if req.noise_floor {
        let plain = params
            .clone()
            .with_flash_attention_policy(llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED);
        Some(
            llama
                .llama()
                .new_context(llama.backend(), plain)
                .map_err(|e| EngineError::Context(e.to_string()))?,
        )
    } else {
        None
    };
    let mut ctx = llama
        .llama()
        .new_context(llama.backend(), params)
        .map_err(|e| EngineError::Context(e.to_string()))?;
    let vocab = llama.llama().vocab();

    let mut stats = Stats::default();
    let mut floor = Stats::default();
    let mut floor_logits: Vec<f32> = Vec::new();
    let mut seen: Vec<Vec<i32>> = Vec::with_capacity(prompts.len());
    let (mut llama_seconds, mut native_seconds) = (0.0, 0.0);
    let mut batch = LlamaBatch::new(n_ctx, 1);
    let mut llama_logits: Vec<f32> = Vec::with_capacity(n_ctx * n_vocab);
    let mut kv_logits: Vec<f32> = Vec::new();
    for (index, (line, prompt)) in lines.iter().zip(&prompts).enumerate() {
        let decode_err = |why: String| GoldenError::Decode {
            line: line.number,
            why,
        };
        // llama.cpp: the prompt with logits for every token, then greedy continuation.
        let started = Instant::now();
        ctx.clear_kv_cache();
        llama_logits.clear();
        let mut tokens = prompt.clone();
        decode_all(&mut ctx, &mut batch, &tokens, &mut llama_logits).map_err(decode_err)?;
        while tokens.len() < prompt.len() + req.continue_tokens {
            let last = &llama_logits[llama_logits.len() - n_vocab..];
            let next = argmax(last) as i32;
            if vocab.is_eog(LlamaToken(next)) {
                break;
            }
            batch.clear();
            batch
                .add(LlamaToken(next), tokens.len() as i32, &[0], true)
                .map_err(|e| decode_err(e.to_string()))?;
            ctx.decode(&mut batch)
                .map_err(|e| decode_err(e.to_string()))?;
            llama_logits.extend_from_slice(ctx.get_logits_ith(0));
            tokens.push(next);
        }
        llama_seconds += started.elapsed().as_secs_f64();

        // llama.cpp without flash attention, the whole sequence in one batch.
        if let Some(fctx) = floor_ctx.as_mut() {
            fctx.clear_kv_cache();
            floor_logits.clear();
            decode_all(fctx, &mut batch, &tokens, &mut floor_logits).map_err(decode_err)?;
        }

        // The candidate: the same tokens, teacher-forced, logits for every position.
        let started = Instant::now();
        let candidate_logits = match &mut candidate {
            Candidate::Native(native) => {
                native
                    .kv_mut()
                    .clear(0)
                    .map_err(|source| GoldenError::Native {
                        line: line.number,
                        source,
                    })?;
                let fed: Vec<BatchToken> = tokens
                    .iter()
                    .enumerate()
                    .map(|(pos, &token)| BatchToken {
                        seq: 0,
                        token,
                        pos: pos as u32,
                    })
                    .collect();
                let want = vec![true; fed.len()];
                native
                    .forward(&fed, &want)
                    .map_err(|source| GoldenError::Native {
                        line: line.number,
                        source,
                    })?
            }
            Candidate::KvType(kctx) => {
                kv_logits.clear();
                decode_as_served(kctx, &mut batch, prompt.len(), &tokens, &mut kv_logits)
                    .map_err(decode_err)?;
                &kv_logits[..]
            }
        };
        native_seconds += started.elapsed().as_secs_f64();

        // A position whose tokens up to it were compared already (the chat template's
        // opening, shared by every prompt) is the same computation: counting it again would
        // weigh one near tie once per prompt.
        let shared = seen
            .iter()
            .map(|s: &Vec<i32>| common_prefix(s, &tokens))
            .max()
            .unwrap_or(0);
        stats.repeated += shared;
        for (pos, (a, b)) in llama_logits
            .chunks_exact(n_vocab)
            .zip(candidate_logits.chunks_exact(n_vocab))
            .enumerate()
            .skip(shared)
        {
            let at = stats.add(a, b, index, pos);
            tracing::trace!(
                line = line.number,
                pos,
                token = tokens.get(pos + 1).copied(),
                llama_top1 = at.top1.0,
                native_top1 = at.top1.1,
                margin = at.margin,
                kl = at.kl,
                max_diff = at.max_diff,
                "position"
            );
        }
        if floor_ctx.is_some() {
            for (pos, (a, b)) in llama_logits
                .chunks_exact(n_vocab)
                .zip(floor_logits.chunks_exact(n_vocab))
                .enumerate()
                .skip(shared)
            {
                floor.add(a, b, index, pos);
            }
        }
        seen.push(tokens.clone());
        tracing::debug!(
            line = line.number,
            prompt_tokens = prompt.len(),
            continued = tokens.len() - prompt.len(),
            "compared"
        );
    }
    let mut report = stats.report(prompts.len(), llama_seconds, native_seconds);
    report.candidate = match req.kv_type {
        // Not the device: `make cuda-sim` checks that both devices report the same.
        None => "native".to_string(),
        Some(types) => format!("llama.cpp with {types} KV (reference: f16 KV)"),
    };
    if floor_ctx.is_some() {
        let f = floor.report(prompts.len(), 0.0, 0.0);
        report.llama_noise_floor = Some(NoiseFloor {
            top1_agreement: f.top1_agreement,
            top1_disagreements: f.top1_disagreements,
            mean_kl: f.mean_kl,
            max_kl: f.max_kl,
            max_abs_logit_diff: f.max_abs_logit_diff,
        });
    }
    Ok(report)
}

/// The native model, opened as the server opens it (one sequence of the longest prompt's
/// context): a model that is not Q8_0 fails here, naming the tensor, before any llama.cpp
/// work; a pass that cannot multiply the activations asked for (F32 on CUDA) refuses them
/// by name.
fn open_candidate_native(
    req: &Request,
    n_ctx: usize,
    n_vocab: usize,
) -> Result<native::Model<'static>, GoldenError> {
    let native_load = |source| GoldenError::NativeLoad {
        path: req.model.clone(),
        source,
    };
    let mut native =
        open_native(&req.model, req.device, 1, n_ctx, req.threads).map_err(native_load)?;
    native
        .set_activations(req.activations)
        .map_err(native_load)?;
    if native.hparams().n_vocab != n_vocab {
        return Err(GoldenError::NativeLoad {
            path: req.model.clone(),
            source: NativeError::BadMetadata(format!(
                "vocabulary of {} tokens, llama.cpp's has {n_vocab}",
                native.hparams().n_vocab
            )),
        });
    }
    Ok(native)
}

/// Feeds `tokens` as the daemon does: the first `prompt` in one batch, then one token per
/// decode; appends the logits of every position to `out`.
fn decode_as_served(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    prompt: usize,
    tokens: &[i32],
    out: &mut Vec<f32>,
) -> Result<(), String> {
    ctx.clear_kv_cache();
    decode_all(ctx, batch, &tokens[..prompt], out)?;
    for (pos, &t) in tokens.iter().enumerate().skip(prompt) {
        batch.clear();
        batch
            .add(LlamaToken(t), pos as i32, &[0], true)
            .map_err(|e| e.to_string())?;
        ctx.decode(batch).map_err(|e| e.to_string())?;
        out.extend_from_slice(ctx.get_logits_ith(0));
    }
    Ok(())
}

/// Feeds `tokens` from position 0 in one batch and appends the logits of every position
/// to `out`.
fn decode_all(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    tokens: &[i32],
    out: &mut Vec<f32>,
) -> Result<(), String> {
    batch.clear();
    for (pos, &t) in tokens.iter().enumerate() {
        batch
            .add(LlamaToken(t), pos as i32, &[0], true)
            .map_err(|e| e.to_string())?;
    }
    ctx.decode(batch).map_err(|e| e.to_string())?;
    for i in 0..tokens.len() {
        out.extend_from_slice(ctx.get_logits_ith(i as i32));
    }
    Ok(())
}

fn read_prompts(path: &Path) -> Result<Vec<Line>, GoldenError> {
    let text = std::fs::read_to_string(path).map_err(|source| GoldenError::Prompts {
        path: path.to_path_buf(),
        source,
    })?;
    let lines: Vec<Line> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(i, l)| Line {
            number: i + 1,
            text: l.to_string(),
        })
        .collect();
    if lines.is_empty() {
        return Err(GoldenError::NoPrompts(path.to_path_buf()));
    }
    Ok(lines)
}

/// How many leading tokens two sequences share.
fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
