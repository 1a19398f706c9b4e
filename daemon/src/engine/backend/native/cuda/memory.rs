//! The CUDA pass's GPU memory besides the KV cache: the weights, copied once (Q8_0 bytes
//! as they lie in the file, Q|K|V and gate|up each joined into one matrix), and one
//! micro-batch's scratch; and the naming of a GPU error.

use std::sync::Arc;

use inferloop_kernels::cpu::attention::{AttnShape, CHUNK};
use inferloop_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use inferloop_kernels::cuda::layer;
use inferloop_kernels::q8::{device_layout, Q8Matrix, QK};

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
    /// `attn_q`, `attn_k` and `attn_v` as one matrix, their rows one after the other: each
    /// row's dot product is the one it had alone, and one launch reads all three.
    pub(super) wqkv: DevQ8,
    /// Their biases joined likewise (`None` when none has one). A part without a bias is
    /// filled with `-0.0`: `y + -0.0` is `y`, bit for bit, whatever `y` is.
    pub(super) bqkv: Option<CudaSlice<f32>>,
    pub(super) wo: DevQ8,
    pub(super) ffn_norm: CudaSlice<f32>,
    /// `ffn_gate` and `ffn_up` as one matrix (gate rows first).
    pub(super) ffn_gate_up: DevQ8,
    pub(super) ffn_down: DevQ8,
}

pub(super) struct DevWeights {
    pub(super) token_embd: DevQ8,
    pub(super) layers: Vec<DevLayer>,
    pub(super) output_norm: CudaSlice<f32>,
    /// `None` when the output projection is the embedding (tied).
    pub(super) output: Option<DevQ8>,
}

/// One pass's activations in GPU memory, [`UBATCH`] rows of each width, and its per-token
/// inputs (uploaded before the pass's kernels, which read them there).
pub(super) struct DevScratch {
    /// The residual stream, `[n][n_embd]`.
    pub(super) x: CudaSlice<f32>,
    /// Fused q|k|v rows, `[n][q_dim + 2 kv_dim]`.
    pub(super) qkv: CudaSlice<f32>,
    pub(super) attn: CudaSlice<f32>,
    /// Fused gate|up rows, `[n][2 n_ff]`.
    pub(super) gate_up: CudaSlice<f32>,
    /// A projection before it is added to `x`, where a matmul cannot add it itself.
    pub(super) o: CudaSlice<f32>,
    /// The quantized matmul input: quants and block scales, sized for the widest input.
    pub(super) qa_q: CudaSlice<i8>,
    pub(super) qa_d: CudaSlice<f32>,
    /// A second quantized input, for the layer kernels: one writes it while the next
    /// kernel's blocks may still read `qa_q` / `qa_d`.
    pub(super) qb_q: CudaSlice<i8>,
    pub(super) qb_d: CudaSlice<f32>,
    /// The layer kernels' counters (zeros between launches).
    pub(super) counters: CudaSlice<i32>,
    /// The pass's inputs, uploaded in one copy: [`Input`] parts of [`UBATCH`] each.
    pub(super) inputs: CudaSlice<i32>,
    pub(super) attn_ws: CudaSlice<f32>,
    pub(super) logits: CudaSlice<f32>,
}

/// The parts of [`DevScratch::inputs`], in order.
#[derive(Debug, Clone, Copy)]
pub(super) enum Input {
    Tokens,
    Pos,
    /// Per token, its KV cell (`seq * n_ctx + pos`).
    Cells,
    /// The tokens whose logits are wanted, in order.
    Rows,
}

impl Input {
    pub(super) const COUNT: usize = 4;

