//! The forward pass: a batch of `(seq, token, pos)` through every layer, logits for the
//! tokens that ask for them.
//!
//! The batch goes through the model in passes of at most [`UBATCH`] tokens, so the weights
//! are read once per pass. By default ([`Activations::Q8`]) every linear layer quantizes its
//! input to 8-bit blocks and runs the Q8_0 GEMM, as llama.cpp's CPU matmuls do for Q8_0
//! weights (same rounding, f16 block scales included), so the golden check compares like
//! with like; [`Activations::F32`] runs the GEMV on f32 inputs instead, which equals
//! llama.cpp reading the same weights dequantized to f32. Within a pass every layer first writes the K and V of all its tokens into the cache,
//! then runs attention per token over positions `0..=pos` of its sequence: a prompt chunk's
//! token sees the chunk's earlier tokens, which are already stored, and no later one. Each
//! column's arithmetic does not depend on the others, so a token's logits are the same bits
//! whether it is fed alone, in a chunk or beside other sequences.

use inferloop_kernels::cpu::attention::{attention_decode, AttnShape, CHUNK};
use inferloop_kernels::cpu::elementwise::{add_inplace, silu_mul};
use inferloop_kernels::cpu::embed::embed;
use inferloop_kernels::cpu::gemm::gemm;
use inferloop_kernels::cpu::gemv::{gemv, ShapeError, MAX_COLS};
use inferloop_kernels::cpu::quantize::{quantize_into, Q8Act};
use inferloop_kernels::cpu::rmsnorm::{rmsnorm, rmsnorm_inplace};
use inferloop_kernels::cpu::rope::{rope_inplace, Rope};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{Q8Matrix, QK};

use super::cuda::CudaExec;
use super::hparams::HParams;
use super::kv::{KvCache, Store};
use super::weights::Weights;
use super::NativeError;

/// Tokens per pass through the layers (the CUDA GEMV's columns per launch).
pub const UBATCH: usize = MAX_COLS;

/// What the linear layers multiply the weights with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// Inputs quantized to Q8_0 blocks, then the int8 GEMM (`dp4a` on the GPU): llama.cpp's
    /// own numerics for Q8_0 weights.
    #[default]
    Q8,
    /// Inputs kept in f32, the GEMV: the numerics of f32 weights.
    F32,
}

/// One token of a batch: fed to sequence `seq` at position `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    pub seq: usize,
    pub token: i32,
    pub pos: u32,
}

/// A loaded model with its KV cache and scratch: everything [`Model::forward`] needs, sized
/// once so that no step allocates per token.
pub struct Model<'a> {
    hp: HParams,
    w: Weights<'a>,
    kv: KvCache,
    isa: Isa,
    threads: usize,
    activations: Activations,
    s: Scratch,
    logits: Vec<f32>,
    /// Per sequence, during a batch: its length once the batch is stored, and its first
    /// position in the batch (`None` when absent).
    next_len: Vec<usize>,
    first_pos: Vec<Option<usize>>,
    /// The GPU the pass runs on (`None`: the CPU twins). Its KV cache is `kv`'s store.
    cuda: Option<Box<CudaExec>>,
}

/// Activations of one pass, `UBATCH` rows of each width.
struct Scratch {
    /// The residual stream, `[n][n_embd]`.
    x: Vec<f32>,
    /// Its normalized copy, the matmuls' input.
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    /// A projection back to `n_embd` (attention output, FFN down) before the residual add.
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// The quantized input of the matmuls, sized once for the widest (`n_ff`).
    qa: Q8Act,
    tokens: Vec<i32>,
    pos: Vec<i32>,
}

impl Scratch {
    /// No buffers: for a model whose pass runs on the GPU.
    fn empty() -> Self {
        Self {
            x: Vec::new(),
            xn: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            attn: Vec::new(),
            o: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            act: Vec::new(),
            qa: Q8Act {
                q: Vec::new(),
                d: Vec::new(),
                rows: 0,
                k: 0,
            },
            tokens: Vec::new(),
            pos: Vec::new(),
        }
    }

