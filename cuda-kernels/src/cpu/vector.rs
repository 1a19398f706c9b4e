//! What the op twins (rmsnorm, rope, elementwise, embed, softmax, attention) share: their
//! shape error, the exp they and their kernels compute, the mirror of a CUDA block
//! reduction, and the few vector loops their hot paths run on AVX2+FMA, NEON or scalar.
//!
//! Every path computes each element with the same correctly rounded IEEE operations in the
//! same order (fused multiply-adds where the kernel writes `fmaf`), so Scalar, AVX2 and NEON
//! agree bit for bit with each other and with the GPU; only their speed differs.

use super::simd::Isa;

/// An input whose shape does not fit the op.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("{what} holds {got} values, {expected} expected")]
    Len {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{what} holds {got} values, not a multiple of {of}")]
    NotMultiple {
        what: &'static str,
        got: usize,
        of: usize,
    },
    #[error("token {token} at index {index} is outside the vocabulary of {n_vocab}")]
    Token {
        index: usize,
        token: i64,
        n_vocab: usize,
    },
    #[error("unsupported shape: {0}")]
    Unsupported(String),
}

/// `what` must hold exactly `expected` values.
pub(crate) fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), ShapeError> {
    if got == expected {
        Ok(())
    } else {
        Err(ShapeError::Len {
            what,
            expected,
            got,
        })
    }
}

/// `what` must be a whole number of `of`-value rows (and `of` not zero).
pub(crate) fn check_rows(what: &'static str, got: usize, of: usize) -> Result<usize, ShapeError> {
    if of == 0 || got % of != 0 {
        Err(ShapeError::NotMultiple { what, got, of })
    } else {
        Ok(got / of)
    }
}

// expf's constants: the shortest literals of the f32 values, the same text as in the
// kernels' `il_expf` (so both compilers pick the same bits).
const LOG2E: f32 = std::f32::consts::LOG2_E; // 0x3fb8aa3b, the kernels' 1.442695f
const LN2_HI: f32 = 0.69314575; // 0x3f317200, exact in 16 bits so k * LN2_HI is exact
const LN2_LO: f32 = 1.4286068e-6; // 0x35bfbe8e
                                  // Taylor coefficients 1/7! … 1/2!; degree 7 leaves < 0.1 ulp on |r| <= ln2/2.
const C7: f32 = 0.0001984127;
const C6: f32 = 0.0013888889;
const C5: f32 = 0.008333334;
const C4: f32 = 0.041666668;
const C3: f32 = 0.16666667;
const C2: f32 = 0.5;
/// Below this exp flushes to 0 (the result would be under 2^-125 anyway).
const EXP_LO: f32 = -87.0;
/// Inputs clamp here so that 2^k stays a normal float.
const EXP_HI: f32 = 88.0;

/// e^x as the kernels compute it (`il_expf` in each `.cu`): k = rint(x log2 e), r = x - k ln2
/// in two fused steps, a degree-7 Taylor polynomial in Horner form, times 2^k built from bits.
/// About 1 ulp from the true value; not libm's exp, which differs between CPU and GPU.
#[inline]
pub fn expf(x: f32) -> f32 {
    if x < EXP_LO {
        return 0.0;
    }
    let x = x.min(EXP_HI);
    let k = (x * LOG2E).round_ties_even();
    let r = (-k).mul_add(LN2_HI, x);
    let r = (-k).mul_add(LN2_LO, r);
    let mut p = C7;
    p = p.mul_add(r, C6);
    p = p.mul_add(r, C5);
    p = p.mul_add(r, C4);
    p = p.mul_add(r, C3);
    p = p.mul_add(r, C2);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    p * f32::from_bits(((k as i32 + 127) << 23) as u32)
}

/// The sum a warp's xor butterfly (offsets 16, 8, 4, 2, 1) leaves in every lane: the
/// additions commute exactly, so lane 0's tree is every lane's.
#[inline]
pub fn warp_sum(v: &mut [f32; 32]) -> f32 {
    let mut off = 16;
    while off > 0 {
        for i in 0..off {
            v[i] += v[i + off];
        }
        off >>= 1;
    }
    v[0]
}

/// The kernels' `block_sum`: each warp sums its 32 threads' partials, then every warp sums
/// the warp totals padded with zeros to 32 lanes. `partials` holds one value per thread (a
/// multiple of 32, at most 1024 threads).
pub fn block_sum(partials: &[f32]) -> f32 {
    let mut warps = [0f32; 32];
    for (w, lanes) in warps.iter_mut().zip(partials.chunks_exact(32)) {
        let mut v = [0f32; 32];
        v.copy_from_slice(lanes);
        *w = warp_sum(&mut v);
    }
    warp_sum(&mut warps)
}

