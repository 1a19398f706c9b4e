//! Twin of `kernels/q8_gemv.cu`: Q8_0 GEMV for decode, y[c][r] = W[r] . x[c].
//!
//! The CUDA kernel gives each row one warp: lane `l = 8g + s` takes blocks `g, g+4, g+8, …`
//! and, within a block, quants `4s..4s+3`, forming per block and column
//! `p = q0*x0; p = fma(q1,x1,p); p = fma(q2,x2,p); p = fma(q3,x3,p); acc = fma(d,p,acc)`,
//! then the warp sums its 32 lanes with an xor butterfly (16, 8, 4, 2, 1). This file replays
//! those 32 lanes and that butterfly, so the results equal the GPU's bit for bit (every step
//! is a correctly rounded IEEE operation on both sides).
//!
//! The vector paths hold the 8 sub-lanes `s` of a group in one 8-float vector (two on NEON):
//! the quants of lane `s` are the 4 bytes of the block's 32-bit word `s`, split with shifts,
//! and `x` is permuted once per call so that element `j` of every lane is one contiguous load.

use half::f16;

use super::simd::Isa;
use crate::q8::{row_bytes, LayoutError, Q8Matrix, BLOCK_BYTES, QK};

/// Columns the CUDA kernel takes per launch; more are done in passes of this many.
pub const MAX_COLS: usize = 8;

/// A shape that does not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{what} holds {got} values, {expected} expected")]
    Len {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// `what` must hold `a * b` values.
pub(crate) fn check_len(
    what: &'static str,
    got: usize,
    a: usize,
    b: usize,
) -> Result<(), ShapeError> {
    match a.checked_mul(b) {
        Some(expected) if expected == got => Ok(()),
        expected => Err(ShapeError::Len {
            what,
            expected: expected.unwrap_or(usize::MAX),
            got,
        }),
    }
}

/// `isa` if this CPU can run it, else [`Isa::Scalar`] (same results, only slower).
pub(crate) fn usable(isa: Isa) -> Isa {
    match isa {
        Isa::Scalar => Isa::Scalar,
        _ if Isa::available().contains(&isa) => isa,
        _ => Isa::Scalar,
    }
}

/// `y[c * rows + r] = sum_k W[r][k] * x[c * k + k']` for `c < ncols`: `x` is `ncols`
/// consecutive vectors of `w.k`, `y` is `ncols` consecutive vectors of `w.rows`. Rows are
/// split over `threads` threads (0 counts as 1); the result does not depend on it.
pub fn gemv(
    isa: Isa,
    threads: usize,
    w: &Q8Matrix,
    x: &[f32],
    ncols: usize,
    y: &mut [f32],
) -> Result<(), ShapeError> {
    // The fields are public: check them again rather than trust them.
    let w = Q8Matrix::new(w.bytes, w.rows, w.k)?;
    check_len("x", x.len(), ncols, w.k)?;
    check_len("y", y.len(), ncols, w.rows)?;
    let isa = usable(isa);
    let (rows, k) = (w.rows, w.k);
    if rows == 0 {
        return Ok(());
    }
    for (xg, yg) in x.chunks(MAX_COLS * k).zip(y.chunks_mut(MAX_COLS * rows)) {
        pass(isa, threads, &w, xg, yg);
    }
    Ok(())
}

/// [`gemv`] with the best ISA this CPU has.
pub fn gemv_auto(
    threads: usize,
    w: &Q8Matrix,
    x: &[f32],
    ncols: usize,
    y: &mut [f32],
) -> Result<(), ShapeError> {
    gemv(Isa::detect(), threads, w, x, ncols, y)
}

/// One launch's worth: up to [`MAX_COLS`] columns, shapes already checked.
fn pass(isa: Isa, threads: usize, w: &Q8Matrix, x: &[f32], y: &mut [f32]) {
    let (rows, k) = (w.rows, w.k);
    let mut buf = Vec::new();
    let xp = permute(x, k, &mut buf);
    // Pieces of at least 16 KiB of weights: below that a job costs more than it saves.
    let min_rows = (16 << 10) / row_bytes(k);
    super::pool::split_rows(threads, rows, 1, min_rows, y, |r0, cols| {
        rows_range(isa, w, xp, r0, cols)
    });
}

/// `xp[c*k + 32b + 8j + s] = x[c*k + 32b + 4s + j]`: element `j` of sub-lanes 0..8 side by side,
/// in `buf`, 32-byte aligned so that no load of 8 of them straddles two cache lines.
fn permute<'a>(x: &[f32], k: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
    buf.clear();
    buf.resize(x.len() + 8, 0.0);
    let skip = buf.as_ptr().align_offset(32).min(8);
    let xp = &mut buf[skip..skip + x.len()];
    for (src, dst) in x.chunks_exact(QK).zip(xp.chunks_exact_mut(QK)) {
        for s in 0..8 {
            for j in 0..4 {
                dst[8 * j + s] = src[4 * s + j];
            }
        }
    }
    debug_assert_eq!(x.len() % k, 0);
    &buf[skip..skip + x.len()]
}

