//! The forward pass: a batch of `(seq, token, pos)` through every layer, logits for the
//! tokens that ask for them, on whichever [`Pass`] the [`Model`] was opened with.
//!
//! The batch is checked whole against the cache first, then goes through the pass in
//! micro-batches of at most [`UBATCH`] tokens, so the weights are read once per
//! micro-batch. Within one, every layer first writes the K and V of all its tokens into
//! the cache, then runs attention per token over positions `0..=pos` of its sequence: a
//! prompt chunk's token sees the chunk's earlier tokens, which are already stored, and no
//! later one. Each column's arithmetic does not depend on the others, so a token's logits
//! are the same bits whether it is fed alone, in a chunk or beside other sequences.

use super::cpu::CpuPass;
use super::cuda::CudaPass;
use super::hparams::HParams;
use super::kv::Kv;
use super::pass::Pass;
use super::weights::Weights;

pub use super::batch::{Activations, BatchToken, UBATCH};
use super::error::NativeError;

/// A loaded model: its hyperparameters and the pass (with its KV cache) it runs on, plus
/// the batch bookkeeping, sized once so that no step allocates per token.
pub struct Model<'a> {
    hp: HParams,
    pass: Box<dyn Pass + 'a>,
    logits: Vec<f32>,
    /// An embedding batch's hidden states: `n_embd` per token.
    hidden: Vec<f32>,
    /// Per sequence, during a batch: its length once the batch is stored, and its first
    /// position in the batch (`None` when absent).
    next_len: Vec<usize>,
    first_pos: Vec<Option<usize>>,
}

impl<'a> Model<'a> {
    /// A model on the CPU twins over `weights` (loaded for `hp`) with a KV cache of `n_seq`
    /// sequences of `n_ctx` positions each; matmuls split over `threads` threads.
    pub fn new(
        hp: HParams,
        weights: Weights<'a>,
        n_seq: usize,
        n_ctx: usize,
        threads: usize,
    ) -> Result<Self, NativeError> {
        let pass = CpuPass::new(hp.clone(), weights, n_seq, n_ctx, threads)?;
        Ok(Self::with_pass(hp, Box::new(pass)))
    }

    /// A model whose pass runs on `gpu`: the weights are copied to GPU memory and the KV
    /// cache is allocated there.
    pub fn new_cuda(
        hp: HParams,
        weights: Weights<'a>,
        n_seq: usize,
        n_ctx: usize,
        gpu: inferloop_kernels::cuda::Gpu,
    ) -> Result<Self, NativeError> {
        let pass = CudaPass::new(gpu, &hp, &weights, n_seq, n_ctx)?;
        Ok(Self::with_pass(hp, Box::new(pass)))
    }

    /// A model for `hp` on `pass` (built for the same `hp`).
    pub fn with_pass(hp: HParams, pass: Box<dyn Pass + 'a>) -> Self {
        let n_seq = pass.kv().n_seq();
        Self {
            hp,
            pass,
            logits: Vec::new(),
            hidden: Vec::new(),
            next_len: vec![0; n_seq],
            first_pos: vec![None; n_seq],
        }
    }

    /// The GPU the pass runs on and the GPU memory its weights and scratch take (`None`
    /// on the CPU).
    pub fn cuda(&self) -> Option<(&str, usize)> {
        self.pass.gpu()
    }

    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    pub fn kv(&self) -> &dyn Kv {
        self.pass.kv()
    }

    /// Truncate, clear and prefix copies go through here.
    pub fn kv_mut(&mut self) -> &mut dyn Kv {
        self.pass.kv_mut()
    }

    /// What the linear layers multiply: refused where the pass does not run that mode (the
    /// CUDA pass runs [`Activations::Q8`] only).
    pub fn set_activations(&mut self, activations: Activations) -> Result<(), NativeError> {
        self.pass.set_activations(activations)
    }

    pub fn activations(&self) -> Activations {
        self.pass.activations()
    }