/// Per-thread partial sums of a block-strided loop: thread `t` of `threads` adds, in order,
/// `f(i)` for `i = t, t + threads, …`, starting from 0. `step(acc, chunk, base)` applies one
/// stride of the loop to the threads `0..chunk` (a vector loop across threads).
pub(crate) fn strided_partials(
    n: usize,
    threads: usize,
    mut step: impl FnMut(&mut [f32], usize),
) -> Vec<f32> {
    let mut acc = vec![0f32; threads];
    let mut base = 0;
    while base < n {
        let m = threads.min(n - base);
        step(&mut acc[..m], base);
        base += threads;
    }
    acc
}

#[cfg(target_arch = "x86_64")]
fn avx2_ok() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// The vector path `isa` asks for, if this CPU has it (else the scalar one, same results).
#[derive(Clone, Copy)]
enum Path {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

fn path(isa: Isa) -> Path {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if avx2_ok() => Path::Avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Path::Neon,
        _ => Path::Scalar,
    }
}

/// `acc[i] = fma(a[i], b[i], acc[i])` over the common length.
pub fn fma_acc(isa: Isa, acc: &mut [f32], a: &[f32], b: &[f32]) {
    let n = acc.len().min(a.len()).min(b.len());
    let (acc, a, b) = (&mut acc[..n], &a[..n], &b[..n]);
    match path(isa) {
        // SAFETY: the CPU has the features (checked by `path`); lengths are equal.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::fma_acc(acc, a, b) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { arm::fma_acc(acc, a, b) },
        Path::Scalar => {
            for ((c, x), y) in acc.iter_mut().zip(a).zip(b) {
                *c = x.mul_add(*y, *c);
            }
        }
    }
}

/// `acc[i] = fma(s, b[i], acc[i])` over the common length.
pub fn axpy(isa: Isa, acc: &mut [f32], s: f32, b: &[f32]) {
    let n = acc.len().min(b.len());
    let (acc, b) = (&mut acc[..n], &b[..n]);
    match path(isa) {
        // SAFETY: as in `fma_acc`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::axpy(acc, s, b) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { arm::axpy(acc, s, b) },
        Path::Scalar => {
            for (c, y) in acc.iter_mut().zip(b) {
                *c = s.mul_add(*y, *c);
            }
        }
    }
}

/// `acc[i] = acc[i] + a[i]` over the common length.
pub fn add_acc(isa: Isa, acc: &mut [f32], a: &[f32]) {
    let n = acc.len().min(a.len());
    let (acc, a) = (&mut acc[..n], &a[..n]);
    match path(isa) {
        // SAFETY: as in `fma_acc`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::add_acc(acc, a) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { arm::add_acc(acc, a) },
        Path::Scalar => {
            for (c, x) in acc.iter_mut().zip(a) {
                *c += *x;
            }
        }
    }
}

/// `x[i] = expf(x[i] - m)`.
pub fn exp_sub(isa: Isa, x: &mut [f32], m: f32) {
    match path(isa) {
        // SAFETY: as in `fma_acc`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::exp_sub(x, m) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { arm::exp_sub(x, m) },
        Path::Scalar => {
            for v in x.iter_mut() {
                *v = expf(*v - m);
            }
        }
    }
}

