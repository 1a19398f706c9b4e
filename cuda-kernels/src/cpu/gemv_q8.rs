//! Twin of `q8_gemv_q8` in `kernels/q8_gemv.cu`: the Q8_0 x Q8_0 GEMV for decode (1 to 8
//! tokens), `y[c][r] = W[r] . X[c] (+ bias[r]) (+ y[c][r])`, `X` quantized by
//! [`super::quantize`].
//!
//! The float order is the kernel's (documented at the top of the .cu file): per row and
//! column, 32 partials, partial `l` owning blocks `b = l, l+32, …` in increasing `b`, each
//! step `acc_l = fma(dw_b * dx_b, isum_b as f32, acc_l)` with `isum_b` exact in i32; then
//! the xor butterfly over the 32 partials (16, 8, 4, 2, 1), then the epilogue
//! `t = dot; t = t + bias[r]; y = y + t` (each step only when asked). Every step is one
//! correctly rounded IEEE operation on both sides, so results equal the kernel's bit for bit.
//!
//! The AVX2 path takes 8 rows at once (`group_avx2`: lane r = row r, one vector per
//! partial, the butterfly as vector adds); leftover rows take `row_avx2`, which holds
//! partials `8v..8v+8` in the lanes of vector `v`: 8 consecutive blocks
//! give their 8 exact `isum`s in the lanes of one vector, so each lane runs its own
//! partial's scalar sequence, and the butterfly is done on the 4 vectors (commutative adds:
//! lane 0 gets the same value as the scalar butterfly's lane 0). The NEON path does the same
//! with 4 blocks and 8 vectors of 4 partials.

use half::f16;

use super::gemv::{butterfly, check_len, usable, ShapeError};
use super::quantize::Q8Act;
use super::simd::Isa;
use crate::q8::{row_bytes, Q8Matrix, BLOCK_BYTES, QK};

/// Partial sums per (row, column): one per lane of the kernel's warp.
pub const PARTIALS: usize = 32;
/// Columns the kernel takes in one launch (the daemon's micro-batches up to this size
/// use this GEMV; the twin itself takes any number, in groups of this many).
pub const MAX_COLS: usize = 8;

/// `y[c * rows + r] = dot(W[r], X[c]) (+ bias[r]) (+ y[c * rows + r] if accumulate)` for
/// the `x.rows` columns of `x`. Rows are split over `threads` threads (0 counts as 1); the
/// result does not depend on it.
pub fn gemv_q8(
    isa: Isa,
    threads: usize,
    w: &Q8Matrix,
    x: &Q8Act,
    bias: Option<&[f32]>,
    accumulate: bool,
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
    if let Some(b) = bias {
        check_len("bias", b.len(), w.rows, 1)?;
    }
    if w.rows == 0 || x.rows == 0 {
        return Ok(());
    }
    let mut isa = usable(isa);
    if isa == Isa::Avx2 && x.q.contains(&-128) {
        // The AVX2 path's byte products need |x| <= 127 (see `chunk_avx2`); the quantizer
        // never writes -128, other callers may: they get the (identical) scalar results.
        isa = Isa::Scalar;
    }
    let w = &w;
    let ep = Epilogue { bias, accumulate };
    // Pieces of at least 16 KiB of weights: below that a job costs more than it saves.
    let min_rows = (16 << 10) / row_bytes(w.k);
    // Pieces of whole row groups (the AVX2 path's 8 rows).
    super::pool::split_rows(threads, w.rows, GROUP, min_rows, y, |r0, cols| {
        rows_range(isa, w, x, ep, r0, cols)
    });
    Ok(())
}

/// [`gemv_q8`] with the best ISA this CPU has.
pub fn gemv_q8_auto(
    threads: usize,
    w: &Q8Matrix,
    x: &Q8Act,
    bias: Option<&[f32]>,
    accumulate: bool,
    y: &mut [f32],
) -> Result<(), ShapeError> {
    gemv_q8(Isa::detect(), threads, w, x, bias, accumulate, y)
}

/// Rows the AVX2 path computes together, one per lane.
const GROUP: usize = 8;

#[derive(Clone, Copy)]
struct Epilogue<'a> {
    bias: Option<&'a [f32]>,
    accumulate: bool,
}

impl Epilogue<'_> {
    /// The kernel's epilogue for row `r`: `t = dot (+ bias[r])`, then `y = t` or `y + t`.
    fn apply(&self, r: usize, dot: f32, y: &mut f32) {
        let t = match self.bias {
            Some(b) => dot + b[r],
            None => dot,
        };
        *y = if self.accumulate { *y + t } else { t };
    }
}

