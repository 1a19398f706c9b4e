//! Twin of `kernels/elementwise.cu`: SwiGLU's `silu(gate) * up`, the residual add and the
//! KV cache write (f32 rounded to f16).
//!
//! Both are elementwise with a fixed sequence of correctly rounded operations per value, so
//! the scalar loops here give the GPU's bits; vector paths would only change the speed,
//! and these are not the hot loops of a forward pass (the matmuls are).

use half::f16;

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

/// The KV cache write (`kv_store_f16`): token `t`'s `width` values of `x`, rounded to f16
/// (nearest even), into cell `cells[t]` of `cache` (`width` values per cell, f16 bits).
pub fn kv_store_f16(
    x: &[f32],
    width: usize,
    cells: &[usize],
    cache: &mut [u16],
) -> Result<(), ShapeError> {
    check_len("kv_store x", x.len(), cells.len() * width)?;
    let n_cells = cache.len().checked_div(width).unwrap_or(0);
    for (t, &cell) in cells.iter().enumerate() {
        if cell >= n_cells {
            return Err(ShapeError::Unsupported(format!(
                "kv_store: cell {cell} outside the cache's {n_cells}"
            )));
        }
        let src = &x[t * width..(t + 1) * width];
        for (d, &v) in cache[cell * width..(cell + 1) * width].iter_mut().zip(src) {
            *d = f16::from_f32(v).to_bits();
        }
    }
    Ok(())
}
