//! The device seam: [`Pass`], one device's forward pass over the layers with the KV cache
//! it owns. [`super::cpu::CpuPass`] runs on `inferloop-kernels`' CPU twins,
//! [`super::cuda::CudaPass`] on its CUDA kernels; [`super::forward::Model`] checks a batch,
//! cuts it into micro-batches and hands them to whichever it holds.

use super::batch::{Activations, BatchToken, UBATCH};
use super::error::NativeError;
use super::hparams::HParams;
use super::kv::Kv;
use super::weights::Weights;

/// One device's forward pass and its KV cache.
pub trait Pass: Send {
    /// Runs at most [`super::batch::UBATCH`] tokens through every layer: stores their K and V,
    /// and writes the logits of the tokens whose `want` entry is set into `logits`, one
    /// `n_vocab` row each, in order. The caller has checked the tokens against the cache
    /// (sequence, vocabulary, positions in order without a gap). On success each sequence
    /// holds positions up to its last token here; on an error the caller truncates.
    fn run(
        &mut self,
        toks: &[BatchToken],
        want: &[bool],
        logits: &mut [f32],
    ) -> Result<(), NativeError>;

    /// Like [`run`](Pass::run), but writes every token's hidden state after the final norm
    /// (`n_embd` floats each, in order) into `hidden` instead of logits: an embedding pass.
    fn run_hidden(&mut self, toks: &[BatchToken], hidden: &mut [f32]) -> Result<(), NativeError> {
        let _ = (toks, hidden);
        Err(NativeError::Unsupported(
            "embeddings on this device (the native backend computes them on the CPU)".into(),
        ))
    }

    fn kv(&self) -> &dyn Kv;

    fn kv_mut(&mut self) -> &mut dyn Kv;

    /// Chooses what the linear layers multiply; a device refuses a mode it does not run.
    fn set_activations(&mut self, activations: Activations) -> Result<(), NativeError>;

    /// What the linear layers multiply now (part of a saved prefix's layout: the modes
    /// store different K and V bits).
    fn activations(&self) -> Activations {
        Activations::Q8
    }

    /// The GPU the pass runs on and the GPU memory its weights and scratch take (`None` on
    /// the CPU).
    fn gpu(&self) -> Option<(&str, usize)>;
}

/// What every pass refuses at open: an empty cache, and weights loaded for other
/// hyperparameters.
pub fn check_open(
    hp: &HParams,
    weights: &Weights<'_>,
    n_seq: usize,
    n_ctx: usize,
) -> Result<(), NativeError> {
    if n_seq == 0 || n_ctx == 0 {
        return Err(NativeError::Kv(format!(
            "a cache of {n_seq} sequences of {n_ctx} positions holds nothing"
        )));
    }
    if weights.layers.len() != hp.n_layer
        || weights.token_embd.k != hp.n_embd
        || weights.token_embd.rows != hp.n_vocab
    {
        return Err(NativeError::BadMetadata(format!(
            "weights of {} layers, embedding {} x {}, loaded for other hyperparameters \
             ({} layers, {} x {})",
            weights.layers.len(),
            weights.token_embd.rows,
            weights.token_embd.k,
            hp.n_layer,
            hp.n_vocab,
            hp.n_embd
        )));
    }
    Ok(())
}

/// Refuses a micro-batch a pass's buffers are not sized for ([`super::forward::Model`]
/// never sends one).
pub fn check_micro_batch(toks: &[BatchToken], want: &[bool]) -> Result<(), NativeError> {
    if toks.len() <= UBATCH && want.len() == toks.len() {
        return Ok(());
    }
    Err(NativeError::Batch {
        index: toks.len().min(want.len()),
        why: format!(
            "a pass takes at most {UBATCH} tokens with one want entry each, not {} tokens \
             with {} entries",
            toks.len(),
            want.len()
        ),
    })
}
