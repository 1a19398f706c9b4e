//! Twin of `kernels/softmax.cu`: row softmax, `y = exp(x - max) / sum`, rows of `n`.
//!
//! The max is exact in any order. The exponentials are [`expf`](super::vector::expf) (the
//! kernel's `il_expf`); their sum replays the block of [`THREADS`] threads (thread `t` adds
//! `e[i]` for `i = t, t + THREADS, …`, then the warp butterflies of [`block_sum`]); then each
//! `e / sum` is one correctly rounded division. Every [`Isa`] gives the GPU's bits.

use super::simd::Isa;
use super::vector::{add_acc, block_sum, check_rows, div, exp_sub, strided_partials, ShapeError};

/// Threads per block the launch uses (at most the kernel's `SOFTMAX_THREADS`).
pub const THREADS: usize = 256;

/// Softmax of each row of `n` values of `x`, in place. (A row of only -inf, or with NaNs,
/// has no meaningful result; the twin computes the same meaningless one as the GPU.)
pub fn softmax_inplace(isa: Isa, x: &mut [f32], n: usize) -> Result<(), ShapeError> {
    check_rows("softmax x", x.len(), n)?;
    for row in x.chunks_exact_mut(n) {
        softmax_row(isa, row, THREADS);
    }
    Ok(())
}

/// Softmax of one row in place, as a block of `threads` threads (a multiple of 32).
fn softmax_row(isa: Isa, row: &mut [f32], threads: usize) {
    let (_, s) = exp_and_sum(isa, row, threads);
    div(isa, row, s);
}

/// The first two passes of a block softmax, shared with the attention twin: `row` becomes
/// `expf(row - max)`; returns `(max, sum)`, the sum taken as a block of `threads` threads (a
/// multiple of 32) takes it.
pub(crate) fn exp_and_sum(isa: Isa, row: &mut [f32], threads: usize) -> (f32, f32) {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    exp_sub(isa, row, m);
    let partials = strided_partials(row.len(), threads, |acc, base| {
        let k = acc.len();
        add_acc(isa, acc, &row[base..base + k]);
    });
    (m, block_sum(&partials))
}
