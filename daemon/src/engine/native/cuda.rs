//! The forward pass on a CUDA GPU: the same pass as the CPU one in [`super::forward`], op
//! for op, on `inferloop-kernels`' CUDA kernels, which give their twins' bits. Weights are
//! copied to GPU memory once (Q8_0 bytes as they lie in the file), the KV cache lives there
//! ([`DeviceKv`]), and each pass uploads its tokens and positions and downloads only the
//! logits rows asked for.
//!
//! On a Jetson, GPU memory is the same DRAM as the CPU's: the ledger counts the copy as
//! device memory, and the file's pages, read once to upload, can be dropped by the kernel.

use std::sync::Arc;

use inferloop_kernels::cpu::attention::{AttnShape, CHUNK};
use inferloop_kernels::cuda::cudarc::driver::{
    result, CudaSlice, CudaStream, DevicePtrMut, DriverError,
};
use inferloop_kernels::cuda::{ops, q8 as gq8, Gpu};
use inferloop_kernels::q8::{Q8Matrix, QK};

use super::forward::UBATCH;
use super::hparams::HParams;
use super::sampling::argmax;
use super::weights::Weights;
use super::{BatchToken, NativeError};

/// A Q8_0 matrix in GPU memory, its bytes as in the file.
struct DevQ8 {
    bytes: CudaSlice<u8>,
    rows: usize,
    k: usize,
}

struct DevLayer {
    attn_norm: CudaSlice<f32>,
    wq: DevQ8,
    wk: DevQ8,
    wv: DevQ8,
    bq: Option<CudaSlice<f32>>,
    bk: Option<CudaSlice<f32>>,
    bv: Option<CudaSlice<f32>>,
    wo: DevQ8,
    ffn_norm: CudaSlice<f32>,
    ffn_gate: DevQ8,
    ffn_up: DevQ8,
    ffn_down: DevQ8,
}

struct DevWeights {
    token_embd: DevQ8,
    layers: Vec<DevLayer>,
    output_norm: CudaSlice<f32>,
    /// `None` when the output projection is the embedding (tied).
    output: Option<DevQ8>,
}