    fn new(hp: &HParams) -> Self {
        let rows = |width: usize| vec![0.0; UBATCH * width];
        Self {
            x: rows(hp.n_embd),
            xn: rows(hp.n_embd),
            q: rows(hp.q_dim()),
            k: rows(hp.kv_dim()),
            v: rows(hp.kv_dim()),
            attn: rows(hp.q_dim()),
            o: rows(hp.n_embd),
            gate: rows(hp.n_ff),
            up: rows(hp.n_ff),
            act: rows(hp.n_ff),
            qa: Q8Act {
                q: Vec::with_capacity(UBATCH * hp.n_ff.max(hp.n_embd).max(hp.q_dim())),
                d: Vec::with_capacity(UBATCH * hp.n_ff.max(hp.n_embd).max(hp.q_dim()) / QK),
                rows: 0,
                k: 0,
            },
            tokens: vec![0; UBATCH],
            pos: vec![0; UBATCH],
        }
    }
}

impl<'a> Model<'a> {
    /// A model over `weights` (loaded for `hp`) with a KV cache of `n_seq` sequences of
    /// `n_ctx` positions each; matmuls split over `threads` threads.
    pub fn new(
        hp: HParams,
        weights: Weights<'a>,
        n_seq: usize,
        n_ctx: usize,
        threads: usize,
    ) -> Result<Self, NativeError> {
        Self::check(&hp, &weights, n_seq, n_ctx)?;
        let kv = KvCache::new(hp.n_layer, n_seq, n_ctx, hp.kv_dim());
        let s = Scratch::new(&hp);
        Self::build(hp, weights, kv, s, threads)
    }

