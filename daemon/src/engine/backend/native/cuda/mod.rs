//! The forward pass on a CUDA GPU: the same pass as [`super::cpu::CpuPass`], op for op, on
//! `inferloop-kernels`' CUDA kernels, which give their twins' bits. Weights are copied to
//! GPU memory once ([`memory`]), the KV cache lives there ([`DeviceKv`]), and each pass
//! uploads its tokens and positions and downloads only the logits rows asked for.
//!
//! On a Jetson, GPU memory is the same DRAM as the CPU's: the ledger counts the copy as
//! device memory, and the file's pages, read once to upload, can be dropped by the kernel.

mod kv;
mod memory;

use inferloop_kernels::cpu::attention::CHUNK;
use inferloop_kernels::cuda::cudarc::driver::CudaSlice;
use inferloop_kernels::cuda::{ops, q8 as gq8, Gpu};
use inferloop_kernels::q8::QK;

use super::batch::{Activations, BatchToken};
use super::error::NativeError;
use super::hparams::HParams;
use super::kv::{Kv, KvCache};
use super::pass::{check_micro_batch, check_open, Pass};
use super::weights::Weights;
use memory::{alloc_scratch, attn_shape, op, upload_weights, DevQ8, DevScratch, DevWeights};

pub use kv::DeviceKv;

/// The CUDA pass: the GPU, the weights and scratch in its memory, and the KV cache there.
pub struct CudaPass {
    gpu: Gpu,
    hp: HParams,
    w: DevWeights,
    s: DevScratch,
    kv: KvCache<DeviceKv>,
    /// Bytes of GPU memory the weights and scratch take (the KV cache is counted apart).
    bytes: usize,
}

impl CudaPass {
    /// Uploads `weights` (loaded for `hp`) to `gpu` and allocates the pass's scratch and a
    /// KV cache of `n_seq` sequences × `n_ctx` cells there.
    pub fn new(
        gpu: Gpu,
        hp: &HParams,
        weights: &Weights<'_>,
        n_seq: usize,
        n_ctx: usize,
    ) -> Result<Self, NativeError> {
        check_open(hp, weights, n_seq, n_ctx)?;
        let st = gpu.stream.clone();
        let (w, weight_bytes) = upload_weights(&st, weights)?;
        let (s, scratch_bytes) = alloc_scratch(&st, hp, n_ctx)?;
        let cells = DeviceKv::new(&st, hp.n_layer, n_seq, n_ctx, hp.kv_dim())?;
        st.synchronize().map_err(op(None, "upload"))?;
        Ok(Self {
            gpu,
            hp: hp.clone(),
            w,
            s,
            kv: KvCache::new(hp.n_layer, n_seq, n_ctx, hp.kv_dim(), cells),
            bytes: weight_bytes + scratch_bytes,
        })
    }
}

impl Pass for CudaPass {
    fn run(
        &mut self,
        toks: &[BatchToken],
        want: &[bool],
        logits: &mut [f32],
    ) -> Result<(), NativeError> {
        check_micro_batch(toks, want)?;
        let Self {
            gpu, w, s, hp, kv, ..
        } = self;
        let n_ctx = kv.n_ctx();
        let g = &*gpu;
        let st = g.stream.clone();
        let n = toks.len();
        let (e, qd, kvd, ff, eps) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff, hp.rms_eps);
        let host = |f: &dyn Fn(&BatchToken) -> usize| -> Vec<i32> {
            toks.iter().map(|t| f(t) as i32).collect()
        };
        let upload = |src: Vec<i32>, dst: &mut CudaSlice<i32>| {
            st.memcpy_htod(&src, &mut dst.slice_mut(..n))
                .map_err(op(None, "upload batch"))
        };
        upload(host(&|t| t.token as usize), &mut s.tokens)?;
        upload(host(&|t| t.pos as usize), &mut s.pos)?;
        upload(host(&|t| t.seq * n_ctx + t.pos as usize), &mut s.cells)?;
        upload(host(&|t| t.pos as usize + 1), &mut s.kv_len)?;

