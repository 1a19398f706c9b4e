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

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use serde::Serialize;

use crate::engine::model::ChatTurn;
use crate::engine::native::{self, BatchToken, NativeError};
use crate::engine::prompt::Limit;
use crate::engine::{EngineError, LoadedModel};
use crate::exit::ExitCode;

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
    /// Run the native forward on the first CUDA GPU instead of the CPU twins.
    pub cuda: bool,
}

/// The comparison over every position of every prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Positions compared (prompt tokens plus continuation tokens, all prompts), each
    /// distinct token prefix once.
    pub positions: usize,
    /// Fraction of positions where both put the same token first.
    pub top1_agreement: f64,
    /// KL(p_llama ‖ p_native) in nats, averaged over positions.
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_diff: f64,
    pub prompts: usize,
    /// Positions where the top-1 tokens differ.
    pub top1_disagreements: usize,
    /// Positions not counted because an earlier prompt began with the same tokens up to
    /// them (their logits are the same computation).
    pub repeated_positions: usize,
    /// Where the largest KL was: prompt index (0-based, among the prompts read) and position.
    pub worst: Option<Worst>,
    pub llama_seconds: f64,
    pub native_seconds: f64,
    /// With `--noise-floor`: llama.cpp without flash attention against llama.cpp with it,
    /// over the same positions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llama_noise_floor: Option<NoiseFloor>,
}

/// llama.cpp against itself: the same comparison between its two attention paths.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NoiseFloor {
    pub top1_agreement: f64,
    pub top1_disagreements: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_diff: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Worst {
    pub prompt: usize,
    pub pos: usize,
    pub kl: f64,
}

