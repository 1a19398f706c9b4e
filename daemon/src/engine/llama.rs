//! The llama.cpp backend: one context on the CPU, every slot a llama.cpp sequence, one
//! `llama_decode` per step over the plan's tokens, a llama.cpp sampler chain per sequence.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::{BatchAddError, LlamaBatch};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::backend::{
    Backend, BackendError, Capabilities, Device, SeqId, SeqOutcome, StepPlan, Vocab, Work,
};
use super::logprobs::{apply_bias, Distribution, TokenLogprobs};
use super::plan::EnginePlan;
use super::{EngineError, LoadedModel, SamplingParams};

/// llama.cpp on the CPU: grammars through llguidance, a unified KV pool, its own weights.
pub const CAPABILITIES: Capabilities = Capabilities {
    constrained_decoding: true,
    shared_kv_pool: true,
    logprobs: true,
    own_weights: false,
    devices: &[Device::Cpu],
};

pub struct LlamaCpp<'m> {
    model: &'m LoadedModel,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    samplers: Vec<Option<SeqSampler>>,
    shared_kv: bool,
    /// One row of logits, biased, for `logprobs` (kept to avoid an allocation per token).
    row: Vec<f32>,
}

/// A sequence's sampler chain, and what its `logprobs` need: the chain biases the
/// candidates it samples from, not the context's logits, so the bias is applied again to
/// the row the log-probabilities are computed from.
struct SeqSampler {
    chain: LlamaSampler,
    logprobs: Option<u8>,
    bias: Vec<(i32, f32)>,
}

impl SeqSampler {
    /// The next token, and its log-probabilities when asked for.
    fn sample(
        &mut self,
        ctx: &LlamaContext<'_>,
        idx: i32,
        row: &mut Vec<f32>,
    ) -> (i32, Option<TokenLogprobs>) {
        let token = self.chain.sample(ctx, idx).0;
        let logprobs = self.logprobs.map(|n| {
            row.clear();
            row.extend_from_slice(ctx.get_logits_ith(idx));
            apply_bias(row, &self.bias);
            Distribution::of(row, usize::from(n)).report(row, token)
        });
        (token, logprobs)
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
            row: Vec::new(),
        })
    }

    /// Fills the batch in plan order; returns, per work, the batch index of its logits.
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
        *slot = Some(SeqSampler {
            chain: build_sampler(sampling, self.model.info().n_vocab),
            logprobs: sampling.logprobs,
            bias: sampling.logit_bias.clone(),
        });
        Ok(())
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
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
        plan.work
            .iter()
            .zip(logits)
            .map(|(work, at)| {
                let seq = work.seq();
                match (at, self.samplers.get_mut(seq).and_then(Option::as_mut)) {
                    (None, _) => SeqOutcome::new(seq, Ok(None)),
                    (Some(idx), Some(sampler)) => {
                        let (token, logprobs) = sampler.sample(&self.ctx, idx, &mut self.row);
                        SeqOutcome {
                            seq,
                            result: Ok(Some(token)),
                            logprobs,
                        }
                    }
                    (Some(_), None) => SeqOutcome::new(
                        seq,
                        Err(BackendError::Sequence(format!(
                            "sequence {seq} was not opened"
                        ))),
                    ),
                }
            })
            .collect()
    }

    fn close(&mut self, seq: SeqId) {
        if let Some(s) = self.samplers.get_mut(seq) {
            *s = None;
        }
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
            // A stream per sequence: llama.cpp copies whole streams (at the next decode),
            // then the tail past the prefix is dropped.
            self.ctx
                .copy_kv_cache_seq(src as i32, dst as i32, None, None)
                .map_err(|e| fail(&e))?;
            self.truncate(dst, len);
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

fn build_sampler(p: &SamplingParams, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::new();
    if !p.logit_bias.is_empty() {
        let bias: Vec<LlamaLogitBias> = p
            .logit_bias
            .iter()
            .map(|&(t, b)| LlamaLogitBias::new(LlamaToken(t), b))
            .collect();
        chain.push(LlamaSampler::logit_bias(n_vocab, &bias));
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            64,
            1.0,
            p.frequency_penalty,
            p.presence_penalty,
        ));
    }
    // After the bias and penalties, before truncation: top-k and top-p then choose among
    // the tokens the grammar allows, never among ones it would mask afterwards.
    if let Some(c) = &p.constraint {
        chain.push(c.sampler());
    }
    if p.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        if p.top_k > 0 {
            chain.push(LlamaSampler::top_k(p.top_k));
        }
        if p.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(p.top_p, 1));
        }
        if p.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(p.min_p, 1));
        }
        chain.push(LlamaSampler::temp(p.temperature));
        chain.push(LlamaSampler::dist(p.seed));
    }
    LlamaSampler::chain_simple(chain)
}
