//! The llama.cpp backend: one context on the CPU, every slot a llama.cpp sequence, one
//! `llama_decode` per step over the plan's tokens, a llama.cpp sampler chain per sequence.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::session::LlamaStateSeqFlags;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::{BatchAddError, LlamaBatch};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::llama_embed as embed;
use super::logprobs::{apply_bias, Distribution, TokenLogprobs};
use super::sampling_chain::{self, Stage, MIN_KEEP};
use super::seam::{
    step_split, verify_rows, Backend, BackendError, Capabilities, Device, SeqId, SeqOutcome,
    StepPlan, Vocab, Work,
};
use crate::config::{KvType, KvTypes};
use crate::engine::chat::model::LoadedModel;
use crate::engine::constraint::{Constraint, ConstraintGuard};
use crate::engine::embed::Pooling;
use crate::engine::plan::EnginePlan;
use crate::engine::types::{EngineError, SamplingParams};

/// llama.cpp on the CPU: grammars through llguidance, a unified KV pool, its own weights.
pub const CAPABILITIES: Capabilities = Capabilities {
    constrained_decoding: true,
    shared_kv_pool: true,
    logprobs: true,
    own_weights: false,
    embeddings: true,
    quantized_kv: true,
    devices: &[Device::Cpu],
};

/// The llama-cpp-2 release the workspace pins (`=` in Cargo.toml): llama.cpp's state format
/// may change between releases, so saved prefixes name it.
const LLAMA_CPP_2: &str = "0.1.160";

pub struct LlamaCpp<'m> {
    model: &'m LoadedModel,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    samplers: Vec<Option<SeqSampler>>,
    shared_kv: bool,
    /// Cells of one sequence's KV stream when each has its own (`ctx`).
    stream_cells: u32,
    /// The KV cells' element types: saved prefixes are in them.
    kv_type: KvTypes,
    /// One row of logits, biased, for `logprobs` (kept to avoid an allocation per token).
    row: Vec<f32>,
    /// The embedding passes and their own context (see [`embed`]).
    embed: embed::Passes<'m>,
}

/// What a saved prefix's bytes depend on: llama.cpp's release, the KV element types (a
/// q8_0 row is not an f16 row), the model's layers, width and heads, and whether the
/// sequences share one pool. The prompt cache restores an entry only under the same string.
fn kv_layout(
    [n_layer, n_embd, n_head, n_head_kv]: [u32; 4],
    types: KvTypes,
    shared: bool,
) -> String {
    format!(
        "llama.cpp via llama-cpp-2 {LLAMA_CPP_2}: {} K and {} V, {n_layer} layers, {n_embd} embd, {n_head} heads ({n_head_kv} kv), unified {shared}",
        types.k, types.v
    )
}

/// Sets the KV cells' element types. A quantized V cache is read only by llama.cpp's flash
/// attention (without it V is stored transposed, element by element, which a block type
/// cannot be): the policy is then `enabled`, not `auto`, so that a build or model where
/// flash attention is unavailable fails at load with llama.cpp's reason instead of
/// serving some other way. f16 V keeps llama.cpp's `auto` (flash attention on the CPU).
pub fn with_kv_types(params: LlamaContextParams, types: KvTypes) -> LlamaContextParams {
    let ggml = |t: KvType| match t {
        KvType::F16 => KvCacheType::F16,
        KvType::Q8_0 => KvCacheType::Q8_0,
        KvType::Q4_0 => KvCacheType::Q4_0,
    };
    let params = params.with_type_k(ggml(types.k)).with_type_v(ggml(types.v));
    if types.v.is_quantized() {
        params.with_flash_attention_policy(llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED)
    } else {
        params
    }
}

/// A sequence's sampler chain, and what its `logprobs` need: the chain biases the
/// candidates it samples from, not the context's logits, so the bias is applied again to
/// the row the log-probabilities are computed from.
struct SeqSampler {
    chain: LlamaSampler,
    logprobs: Option<u8>,
    bias: Vec<(i32, f32)>,
    /// With a grammar: every sampled token checked against it (see [`ConstraintGuard`]).
    guard: Option<ConstraintGuard>,
}

