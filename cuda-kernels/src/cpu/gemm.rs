//! Twin of `kernels/q8_gemm.cu`: Q8_0 GEMM for prefill, `Y[t][r] = W[r] . X[t]`, with `X`
//! quantized by [`super::quantize`].
//!
//! Per output and per 32-block `b`, in increasing `b`: `isum` = the 32 int8 products summed
//! exactly in i32 (`__dp4a` on the GPU), then `acc = fma(dw * dx, isum as f32, acc)`.
//! `|isum| <= 32 * 128 * 128 < 2^24`, so its conversion is exact and the only rounding is in
//! that fixed sequence, which every path here replays: results equal the kernel's bit for bit.
//!
//! The native backend also decodes through this twin (one token). One row at a time, that
//! is a horizontal i32 sum and a scalar fma per block; so on AVX2, up to `FEW_TOKENS` (8)
//! tokens take 8 rows at once instead, the 8 rows' `isum`s of a block in the lanes of one
//! vector, each lane running its row's own scalar sequence.

use half::f16;

use super::gemv::{check_len, usable, ShapeError};
use super::quantize::Q8Act;
use super::simd::Isa;
use crate::q8::{row_bytes, Q8Matrix, BLOCK_BYTES, QK};

/// `y[t * rows + r] = sum_k W[r][k] * X[t][k]`: `y` is `x.rows` consecutive vectors of
/// `w.rows`. Rows are split over `threads` threads (0 counts as 1); the result does not
/// depend on it.
pub fn gemm(
    isa: Isa,
    threads: usize,
    w: &Q8Matrix,
    x: &Q8Act,
    y: &mut [f32],
) -> Result<(), ShapeError> {
    let w = Q8Matrix::new(w.bytes, w.rows, w.k)?;
    x.check()?;
    if x.k != w.k {
        return Err(ShapeError::Len {
            what: "an activation row",
            expected: w.k,
            got: x.k,
        });
    }
    check_len("y", y.len(), x.rows, w.rows)?;
    let isa = usable(isa);
    let rows = w.rows;
    if rows == 0 || x.rows == 0 {
        return Ok(());
    }
    let w = &w;
    // Pieces of whole row groups (for the AVX2 path) and at least 16 KiB of weights.
    let min_rows = (16 << 10) / row_bytes(w.k);
    super::pool::split_rows(threads, rows, 8, min_rows, y, |r0, cols| {
        rows_range(isa, w, x, r0, cols)
    });
    Ok(())
}

/// [`gemm`] with the best ISA this CPU has.
pub fn gemm_auto(threads: usize, w: &Q8Matrix, x: &Q8Act, y: &mut [f32]) -> Result<(), ShapeError> {
    gemm(Isa::detect(), threads, w, x, y)
}

/// Token counts up to this take the row-group path on AVX2 ([`rows_avx2_few`]): decode
/// (one token) and small batches (at 8 tokens still ~2x the per-row path, one thread).
/// Larger ones keep one row at a time, whose widened weights are reused across all the
/// tokens.
#[cfg(target_arch = "x86_64")]
const FEW_TOKENS: usize = 8;