    /// Refuses an empty cache and weights loaded for other hyperparameters.
    fn check(
        hp: &HParams,
        weights: &Weights<'a>,
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

    /// A model over checked weights with the given cache and scratch.
    fn build(
        hp: HParams,
        weights: Weights<'a>,
        kv: KvCache,
        s: Scratch,
        threads: usize,
    ) -> Result<Self, NativeError> {
        let n_seq = kv.n_seq();
        Ok(Self {
            kv,
            cuda: None,
            s,
            isa: Isa::detect(),
            threads: threads.max(1),
            activations: Activations::default(),
            logits: Vec::new(),
            next_len: vec![0; n_seq],
            first_pos: vec![None; n_seq],
            w: weights,
            hp,
        })
    }

    /// A model whose pass runs on `gpu`: the weights are copied to GPU memory and the KV
    /// cache is allocated there; the host keeps only the sequences' lengths and the
    /// one-pass CPU scratch is not allocated.
    pub fn new_cuda(
        hp: HParams,
        weights: Weights<'a>,
        n_seq: usize,
        n_ctx: usize,
        gpu: inferloop_kernels::cuda::Gpu,
    ) -> Result<Self, NativeError> {
        Self::check(&hp, &weights, n_seq, n_ctx)?;
        let (exec, kv) = CudaExec::new(gpu, &hp, &weights, n_seq, n_ctx)?;
        let kv = KvCache::with_store(hp.n_layer, n_seq, n_ctx, hp.kv_dim(), Store::Device(kv));
        let mut model = Self::build(hp, weights, kv, Scratch::empty(), 1)?;
        model.cuda = Some(Box::new(exec));
        Ok(model)
    }

    /// The GPU the pass runs on and the GPU memory its weights and scratch take (`None`
    /// on the CPU).
    pub fn cuda(&self) -> Option<(&str, usize)> {
        self.cuda.as_ref().map(|c| (c.device_name(), c.bytes()))
    }

    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    pub fn weights(&self) -> &Weights<'a> {
        &self.w
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Truncate, clear and prefix copies go through here.
    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// The vector instructions the twins run (detected at creation). Every ISA gives the
    /// same bits; this is for tests and benchmarks.
    pub fn set_isa(&mut self, isa: Isa) {
        self.isa = isa;
    }

    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    pub fn set_activations(&mut self, activations: Activations) {
        self.activations = activations;
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
        let n_want = want_logits.iter().filter(|&&w| w).count();
        self.logits.clear();
        self.logits.resize(n_want * self.hp.n_vocab, 0.0);
        let mut row = 0;
        for (toks, want) in batch.chunks(UBATCH).zip(want_logits.chunks(UBATCH)) {
            if let Err(e) = self.pass(toks, want, row) {
                for (seq, first) in self.first_pos.iter().enumerate() {
                    if let Some(p) = *first {
                        self.kv.set_len(seq, p.min(self.kv.seq_len(seq)));
                    }
                }
                return Err(e);
            }
            row += want.iter().filter(|&&w| w).count();
        }
        for (seq, first) in self.first_pos.iter().enumerate() {
            if first.is_some() {
                self.kv.set_len(seq, self.next_len[seq]);
            }
        }
        Ok(&self.logits)
    }

    /// Checks every token against the cache and fills `next_len` and `first_pos`.
    fn check_batch(&mut self, batch: &[BatchToken]) -> Result<(), NativeError> {
        for (seq, (next, first)) in self
            .next_len
            .iter_mut()
            .zip(self.first_pos.iter_mut())
            .enumerate()
        {
            *next = self.kv.seq_len(seq);
            *first = None;
        }
        let (n_seq, n_ctx, n_vocab) = (self.kv.n_seq(), self.kv.n_ctx(), self.hp.n_vocab);
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

    /// One pass of at most [`UBATCH`] tokens; logits rows from `row` on.
    fn pass(&mut self, toks: &[BatchToken], want: &[bool], row: usize) -> Result<(), NativeError> {
        if let Some(cuda) = self.cuda.as_mut() {
            let n_ctx = self.kv.n_ctx();
            let Store::Device(kv) = self.kv.store_mut() else {
                return Err(NativeError::Kv("the CUDA pass needs a GPU KV cache".into()));
            };
            let nv = self.hp.n_vocab;
            return cuda.pass(
                &self.hp,
                kv,
                n_ctx,
                toks,
                want,
                &mut self.logits[row * nv..],
            );
        }
        let Self {
            hp,
            w,
            kv,
            isa,
            threads,
            activations,
            s,
            logits,
            ..
        } = self;
        let (isa, threads, n) = (*isa, *threads, toks.len());
        let mm = Matmul {
            isa,
            threads,
            activations: *activations,
        };
        let (e, qd, kvd, ff, eps) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff, hp.rms_eps);
        for (i, t) in toks.iter().enumerate() {
            s.tokens[i] = t.token;
            s.pos[i] = t.pos as i32;
        }
        let (tokens, pos) = (&s.tokens[..n], &s.pos[..n]);
        let x = &mut s.x[..n * e];
        let xn = &mut s.xn[..n * e];
        let (q, k, v) = (&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]);
        let (attn, o) = (&mut s.attn[..n * qd], &mut s.o[..n * e]);
        let (gate, up, act) = (
            &mut s.gate[..n * ff],
            &mut s.up[..n * ff],
            &mut s.act[..n * ff],
        );
        let qa = &mut s.qa;
        let (rope_q, rope_k): (Rope, Rope) = (hp.rope(hp.n_head), hp.rope(hp.n_head_kv));
        let shape = AttnShape {
            n_seq: 1,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            n_ctx: kv.n_ctx(),
        };
        let Store::Host(kv) = kv.store_mut() else {
            return Err(NativeError::Kv("the CPU pass needs a host KV cache".into()));
        };

        embed(&w.token_embd, tokens, x).map_err(op(None, "token_embd"))?;
        for (l, ly) in w.layers.iter().enumerate() {
            // Attention: `xn` quantized once for Q, K and V.
            rmsnorm(isa, x, &ly.attn_norm, eps, xn).map_err(op(Some(l), "attn_norm"))?;
            mm.input(xn, n, qa)
                .map_err(op(Some(l), "attn_norm quantize"))?;
            mm.run(&ly.wq, xn, n, qa, q)
                .map_err(op(Some(l), "attn_q"))?;
            mm.run(&ly.wk, xn, n, qa, k)
                .map_err(op(Some(l), "attn_k"))?;
            mm.run(&ly.wv, xn, n, qa, v)
                .map_err(op(Some(l), "attn_v"))?;
            for (y, b, width, name) in [
                (&mut *q, &ly.bq, qd, "attn_q.bias"),
                (&mut *k, &ly.bk, kvd, "attn_k.bias"),
                (&mut *v, &ly.bv, kvd, "attn_v.bias"),
            ] {
                if let Some(b) = b {
                    for yr in y.chunks_exact_mut(width) {
                        add_inplace(yr, b).map_err(op(Some(l), name))?;
                    }
                }
            }
            rope_inplace(&rope_q, q, pos).map_err(op(Some(l), "rope q"))?;
            rope_inplace(&rope_k, k, pos).map_err(op(Some(l), "rope k"))?;
            for (i, t) in toks.iter().enumerate() {
                let r = i * kvd..(i + 1) * kvd;
                kv.write(l, t.seq, t.pos as usize, &k[r.clone()], &v[r]);
            }
            for (i, t) in toks.iter().enumerate() {
                let (kc, vc) = kv.seq_layer(l, t.seq);
                let r = i * qd..(i + 1) * qd;
                let kv_len = [t.pos as usize + 1];
                attention_decode(
                    isa,
                    &shape,
                    &q[r.clone()],
                    kc,
                    vc,
                    &kv_len,
                    CHUNK,
                    &mut attn[r],
                )
                .map_err(op(Some(l), "attention"))?;
            }
            mm.input(attn, n, qa)
                .map_err(op(Some(l), "attention quantize"))?;
            mm.run(&ly.wo, attn, n, qa, o)
                .map_err(op(Some(l), "attn_output"))?;
            add_inplace(x, o).map_err(op(Some(l), "attention residual"))?;

            // Feed-forward (SwiGLU).
            rmsnorm(isa, x, &ly.ffn_norm, eps, xn).map_err(op(Some(l), "ffn_norm"))?;
            mm.input(xn, n, qa)
                .map_err(op(Some(l), "ffn_norm quantize"))?;
            mm.run(&ly.ffn_gate, xn, n, qa, gate)
                .map_err(op(Some(l), "ffn_gate"))?;
            mm.run(&ly.ffn_up, xn, n, qa, up)
                .map_err(op(Some(l), "ffn_up"))?;
            silu_mul(gate, up, act).map_err(op(Some(l), "silu_mul"))?;
            mm.input(act, n, qa)
                .map_err(op(Some(l), "silu_mul quantize"))?;
            mm.run(&ly.ffn_down, act, n, qa, o)
                .map_err(op(Some(l), "ffn_down"))?;
            add_inplace(x, o).map_err(op(Some(l), "ffn residual"))?;
        }

        // The wanted rows, packed into `xn`, normalized and projected onto the vocabulary.
        let mut m = 0;
        for (i, _) in want.iter().enumerate().filter(|(_, &w)| w) {
            xn[m * e..(m + 1) * e].copy_from_slice(&x[i * e..(i + 1) * e]);
            m += 1;
        }
        if m == 0 {
            return Ok(());
        }
        let xo = &mut xn[..m * e];
        rmsnorm_inplace(isa, xo, &w.output_norm, eps).map_err(op(None, "output_norm"))?;
        mm.input(xo, m, qa)
            .map_err(op(None, "output_norm quantize"))?;
        let nv = hp.n_vocab;
        mm.run(&w.output, xo, m, qa, &mut logits[row * nv..(row + m) * nv])
            .map_err(op(None, "output"))?;
        Ok(())
    }
}