impl SeqSampler {
    /// The next token, and its log-probabilities when asked for; an error when the
    /// request's grammar does not allow the token sampled.
    fn sample(
        &mut self,
        ctx: &LlamaContext<'_>,
        idx: i32,
        row: &mut Vec<f32>,
    ) -> Result<(i32, Option<TokenLogprobs>), BackendError> {
        let token = self.chain.sample(ctx, idx).0;
        if let Some(guard) = self.guard.as_mut() {
            guard.follow(token).map_err(BackendError::Sequence)?;
        }
        let logprobs = self.logprobs.map(|n| {
            row.clear();
            row.extend_from_slice(ctx.get_logits_ith(idx));
            apply_bias(row, &self.bias);
            Distribution::of(row, usize::from(n)).report(row, token)
        });
        Ok((token, logprobs))
    }
}

impl<'m> LlamaCpp<'m> {
    /// Creates the context the plan describes: per-slot KV cells, or one shared pool when
    /// the plan oversubscribes the slots.
    pub fn new(model: &'m LoadedModel, plan: &EnginePlan) -> Result<Self, EngineError> {
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(plan.context_cells()))
            .with_n_seq_max(plan.sequences() as u32)
            .with_kv_unified(plan.shared_kv)
            .with_n_batch(plan.n_batch)
            .with_n_ubatch(plan.n_ubatch)
            .with_n_threads(plan.threads)
            .with_n_threads_batch(plan.threads);
        let params = with_kv_types(params, plan.kv_type);
        let ctx = model
            .llama()
            .new_context(model.backend(), params)
            .map_err(|e| EngineError::Context(e.to_string()))?;
        Ok(Self {
            model,
            ctx,
            batch: LlamaBatch::new(plan.n_batch as usize, 1),
            samplers: (0..plan.sequences()).map(|_| None).collect(),
            shared_kv: plan.shared_kv,
            stream_cells: plan.ctx,
            kv_type: plan.kv_type,
            row: Vec::new(),
            embed: embed::Passes::new(plan.sequences(), plan.ctx, plan.threads, plan.kv_type),
        })
    }

    /// A step of generation sequences only: one `llama_decode` over the plan.
    fn step_generation(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        let failed = |reason: String| {
            tracing::error!(
                reason,
                "llama_decode failed; failing the sequences in this step"
            );
            plan.work
                .iter()
                .map(|w| SeqOutcome::new(w.seq(), Err(BackendError::Step(reason.clone()))))
                .collect()
        };
        let logits = match self.fill(plan) {
            Ok(l) => l,
            Err(e) => return failed(format!("batch assembly: {e}")),
        };
        if let Err(e) = self.ctx.decode(&mut self.batch) {
            return failed(e.to_string());
        }
        let mut outcomes = Vec::with_capacity(plan.work.len());
        for (work, at) in plan.work.iter().zip(logits) {
            let seq = work.seq();
            let outcome = match (at, self.samplers.get_mut(seq).and_then(Option::as_mut)) {
                (None, _) => SeqOutcome::new(seq, Ok(None)),
                (Some(idx), Some(sampler)) => match *work {
                    Work::Verify { tokens, pos, .. } => {
                        // Row `i` of the verification is batch index `idx + i`.
                        let (ctx, row) = (&self.ctx, &mut self.row);
                        let produced =
                            verify_rows(&tokens[1..], |i| sampler.sample(ctx, idx + i as i32, row));
                        match produced {
                            Ok(produced) => {
                                // The rejected drafts' rows go; the sequence holds what it
                                // produced.
                                self.truncate(seq, pos + produced.len() as u32);
                                SeqOutcome::produced(seq, produced)
                            }
                            Err(e) => SeqOutcome::new(seq, Err(e)),
                        }
                    }
                    _ => match sampler.sample(&self.ctx, idx, &mut self.row) {
                        Ok(sampled) => SeqOutcome::sampled(seq, sampled),
                        Err(e) => SeqOutcome::new(seq, Err(e)),
                    },
                },
                (Some(_), None) => SeqOutcome::new(
                    seq,
                    Err(BackendError::Sequence(format!(
                        "sequence {seq} was not opened"
                    ))),
                ),
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    /// Fills the batch in plan order; returns, per work, the batch index of its logits (of
    /// its first row, for a verification: one row per token).
    fn fill(&mut self, plan: &StepPlan<'_>) -> Result<Vec<Option<i32>>, BatchAddError> {
        self.batch.clear();
        let mut logits = Vec::with_capacity(plan.work.len());
        for work in &plan.work {
            let seq = [work.seq() as i32];
            match *work {
                Work::Decode { token, pos, .. } => {
                    self.batch.add(LlamaToken(token), pos as i32, &seq, true)?;
                }
                Work::Prefill {
                    tokens,
                    pos,
                    sample,
                    ..
                } => {
                    for (i, t) in tokens.iter().enumerate() {
                        let last = sample && i + 1 == tokens.len();
                        self.batch
                            .add(LlamaToken(*t), pos as i32 + i as i32, &seq, last)?;
                    }
                }
                Work::Verify { tokens, pos, .. } => {
                    let first = self.batch.n_tokens();
                    for (i, t) in tokens.iter().enumerate() {
                        self.batch
                            .add(LlamaToken(*t), pos as i32 + i as i32, &seq, true)?;
                    }
                    logits.push(Some(first));
                    continue;
                }
            }
            logits.push(work.samples().then(|| self.batch.n_tokens() - 1));
        }
        Ok(logits)
    }
}

impl Backend for LlamaCpp<'_> {
    fn name(&self) -> &'static str {
        "llama.cpp"
    }

    fn open(&mut self, seq: SeqId, sampling: &SamplingParams) -> Result<(), BackendError> {
        let slot = self
            .samplers
            .get_mut(seq)
            .ok_or_else(|| BackendError::Sequence(format!("no sequence {seq}")))?;
        self.embed.close(seq);
        *slot = Some(SeqSampler {
            chain: build_sampler(sampling, self.model.info().n_vocab),
            logprobs: sampling.logprobs,
            bias: sampling.logit_bias.clone(),
            guard: sampling.constraint.as_ref().map(Constraint::guard),
        });
        Ok(())
    }

    fn open_embedding(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        self.embed.open(seq, pooling)
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        // Embedding passes run in their own context; the rest share one decode as usual.
        step_split(
            self,
            plan,
            |b, seq| b.embed.has(seq),
            |b, p| b.step_generation(p),
            |b, w| {
                let model = b.model;
                b.embed.work(model, w)
            },
        )
    }

    fn close(&mut self, seq: SeqId) {
        if let Some(s) = self.samplers.get_mut(seq) {
            *s = None;
        }
        self.embed.close(seq);
    }

    fn truncate(&mut self, seq: SeqId, len: u32) {
        let from = (len > 0).then_some(len);
        match self.ctx.clear_kv_cache_seq(Some(seq as u32), from, None) {
            Ok(true) => {}
            Ok(false) => tracing::warn!(seq, len, "llama.cpp refused to drop part of a sequence"),
            Err(e) => {
                tracing::warn!(seq, len, error = %e, "could not drop the KV cells of a sequence")
            }
        }
    }

    fn kv_layout(&self) -> Option<String> {
        let m = self.model.llama();
        let dims = [m.n_layer(), m.n_embd() as u32, m.n_head(), m.n_head_kv()];
        Some(kv_layout(dims, self.kv_type, self.shared_kv))
    }

    fn save_prefix(&mut self, seq: SeqId, len: u32) -> Result<Vec<u8>, BackendError> {
        // The sequence-state API saves every cell a sequence holds: cut it back first.
        self.truncate(seq, len);
        let flags = LlamaStateSeqFlags::empty();
        let size = self.ctx.state_seq_get_size_ext(seq as i32, flags);
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds the `size` bytes llama.cpp just said this sequence's state
        // takes, and nothing changes the sequence in between (this thread owns the context).
        let n = unsafe {
            self.ctx
                .state_seq_get_data_ext(bytes.as_mut_ptr(), seq as i32, flags)
        };
        if n != size {
            return Err(BackendError::Sequence(format!(
                "saving sequence {seq}: llama.cpp wrote {n} of {size} bytes"
            )));
        }
        Ok(bytes)
    }

    fn restore_prefix(&mut self, seq: SeqId, saved: &[u8]) -> Result<u32, BackendError> {
        self.truncate(seq, 0);
        // SAFETY: the prompt cache hands over only bytes `save_prefix` wrote under this
        // `kv_layout` (a disk entry's SHA-256, key and tokens are verified first), and
        // llama.cpp checks the layer count, types and row sizes as it reads them.
        let ok = unsafe {
            self.ctx
                .state_seq_set_data_ext(saved, seq as i32, LlamaStateSeqFlags::empty())
        };
        if !ok {
            self.truncate(seq, 0);
            return Err(BackendError::Sequence(format!(
                "llama.cpp refused a saved state of {} bytes for sequence {seq}",
                saved.len()
            )));
        }
        Ok(self
            .ctx
            .kv_cache_seq_pos_max(seq as i32)
            .saturating_add(1)
            .max(0) as u32)
    }

    fn share_prefix(&mut self, src: SeqId, dst: SeqId, len: u32) -> Result<(), BackendError> {
        let fail = |e: &dyn std::fmt::Display| {
            BackendError::Sequence(format!("KV copy from sequence {src} to {dst}: {e}"))
        };
        self.truncate(dst, 0);
        if self.shared_kv {
            // One pool: the cells gain `dst` as a second owner; nothing is copied.
            self.ctx
                .copy_kv_cache_seq(src as i32, dst as i32, Some(0), Some(len))
                .map_err(|e| fail(&e))?;
        } else {
            // A stream per sequence: llama.cpp's sequence copy copies a whole stream (`ctx`
            // rows of every layer, at the next decode). Its sequence-state API copies only
            // the cells the source holds, twice (out and back in): cheaper while the source
            // holds under half a stream. Either way the tail past the prefix is dropped.
            let held = self
                .ctx
                .kv_cache_seq_pos_max(src as i32)
                .saturating_add(1)
                .max(0) as u32;
            let started = std::time::Instant::now();
            let (how, bytes) = if held.saturating_mul(2) < self.stream_cells {
                let state = self
                    .ctx
                    .state_seq_get(src as i32, LlamaStateSeqFlags::empty())
                    .map_err(|e| fail(&e))?;
                self.ctx
                    .state_seq_set(&state, dst as i32)
                    .map_err(|e| fail(&e))?;
                ("cells", state.byte_len())
            } else {
                self.ctx
                    .copy_kv_cache_seq(src as i32, dst as i32, None, None)
                    .map_err(|e| fail(&e))?;
                ("stream", 0)
            };
            self.truncate(dst, len);
            // `stream`: queued here, copied by the next decode (so not in `us`).
            tracing::debug!(
                src,
                dst,
                len,
                held,
                how,
                bytes,
                us = started.elapsed().as_micros() as u64,
                "prefix copied between KV streams"
            );
        }
        Ok(())
    }
}

