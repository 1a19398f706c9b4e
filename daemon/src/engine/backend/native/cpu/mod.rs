//! The forward pass on the CPU: `inferloop-kernels`' CPU twins over weights borrowed from
//! the file, with the KV cache in host memory ([`HostKv`]).
//!
//! By default ([`Activations::Q8`]) every linear layer quantizes its input to 8-bit blocks
//! and runs the Q8_0 GEMM, as llama.cpp's CPU matmuls do for Q8_0 weights (same rounding,
//! f16 block scales included), so the golden check compares like with like;
//! [`Activations::F32`] runs the GEMV on f32 inputs instead, which equals llama.cpp reading
//! the same weights dequantized to f32.

mod kv;
mod scratch;

use inferloop_kernels::cpu::attention::{attention_decode, AttnShape, CHUNK};
use inferloop_kernels::cpu::elementwise::{add_inplace, silu_mul};
use inferloop_kernels::cpu::embed::embed;
use inferloop_kernels::cpu::rmsnorm::{rmsnorm, rmsnorm_inplace};
use inferloop_kernels::cpu::rope::{rope_inplace, Rope};
use inferloop_kernels::cpu::simd::Isa;

use super::batch::{op_on, Activations, BatchToken};
use super::error::NativeError;
use super::hparams::HParams;
use super::kv::{Kv, KvCache};
use super::pass::{check_micro_batch, check_open, Pass};
use super::weights::Weights;
use scratch::{Matmul, Scratch};

pub use kv::HostKv;

/// The CPU pass: the weights it reads, its KV cache and one micro-batch's scratch.
pub struct CpuPass<'a> {
    hp: HParams,
    w: Weights<'a>,
    kv: KvCache<HostKv>,
    isa: Isa,
    threads: usize,
    activations: Activations,
    s: Scratch,
}

impl<'a> CpuPass<'a> {
    /// A pass over `weights` (loaded for `hp`) with a KV cache of `n_seq` sequences of
    /// `n_ctx` positions each; matmuls split over `threads` threads.
    pub fn new(
        hp: HParams,
        weights: Weights<'a>,
        n_seq: usize,
        n_ctx: usize,
        threads: usize,
    ) -> Result<Self, NativeError> {
        check_open(&hp, &weights, n_seq, n_ctx)?;
        let cells = HostKv::new(hp.n_layer, n_seq, n_ctx, hp.kv_dim());
        Ok(Self {
            kv: KvCache::new(hp.n_layer, n_seq, n_ctx, hp.kv_dim(), cells),
            s: Scratch::new(&hp),
            isa: Isa::detect(),
            threads: threads.max(1),
            activations: Activations::default(),
            w: weights,
            hp,
        })
    }

    /// The vector instructions the twins run (detected at creation). Every ISA gives the
    /// same bits; this is for tests and benchmarks.
    pub fn set_isa(&mut self, isa: Isa) {
        self.isa = isa;
    }

    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }
}

impl CpuPass<'_> {
    /// Every layer over `toks`: their K and V stored, their residuals left in `s.x`.
    fn layers(&mut self, toks: &[BatchToken]) -> Result<(), NativeError> {
        let Self {
            hp,
            w,
            kv,
            isa,
            threads,
            activations,
            s,
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
        let cells = kv.cells_mut();

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
                cells.write(l, t.seq, t.pos as usize, &k[r.clone()], &v[r]);
            }
            for (i, t) in toks.iter().enumerate() {
                let (kc, vc) = cells.seq_layer(l, t.seq);
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
        Ok(())
    }
}

impl Pass for CpuPass<'_> {
    fn run(
        &mut self,
        toks: &[BatchToken],
        want: &[bool],
        logits: &mut [f32],
    ) -> Result<(), NativeError> {
        check_micro_batch(toks, want)?;
        self.layers(toks)?;
        let Self {
            hp,
            w,
            kv,
            isa,
            threads,
            activations,
            s,
        } = self;
        let (isa, threads, e, eps) = (*isa, *threads, hp.n_embd, hp.rms_eps);
        let mm = Matmul {
            isa,
            threads,
            activations: *activations,
        };
        let (x, xn, qa) = (&s.x, &mut s.xn, &mut s.qa);

        // The wanted rows, packed into `xn`, normalized and projected onto the vocabulary.
        let mut m = 0;
        for (i, _) in want.iter().enumerate().filter(|(_, &w)| w) {
            xn[m * e..(m + 1) * e].copy_from_slice(&x[i * e..(i + 1) * e]);
            m += 1;
        }
        if m == 0 {
            kv.hold(toks);
            return Ok(());
        }
        let xo = &mut xn[..m * e];
        rmsnorm_inplace(isa, xo, &w.output_norm, eps).map_err(op(None, "output_norm"))?;
        mm.input(xo, m, qa)
            .map_err(op(None, "output_norm quantize"))?;
        let nv = hp.n_vocab;
        mm.run(&w.output, xo, m, qa, &mut logits[..m * nv])
            .map_err(op(None, "output"))?;
        kv.hold(toks);
        Ok(())
    }

    fn run_hidden(&mut self, toks: &[BatchToken], hidden: &mut [f32]) -> Result<(), NativeError> {
        check_micro_batch(toks, &vec![false; toks.len()])?;
        let (n, e) = (toks.len(), self.hp.n_embd);
        if hidden.len() < n * e {
            return Err(NativeError::Batch {
                index: 0,
                why: format!("{} hidden floats for {n} rows of {e}", hidden.len()),
            });
        }
        self.layers(toks)?;
        let out = &mut hidden[..n * e];
        out.copy_from_slice(&self.s.x[..n * e]);
        rmsnorm_inplace(self.isa, out, &self.w.output_norm, self.hp.rms_eps)
            .map_err(op(None, "output_norm"))?;
        self.kv.hold(toks);
        Ok(())
    }

    fn kv(&self) -> &dyn Kv {
        &self.kv
    }

    fn kv_mut(&mut self) -> &mut dyn Kv {
        &mut self.kv
    }

    fn set_activations(&mut self, activations: Activations) -> Result<(), NativeError> {
        self.activations = activations;
        Ok(())
    }

    fn activations(&self) -> Activations {
        self.activations
    }

    fn gpu(&self) -> Option<(&str, usize)> {
        None
    }
}

/// Maps a kernel's error to one naming the tensor or op (`blk.3.attn_q`).
fn op<E: std::fmt::Display>(
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    op_on("", layer, what)
}
