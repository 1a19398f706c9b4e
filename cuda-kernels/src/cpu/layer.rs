//! Twin of `kernels/layer.cu`: the decode layer's four kernels, each the composition of
//! the twins of the kernels whose arithmetic it runs, in the order it runs it (the matvec
//! is [`gemv_q8`]'s; the epilogues are [`super::fused`]'s). Which block runs an epilogue on
//! the GPU changes no value, so these give the kernels' bits exactly when their parts do.

use super::attention::AttnShape;
use super::fused;
use super::gemv_q8::gemv_q8;
use super::quantize::Q8Act;
use super::rope::Rope;
use super::simd::Isa;
use super::vector::{check_len, ShapeError};
use crate::q8::Q8Matrix;

/// A twin's failure: its matvec's, or an epilogue's.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(transparent)]
    Matvec(#[from] super::gemv::ShapeError),
    #[error(transparent)]
    Op(#[from] ShapeError),
}

/// A layer's KV cache and the step's per-token inputs (`shape.n_seq` is 1; sequences of
/// `shape.n_ctx` cells), as [`fused::attention_step`] takes them.
pub struct Attn<'a> {
    pub shape: AttnShape,
    pub rope: Rope,
    pub pos: &'a [i32],
    pub cells: &'a [usize],
    pub k: &'a mut [u16],
    pub v: &'a mut [u16],
    pub chunk: usize,
}

/// `layer_qkv`: `qkv = Wqkv a (+ bias)`, RoPE of the q and k heads, k and v into the
/// caches, then each token's attention quantized into `q` / `d` (`[ncols][q_dim]`).
#[allow(clippy::too_many_arguments)]
pub fn layer_qkv(
    isa: Isa,
    w: &Q8Matrix,
    a: &Q8Act,
    bias: Option<&[f32]>,
    at: Attn<'_>,
    qkv: &mut [f32],
    q: &mut [i8],
    d: &mut [f32],
) -> Result<(), LayerError> {
    gemv_q8(isa, 1, w, a, bias, false, qkv)?;
    let sh = at.shape;
    fused::rope_store(&at.rope, sh.n_head_kv, qkv, at.pos, at.cells, at.k, at.v)?;
    let mut out = vec![0f32; a.rows * sh.n_head * sh.head_dim];
    fused::attention_step(
        isa, &sh, qkv, at.k, at.v, at.pos, at.cells, at.chunk, &mut out, q, d,
    )?;
    Ok(())
}

/// The norm after [`layer_residual_norm`]'s matvec: `w` on rows `rows[m]` of the new
/// residual, quantized into row `m` of `q` / `d`.
pub struct Norm<'a> {
    pub w: &'a [f32],
    pub eps: f32,
    pub rows: &'a [usize],
    pub q: &'a mut [i8],
    pub d: &'a mut [f32],
}

/// `layer_residual_norm`: `x += W a`, then `norm` of the new `x`.
pub fn layer_residual_norm(
    isa: Isa,
    w: &Q8Matrix,
    a: &Q8Act,
    x: &mut [f32],
    norm: Option<Norm<'_>>,
) -> Result<(), LayerError> {
    gemv_q8(isa, 1, w, a, None, true, x)?;
    match norm {
        Some(n) => Ok(fused::rmsnorm_quantize(
            isa, x, n.rows, n.w, n.eps, n.q, n.d,
        )?),
        None => Ok(()),
    }
}

/// `layer_gate_up`: `gu = Wgu a` (gate rows then up rows, `[ncols][2 n_ff]`), then
/// `silu(gate) * up` quantized into `q` / `d`.
pub fn layer_gate_up(
    isa: Isa,
    w: &Q8Matrix,
    a: &Q8Act,
    gu: &mut [f32],
    q: &mut [i8],
    d: &mut [f32],
) -> Result<(), LayerError> {
    check_len("layer_gate_up gu", gu.len(), a.rows * w.rows)?;
    gemv_q8(isa, 1, w, a, None, false, gu)?;
    fused::silu_mul_quantize(isa, gu, w.rows / 2, q, d)?;
    Ok(())
}