    /// The first `n` entries of this part.
    pub(super) fn of(self, inputs: &CudaSlice<i32>, n: usize) -> CudaView<'_, i32> {
        let at = self as usize * UBATCH;
        inputs.slice(at..at + n)
    }
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
    let mut up_q8 = |parts: &[&Q8Matrix<'_>], what: &'static str| -> Result<DevQ8, NativeError> {
        let k = parts[0].k;
        if parts.iter().any(|m| m.k != k) {
            return Err(NativeError::BadMetadata(format!(
                "{what}: the matrices joined have rows of different lengths"
            )));
        }
        // The kernels read their own layout (the same size): rearranged once, here.
        let dev = device_layout(parts);
        let rows = parts.iter().map(|m| m.rows).sum();
        matrices += dev.len();
        Ok(DevQ8 {
            bytes: st.clone_htod(&dev).map_err(op(None, what))?,
            rows,
            k,
        })
    };
    let token_embd = up_q8(&[&weights.token_embd], "upload token_embd")?;
    let output = if weights.tied_output {
        None
    } else {
        Some(up_q8(&[&weights.output], "upload output")?)
    };
    let mut layers = Vec::with_capacity(weights.layers.len());
    for ly in &weights.layers {
        let biases = [
            (&ly.bq, ly.wq.rows),
            (&ly.bk, ly.wk.rows),
            (&ly.bv, ly.wv.rows),
        ];
        let bqkv = if biases.iter().any(|(b, _)| b.is_some()) {
            let joined: Vec<f32> = biases
                .iter()
                .flat_map(|(b, rows)| match b {
                    Some(b) => b.clone(),
                    None => vec![-0.0; *rows],
                })
                .collect();
            Some(up_f32(&joined, "upload attn_qkv.bias")?)
        } else {
            None
        };
        layers.push(DevLayer {
            attn_norm: up_f32(&ly.attn_norm, "upload attn_norm")?,
            wqkv: up_q8(&[&ly.wq, &ly.wk, &ly.wv], "upload attn_qkv")?,
            bqkv,
            wo: up_q8(&[&ly.wo], "upload attn_output")?,
            ffn_norm: up_f32(&ly.ffn_norm, "upload ffn_norm")?,
            ffn_gate_up: up_q8(&[&ly.ffn_gate, &ly.ffn_up], "upload ffn_gate_up")?,
            ffn_down: up_q8(&[&ly.ffn_down], "upload ffn_down")?,
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
    let qkv = hp.q_dim() + 2 * hp.kv_dim();
    let ws = attn_shape(hp, n_ctx, UBATCH).workspace_len(n_ctx, CHUNK);
    let f32s = |n: usize| st.alloc_zeros::<f32>(n).map_err(op(None, "scratch"));
    let i32s = |n: usize| st.alloc_zeros::<i32>(n).map_err(op(None, "scratch"));
    let s = DevScratch {
        x: f32s(UBATCH * hp.n_embd)?,
        qkv: f32s(UBATCH * qkv)?,
        attn: f32s(UBATCH * hp.q_dim())?,
        gate_up: f32s(UBATCH * 2 * hp.n_ff)?,
        o: f32s(UBATCH * hp.n_embd)?,
        qa_q: st
            .alloc_zeros::<i8>(UBATCH * widest)
            .map_err(op(None, "scratch"))?,
        qa_d: f32s(UBATCH * widest / QK)?,
        qb_q: st
            .alloc_zeros::<i8>(UBATCH * widest)
            .map_err(op(None, "scratch"))?,
        qb_d: f32s(UBATCH * widest / QK)?,
        counters: i32s(layer::COUNTERS)?,
        inputs: i32s(Input::COUNT * UBATCH)?,
        attn_ws: f32s(ws)?,
        logits: f32s(UBATCH * hp.n_vocab)?,
    };
    let scratch = 4
        * (UBATCH * (2 * hp.n_embd + qkv + hp.q_dim() + 2 * hp.n_ff + hp.n_vocab)
            + 2 * UBATCH * widest / QK
            + 4 * UBATCH
            + layer::COUNTERS
            + ws)
        + 2 * UBATCH * widest;
    Ok((s, scratch))
}

/// Maps a GPU error to one naming the tensor or op (`cuda blk.3.attn_q`).
pub(super) fn op<E: std::fmt::Display>(
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    op_on("cuda ", layer, what)
}

/// The attention kernel's shape for `n_seq` sequences of a cache of `n_ctx` positions.
pub(super) fn attn_shape(hp: &HParams, n_ctx: usize, n_seq: usize) -> AttnShape {
    AttnShape {
        n_seq,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        n_ctx,
    }
}