        let rope_q = hp.rope(hp.n_head);
        let rope_k = hp.rope(hp.n_head_kv);
        let shape = attn_shape(hp, n_ctx);
        let stride = n_ctx * kvd;
        let cells = kv.cells_mut();

        ops::embed(
            g,
            &w.token_embd.bytes,
            hp.n_vocab,
            e,
            &s.tokens.slice(..n),
            &mut s.x.slice_mut(..n * e),
        )
        .map_err(op(None, "token_embd"))?;
        for (l, ly) in w.layers.iter().enumerate() {
            let le = Some(l);
            ops::rmsnorm(
                g,
                &s.x.slice(..n * e),
                &ly.attn_norm,
                eps,
                &mut s.xn.slice_mut(..n * e),
            )
            .map_err(op(le, "attn_norm"))?;
            quantize(g, &s.xn, n * e, &mut s.qa_q, &mut s.qa_d).map_err(op(le, "quantize"))?;
            for (m, y, b, width, name) in [
                (&ly.wq, &mut s.q, &ly.bq, qd, "attn_q"),
                (&ly.wk, &mut s.k, &ly.bk, kvd, "attn_k"),
                (&ly.wv, &mut s.v, &ly.bv, kvd, "attn_v"),
            ] {
                matmul(g, m, n, &s.qa_q, &s.qa_d, y).map_err(op(le, name))?;
                if let Some(b) = b {
                    for r in 0..n {
                        ops::add_inplace(g, &mut y.slice_mut(r * width..(r + 1) * width), b)
                            .map_err(op(le, "bias"))?;
                    }
                }
            }
            ops::rope_inplace(g, &rope_q, &mut s.q.slice_mut(..n * qd), &s.pos.slice(..n))
                .map_err(op(le, "rope q"))?;
            ops::rope_inplace(g, &rope_k, &mut s.k.slice_mut(..n * kvd), &s.pos.slice(..n))
                .map_err(op(le, "rope k"))?;
            ops::kv_store_f16(
                g,
                &s.k.slice(..n * kvd),
                kvd,
                &s.cells.slice(..n),
                &mut cells.k[l],
            )
            .map_err(op(le, "kv store k"))?;
            ops::kv_store_f16(
                g,
                &s.v.slice(..n * kvd),
                kvd,
                &s.cells.slice(..n),
                &mut cells.v[l],
            )
            .map_err(op(le, "kv store v"))?;
            for (i, t) in toks.iter().enumerate() {
                let cache = t.seq * stride..(t.seq + 1) * stride;
                ops::attention_decode(
                    g,
                    &shape,
                    &s.q.slice(i * qd..(i + 1) * qd),
                    &cells.k[l].slice(cache.clone()),
                    &cells.v[l].slice(cache),
                    &s.kv_len.slice(i..i + 1),
                    t.pos as usize + 1,
                    CHUNK,
                    &mut s.attn_ws,
                    &mut s.attn.slice_mut(i * qd..(i + 1) * qd),
                )
                .map_err(op(le, "attention"))?;
            }
            quantize(g, &s.attn, n * qd, &mut s.qa_q, &mut s.qa_d).map_err(op(le, "quantize"))?;
            matmul(g, &ly.wo, n, &s.qa_q, &s.qa_d, &mut s.o).map_err(op(le, "attn_output"))?;
            ops::add_inplace(g, &mut s.x.slice_mut(..n * e), &s.o.slice(..n * e))
                .map_err(op(le, "attention residual"))?;

            ops::rmsnorm(
                g,
                &s.x.slice(..n * e),
                &ly.ffn_norm,
                eps,
                &mut s.xn.slice_mut(..n * e),
            )
            .map_err(op(le, "ffn_norm"))?;
            quantize(g, &s.xn, n * e, &mut s.qa_q, &mut s.qa_d).map_err(op(le, "quantize"))?;
            matmul(g, &ly.ffn_gate, n, &s.qa_q, &s.qa_d, &mut s.gate)
                .map_err(op(le, "ffn_gate"))?;
            matmul(g, &ly.ffn_up, n, &s.qa_q, &s.qa_d, &mut s.up).map_err(op(le, "ffn_up"))?;
            ops::silu_mul_inplace(g, &mut s.gate.slice_mut(..n * ff), &s.up.slice(..n * ff))
                .map_err(op(le, "silu_mul"))?;
            quantize(g, &s.gate, n * ff, &mut s.qa_q, &mut s.qa_d).map_err(op(le, "quantize"))?;
            matmul(g, &ly.ffn_down, n, &s.qa_q, &s.qa_d, &mut s.o).map_err(op(le, "ffn_down"))?;
            ops::add_inplace(g, &mut s.x.slice_mut(..n * e), &s.o.slice(..n * e))
                .map_err(op(le, "ffn residual"))?;
        }

