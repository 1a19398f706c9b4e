//! Twin of `kernels/rmsnorm.cu`: `y = x / sqrt(mean(x^2) + eps) * w` per row of `w.len()`.
//!
//! The sum of squares replays the kernel's block of [`THREADS`] threads: thread `t` adds
//! `fma(x[i], x[i], acc)` for `i = t, t + THREADS, …`, then [`block_sum`] mirrors the warp
//! butterflies. The vector paths run that loop across threads (8 or 4 at a time), which is
//! the same operation per thread, so every [`Isa`] gives the GPU's bits.

use super::simd::Isa;
use super::vector::{block_sum, check_len, check_rows, fma_acc, strided_partials, ShapeError};

/// Threads per block the launch uses (at most the kernel's `RMSNORM_THREADS`).
pub const THREADS: usize = 256;

/// Normalizes each row of `x` (rows of `w.len()`) into `y` (same length as `x`).
pub fn rmsnorm(isa: Isa, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) -> Result<(), ShapeError> {
    let n = w.len();
    check_rows("rmsnorm x", x.len(), n)?;
    check_len("rmsnorm y", y.len(), x.len())?;
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let inv = inv_rms(isa, xr, eps);
        // Two roundings, as the kernel's __fmul_rn(__fmul_rn(x, inv), w).
        for ((o, v), g) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
    Ok(())
}

/// In place: each row of `x` (rows of `w.len()`) becomes its normalized self.
pub fn rmsnorm_inplace(isa: Isa, x: &mut [f32], w: &[f32], eps: f32) -> Result<(), ShapeError> {
    let n = w.len();
    check_rows("rmsnorm x", x.len(), n)?;
    for xr in x.chunks_exact_mut(n) {
        let inv = inv_rms(isa, xr, eps);
        for (v, g) in xr.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
    Ok(())
}

/// `1 / sqrt(sum(x^2) / n + eps)`, every step correctly rounded as in the kernel.
fn inv_rms(isa: Isa, x: &[f32], eps: f32) -> f32 {
    let partials = strided_partials(x.len(), THREADS, |acc, base| {
        let m = acc.len();
        fma_acc(isa, acc, &x[base..base + m], &x[base..base + m]);
    });
    let ss = block_sum(&partials);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}
