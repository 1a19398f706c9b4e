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

use crate::engine::chat::model::LoadedModel;
use crate::engine::embed::{Pooled, Pooling};

/// Tokens per `llama_decode` of an embedding pass. Every one is an output, so llama.cpp's
/// output buffer holds this many rows of logits and hidden state: small keeps it small.
pub const EMBED_BATCH: u32 = 32;

/// The embeddings context: one sequence of `n_ctx` cells.
pub fn context<'m>(
    model: &'m LoadedModel,
    n_ctx: u32,
    threads: i32,
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
    model
        .llama()
        .new_context(model.backend(), params)
        .map_err(|e| format!("could not create the embeddings context: {e}"))
}

/// Feeds `tokens` from position 0 and pools their hidden states; the context is left empty.
pub fn run(
    ctx: &mut LlamaContext<'_>,
    tokens: &[i32],
    pooling: Pooling,
) -> Result<Vec<f32>, String> {
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
