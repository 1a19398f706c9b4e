//! The CUDA pass's GPU memory besides the KV cache: the weights, copied once (Q8_0 bytes
//! as they lie in the file), and one micro-batch's scratch; and the naming of a GPU error.

use std::sync::Arc;

use inferloop_kernels::cpu::attention::{AttnShape, CHUNK};
use inferloop_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream};
use inferloop_kernels::q8::{Q8Matrix, QK};

use super::super::batch::{op_on, UBATCH};
use super::super::error::NativeError;
use super::super::hparams::HParams;
use super::super::weights::Weights;

/// A Q8_0 matrix in GPU memory, its bytes as in the file.
pub(super) struct DevQ8 {
    pub(super) bytes: CudaSlice<u8>,
    pub(super) rows: usize,
    pub(super) k: usize,
}

pub(super) struct DevLayer {
    pub(super) attn_norm: CudaSlice<f32>,
    pub(super) wq: DevQ8,
    pub(super) wk: DevQ8,
    pub(super) wv: DevQ8,
    pub(super) bq: Option<CudaSlice<f32>>,
    pub(super) bk: Option<CudaSlice<f32>>,
    pub(super) bv: Option<CudaSlice<f32>>,
    pub(super) wo: DevQ8,
    pub(super) ffn_norm: CudaSlice<f32>,
    pub(super) ffn_gate: DevQ8,
    pub(super) ffn_up: DevQ8,
    pub(super) ffn_down: DevQ8,
}

pub(super) struct DevWeights {
    pub(super) token_embd: DevQ8,
    pub(super) layers: Vec<DevLayer>,
    pub(super) output_norm: CudaSlice<f32>,
    /// `None` when the output projection is the embedding (tied).
    pub(super) output: Option<DevQ8>,
}

/// One pass's activations in GPU memory, [`UBATCH`] rows of each width.
pub(super) struct DevScratch {
    pub(super) x: CudaSlice<f32>,
    pub(super) xn: CudaSlice<f32>,
    pub(super) q: CudaSlice<f32>,
    pub(super) k: CudaSlice<f32>,
    pub(super) v: CudaSlice<f32>,
    pub(super) attn: CudaSlice<f32>,
    pub(super) o: CudaSlice<f32>,
    pub(super) gate: CudaSlice<f32>,
    pub(super) up: CudaSlice<f32>,
    /// The quantized matmul input: quants and block scales, sized for the widest input.
    pub(super) qa_q: CudaSlice<i8>,
    pub(super) qa_d: CudaSlice<f32>,
    pub(super) tokens: CudaSlice<i32>,
    pub(super) pos: CudaSlice<i32>,
    /// Per token, its KV cell (`seq * n_ctx + pos`) and its attention length (`pos + 1`).
    pub(super) cells: CudaSlice<i32>,
    pub(super) kv_len: CudaSlice<i32>,
    pub(super) attn_ws: CudaSlice<f32>,
    pub(super) logits: CudaSlice<f32>,
}

/// Copies `weights` to GPU memory on `st`; returns them and the bytes they take.
pub(super) fn upload_weights(
    st: &Arc<CudaStream>,
    weights: &Weights<'_>,
) -> Result<(DevWeights, usize), NativeError> {
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
    Ok((w, bytes + matrices))
}

/// One pass's scratch on `st` for a cache of `n_ctx` positions; returns it and the bytes
/// it takes.
pub(super) fn alloc_scratch(
    st: &Arc<CudaStream>,
    hp: &HParams,
    n_ctx: usize,
) -> Result<(DevScratch, usize), NativeError> {
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
        * (UBATCH * (3 * hp.n_embd + 2 * hp.q_dim() + 2 * hp.kv_dim() + 2 * hp.n_ff + hp.n_vocab)
            + UBATCH * widest / QK
            + 4 * UBATCH
            + ws)
        + UBATCH * widest;
    Ok((s, scratch))
}

/// Maps a GPU error to one naming the tensor or op (`cuda blk.3.attn_q`).
pub(super) fn op<E: std::fmt::Display>(
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    op_on("cuda ", layer, what)
}

/// The attention kernel's shape for one sequence of a cache of `n_ctx` positions.
pub(super) fn attn_shape(hp: &HParams, n_ctx: usize) -> AttnShape {
    AttnShape {
        n_seq: 1,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        n_ctx,
    }
}