/// One pass's activations in GPU memory, [`UBATCH`] rows of each width.
struct DevScratch {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    /// The quantized matmul input: quants and block scales, sized for the widest input.
    qa_q: CudaSlice<i8>,
    qa_d: CudaSlice<f32>,
    tokens: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    /// Per token, its KV cell (`seq * n_ctx + pos`) and its attention length (`pos + 1`).
    cells: CudaSlice<i32>,
    kv_len: CudaSlice<i32>,
    attn_ws: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

/// The KV cache's cells in GPU memory: per layer, K and V as f16 bits,
/// `[n_seq][n_ctx][kv_dim]` (the attention kernel's layout for one sequence at a time).
pub struct DeviceKv {
    stream: Arc<CudaStream>,
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

impl DeviceKv {
    /// Copies `n` values from offset `src` to offset `dst` in every layer's K and V.
    pub(super) fn copy(&mut self, src: usize, dst: usize, n: usize) -> Result<(), NativeError> {
        let bytes = n * std::mem::size_of::<u16>();
        let off = |i: usize| (i * std::mem::size_of::<u16>()) as u64;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            if src + n > buf.len() || dst + n > buf.len() {
                return Err(NativeError::Kv(format!(
                    "copy of {n} values from {src} to {dst} outside a layer of {}",
                    buf.len()
                )));
            }
            let (base, _guard) = buf.device_ptr_mut(&self.stream);
            // SAFETY: both ranges lie inside this layer's buffer (checked above); they are
            // different sequences' cells, so they do not overlap.
            unsafe {
                result::memcpy_dtod_async(
                    base + off(dst),
                    base + off(src),
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(kv_err)?;
        }
        self.stream.synchronize().map_err(kv_err)
    }
}

fn kv_err(e: DriverError) -> NativeError {
    NativeError::Kv(format!("CUDA: {e}"))
}

/// Everything the CUDA pass needs besides the KV cache.
pub struct CudaExec {
    gpu: Gpu,
    w: DevWeights,
    s: DevScratch,
    /// Bytes of GPU memory the weights and scratch take (the KV cache is counted apart).
    bytes: usize,
}

/// Maps a GPU error to one naming the tensor or op (`cuda blk.3.attn_q`).
fn op<E: std::fmt::Display>(
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    super::forward::op_on("cuda ", layer, what)
}

impl CudaExec {
    /// Uploads `weights` to `gpu` and allocates the pass's scratch and a KV cache of
    /// `n_seq` sequences × `n_ctx` cells there.
    pub fn new(
        gpu: Gpu,
        hp: &HParams,
        weights: &Weights<'_>,
        n_seq: usize,
        n_ctx: usize,
    ) -> Result<(Self, DeviceKv), NativeError> {
        let st = gpu.stream.clone();
        let mut bytes = 0usize;
        let mut up_f32 = |v: &[f32], what: &'static str| {
            bytes += std::mem::size_of_val(v);
            st.clone_htod(v).map_err(op(None, what))
        };
        let mut matrices = 0usize;
        let mut up_q8 = |m: &Q8Matrix<'_>, what: &'static str| -> Result<DevQ8, NativeError> {
            matrices += m.bytes.len();
            Ok(DevQ8 {
                bytes: st.clone_htod(m.bytes).map_err(op(None, what))?,
                rows: m.rows,
                k: m.k,
            })
        };
        let token_embd = up_q8(&weights.token_embd, "upload token_embd")?;
        let output = if weights.tied_output {
            None
        } else {
            Some(up_q8(&weights.output, "upload output")?)
        };
        let mut layers = Vec::with_capacity(weights.layers.len());
        for ly in &weights.layers {
            layers.push(DevLayer {
                attn_norm: up_f32(&ly.attn_norm, "upload attn_norm")?,
                wq: up_q8(&ly.wq, "upload attn_q")?,
                wk: up_q8(&ly.wk, "upload attn_k")?,
                wv: up_q8(&ly.wv, "upload attn_v")?,
                bq: ly
                    .bq
                    .as_deref()
                    .map(|b| up_f32(b, "upload attn_q.bias"))
                    .transpose()?,
                bk: ly
                    .bk
                    .as_deref()
                    .map(|b| up_f32(b, "upload attn_k.bias"))
                    .transpose()?,
                bv: ly
                    .bv
                    .as_deref()
                    .map(|b| up_f32(b, "upload attn_v.bias"))
                    .transpose()?,
                wo: up_q8(&ly.wo, "upload attn_output")?,
                ffn_norm: up_f32(&ly.ffn_norm, "upload ffn_norm")?,
                ffn_gate: up_q8(&ly.ffn_gate, "upload ffn_gate")?,
                ffn_up: up_q8(&ly.ffn_up, "upload ffn_up")?,
                ffn_down: up_q8(&ly.ffn_down, "upload ffn_down")?,
            });
        }
        let output_norm = up_f32(&weights.output_norm, "upload output_norm")?;
        let w = DevWeights {
            token_embd,
            layers,
            output_norm,
            output,
        };
        let widest = hp.n_ff.max(hp.n_embd).max(hp.q_dim());
        let shape = attn_shape(hp, n_ctx);
        let ws = shape.workspace_len(AttnShape::chunks(n_ctx, CHUNK).max(1) * CHUNK, CHUNK);
        let f32s = |n: usize| st.alloc_zeros::<f32>(n).map_err(op(None, "scratch"));
        let i32s = |n: usize| st.alloc_zeros::<i32>(n).map_err(op(None, "scratch"));
        let s = DevScratch {
            x: f32s(UBATCH * hp.n_embd)?,
            xn: f32s(UBATCH * hp.n_embd)?,
            q: f32s(UBATCH * hp.q_dim())?,
            k: f32s(UBATCH * hp.kv_dim())?,
            v: f32s(UBATCH * hp.kv_dim())?,
            attn: f32s(UBATCH * hp.q_dim())?,
            o: f32s(UBATCH * hp.n_embd)?,
            gate: f32s(UBATCH * hp.n_ff)?,
            up: f32s(UBATCH * hp.n_ff)?,
            qa_q: st
                .alloc_zeros::<i8>(UBATCH * widest)
                .map_err(op(None, "scratch"))?,
            qa_d: f32s(UBATCH * widest / QK)?,
            tokens: i32s(UBATCH)?,
            pos: i32s(UBATCH)?,
            cells: i32s(UBATCH)?,
            kv_len: i32s(UBATCH)?,
            attn_ws: f32s(ws)?,
            logits: f32s(UBATCH * hp.n_vocab)?,
        };
        let scratch = 4
            * (UBATCH
                * (3 * hp.n_embd + 2 * hp.q_dim() + 2 * hp.kv_dim() + 2 * hp.n_ff + hp.n_vocab)
                + UBATCH * widest / QK
                + 4 * UBATCH
                + ws)
            + UBATCH * widest;
        let cells = n_seq * n_ctx * hp.kv_dim();
        let cache = |what| {
            (0..hp.n_layer)
                .map(|_| st.alloc_zeros::<u16>(cells).map_err(op(None, what)))
                .collect::<Result<Vec<_>, _>>()
        };
        let kv = DeviceKv {
            stream: st.clone(),
            k: cache("KV cache")?,
            v: cache("KV cache")?,
        };
        st.synchronize().map_err(op(None, "upload"))?;
        Ok((
            Self {
                gpu,
                w,
                s,
                bytes: bytes + matrices + scratch,
            },
            kv,
        ))
    }

