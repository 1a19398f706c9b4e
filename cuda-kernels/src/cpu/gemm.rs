//! Twin of `kernels/q8_gemm.cu`: Q8_0 GEMM for prefill, `Y[t][r] = W[r] . X[t]`, with `X`
//! quantized by [`super::quantize`].
//!
//! Per output and per 32-block `b`, in increasing `b`: `isum` = the 32 int8 products summed
//! exactly in i32 (`__dp4a` on the GPU), then `acc = fma(dw * dx, isum as f32, acc)`.
//! `|isum| <= 32 * 128 * 128 < 2^24`, so its conversion is exact and the only rounding is in
//! that fixed sequence, which every path here replays: results equal the kernel's bit for bit.

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
    // Pieces of at least 16 KiB of weights: below that a job costs more than it saves.
    let min_rows = (16 << 10) / row_bytes(w.k);
    super::pool::split_rows(threads, rows, 1, min_rows, y, |r0, cols| {
        rows_range(isa, w, x, r0, cols)
    });
    Ok(())
}

/// [`gemm`] with the best ISA this CPU has.
pub fn gemm_auto(threads: usize, w: &Q8Matrix, x: &Q8Act, y: &mut [f32]) -> Result<(), ShapeError> {
    gemm(Isa::detect(), threads, w, x, y)
}

/// Rows `r0..r0 + cols[0].len()`, writing `cols[t][r - r0]`.
fn rows_range(isa: Isa, w: &Q8Matrix, x: &Q8Act, r0: usize, mut cols: Vec<&mut [f32]>) {
    let n = cols.first().map_or(0, |c| c.len());
    let mut acc = vec![0f32; x.rows];
    for i in 0..n {
        let row = w.row(r0 + i);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `usable` only returns Avx2 where the CPU has AVX2 and FMA.
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