/// The linear layers of one pass: [`Matmul::input`] once per input (it quantizes it for
/// [`Activations::Q8`]), then [`Matmul::run`] for each weight that reads it.
struct Matmul {
    isa: Isa,
    threads: usize,
    activations: Activations,
}

impl Matmul {
    /// Prepares the `n` rows of `x` in `a`, reusing its buffers (no allocation once they
    /// have held the widest input).
    fn input(&self, x: &[f32], n: usize, a: &mut Q8Act) -> Result<(), ShapeError> {
        if self.activations == Activations::F32 {
            return Ok(());
        }
        a.q.resize(x.len(), 0);
        a.d.resize(x.len() / QK, 0.0);
        (a.rows, a.k) = (n, x.len() / n.max(1));
        quantize_into(self.isa, x, &mut a.q, &mut a.d)
    }

    /// `y = W . x` for the input last prepared: `x` itself in f32, `a` quantized.
    fn run(
        &self,
        w: &Q8Matrix,
        x: &[f32],
        n: usize,
        a: &Q8Act,
        y: &mut [f32],
    ) -> Result<(), ShapeError> {
        match self.activations {
            Activations::Q8 => gemm(self.isa, self.threads, w, a, y),
            Activations::F32 => gemv(self.isa, self.threads, w, x, n, y),
        }
    }
}

/// Maps a kernel's error to one naming the tensor or op (`blk.3.attn_q`).
fn op<E: std::fmt::Display>(
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    op_on("", layer, what)
}

/// [`op`] with a device prefix (`cuda blk.3.attn_q`).
pub(super) fn op_on<E: std::fmt::Display>(
    device: &'static str,
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    move |e| NativeError::Kernel {
        what: match layer {
            Some(l) => format!("{device}blk.{l}.{what}"),
            None => format!("{device}{what}"),
        },
        why: e.to_string(),
    }
}