        // The wanted rows, packed into `xn`, normalized and projected onto the vocabulary.
        let mut m = 0;
        for (i, _) in want.iter().enumerate().filter(|(_, &w)| w) {
            st.memcpy_dtod(
                &s.x.slice(i * e..(i + 1) * e),
                &mut s.xn.slice_mut(m * e..(m + 1) * e),
            )
            .map_err(op(None, "pack rows"))?;
            m += 1;
        }
        if m == 0 {
            st.synchronize().map_err(op(None, "sync"))?;
            kv.hold(toks);
            return Ok(());
        }
        ops::rmsnorm_inplace(g, &mut s.xn.slice_mut(..m * e), &w.output_norm, eps)
            .map_err(op(None, "output_norm"))?;
        quantize(g, &s.xn, m * e, &mut s.qa_q, &mut s.qa_d).map_err(op(None, "quantize"))?;
        let output = w.output.as_ref().unwrap_or(&w.token_embd);
        let nv = hp.n_vocab;
        matmul(g, output, m, &s.qa_q, &s.qa_d, &mut s.logits).map_err(op(None, "output"))?;
        st.memcpy_dtoh(&s.logits.slice(..m * nv), &mut logits[..m * nv])
            .map_err(op(None, "download logits"))?;
        st.synchronize().map_err(op(None, "sync"))?;
        kv.hold(toks);
        Ok(())
    }

    fn kv(&self) -> &dyn Kv {
        &self.kv
    }

    fn kv_mut(&mut self) -> &mut dyn Kv {
        &mut self.kv
    }

    fn set_activations(&mut self, activations: Activations) -> Result<(), NativeError> {
        match activations {
            Activations::Q8 => Ok(()),
            Activations::F32 => Err(NativeError::Unsupported(
                "the CUDA pass multiplies Q8 activations only (--activations q8)".into(),
            )),
        }
    }

    fn gpu(&self) -> Option<(&str, usize)> {
        Some((&self.gpu.name, self.bytes))
    }
}

/// Quantizes the first `len` values of `x` into the first blocks of `q` / `d`.
fn quantize(
    g: &Gpu,
    x: &CudaSlice<f32>,
    len: usize,
    q: &mut CudaSlice<i8>,
    d: &mut CudaSlice<f32>,
) -> Result<(), gq8::Q8Error> {
    gq8::quantize_into(
        g,
        &x.slice(..len),
        &mut q.slice_mut(..len),
        &mut d.slice_mut(..len / QK),
    )
}

/// `y = W . x` for the `n` rows last quantized into `q` / `d`: the decode GEMV up to
/// [`gq8::GEMV_MAX_COLS`] rows (the CPU pass's choice too), else the int8 GEMM.
fn matmul(
    g: &Gpu,
    m: &DevQ8,
    n: usize,
    q: &CudaSlice<i8>,
    d: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), gq8::Q8Error> {
    let (q, d) = (q.slice(..n * m.k), d.slice(..n * m.k / QK));
    let mut y = y.slice_mut(..n * m.rows);
    if (1..=gq8::GEMV_MAX_COLS).contains(&n) {
        return gq8::gemv_q8_into(g, &m.bytes, m.rows, m.k, &q, &d, n, None, false, &mut y);
    }
    gq8::gemm_parts(g, &m.bytes, m.rows, m.k, &q, &d, n, &mut y)
}