impl Vocab for LoadedModel {
    fn is_end(&self, token: i32) -> bool {
        self.llama().vocab().is_eog(LlamaToken(token))
    }

    fn piece(&self, token: i32) -> Vec<u8> {
        self.output_piece(token)
    }

    fn token_text(&self, token: i32) -> Vec<u8> {
        self.token_bytes(token)
    }
}

/// llama.cpp's sampler for `p`: one llama.cpp sampler per stage of the shared chain.
fn build_sampler(p: &SamplingParams, n_vocab: i32) -> LlamaSampler {
    LlamaSampler::chain_simple(
        sampling_chain::stages(p)
            .into_iter()
            .filter_map(|stage| stage_sampler(stage, p, n_vocab)),
    )
}

/// The llama.cpp sampler that runs `stage` of `p`'s chain (`None` only for a grammar stage
/// without a grammar, which `stages` never lists).
fn stage_sampler(stage: Stage, p: &SamplingParams, n_vocab: i32) -> Option<LlamaSampler> {
    Some(match stage {
        Stage::LogitBias => {
            let bias: Vec<LlamaLogitBias> = p
                .logit_bias
                .iter()
                .map(|&(t, b)| LlamaLogitBias::new(LlamaToken(t), b))
                .collect();
            LlamaSampler::logit_bias(n_vocab, &bias)
        }
        Stage::Penalties {
            frequency,
            presence,
            repeat,
            last_n,
        } => LlamaSampler::penalties(
            n_vocab,
            // At most `MAX_PENALTY_LAST_N`, checked by validation.
            i32::try_from(last_n).unwrap_or(i32::MAX),
            repeat,
            frequency,
            presence,
        ),
        Stage::Grammar => p.constraint.as_ref()?.sampler(),
        Stage::Greedy => LlamaSampler::greedy(),
        Stage::TopK(k) => LlamaSampler::top_k(k),
        Stage::TopP(q) => LlamaSampler::top_p(q, MIN_KEEP),
        Stage::MinP(q) => LlamaSampler::min_p(q, MIN_KEEP),
        Stage::Temperature(t) => LlamaSampler::temp(t),
        Stage::Dist { seed } => LlamaSampler::dist(seed),
    })
}