/// Rows `r0..r0 + cols[0].len()`, updating `cols[c][r - r0]`.
fn rows_range(
    isa: Isa,
    w: &Q8Matrix,
    x: &Q8Act,
    ep: Epilogue,
    r0: usize,
    mut cols: Vec<&mut [f32]>,
) {
    let n = cols.first().map_or(0, |c| c.len());
    let mut dots = vec![0f32; x.rows];
    // Rows already done by the row-group path; the rest go one at a time.
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` only returns Avx2 where the CPU has AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { groups_avx2(w, x, ep, r0, &mut cols, n) },
        _ => 0,
    };
    for i in done..n {
        let row = w.row(r0 + i);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { row_avx2(row, x, &mut dots) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `usable` only returns Neon on aarch64, where NEON is baseline.
            Isa::Neon => unsafe { row_neon(row, x, &mut dots) },
            _ => row_scalar(row, x, &mut dots),
        }
        for (col, &d) in cols.iter_mut().zip(&dots) {
            ep.apply(r0 + i, d, &mut col[i]);
        }
    }
}

fn block_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// The exact i32 dot product of two blocks' 32 quants (`__dp4a` eight times on the GPU).
fn isum(wq: &[u8], xq: &[i8]) -> i32 {
    wq.iter()
        .zip(xq)
        .map(|(&w, &v)| i32::from(w as i8) * i32::from(v))
        .sum()
}

/// The reference sequence, one partial at a time: `dots[c]` for every column of `x`.
fn row_scalar(row: &[u8], x: &Q8Act, dots: &mut [f32]) {
    let nb = x.k / QK;
    for (c, dot) in dots.iter_mut().enumerate() {
        let mut acc = [0f32; PARTIALS];
        for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
            let xq = &x.q[c * x.k + b * QK..c * x.k + (b + 1) * QK];
            let s = isum(&block[2..], xq) as f32;
            let a = &mut acc[b % PARTIALS];
            *a = (block_scale(block) * x.d[c * nb + b]).mul_add(s, *a);
        }
        *dot = butterfly(acc);
    }
}

/// The first `n / GROUP * GROUP` rows of `r0..r0 + n`, [`GROUP`] at a time by
/// [`group_avx2`], epilogue applied; returns how many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_avx2(
    w: &Q8Matrix,
    x: &Q8Act,
    ep: Epilogue,
    r0: usize,
    cols: &mut [&mut [f32]],
    n: usize,
) -> usize {
    let mut out = [[0f32; GROUP]; MAX_COLS];
    let mut i = 0;
    while i + GROUP <= n {
        let rows: [&[u8]; GROUP] = std::array::from_fn(|j| w.row(r0 + i + j));
        for (g, cg) in cols.chunks_mut(MAX_COLS).enumerate() {
            let c0 = g * MAX_COLS;
            match cg.len() {
                1 => group_avx2::<1>(rows, x, c0, &mut out),
                2 => group_avx2::<2>(rows, x, c0, &mut out),
                3 => group_avx2::<3>(rows, x, c0, &mut out),
                4 => group_avx2::<4>(rows, x, c0, &mut out),
                5 => group_avx2::<5>(rows, x, c0, &mut out),
                6 => group_avx2::<6>(rows, x, c0, &mut out),
                7 => group_avx2::<7>(rows, x, c0, &mut out),
                _ => group_avx2::<8>(rows, x, c0, &mut out),
            }
            for (col, o) in cg.iter_mut().zip(&out) {
                for (j, &d) in o.iter().enumerate() {
                    ep.apply(r0 + i + j, d, &mut col[i + j]);
                }
            }
        }
        i += GROUP;
    }
    i
}

/// Row groups up to this many bytes prefetch the next group; longer rows are streams the
/// hardware prefetchers follow (as in [`super::gemm`]).
#[cfg(target_arch = "x86_64")]
const PREFETCH_SPAN: usize = 24 << 10;

/// [`GROUP`] rows against columns `c0..c0 + NC`, `out[c][r]`: lane `r` of `acc[c][l]` is
/// partial `l` of row `r`, so each block's 8 exact `isum`s (one per row, gathered into one
/// vector) take one step of partial `b % 32` in every lane, and the butterfly is 31 vector
/// adds `a[l] = a[l] + a[l + o]` (l < o: `l + o = l ^ o`), lane by lane the warp's.
/// Activations are widened to i16 here (exact for every value, -128 included).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const NC: usize>(
    rows: [&[u8]; GROUP],
    x: &Q8Act,
    c0: usize,
    out: &mut [[f32; GROUP]; MAX_COLS],
) {
    use std::arch::x86_64::*;
    let (k, nb) = (x.k, x.k / QK);
    debug_assert!(rows.iter().all(|r| r.len() == nb * BLOCK_BYTES));
    debug_assert!(x.q.len() >= (c0 + NC) * k && x.d.len() >= (c0 + NC) * nb);
    let w = rows.map(|r| r.as_ptr());
    let (xq, xd) = (x.q.as_ptr().add(c0 * k), x.d.as_ptr().add(c0 * nb));
    let mut acc = [[_mm256_setzero_ps(); PARTIALS]; NC];
    // The 8 rows are one contiguous span walked as 8 interleaved streams: prefetch the
    // next group's span when it is short (see `super::gemm`).
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
        let h = wb.map(|p| (p as *const i16).read_unaligned());
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
        ));
        for (c, a) in acc.iter_mut().enumerate() {
            let xb = xq.add(c * k + b * QK);
            let x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb as *const __m128i));
            let x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(16) as *const __m128i));
            // Widened to i16, the products and their pairwise sums cannot overflow.
            let s = wb.map(|p| {
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i));
                _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1))
            });
            let isum = _mm256_cvtepi32_ps(hsum8(s));
            let dx = _mm256_set1_ps(*xd.add(c * nb + b));
            let p = &mut a[b % PARTIALS];
            *p = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), isum, *p);
        }
    }
    for (o, a) in out.iter_mut().zip(acc.iter_mut()) {
        for step in [16, 8, 4, 2, 1] {
            for l in 0..step {
                a[l] = _mm256_add_ps(a[l], a[l + step]);
            }
        }
        _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
    }
}

/// Needs `x.q` free of -128 (checked by [`gemv_q8`]). Columns go in groups of up to 8, each
/// group's row walked once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2(row: &[u8], x: &Q8Act, dots: &mut [f32]) {
    for (g, d) in dots.chunks_mut(MAX_COLS).enumerate() {
        let c0 = g * MAX_COLS;
        match d.len() {
            1 => row_avx2_n::<1>(row, x, c0, d),
            2 => row_avx2_n::<2>(row, x, c0, d),
            3 => row_avx2_n::<3>(row, x, c0, d),
            4 => row_avx2_n::<4>(row, x, c0, d),
            5 => row_avx2_n::<5>(row, x, c0, d),
            6 => row_avx2_n::<6>(row, x, c0, d),
            7 => row_avx2_n::<7>(row, x, c0, d),
            _ => row_avx2_n::<8>(row, x, c0, d),
        }
    }
}

/// Columns `c0..c0 + NC` of one row: per step 8 blocks, their scales read once for all
/// the columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2_n<const NC: usize>(row: &[u8], x: &Q8Act, c0: usize, dots: &mut [f32]) {
    use std::arch::x86_64::*;
    let (k, nb) = (x.k, x.k / QK);
    debug_assert!(row.len() == nb * BLOCK_BYTES && dots.len() == NC);
    debug_assert!(x.q.len() >= (c0 + NC) * k && x.d.len() >= (c0 + NC) * nb);
    let w = row.as_ptr();
    let xq = x.q.as_ptr().add(c0 * k);
    let xd = x.d.as_ptr().add(c0 * nb);
    // acc[c][v] lane j = partial 8v + j of column c.
    let mut acc = [[_mm256_setzero_ps(); 4]; NC];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(8);
        let dw = scales_avx2(w, b0, n);
        let v = (b0 / 8) % 4;
        for (c, a) in acc.iter_mut().enumerate() {
            let isum = isums_avx2(w, xq.add(c * k), b0, n);
            let dc = xd.add(c * nb + b0);
            let step = if n == 8 {
                _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(dc)), isum, a[v])
            } else {
                // The last nb % 8 blocks: only their lanes take the step.
                let keep = lanes_below(n);
                let dx = _mm256_maskload_ps(dc, _mm256_castps_si256(keep));
                let t = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), isum, a[v]);
                _mm256_blendv_ps(a[v], t, keep)
            };
            a[v] = step;
        }
        b0 += 8;
    }
    for (d, a) in dots.iter_mut().zip(&acc) {
        *d = butterfly_avx2(*a);
    }
}

/// The f16 scales of blocks `b0..b0 + n` (n <= 8), converted exactly by F16C; lanes from
/// `n` on are 0 (those blocks may lie past the matrix and are not read).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales_avx2(w: *const u8, b0: usize, n: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let scale = |j: usize| {
        if j < n {
            (w.add((b0 + j) * BLOCK_BYTES) as *const i16).read_unaligned()
        } else {
            0
        }
    };
    _mm256_cvtph_ps(_mm_setr_epi16(
        scale(0),
        scale(1),
        scale(2),
        scale(3),
        scale(4),
        scale(5),
        scale(6),
        scale(7),
    ))
}

/// Lane `j` = the exact i32 dot product (as f32) of block `b0 + j` of the row `w` and of
/// the column `xc`, for `j < n` (n <= 8); 0 beyond.
///
/// The byte products are ggml's: `|w|` as unsigned bytes (-128 becomes 128) times `x` with
/// `w`'s sign, pairs summed into i16 by `maddubs`. With `|x| <= 127` a pair is at most
/// 2 * 128 * 127 = 32512, so the i16 saturation never applies and the sums are exact.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn isums_avx2(
    w: *const u8,
    xc: *const i8,
    b0: usize,
    n: usize,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut s = [_mm256_setzero_si256(); 8];
    for (j, sj) in s.iter_mut().enumerate().take(n) {
        let p = w.add((b0 + j) * BLOCK_BYTES + 2);
        let wv = _mm256_loadu_si256(p as *const __m256i);
        let xv = _mm256_loadu_si256(xc.add((b0 + j) * QK) as *const __m256i);
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        *sj = _mm256_madd_epi16(pairs, ones);
    }
    _mm256_cvtepi32_ps(hsum8(s))
}

/// All-ones in lanes `0..n`, zero in the others.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes_below(n: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx))
}

/// Lane `r` = the sum of the 8 lanes of `s[r]` (i32 adds: exact, so their order is free).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum8(s: [std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    let b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// The xor butterfly on partials `8v + j` = lane `j` of `a[v]`: after step `o` every lane
/// `l` holds `v[l] + v[l ^ o]`, as in the warp; lane 0 is the result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn butterfly_avx2(a: [std::arch::x86_64::__m256; 4]) -> f32 {
    use std::arch::x86_64::*;
    // o = 16: lanes 0..15 (16..31 hold the same sums).
    let (b0, b1) = (_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    // o = 8: lanes 0..7.
    let c = _mm256_add_ps(b0, b1);
    // o = 4: the other 128-bit half; o = 2, 1: within each half.
    let c = _mm256_add_ps(c, _mm256_permute2f128_ps::<1>(c, c));
    let c = _mm256_add_ps(c, _mm256_permute_ps::<0b01_00_11_10>(c));
    let c = _mm256_add_ps(c, _mm256_permute_ps::<0b10_11_00_01>(c));
    _mm256_cvtss_f32(c)
}

/// [`row_avx2`] on NEON: partials `4v..4v+4` in vector `v`, 4 blocks per step.
#[cfg(target_arch = "aarch64")]
unsafe fn row_neon(row: &[u8], x: &Q8Act, dots: &mut [f32]) {
    use std::arch::aarch64::*;
    let (k, nb) = (x.k, x.k / QK);
    for (c, dot) in dots.iter_mut().enumerate() {
        let xc = x.q.as_ptr().add(c * k);
        let dc = &x.d[c * nb..(c + 1) * nb];
        let mut acc = [vdupq_n_f32(0.0); 8];
        let mut b0 = 0;
        while b0 < nb {
            let n = (nb - b0).min(4);
            let mut s = [vdupq_n_s32(0); 4];
            let mut dwdx = [0f32; 4];
            for j in 0..n {
                let b = b0 + j;
                let p = row.as_ptr().add(b * BLOCK_BYTES);
                dwdx[j] = block_scale(&row[b * BLOCK_BYTES..]) * dc[b];
                let w0 = vld1q_s8(p.add(2) as *const i8);
                let w1 = vld1q_s8(p.add(18) as *const i8);
                let x0 = vld1q_s8(xc.add(b * QK));
                let x1 = vld1q_s8(xc.add(b * QK + 16));
                // Each i16 product fits (|p| <= 16384); pairs are summed in i32: exact.
                let mut t = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
                t = vpadalq_s16(t, vmull_high_s8(w0, x0));
                t = vpadalq_s16(t, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
                s[j] = vpadalq_s16(t, vmull_high_s8(w1, x1));
            }
            // Lane j = block b0 + j's exact isum.
            let isum = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            let a = &mut acc[(b0 / 4) % 8];
            let stepped = vfmaq_f32(*a, vld1q_f32(dwdx.as_ptr()), vcvtq_f32_s32(isum));
            // Lanes past the row's last block keep their partial.
            let keep = vcltq_u32(vld1q_u32([0u32, 1, 2, 3].as_ptr()), vdupq_n_u32(n as u32));
            *a = vbslq_f32(keep, stepped, *a);
            b0 += 4;
        }
        // The butterfly: o = 16, 8 across vectors, 4 across vectors, 2, 1 within one.
        let b: [float32x4_t; 4] = std::array::from_fn(|v| vaddq_f32(acc[v], acc[v + 4]));
        let c2 = [vaddq_f32(b[0], b[2]), vaddq_f32(b[1], b[3])];
        let d = vaddq_f32(c2[0], c2[1]);
        let e = vaddq_f32(d, vextq_f32::<2>(d, d));
        let f = vaddq_f32(e, vrev64q_f32(e));
        *dot = vgetq_lane_f32::<0>(f);
    }
}