/// Rows `r0..r0 + cols[0].len()`, writing `cols[c][r - r0]`.
fn rows_range(isa: Isa, w: &Q8Matrix, xp: &[f32], r0: usize, mut cols: Vec<&mut [f32]>) {
    let ncols = cols.len();
    let n = cols.first().map_or(0, |c| c.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && ncols == 1 && w.k > TILED_K {
        // SAFETY: `usable` only returns Avx2 where the CPU has AVX2 and FMA.
        unsafe { rows_avx2_tiled(w, xp, r0, &mut cols[0][..n]) };
        return;
    }
    let mut out = [0f32; MAX_COLS];
    for i in 0..n {
        let row = w.row(r0 + i);
        row_dot(isa, row, xp, w.k, ncols, &mut out);
        for (c, col) in cols.iter_mut().enumerate() {
            col[i] = out[c];
        }
    }
}

fn row_dot(isa: Isa, row: &[u8], xp: &[f32], k: usize, ncols: usize, out: &mut [f32; MAX_COLS]) {
    debug_assert!(row.len() == row_bytes(k) && xp.len() == ncols * k && ncols <= MAX_COLS);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` only returns Avx2 where the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { row_avx2(row, xp, k, ncols, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `usable` only returns Neon on aarch64, where NEON is baseline.
        Isa::Neon => unsafe { row_neon(row, xp, k, ncols, out) },
        _ => row_scalar(row, xp, k, ncols, out),
    }
}

fn block_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// The warp's butterfly: after step `o` lane `l` holds `v[l] + v[l ^ o]`; lane 0 is kept.
pub(crate) fn butterfly(mut v: [f32; 32]) -> f32 {
    for o in [16, 8, 4, 2, 1] {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = prev[l] + prev[l ^ o];
        }
    }
    v[0]
}

/// Signed byte `j` of a little-endian word, as the kernel's shifts extract it.
fn quant(u: u32, j: u32) -> f32 {
    (((u << (24 - 8 * j)) as i32) >> 24) as f32
}

fn row_scalar(row: &[u8], xp: &[f32], k: usize, ncols: usize, out: &mut [f32; MAX_COLS]) {
    // acc[c][lane]
    let mut acc = [[0f32; 32]; MAX_COLS];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let g = b & 3;
        let d = block_scale(block);
        for s in 0..8 {
            let u = u32::from_le_bytes([
                block[2 + 4 * s],
                block[3 + 4 * s],
                block[4 + 4 * s],
                block[5 + 4 * s],
            ]);
            let q = [quant(u, 0), quant(u, 1), quant(u, 2), quant(u, 3)];
            for (c, a) in acc.iter_mut().enumerate().take(ncols) {
                let xs = &xp[c * k + b * QK..c * k + b * QK + QK];
                let mut p = q[0] * xs[s];
                p = q[1].mul_add(xs[8 + s], p);
                p = q[2].mul_add(xs[16 + s], p);
                p = q[3].mul_add(xs[24 + s], p);
                let lane = &mut a[8 * g + s];
                *lane = d.mul_add(p, *lane);
            }
        }
    }
    for c in 0..ncols {
        out[c] = butterfly(acc[c]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(row: &[u8], xp: &[f32], k: usize, ncols: usize, out: &mut [f32; MAX_COLS]) {
    // One copy per column count: the accumulators are then named registers, not an array
    // indexed by the block's group (which kept them in memory, a store-to-load round trip
    // on every block's dependency chain).
    match ncols {
        1 => row_avx2_n::<1>(row, xp, k, out),
        2 => row_avx2_n::<2>(row, xp, k, out),
        3 => row_avx2_n::<3>(row, xp, k, out),
        4 => row_avx2_n::<4>(row, xp, k, out),
        5 => row_avx2_n::<5>(row, xp, k, out),
        6 => row_avx2_n::<6>(row, xp, k, out),
        7 => row_avx2_n::<7>(row, xp, k, out),
        _ => row_avx2_n::<8>(row, xp, k, out),
    }
}

/// How far ahead of the block being read a row's weights are prefetched, in bytes. The
/// hardware prefetchers alone fall behind when `x` does not fit in L1 (k = 14336: 56 KiB),
/// as the twin then waits on L2 for `x` and on memory for the weights by turns.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 2048;

/// Prefetches the 4 blocks (136 bytes, at most 3 cache lines) [`PREFETCH_AHEAD`] bytes
/// past `p`: this row's, or the next rows' when it ends sooner. The address may lie past
/// the matrix, which a prefetch never faults on.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn prefetch_avx2(p: *const u8) {
    use std::arch::x86_64::*;
    let p = p.wrapping_add(PREFETCH_AHEAD) as *const i8;
    _mm_prefetch::<_MM_HINT_T0>(p);
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn block_avx2<const NC: usize>(
    block: *const u8,
    xs: *const f32,
    k: usize,
    acc: &mut [std::arch::x86_64::__m256; NC],
) {
    use std::arch::x86_64::*;
    let d = _mm256_set1_ps(f16::from_bits(u16::from_le_bytes([*block, *block.add(1)])).to_f32());
    // Word s of the quants = the 4 quants of sub-lane s.
    let v = _mm256_loadu_si256(block.add(2) as *const __m256i);
    let q0 = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v)));
    let q1 = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(v)));
    let q2 = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(v)));
    let q3 = _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(v));
    for (c, a) in acc.iter_mut().enumerate() {
        let x = xs.add(c * k);
        let mut p = _mm256_mul_ps(q0, _mm256_loadu_ps(x));
        p = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x.add(8)), p);
        p = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x.add(16)), p);
        p = _mm256_fmadd_ps(q3, _mm256_loadu_ps(x.add(24)), p);
        *a = _mm256_fmadd_ps(d, p, *a);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2_n<const NC: usize>(row: &[u8], xp: &[f32], k: usize, out: &mut [f32; MAX_COLS]) {
    use std::arch::x86_64::*;
    let nb = row.len() / BLOCK_BYTES;
    debug_assert!(xp.len() >= NC * k && nb * QK == k);
    // acc[g][c]: group g (blocks g, g+4, ...) of column c, four groups unrolled.
    let mut acc = [[_mm256_setzero_ps(); NC]; 4];
    let (w, x) = (row.as_ptr(), xp.as_ptr());
    let mut b = 0;
    while b + 4 <= nb {
        prefetch_avx2(w.wrapping_add(b * BLOCK_BYTES));
        let [a0, a1, a2, a3] = &mut acc;
        block_avx2::<NC>(w.add(b * BLOCK_BYTES), x.add(b * QK), k, a0);
        block_avx2::<NC>(w.add((b + 1) * BLOCK_BYTES), x.add((b + 1) * QK), k, a1);
        block_avx2::<NC>(w.add((b + 2) * BLOCK_BYTES), x.add((b + 2) * QK), k, a2);
        block_avx2::<NC>(w.add((b + 3) * BLOCK_BYTES), x.add((b + 3) * QK), k, a3);
        b += 4;
    }
    while b < nb {
        block_avx2::<NC>(w.add(b * BLOCK_BYTES), x.add(b * QK), k, &mut acc[b & 3]);
        b += 1;
    }
    for c in 0..NC {
        let mut lanes = [0f32; 32];
        for (g, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(lanes[8 * g..].as_mut_ptr(), a[c]);
        }
        out[c] = butterfly(lanes);
    }
}

/// One column with a longer `x` than this (f32, permuted: 24 KiB) is walked in tiles of
/// [`TILE_BLOCKS`] blocks ([`rows_avx2_tiled`]): a whole `x` no longer stays in L1 beside the
/// weights streaming through it, and the twin waited on L2 for it.
#[cfg(target_arch = "x86_64")]
const TILED_K: usize = 6144;
/// 2048 weights: 8 KiB of `x` (16 KiB measured the same within the noise), and a multiple
/// of 4 blocks so that every tile starts at group 0.
#[cfg(target_arch = "x86_64")]
const TILE_BLOCKS: usize = 64;
/// Rows whose accumulators are kept while their tiles are walked.
#[cfg(target_arch = "x86_64")]
const PANEL: usize = 16;

/// Rows `r0..r0 + out.len()` against one column, for long rows: per panel of [`PANEL`]
/// rows, tile after tile of `x`, each row's four group accumulators kept across tiles. Each
/// accumulator still takes its blocks in increasing order, one `fma(d, p, acc)` each, and
/// the butterfly comes after the last tile, so every result equals [`row_avx2_n`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2_tiled(w: &Q8Matrix, xp: &[f32], r0: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (k, nb, rb) = (w.k, w.k / QK, row_bytes(w.k));
    debug_assert!(xp.len() == k && (r0 + out.len()) * rb <= w.bytes.len());
    let x = xp.as_ptr();
    for (p, outp) in out.chunks_mut(PANEL).enumerate() {
        let np = outp.len();
        let base = w.bytes.as_ptr().add((r0 + p * PANEL) * rb);
        let mut acc = [[[_mm256_setzero_ps(); 1]; 4]; PANEL];
        let mut t0 = 0;
        while t0 < nb {
            let t1 = (t0 + TILE_BLOCKS).min(nb);
            for (i, a) in acc.iter_mut().enumerate().take(np) {
                let row = base.add(i * rb);
                // Prefetched while this slice is read: the next row's slice of the tile, or
                // (after the panel's last row) the first row's slice of the next tile.
                let ahead = if i + 1 < np {
                    rb as isize
                } else {
                    ((t1 - t0) * BLOCK_BYTES) as isize - (i * rb) as isize
                };
                let [a0, a1, a2, a3] = a;
                let mut b = t0;
                while b + 4 <= t1 {
                    let wb = row.add(b * BLOCK_BYTES);
                    let pf = wb.wrapping_offset(ahead) as *const i8;
                    _mm_prefetch::<_MM_HINT_T0>(pf);
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64));
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(128));
                    block_avx2::<1>(wb, x.add(b * QK), k, a0);
                    block_avx2::<1>(wb.add(BLOCK_BYTES), x.add((b + 1) * QK), k, a1);
                    block_avx2::<1>(wb.add(2 * BLOCK_BYTES), x.add((b + 2) * QK), k, a2);
                    block_avx2::<1>(wb.add(3 * BLOCK_BYTES), x.add((b + 3) * QK), k, a3);
                    b += 4;
                }
                // Only the last tile can end off a multiple of 4.
                while b < t1 {
                    let g = match b & 3 {
                        0 => &mut *a0,
                        1 => &mut *a1,
                        2 => &mut *a2,
                        _ => &mut *a3,
                    };
                    block_avx2::<1>(row.add(b * BLOCK_BYTES), x.add(b * QK), k, g);
                    b += 1;
                }
            }
            t0 = t1;
        }
        for (o, a) in outp.iter_mut().zip(&acc) {
            let mut lanes = [0f32; 32];
            for (g, v) in a.iter().enumerate() {
                _mm256_storeu_ps(lanes[8 * g..].as_mut_ptr(), v[0]);
            }
            *o = butterfly(lanes);
        }
    }
}

#[cfg(target_arch = "aarch64")]
unsafe fn row_neon(row: &[u8], xp: &[f32], k: usize, ncols: usize, out: &mut [f32; MAX_COLS]) {
    use std::arch::aarch64::*;
    // acc[c][g][h]: sub-lanes 4h..4h+3 of group g.
    let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; MAX_COLS];
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let g = b & 3;
        let d = vdupq_n_f32(block_scale(block));
        let mut q = [[vdupq_n_f32(0.0); 4]; 2];
        for (h, qh) in q.iter_mut().enumerate() {
            // Byte loads: the quants are only 2-byte aligned.
            let v = vreinterpretq_s32_u8(vld1q_u8(block[2 + 16 * h..].as_ptr()));
            qh[0] = vcvtq_f32_s32(vshrq_n_s32::<24>(vshlq_n_s32::<24>(v)));
            qh[1] = vcvtq_f32_s32(vshrq_n_s32::<24>(vshlq_n_s32::<16>(v)));
            qh[2] = vcvtq_f32_s32(vshrq_n_s32::<24>(vshlq_n_s32::<8>(v)));
            qh[3] = vcvtq_f32_s32(vshrq_n_s32::<24>(v));
        }
        for (c, a) in acc.iter_mut().enumerate().take(ncols) {
            let xs = xp[c * k + b * QK..c * k + b * QK + QK].as_ptr();
            for (h, qh) in q.iter().enumerate() {
                let xh = xs.add(4 * h);
                let mut p = vmulq_f32(qh[0], vld1q_f32(xh));
                p = vfmaq_f32(p, qh[1], vld1q_f32(xh.add(8)));
                p = vfmaq_f32(p, qh[2], vld1q_f32(xh.add(16)));
                p = vfmaq_f32(p, qh[3], vld1q_f32(xh.add(24)));
                a[g][h] = vfmaq_f32(a[g][h], d, p);
            }
        }
    }
    for c in 0..ncols {
        let mut lanes = [0f32; 32];
        for g in 0..4 {
            for h in 0..2 {
                vst1q_f32(lanes[8 * g + 4 * h..].as_mut_ptr(), acc[c][g][h]);
            }
        }
        out[c] = butterfly(lanes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_extracts_signed_bytes_in_memory_order() {
        let u = u32::from_le_bytes([0x80, 0x7f, 0xff, 0x01]);
        assert_eq!(
            [quant(u, 0), quant(u, 1), quant(u, 2), quant(u, 3)],
            [-128.0, 127.0, -1.0, 1.0]
        );
    }

    #[test]
    fn shapes_are_errors_not_panics() {
        let bytes = [0u8; 34];
        let w = Q8Matrix::new(&bytes, 1, 32).unwrap();
        let mut y = [0f32; 1];
        assert!(matches!(
            gemv(Isa::Scalar, 1, &w, &[0.0; 31], 1, &mut y),
            Err(ShapeError::Len { what: "x", .. })
        ));
        assert!(matches!(
            gemv(Isa::Scalar, 1, &w, &[0.0; 32], 1, &mut [0.0; 2]),
            Err(ShapeError::Len { what: "y", .. })
        ));
        let bad = Q8Matrix {
            bytes: &bytes,
            rows: 2,
            k: 32,
        };
        assert!(matches!(
            gemv(Isa::Scalar, 1, &bad, &[0.0; 32], 1, &mut [0.0; 2]),
            Err(ShapeError::Layout(_))
        ));
    }
}
