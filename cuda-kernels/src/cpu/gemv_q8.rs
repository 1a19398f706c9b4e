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
//! The AVX2 path holds partials `8v..8v+8` in the lanes of vector `v`: 8 consecutive blocks
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
/// use this GEMV; the twin itself takes any number, column by column).
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
    let isa = usable(isa);
    let xw = widen(isa, &x.q);
    let w = &w;
    let ep = Epilogue { bias, accumulate };
    // Pieces of at least 16 KiB of weights: below that a job costs more than it saves.
    let min_rows = (16 << 10) / row_bytes(w.k);
    super::pool::split_rows(threads, w.rows, 1, min_rows, y, |r0, cols| {
        rows_range(isa, w, x, &xw, ep, r0, cols)
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

/// The activation quants widened to i16 once per call for the AVX2 path (every row reads
/// them); empty for the scalar path.
fn widen(isa: Isa, q: &[i8]) -> Vec<i16> {
    match isa {
        Isa::Avx2 => q.iter().map(|&v| i16::from(v)).collect(),
        _ => Vec::new(),
    }
}

/// Rows `r0..r0 + cols[0].len()`, updating `cols[c][r - r0]`.
fn rows_range(
    isa: Isa,
    w: &Q8Matrix,
    x: &Q8Act,
    xw: &[i16],
    ep: Epilogue,
    r0: usize,
    mut cols: Vec<&mut [f32]>,
) {
    let n = cols.first().map_or(0, |c| c.len());
    let mut dots = vec![0f32; x.rows];
    for i in 0..n {
        let row = w.row(r0 + i);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `usable` only returns Avx2 where the CPU has AVX2, FMA and F16C.
            Isa::Avx2 => unsafe { row_avx2(row, x, xw, &mut dots) },
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2(row: &[u8], x: &Q8Act, xw: &[i16], dots: &mut [f32]) {
    use std::arch::x86_64::*;
    let (k, nb) = (x.k, x.k / QK);
    debug_assert!(row.len() == nb * BLOCK_BYTES && xw.len() == x.q.len());
    for (c, dot) in dots.iter_mut().enumerate() {
        let xc = xw.as_ptr().add(c * k);
        let dc = x.d.as_ptr().add(c * nb);
        // acc[v] lane j = partial 8v + j.
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut b0 = 0;
        while b0 + 8 <= nb {
            let (dwdx, isum) = chunk_avx2(row.as_ptr(), xc, dc, b0, 8);
            let a = &mut acc[(b0 / 8) % 4];
            *a = _mm256_fmadd_ps(dwdx, isum, *a);
            b0 += 8;
        }
        if b0 < nb {
            // The last nb % 8 blocks: only their lanes take the step, the others keep theirs.
            let n = nb - b0;
            let (dwdx, isum) = chunk_avx2(row.as_ptr(), xc, dc, b0, n);
            let a = &mut acc[(b0 / 8) % 4];
            *a = _mm256_blendv_ps(*a, _mm256_fmadd_ps(dwdx, isum, *a), lanes_below(n));
        }
        *dot = butterfly_avx2(acc);
    }
}

/// Blocks `b0..b0 + n` (n <= 8) of a row against one column: lane `j` holds
/// `dw * dx` and the exact `isum` (as f32) of block `b0 + j`; lanes from `n` on hold zeros
/// (nothing past the row or the column is read).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn chunk_avx2(
    w: *const u8,
    xc: *const i16,
    dc: *const f32,
    b0: usize,
    n: usize,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    let mut s = [_mm256_setzero_si256(); 8];
    let mut h = [0i16; 8];
    for j in 0..n {
        let p = w.add((b0 + j) * BLOCK_BYTES);
        h[j] = (p as *const i16).read_unaligned();
        let xb = xc.add((b0 + j) * QK);
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i));
        let x0 = _mm256_loadu_si256(xb as *const __m256i);
        let x1 = _mm256_loadu_si256(xb.add(16) as *const __m256i);
        // i16 products summed in pairs into i32 (madd): exact.
        s[j] = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
    }
    // f16 scales, converted exactly by F16C.
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
    let dx = if n == 8 {
        _mm256_loadu_ps(dc.add(b0))
    } else {
        _mm256_maskload_ps(dc.add(b0), _mm256_castps_si256(lanes_below(n)))
    };
    (_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(hsum8(s)))
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