    /// Feeds `batch` and returns the logits of the tokens whose `want_logits` entry is set:
    /// one row of `n_vocab` each, in batch order.
    ///
    /// A sequence's tokens must come in order at consecutive positions, the first at most
    /// its current length (a lower position drops what the sequence held from there on);
    /// positions below `n_ctx`, tokens inside the vocabulary. A batch that breaks this is
    /// refused before anything is computed. After a kernel error the sequences in the batch
    /// keep only what they held before their first position in it.
    pub fn forward(
        &mut self,
        batch: &[BatchToken],
        want_logits: &[bool],
    ) -> Result<&[f32], NativeError> {
        if want_logits.len() != batch.len() {
            return Err(NativeError::Batch {
                index: batch.len().min(want_logits.len()),
                why: format!(
                    "{} want_logits entries for {} tokens",
                    want_logits.len(),
                    batch.len()
                ),
            });
        }
        self.check_batch(batch)?;
        let nv = self.hp.n_vocab;
        let n_want = want_logits.iter().filter(|&&w| w).count();
        self.logits.clear();
        self.logits.resize(n_want * nv, 0.0);
        let mut row = 0;
        for (toks, want) in batch.chunks(UBATCH).zip(want_logits.chunks(UBATCH)) {
            if let Err(e) = self.pass.run(toks, want, &mut self.logits[row * nv..]) {
                let kv = self.pass.kv_mut();
                for (seq, first) in self.first_pos.iter().enumerate() {
                    if let Some(p) = *first {
                        // `seq` is inside the cache (checked above): this cannot fail.
                        kv.truncate(seq, p).ok();
                    }
                }
                return Err(e);
            }
            row += want.iter().filter(|&&w| w).count();
        }
        Ok(&self.logits)
    }

    /// Feeds `batch` like [`forward`](Self::forward) and returns every token's hidden state
    /// after the final norm, `n_embd` floats each in batch order: an embedding pass.
    pub fn hidden(&mut self, batch: &[BatchToken]) -> Result<&[f32], NativeError> {
        self.check_batch(batch)?;
        let e = self.hp.n_embd;
        self.hidden.clear();
        self.hidden.resize(batch.len() * e, 0.0);
        for (c, toks) in batch.chunks(UBATCH).enumerate() {
            let out = &mut self.hidden[c * UBATCH * e..];
            if let Err(err) = self.pass.run_hidden(toks, out) {
                let kv = self.pass.kv_mut();
                for (seq, first) in self.first_pos.iter().enumerate() {
                    if let Some(p) = *first {
                        kv.truncate(seq, p).ok();
                    }
                }
                return Err(err);
            }
        }
        Ok(&self.hidden)
    }

    /// Checks every token against the cache and fills `next_len` and `first_pos`.
    fn check_batch(&mut self, batch: &[BatchToken]) -> Result<(), NativeError> {
        let kv = self.pass.kv();
        for (seq, (next, first)) in self
            .next_len
            .iter_mut()
            .zip(self.first_pos.iter_mut())
            .enumerate()
        {
            *next = kv.seq_len(seq);
            *first = None;
        }
        let (n_seq, n_ctx, n_vocab) = (kv.n_seq(), kv.n_ctx(), self.hp.n_vocab);
        for (index, t) in batch.iter().enumerate() {
            let fail = |why: String| Err(NativeError::Batch { index, why });
            let pos = t.pos as usize;
            if t.seq >= n_seq {
                return fail(format!("sequence {} outside the cache's {n_seq}", t.seq));
            }
            if usize::try_from(t.token).map_or(true, |tok| tok >= n_vocab) {
                return fail(format!(
                    "token {} outside the vocabulary of {n_vocab}",
                    t.token
                ));
            }
            if pos >= n_ctx {
                return fail(format!(
                    "position {pos} beyond the context of {n_ctx} positions"
                ));
            }
            let held = self.next_len[t.seq];
            match self.first_pos[t.seq] {
                Some(_) if pos != held => {
                    return fail(format!(
                        "position {pos} of sequence {} does not follow its previous token in \
                         the batch (position {})",
                        t.seq,
                        held - 1
                    ))
                }
                None if pos > held => {
                    return fail(format!(
                        "position {pos} leaves a gap: sequence {} holds {held} positions",
                        t.seq
                    ))
                }
                Some(_) => {}
                None => self.first_pos[t.seq] = Some(pos),
            }
            self.next_len[t.seq] = pos + 1;
        }
        Ok(())
    }
}