#[cfg(test)]
mod tests {
    use llama_cpp_2::token::data::LlamaTokenData;
    use llama_cpp_2::token::data_array::LlamaTokenDataArray;

    use super::*;
    use crate::engine::native::sampling::Sampler;

    #[test]
    fn saved_prefixes_of_one_kv_type_never_match_another() {
        let dims = [30, 576, 9, 3];
        let f16 = kv_layout(dims, KvTypes::F16, false);
        assert!(f16.contains("f16 K and f16 V"), "{f16}");
        let all = [
            f16,
            kv_layout(dims, KvTypes::both(KvType::Q8_0), false),
            kv_layout(dims, KvTypes::both(KvType::Q4_0), false),
            kv_layout(
                dims,
                KvTypes {
                    k: KvType::Q8_0,
                    v: KvType::F16,
                },
                false,
            ),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn the_layout_names_the_llama_cpp_2_release_the_workspace_pins() {
        let manifest = include_str!("../../../../Cargo.toml");
        let pin = format!("llama-cpp-2 = \"={LLAMA_CPP_2}\"");
        assert!(manifest.contains(&pin), "workspace Cargo.toml lacks {pin}");
    }

    /// No ties, so that "the highest" means one token in both implementations.
    const ROW: [f32; 8] = [0.5, 2.0, 1.0, 1.7, -1.0, 1.9, 0.25, 1.2];

    /// The llama.cpp sampler each stage must become.
    fn llama_name(stage: Stage) -> &'static str {
        match stage {
            Stage::LogitBias => "logit-bias",
            Stage::Penalties { .. } => "penalties",
            Stage::Grammar => "grammar",
            Stage::Greedy => "greedy",
            Stage::TopK(_) => "top-k",
            Stage::TopP(_) => "top-p",
            Stage::MinP(_) => "min-p",
            Stage::Temperature(_) => "temp",
            Stage::Dist { .. } => "dist",
        }
    }

    /// Settings whose chain picks one token for sure, so that llama.cpp's random stream and
    /// the native one cannot make the two differ. Penalties are odd numbers so that no two
    /// penalized logits tie.
    fn deterministic() -> Vec<SamplingParams> {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        vec![
            greedy.clone(),
            SamplingParams {
                logit_bias: vec![(1, -5.0), (6, 3.0)],
                ..greedy.clone()
            },
            SamplingParams {
                frequency_penalty: 0.0703,
                ..greedy.clone()
            },
            SamplingParams {
                presence_penalty: 0.61,
                frequency_penalty: 0.0371,
                logit_bias: vec![(4, 2.5)],
                ..greedy.clone()
            },
            SamplingParams {
                temperature: 1.5,
                top_k: 1,
                frequency_penalty: 0.1337,
                seed: 11,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 0.8,
                top_k: 4,
                top_p: 0.01,
                presence_penalty: 0.4123,
                seed: 5,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 2.0,
                min_p: 0.9999,
                frequency_penalty: 0.0703,
                logit_bias: vec![(0, 1.0)],
                seed: 9,
                ..SamplingParams::default()
            },
            // ROW has negative logits: the repeat penalty multiplies those and divides the
            // others, over a window shorter than the run.
            SamplingParams {
                repeat_penalty: 1.37,
                penalty_last_n: 5,
                ..greedy.clone()
            },
            SamplingParams {
                repeat_penalty: 2.91,
                presence_penalty: 0.0313,
                penalty_last_n: 3,
                logit_bias: vec![(4, 3.1)],
                ..greedy.clone()
            },
        ]
    }

    #[test]
    fn the_llama_chain_and_the_native_sampler_follow_one_description() {
        let n_vocab = ROW.len() as i32;
        for p in deterministic() {
            let stages = sampling_chain::stages(&p);
            // The same stages, in order, on both sides.
            let built: Vec<String> = stages
                .iter()
                .filter_map(|&s| stage_sampler(s, &p, n_vocab))
                .map(|s| {
                    s.name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .collect();
            let want: Vec<&str> = stages.iter().map(|&s| llama_name(s)).collect();
            assert_eq!(built, want, "{p:?}");
            let mut native = Sampler::new(&p);
            assert_eq!(native.stages(), stages.as_slice(), "{p:?}");
            // The same tokens, past the penalty window.
            let mut chain = build_sampler(&p, n_vocab);
            let mut tokens = Vec::new();
            for step in 0..sampling_chain::PENALTY_LAST_N as usize + 16 {
                let mut cand = LlamaTokenDataArray::from_iter(
                    ROW.iter()
                        .enumerate()
                        .map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)),
                    false,
                );
                chain.apply(&mut cand);
                let token = cand.selected_token().expect("the chain selects a token");
                chain.accept(token);
                assert_eq!(native.sample(&ROW), token.0, "step {step} of {p:?}");
                tokens.push(token.0);
            }
            if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 || p.repeat_penalty != 1.0 {
                assert!(
                    tokens.iter().any(|&t| t != tokens[0]),
                    "the penalties moved the pick: {p:?}"
                );
            }
        }
    }
}