/// Rows `r0..r0 + cols[0].len()`, writing `cols[t][r - r0]`.
fn rows_range(isa: Isa, w: &Q8Matrix, x: &Q8Act, r0: usize, mut cols: Vec<&mut [f32]>) {
    let n = cols.first().map_or(0, |c| c.len());
    // Rows already done by a row-group path; the rest go one at a time.
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` only returns Avx2 where the CPU has AVX2, FMA and F16C.
        Isa::Avx2 if x.rows <= FEW_TOKENS => unsafe { groups_avx2(w, x, r0, &mut cols, n) },
        _ => 0,
    };
    let mut acc = vec![0f32; x.rows];
    for i in done..n {
        let row = w.row(r0 + i);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `usable` only returns Avx2 where the CPU has AVX2, FMA and F16C.
            Isa::Avx2 => unsafe { row_avx2(row, x, &mut acc) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: NEON is baseline on aarch64.
            Isa::Neon => unsafe { row_neon(row, x, &mut acc) },
            _ => row_scalar(row, x, &mut acc),
        }
        for (col, &a) in cols.iter_mut().zip(&acc) {
            col[i] = a;
        }
    }
}

fn block_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

fn row_scalar(row: &[u8], x: &Q8Act, acc: &mut [f32]) {
    let nb = x.k / QK;
    acc.fill(0.0);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let dw = block_scale(block);
        let wq = &block[2..];
        for (t, a) in acc.iter_mut().enumerate() {
            let xq = &x.q[t * x.k + b * QK..t * x.k + b * QK + QK];
            let isum: i32 = wq
                .iter()
                .zip(xq)
                .map(|(&w, &v)| i32::from(w as i8) * i32::from(v))
                .sum();
            *a = (dw * x.d[t * nb + b]).mul_add(isum as f32, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(row: &[u8], x: &Q8Act, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    let nb = x.k / QK;
    acc.fill(0.0);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let dw = block_scale(block);
        // Widened to i16, the products and their pairwise sums cannot overflow (madd is i32).
        let wp = block[2..].as_ptr();
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp as *const __m128i));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.add(16) as *const __m128i));
        for (t, a) in acc.iter_mut().enumerate() {
            let xp = x.q[t * x.k + b * QK..t * x.k + b * QK + QK].as_ptr();
            let x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xp as *const __m128i));
            let x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xp.add(16) as *const __m128i));
            let s = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            let isum = _mm_cvtsi128_si32(s);
            *a = (dw * x.d[t * nb + b]).mul_add(isum as f32, *a);
        }
    }
}

/// Row groups up to this many bytes prefetch the next group (see [`rows_avx2_nt`]); longer
/// rows are streams the hardware prefetchers follow, and prefetching a whole group ahead
/// of those only evicted what was still to be read (measured on Zen 4: k = 576 to 2048
/// gain 1.5 to 4x, k = 3072 is even, k = 4096 loses ~10%).
#[cfg(target_arch = "x86_64")]
const PREFETCH_SPAN: usize = 24 << 10;

/// Rows computed together by [`rows_avx2_few`]: one per f32 lane of a 256-bit vector.
#[cfg(target_arch = "x86_64")]
const GROUP: usize = 8;

/// The first `n / GROUP * GROUP` rows of `r0..r0 + n` by [`rows_avx2_few`]; returns how many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_avx2(
    w: &Q8Matrix,
    x: &Q8Act,
    r0: usize,
    cols: &mut [&mut [f32]],
    n: usize,
) -> usize {
    let mut out = [[0f32; GROUP]; FEW_TOKENS];
    let mut i = 0;
    while i + GROUP <= n {
        let rows: [&[u8]; GROUP] = std::array::from_fn(|j| w.row(r0 + i + j));
        rows_avx2_few(rows, x, &mut out);
        for (col, o) in cols.iter_mut().zip(&out) {
            col[i..i + GROUP].copy_from_slice(o);
        }
        i += GROUP;
    }
    i
}

/// [`GROUP`] rows against `x.rows <= FEW_TOKENS` tokens, `out[t][r]`. Per block, the 8
/// rows' exact `isum`s are gathered into the lanes of one vector, so lane `r` then runs
/// row `r`'s scalar sequence `acc = fma(dw * dx, isum as f32, acc)` (same operations, same
/// order, same roundings) while the activation block is widened once for the 8 rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2_few(rows: [&[u8]; GROUP], x: &Q8Act, out: &mut [[f32; GROUP]; FEW_TOKENS]) {
    match x.rows {
        1 => rows_avx2_nt::<1>(rows, x, out),
        2 => rows_avx2_nt::<2>(rows, x, out),
        3 => rows_avx2_nt::<3>(rows, x, out),
        4 => rows_avx2_nt::<4>(rows, x, out),
        5 => rows_avx2_nt::<5>(rows, x, out),
        6 => rows_avx2_nt::<6>(rows, x, out),
        7 => rows_avx2_nt::<7>(rows, x, out),
        _ => rows_avx2_nt::<8>(rows, x, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2_nt<const NT: usize>(
    rows: [&[u8]; GROUP],
    x: &Q8Act,
    out: &mut [[f32; GROUP]; FEW_TOKENS],
) {
    use std::arch::x86_64::*;
    let (k, nb) = (x.k, x.k / QK);
    debug_assert!(NT <= FEW_TOKENS && x.rows == NT);
    debug_assert!(rows.iter().all(|r| r.len() == nb * BLOCK_BYTES));
    debug_assert!(x.q.len() == NT * k && x.d.len() == NT * nb);
    let w = rows.map(|r| r.as_ptr());
    let (xq, xd) = (x.q.as_ptr(), x.d.as_ptr());
    let mut acc = [_mm256_setzero_ps(); NT];
    // The 8 rows are one contiguous span, walked as 8 interleaved streams, which the
    // hardware prefetchers miss when rows are short (8 x 612 bytes for k = 576 lie in two
    // pages). So the next group's span is prefetched here, 8 blocks' worth per step.
    let next = w[0].wrapping_add(GROUP * nb * BLOCK_BYTES);
    let prefetch = GROUP * nb * BLOCK_BYTES <= PREFETCH_SPAN;
    for b in 0..nb {
        if prefetch {
            let pf = next.wrapping_add(b * GROUP * BLOCK_BYTES) as *const i8;
            for line in 0..GROUP * BLOCK_BYTES / 64 + 1 {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * line));
            }
        }
        let wb = w.map(|p| p.add(b * BLOCK_BYTES));
        // The 8 rows' f16 scales, converted exactly by F16C.
        let h = wb.map(|p| (p as *const i16).read_unaligned());
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
        ));
        for (t, a) in acc.iter_mut().enumerate() {
            let xb = xq.add(t * k + b * QK);
            let x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb as *const __m128i));
            let x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(16) as *const __m128i));
            // Widened to i16, the products and their pairwise sums cannot overflow (madd
            // is i32): s[r] holds 8 partial sums of row r.
            let s = wb.map(|p| {
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i));
                _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1))
            });
            let isum = hsum8(s);
            let dx = _mm256_set1_ps(*xd.add(t * nb + b));
            *a = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum), *a);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// Lane `r` = the sum of the 8 lanes of `s[r]` (i32 adds: exact, so their order is free).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum8(s: [std::arch::x86_64::__m256i; GROUP]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Per 128-bit half: [r0, r1, r2, r3] pair sums, then quad sums of rows 0..3 / 4..7.
    let a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    let b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    // a = [rows 0..3 of the low halves | rows 0..3 of the high halves], b likewise for 4..7.
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

#[cfg(target_arch = "aarch64")]
unsafe fn row_neon(row: &[u8], x: &Q8Act, acc: &mut [f32]) {
    use std::arch::aarch64::*;
    let nb = x.k / QK;
    acc.fill(0.0);
    for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let dw = block_scale(block);
        let wp = block[2..].as_ptr() as *const i8;
        let w0 = vld1q_s8(wp);
        let w1 = vld1q_s8(wp.add(16));
        for (t, a) in acc.iter_mut().enumerate() {
            let xp = x.q[t * x.k + b * QK..t * x.k + b * QK + QK].as_ptr();
            let x0 = vld1q_s8(xp);
            let x1 = vld1q_s8(xp.add(16));
            // Each i16 product fits (|p| <= 16384); pairs are summed in i32.
            let mut s = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
            s = vpadalq_s16(s, vmull_high_s8(w0, x0));
            s = vpadalq_s16(s, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
            s = vpadalq_s16(s, vmull_high_s8(w1, x1));
            let isum = vaddvq_s32(s);
            *a = (dw * x.d[t * nb + b]).mul_add(isum as f32, *a);
        }
    }
}