    /// GPU memory the weights and scratch take, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device's name, e.g. `Orin (nvgpu)`.
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// One pass of at most [`UBATCH`] tokens: the logits of the wanted ones into `logits`
    /// (one `n_vocab` row each, in order).
    pub(super) fn pass(
        &mut self,
        hp: &HParams,
        kv: &mut DeviceKv,
        n_ctx: usize,
        toks: &[BatchToken],
        want: &[bool],
        logits: &mut [f32],
    ) -> Result<(), NativeError> {
        let Self { gpu, w, s, .. } = self;
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
                &mut kv.k[l],
            )
            .map_err(op(le, "kv store k"))?;
            ops::kv_store_f16(
                g,
                &s.v.slice(..n * kvd),
                kvd,
                &s.cells.slice(..n),
                &mut kv.v[l],
            )
            .map_err(op(le, "kv store v"))?;
            for (i, t) in toks.iter().enumerate() {
                let cache = t.seq * stride..(t.seq + 1) * stride;
                ops::attention_decode(
                    g,
                    &shape,
                    &s.q.slice(i * qd..(i + 1) * qd),
                    &kv.k[l].slice(cache.clone()),
                    &kv.v[l].slice(cache),
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
            return st.synchronize().map_err(op(None, "sync"));
        }
        ops::rmsnorm_inplace(g, &mut s.xn.slice_mut(..m * e), &w.output_norm, eps)
            .map_err(op(None, "output_norm"))?;
        quantize(g, &s.xn, m * e, &mut s.qa_q, &mut s.qa_d).map_err(op(None, "quantize"))?;
        let output = w.output.as_ref().unwrap_or(&w.token_embd);
        let nv = hp.n_vocab;
        matmul(g, output, m, &s.qa_q, &s.qa_d, &mut s.logits).map_err(op(None, "output"))?;
        st.memcpy_dtoh(&s.logits.slice(..m * nv), &mut logits[..m * nv])
            .map_err(op(None, "download logits"))?;
        st.synchronize().map_err(op(None, "sync"))
    }
}

fn attn_shape(hp: &HParams, n_ctx: usize) -> AttnShape {
    AttnShape {
        n_seq: 1,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        n_ctx,
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

/// `y = W . x` for the `n` rows last quantized into `q` / `d` (the int8 GEMM).
fn matmul(
    g: &Gpu,
    m: &DevQ8,
    n: usize,
    q: &CudaSlice<i8>,
    d: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), gq8::Q8Error> {
    gq8::gemm_parts(
        g,
        &m.bytes,
        m.rows,
        m.k,
        &q.slice(..n * m.k),
        &d.slice(..n * m.k / QK),
        n,
        &mut y.slice_mut(..n * m.rows),
    )
}

/// Feeds the same tokens to `model` (on the GPU) and `twin` (on the CPU) and compares the
/// logits: every row's top token must agree and no logit may differ by more than
/// [`CHECK_TOLERANCE`]. Returns the largest difference; `model`'s sequence 0 is left empty.
pub fn check_against_twin(
    model: &mut super::Model<'_>,
    twin: &mut super::Model<'_>,
) -> Result<f32, NativeError> {
    let n_vocab = model.hparams().n_vocab;
    let n = model.kv().n_ctx().min(twin.kv().n_ctx()).min(6) as u32;
    let batch: Vec<BatchToken> = (0..n)
        .map(|pos| BatchToken {
            seq: 0,
            token: ((pos as usize * 7919 + 1) % n_vocab) as i32,
            pos,
        })
        .collect();
    let want = vec![true; batch.len()];
    let gpu = model.forward(&batch, &want)?.to_vec();
    model.kv_mut().clear(0)?;
    let cpu = twin.forward(&batch, &want)?;
    let mut worst = 0f32;
    for (row, (g, c)) in gpu.chunks(n_vocab).zip(cpu.chunks(n_vocab)).enumerate() {
        let diff = g
            .iter()
            .zip(c)
            .map(|(a, b)| (a - b).abs())
            .fold(
                0f32,
                |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
            );
        worst = worst.max(diff);
        if argmax(g) != argmax(c) || diff > CHECK_TOLERANCE {
            return Err(NativeError::Kernel {
                what: "cuda self-check".into(),
                why: format!(
                    "position {row}: the GPU's logits differ from the CPU twins' (top token {} \
                     vs {}, largest difference {diff}); refusing to serve on this GPU",
                    argmax(g),
                    argmax(c)
                ),
            });
        }
    }
    Ok(worst)
}

/// The largest logit difference the self-check accepts. The kernels give their twins'
/// bits, so any difference is a fault; this only leaves room for a driver that contracts
/// differently, not for a wrong kernel.
pub const CHECK_TOLERANCE: f32 = 1e-2;