impl Report {
    /// One line for people: `612 positions over 20 prompts: top-1 agreement 99.84% …`.
    pub fn summary(&self) -> String {
        format!(
            "{} positions over {} prompts: top-1 agreement {:.2}% ({} differ), mean KL {:.2e}, \
             max KL {:.2e}, max |logit diff| {:.4} (llama.cpp {:.1} s, native {:.1} s)",
            self.positions,
            self.prompts,
            100.0 * self.top1_agreement,
            self.top1_disagreements,
            self.mean_kl,
            self.max_kl,
            self.max_abs_logit_diff,
            self.llama_seconds,
            self.native_seconds
        ) + &self.llama_noise_floor.map_or_else(String::new, |f| {
            format!(
                "; llama.cpp against itself (flash attention off vs on): top-1 agreement \
                 {:.2}% ({} differ), mean KL {:.2e}",
                100.0 * f.top1_agreement,
                f.top1_disagreements,
                f.mean_kl
            )
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    #[error("prompts file {}: {source}", .path.display())]
    Prompts {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("prompts file {} holds no prompt (blank lines and `#` lines are skipped)", .0.display())]
    NoPrompts(PathBuf),
    #[error("prompt {line} of {}: {why}", .path.display())]
    Tokenize {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error(transparent)]
    Llama(#[from] EngineError),
    #[error("llama.cpp decode at prompt line {line}: {why}")]
    Decode { line: usize, why: String },
    #[error("native model {}: {source}", .path.display())]
    NativeLoad { path: PathBuf, source: NativeError },
    #[error("native forward pass at prompt line {line}: {source}")]
    Native { line: usize, source: NativeError },
}

impl GoldenError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Prompts { .. } => "prompts_file",
            Self::NoPrompts(_) => "no_prompts",
            Self::Tokenize { .. } => "tokenize",
            Self::Llama(_) => "llama_load",
            Self::Decode { .. } => "llama_decode",
            Self::NativeLoad { .. } => "native_load",
            Self::Native { .. } => "native_forward",
        }
    }

    /// A prompts file that cannot be read or used is a usage error (2); a model either side
    /// cannot load or run (not Q8_0, say) is a load failure (4).
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Prompts { .. } | Self::NoPrompts(_) | Self::Tokenize { .. } => ExitCode::Usage,
            Self::Llama(_)
            | Self::Decode { .. }
            | Self::NativeLoad { .. }
            | Self::Native { .. } => ExitCode::ModelLoad,
        }
    }
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

    // The native model first: a model that is not Q8_0 fails here, naming the tensor,
    // before any llama.cpp work.
    let native_load = |source| GoldenError::NativeLoad {
        path: req.model.clone(),
        source,
    };
    let mut native = if req.cuda {
        if req.activations == native::Activations::F32 {
            return Err(native_load(NativeError::Unsupported(
                "the CUDA pass multiplies Q8 activations only (--activations q8)".into(),
            )));
        }
        let gpu = inferloop_kernels::cuda::Gpu::open_default(0).map_err(|e| {
            native_load(NativeError::Kernel {
                what: "cuda".into(),
                why: e.to_string(),
            })
        })?;
        native::open_model_cuda(&req.model, 1, n_ctx, req.threads, gpu)
    } else {
        native::open_model(&req.model, 1, n_ctx, req.threads)
    }
    .map_err(native_load)?;
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

    let threads = i32::try_from(req.threads).unwrap_or(i32::MAX);
    let n_ctx_u32 = u32::try_from(n_ctx).unwrap_or(u32::MAX);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx_u32))
        .with_n_seq_max(1)
        .with_n_batch(n_ctx_u32)
        .with_n_ubatch(n_ctx_u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
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

        // Native: the same tokens, teacher-forced, logits for every position.
        let started = Instant::now();
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
        let native_logits = native
            .forward(&fed, &want)
            .map_err(|source| GoldenError::Native {
                line: line.number,
                source,
            })?;
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
            .zip(native_logits.chunks_exact(n_vocab))
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

/// The first index of the largest value (llama.cpp's greedy sampler keeps the first too).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// One position's comparison, for the trace log.
#[derive(Debug, Clone, Copy)]
struct Position {
    /// llama.cpp's top-1 token and the native one.
    top1: (usize, usize),
    /// How far llama.cpp's top-1 logit is above its second: a small margin is a near tie.
    margin: f32,
    kl: f64,
    max_diff: f64,
}

/// The gap between the largest and the second-largest value.
fn top2_margin(row: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    first - second
}

/// Running totals of the comparison.
#[derive(Debug, Default)]
struct Stats {
    positions: usize,
    /// Positions skipped because an earlier prompt began with the same tokens.
    repeated: usize,
    agree: usize,
    kl_sum: f64,
    max_kl: f64,
    max_abs_diff: f64,
    worst: Option<Worst>,
}

impl Stats {
    /// Compares one position: `reference` is llama.cpp's logits row, `native` the native one.
    fn add(&mut self, reference: &[f32], native: &[f32], prompt: usize, pos: usize) -> Position {
        self.positions += 1;
        let top1 = (argmax(reference), argmax(native));
        if top1.0 == top1.1 {
            self.agree += 1;
        }
        let kl = kl_divergence(reference, native);
        self.kl_sum += kl;
        if self.worst.is_none_or(|w| kl > w.kl) {
            self.worst = Some(Worst { prompt, pos, kl });
        }
        self.max_kl = self.max_kl.max(kl);
        let diff = reference
            .iter()
            .zip(native)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
            .fold(0.0, f64::max);
        self.max_abs_diff = self.max_abs_diff.max(diff);
        Position {
            top1,
            margin: top2_margin(reference),
            kl,
            max_diff: diff,
        }
    }

    fn report(&self, prompts: usize, llama_seconds: f64, native_seconds: f64) -> Report {
        let n = self.positions.max(1) as f64;
        Report {
            positions: self.positions,
            top1_agreement: self.agree as f64 / n,
            mean_kl: self.kl_sum / n,
            max_kl: self.max_kl,
            max_abs_logit_diff: self.max_abs_diff,
            prompts,
            top1_disagreements: self.positions - self.agree,
            repeated_positions: self.repeated,
            worst: self.worst,
            llama_seconds,
            native_seconds,
            llama_noise_floor: None,
        }
    }
}

/// log-softmax in f64 of a logits row.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// KL(p ‖ q) in nats between the softmaxes of two logits rows.
fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    let kl: f64 = lp.iter().zip(&lq).map(|(&a, &b)| a.exp() * (a - b)).sum();
    // Rounding can leave a tiny negative sum for equal rows.
    kl.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_rows_agree_with_zero_kl_and_zero_difference() {
        let row = [0.5, -1.0, 3.0, 2.0];
        let mut s = Stats::default();
        s.add(&row, &row, 0, 0);
        let r = s.report(1, 0.0, 0.0);
        assert_eq!((r.positions, r.top1_disagreements), (1, 0));
        assert_eq!(r.top1_agreement, 1.0);
        assert!(r.mean_kl < 1e-15, "{}", r.mean_kl);
        assert_eq!(r.max_abs_logit_diff, 0.0);
    }

    #[test]
    fn a_constant_shift_changes_no_probability_but_shows_in_the_logit_difference() {
        let a = [0.5f32, -1.0, 3.0, 2.0];
        let b = a.map(|v| v + 0.25);
        assert!(kl_divergence(&a, &b) < 1e-12);
        let mut s = Stats::default();
        s.add(&a, &b, 0, 0);
        assert_eq!(s.report(1, 0.0, 0.0).max_abs_logit_diff, 0.25);
    }

    #[test]
    fn kl_matches_the_closed_form_and_a_swapped_top1_counts_as_disagreement() {
        // p = softmax([ln 3, 0]) = (3/4, 1/4); q = (1/4, 3/4).
        let p = [3f32.ln(), 0.0];
        let q = [0.0, 3f32.ln()];
        let want = 0.75 * (3.0f64).ln() + 0.25 * (1.0f64 / 3.0).ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-6);
        let mut s = Stats::default();
        s.add(&p, &p, 0, 0);
        s.add(&p, &q, 2, 7);
        let r = s.report(3, 0.0, 0.0);
        assert_eq!(r.top1_agreement, 0.5);
        assert_eq!(r.top1_disagreements, 1);
        let w = r.worst.expect("a worst position");
        assert_eq!((w.prompt, w.pos), (2, 7));
        assert!((r.mean_kl - want / 2.0).abs() < 1e-6);
    }

    #[test]
    fn argmax_keeps_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn blank_and_comment_lines_are_skipped_and_line_numbers_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.txt");
        std::fs::write(&path, "# prompts\n\nFirst one\n  \nSecond\n").unwrap();
        let lines = read_prompts(&path).unwrap();
        let got: Vec<(usize, &str)> = lines.iter().map(|l| (l.number, l.text.as_str())).collect();
        assert_eq!(got, [(3, "First one"), (5, "Second")]);
        std::fs::write(&path, "# only a comment\n\n").unwrap();
        assert!(matches!(
            read_prompts(&path),
            Err(GoldenError::NoPrompts(_))
        ));
    }
}
