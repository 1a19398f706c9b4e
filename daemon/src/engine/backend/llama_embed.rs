//! llama.cpp's embedding pass: a second context, made at the first embedding request, with
//! embeddings on and llama.cpp's pooling off, so that every token's final-norm hidden state
//! comes back and [`Pooled`] pools it as the model says.
//!
//! Why a context of its own: llama.cpp's `embeddings` flag makes every token of a batch an
//! output (logits included), so on the generation context every prompt token of every
//! sequence in the step would pay the vocabulary projection and its buffer; llama-cpp-2
//! does not expose `llama_set_embeddings` to switch it per batch either. One sequence of
//! `ctx` cells is enough: the scheduler gathers an embedding's prompt chunks and this runs
//! it whole at its last chunk. The ledger counts this context as its `embeddings` term
//! ([`super::footprint`]).

use std::num::NonZeroU32;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::seam::{BackendError, SeqId, SeqOutcome, Work};
use crate::config::KvTypes;
use crate::engine::chat::model::LoadedModel;
use crate::engine::embed::{Pooled, Pooling};

/// Tokens per `llama_decode` of an embedding pass. Every one is an output, so llama.cpp's
/// output buffer holds this many rows of logits and hidden state: small keeps it small.
pub const EMBED_BATCH: u32 = 32;

/// The backend's embedding sequences and the context they are computed in.
pub struct Passes<'m> {
    /// Per sequence opened for an embedding: its pooling and the prompt fed so far.
    seqs: Vec<Option<Pass>>,
    /// Made at the first embedding pass.
    ctx: Option<LlamaContext<'m>>,
    n_ctx: u32,
    threads: i32,
    /// The generation context's KV types: the ledger sizes this context's cells alike.
    kv_type: KvTypes,
}

struct Pass {
    pooling: Pooling,
    tokens: Vec<i32>,
}

impl<'m> Passes<'m> {
    pub fn new(n_seq: usize, n_ctx: u32, threads: i32, kv_type: KvTypes) -> Self {
        Self {
            seqs: (0..n_seq).map(|_| None).collect(),
            ctx: None,
            n_ctx,
            threads,
            kv_type,
        }
    }

    pub fn open(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        let slot = self
            .seqs
            .get_mut(seq)
            .ok_or_else(|| BackendError::Sequence(format!("no sequence {seq}")))?;
        *slot = Some(Pass {
            pooling,
            tokens: Vec::new(),
        });
        Ok(())
    }

    pub fn close(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.get_mut(seq) {
            *s = None;
        }
    }

    /// Whether `seq` is an embedding pass.
    pub fn has(&self, seq: SeqId) -> bool {
        self.seqs.get(seq).is_some_and(Option::is_some)
    }

    /// One pass's work: its chunk is kept, and the last one computes the whole prompt.
    pub fn work(&mut self, model: &'m LoadedModel, work: &Work<'_>) -> SeqOutcome {
        let seq = work.seq();
        let fail = |why: String| SeqOutcome::new(seq, Err(BackendError::Sequence(why)));
        let Work::Prefill { tokens, sample, .. } = *work else {
            return fail(format!(
                "sequence {seq} is an embedding pass: it decodes nothing"
            ));
        };
        let Some(pass) = self.seqs.get_mut(seq).and_then(Option::as_mut) else {
            return fail(format!("no sequence {seq}"));
        };
        pass.tokens.extend_from_slice(tokens);
        if !sample {
            return SeqOutcome::new(seq, Ok(None));
        }
        let (pooling, prompt) = (pass.pooling, std::mem::take(&mut pass.tokens));
        let ctx = match self.ctx.take() {
            Some(c) => c,
            None => match context(model, self.n_ctx, self.threads, self.kv_type) {
                Ok(c) => c,
                Err(e) => return fail(e),
            },
        };
        match run(self.ctx.insert(ctx), &prompt, pooling) {
            Ok(v) => SeqOutcome {
                embedding: Some(v),
                ..SeqOutcome::new(seq, Ok(None))
            },
            Err(e) => fail(e),
        }
    }
}

/// The embeddings context: one sequence of `n_ctx` cells.
fn context<'m>(
    model: &'m LoadedModel,
    n_ctx: u32,
    threads: i32,
    kv_type: KvTypes,
) -> Result<LlamaContext<'m>, String> {
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_seq_max(1)
        .with_n_batch(EMBED_BATCH)
        .with_n_ubatch(EMBED_BATCH)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        .with_embeddings(true)
        .with_pooling_type(LlamaPoolingType::None);
    let params = super::llama::with_kv_types(params, kv_type);
    model
        .llama()
        .new_context(model.backend(), params)
        .map_err(|e| format!("could not create the embeddings context: {e}"))
}

/// Feeds `tokens` from position 0 and pools their hidden states; the context is left empty.
fn run(ctx: &mut LlamaContext<'_>, tokens: &[i32], pooling: Pooling) -> Result<Vec<f32>, String> {
    ctx.clear_kv_cache();
    let result = feed(ctx, tokens, pooling);
    ctx.clear_kv_cache();
    result
}

fn feed(ctx: &mut LlamaContext<'_>, tokens: &[i32], pooling: Pooling) -> Result<Vec<f32>, String> {
    let n = EMBED_BATCH as usize;
    let mut batch = LlamaBatch::new(n, 1);
    let mut pooled = Pooled::new(pooling);
    for (c, chunk) in tokens.chunks(n).enumerate() {
        batch.clear();
        for (i, &t) in chunk.iter().enumerate() {
            batch
                .add(LlamaToken(t), (c * n + i) as i32, &[0], true)
                .map_err(|e| format!("embedding batch: {e}"))?;
        }
        ctx.decode(&mut batch)
            .map_err(|e| format!("embedding decode: {e}"))?;
        for i in 0..chunk.len() {
            let row = ctx
                .embeddings_ith(i as i32)
                .map_err(|e| format!("embedding row {i}: {e}"))?;
            pooled.push(row);
        }
    }
    pooled
        .finish()
        .ok_or_else(|| "an embedding of no tokens".to_string())
}
