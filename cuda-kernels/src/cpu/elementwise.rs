//! Twin of `kernels/elementwise.cu`: SwiGLU's `silu(gate) * up` and the residual add.
//!
//! Both are elementwise with a fixed sequence of correctly rounded operations per value, so
//! the scalar loops here give the GPU's bits; vector paths would only change the speed,
//! and these are not the hot loops of a forward pass (the matmuls are).

use super::vector::{check_len, expf, ShapeError};

/// `silu(g) = g * sigmoid(g)` as the kernel computes it: `e = expf(-|g|)`, sigmoid
/// `1 / (1 + e)` for `g >= 0` else `e / (1 + e)`, which never overflows.
#[inline]
pub fn silu(g: f32) -> f32 {
    let e = expf(-g.abs());
    let d = 1.0 + e;
    let sig = if g >= 0.0 { 1.0 / d } else { e / d };
    g * sig
}

/// `out[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
    check_len("silu_mul up", up.len(), gate.len())?;
    check_len("silu_mul out", out.len(), gate.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
    Ok(())
}

/// `out[i] = a[i] + b[i]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
    check_len("add b", b.len(), a.len())?;
    check_len("add out", out.len(), a.len())?;
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

/// `acc[i] += b[i]`: the residual add in place.
pub fn add_inplace(acc: &mut [f32], b: &[f32]) -> Result<(), ShapeError> {
    check_len("add b", b.len(), acc.len())?;
    for (o, y) in acc.iter_mut().zip(b) {
        *o += y;
    }
    Ok(())
}