/// `x[i] = x[i] / s` (a correctly rounded division on every path, like `__fdiv_rn`).
pub fn div(isa: Isa, x: &mut [f32], s: f32) {
    match path(isa) {
        // SAFETY: as in `fma_acc`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::div(x, s) },
        #[cfg(target_arch = "aarch64")]
        Path::Neon => unsafe { arm::div(x, s) },
        Path::Scalar => {
            for v in x.iter_mut() {
                *v /= s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma_acc(acc: &mut [f32], a: &[f32], b: &[f32]) {
        let n = acc.len();
        let mut i = 0;
        while i + 8 <= n {
            let c = _mm256_loadu_ps(acc.as_ptr().add(i));
            let x = _mm256_loadu_ps(a.as_ptr().add(i));
            let y = _mm256_loadu_ps(b.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(x, y, c));
            i += 8;
        }
        for j in i..n {
            acc[j] = a[j].mul_add(b[j], acc[j]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(acc: &mut [f32], s: f32, b: &[f32]) {
        let n = acc.len();
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= n {
            let c = _mm256_loadu_ps(acc.as_ptr().add(i));
            let y = _mm256_loadu_ps(b.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(vs, y, c));
            i += 8;
        }
        for j in i..n {
            acc[j] = s.mul_add(b[j], acc[j]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn add_acc(acc: &mut [f32], a: &[f32]) {
        let n = acc.len();
        let mut i = 0;
        while i + 8 <= n {
            let c = _mm256_loadu_ps(acc.as_ptr().add(i));
            let x = _mm256_loadu_ps(a.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_add_ps(c, x));
            i += 8;
        }
        for j in i..n {
            acc[j] += a[j];
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let lo = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
        // The lower clamp only keeps 2^k normal in lanes that are zeroed below.
        let xc = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(EXP_HI)),
            _mm256_set1_ps(EXP_LO),
        );
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(C7);
        for c in [C6, C5, C4, C3, C2, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
        let s = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
        _mm256_andnot_ps(lo, _mm256_mul_ps(p, s))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sub(x: &mut [f32], m: f32) {
        let n = x.len();
        let vm = _mm256_set1_ps(m);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vm);
            _mm256_storeu_ps(x.as_mut_ptr().add(i), exp8(v));
            i += 8;
        }
        for v in &mut x[i..] {
            *v = expf(*v - m);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn div(x: &mut [f32], s: f32) {
        let n = x.len();
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), _mm256_div_ps(v, vs));
            i += 8;
        }
        for v in &mut x[i..] {
            *v /= s;
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::*;

    #[target_feature(enable = "neon")]
    pub unsafe fn fma_acc(acc: &mut [f32], a: &[f32], b: &[f32]) {
        let n = acc.len();
        let mut i = 0;
        while i + 4 <= n {
            let c = vld1q_f32(acc.as_ptr().add(i));
            let x = vld1q_f32(a.as_ptr().add(i));
            let y = vld1q_f32(b.as_ptr().add(i));
            vst1q_f32(acc.as_mut_ptr().add(i), vfmaq_f32(c, x, y));
            i += 4;
        }
        for j in i..n {
            acc[j] = a[j].mul_add(b[j], acc[j]);
        }
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn axpy(acc: &mut [f32], s: f32, b: &[f32]) {
        let n = acc.len();
        let vs = vdupq_n_f32(s);
        let mut i = 0;
        while i + 4 <= n {
            let c = vld1q_f32(acc.as_ptr().add(i));
            let y = vld1q_f32(b.as_ptr().add(i));
            vst1q_f32(acc.as_mut_ptr().add(i), vfmaq_f32(c, vs, y));
            i += 4;
        }
        for j in i..n {
            acc[j] = s.mul_add(b[j], acc[j]);
        }
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn add_acc(acc: &mut [f32], a: &[f32]) {
        let n = acc.len();
        let mut i = 0;
        while i + 4 <= n {
            let c = vld1q_f32(acc.as_ptr().add(i));
            let x = vld1q_f32(a.as_ptr().add(i));
            vst1q_f32(acc.as_mut_ptr().add(i), vaddq_f32(c, x));
            i += 4;
        }
        for j in i..n {
            acc[j] += a[j];
        }
    }

    #[target_feature(enable = "neon")]
    unsafe fn exp4(x: float32x4_t) -> float32x4_t {
        let lo = vcltq_f32(x, vdupq_n_f32(EXP_LO));
        // The lower clamp only keeps 2^k normal in lanes that are zeroed below; the `nm`
        // forms return the number for a NaN input, as fminf does.
        let xc = vmaxnmq_f32(vminnmq_f32(x, vdupq_n_f32(EXP_HI)), vdupq_n_f32(EXP_LO));
        let k = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(LOG2E)));
        let r = vfmsq_f32(xc, k, vdupq_n_f32(LN2_HI));
        let r = vfmsq_f32(r, k, vdupq_n_f32(LN2_LO));
        let mut p = vdupq_n_f32(C7);
        for c in [C6, C5, C4, C3, C2, 1.0, 1.0] {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let e = vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127));
        let s = vreinterpretq_f32_s32(vshlq_n_s32::<23>(e));
        vbslq_f32(lo, vdupq_n_f32(0.0), vmulq_f32(p, s))
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn exp_sub(x: &mut [f32], m: f32) {
        let n = x.len();
        let vm = vdupq_n_f32(m);
        let mut i = 0;
        while i + 4 <= n {
            let v = vsubq_f32(vld1q_f32(x.as_ptr().add(i)), vm);
            vst1q_f32(x.as_mut_ptr().add(i), exp4(v));
            i += 4;
        }
        for v in &mut x[i..] {
            *v = expf(*v - m);
        }
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn div(x: &mut [f32], s: f32) {
        let n = x.len();
        let vs = vdupq_n_f32(s);
        let mut i = 0;
        while i + 4 <= n {
            let v = vld1q_f32(x.as_ptr().add(i));
            vst1q_f32(x.as_mut_ptr().add(i), vdivq_f32(v, vs));
            i += 4;
        }
        for v in &mut x[i..] {
            *v /= s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm_and_flushes_below_the_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let e = expf(x) as f64;
            let r = (x as f64).exp();
            worst = worst.max(((e - r) / r).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(expf(-87.5), 0.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(0.0), 1.0);
        // The kernels write these as literals.
        assert_eq!(LOG2E.to_bits(), 0x3fb8_aa3b);
        assert_eq!(LN2_HI.to_bits(), 0x3f31_7200);
        assert_eq!(LN2_LO.to_bits(), 0x35bf_be8e);
    }

    #[test]
    fn vector_paths_equal_scalar_bit_for_bit() {
        let x: Vec<f32> = (0..203)
            .map(|i| (i as f32 * 0.731).sin() * 90.0 - 40.0)
            .collect();
        for isa in Isa::available() {
            let mut a = x.clone();
            exp_sub(isa, &mut a, 3.0);
            let mut b = x.clone();
            exp_sub(Isa::Scalar, &mut b, 3.0);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{isa:?}"
            );
        }
    }
}
