//! Twin of `kernels/quantize.cu`: f32 activations into blocks of 32 int8 with one scale (an
//! f16 value kept as f32), the input of the Q8_0 GEMM: ggml's `block_q8_0`, which llama.cpp's
//! CPU matmuls quantize activations into for Q8_0 weights.
//!
//! Layout, planar as on the GPU: `q[32b + i]` is element `i` of block `b`, `d[b]` its scale;
//! rows are consecutive, so `rows x k` values make `rows * k / 32` blocks.
//!
//! Per block: `amax = max |x|`, `d = amax / 127`, `id = d != 0 ? 1 / d : 0`,
//! `q = round(x * id)` (half away from zero, as `roundf`), then `d` rounded to f16 (the
//! quants keep the unrounded `id`, as in ggml). Each step is one correctly rounded
//! IEEE operation on both sides, and the maximum does not depend on order, so every path
//! here equals the kernel bit for bit (for finite inputs).

use super::gemv::{check_len, usable, ShapeError};
use super::simd::Isa;
use crate::q8::{LayoutError, QK};

/// Quantized activations: `rows` rows of `k` values.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Act {
    /// `rows * k` quants, block after block.
    pub q: Vec<i8>,
    /// `rows * k / 32` scales.
    pub d: Vec<f32>,
    pub rows: usize,
    pub k: usize,
}

impl Q8Act {
    /// Checks that `q` and `d` hold `rows` rows of `k` values.
    pub fn new(q: Vec<i8>, d: Vec<f32>, rows: usize, k: usize) -> Result<Self, ShapeError> {
        let act = Self { q, d, rows, k };
        act.check()?;
        Ok(act)
    }

    pub(crate) fn check(&self) -> Result<(), ShapeError> {
        check_k(self.k)?;
        check_len("q", self.q.len(), self.rows, self.k)?;
        check_len("d", self.d.len(), self.rows, self.k / QK)
    }

    /// Back to f32 (`d * q`), for tests and references.
    pub fn dequantize(&self) -> Vec<f32> {
        self.q
            .chunks_exact(QK)
            .zip(&self.d)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * f32::from(v)))
            .collect()
    }
}

fn check_k(k: usize) -> Result<(), ShapeError> {
    if k == 0 || k % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k }.into());
    }
    Ok(())
}

/// Quantizes `x`, rows of `k` values (a multiple of 32).
pub fn quantize(isa: Isa, x: &[f32], k: usize) -> Result<Q8Act, ShapeError> {
    check_k(k)?;
    if x.len() % k != 0 {
        return Err(ShapeError::Len {
            what: "x",
            expected: x.len() / k * k,
            got: x.len(),
        });
    }
    let rows = x.len() / k;
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; x.len() / QK];
    quantize_into(isa, x, &mut q, &mut d)?;
    Ok(Q8Act { q, d, rows, k })
}

/// [`quantize`] with the best ISA this CPU has.
pub fn quantize_auto(x: &[f32], k: usize) -> Result<Q8Act, ShapeError> {
    quantize(Isa::detect(), x, k)
}

/// Quantizes `x` (a multiple of 32 long) into `q` (as long) and `d` (one per 32).
pub fn quantize_into(isa: Isa, x: &[f32], q: &mut [i8], d: &mut [f32]) -> Result<(), ShapeError> {
    if x.len() % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k: x.len() }.into());
    }
    check_len("q", q.len(), x.len(), 1)?;
    check_len("d", d.len(), x.len() / QK, 1)?;
    let isa = usable(isa);
    for ((xb, qb), db) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(d.iter_mut())
    {
        *db = match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `usable` only returns Avx2 where the CPU has AVX2 and FMA.
            Isa::Avx2 => unsafe { block_avx2(xb, qb) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: NEON is baseline on aarch64.
            Isa::Neon => unsafe { block_neon(xb, qb) },
            _ => block_scalar(xb, qb),
        };
        // Stored as f16, as ggml stores it; the quants above used the unrounded inverse.
        *db = half::f16::from_f32(*db).to_f32();
    }
    Ok(())
}

/// `d` and its inverse from a block's `max |x|`.
fn scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

fn block_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (d, id) = scales(amax);
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * id).round() as i8;
    }
    d
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(x: &[f32], q: &mut [i8]) -> f32 {
    use std::arch::x86_64::*;
    let p = x[..QK].as_ptr();
    let sign = _mm256_set1_ps(-0.0);
    let v = [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ];
    let m = v.iter().fold(_mm256_setzero_ps(), |m, &x| {
        _mm256_max_ps(m, _mm256_andnot_ps(sign, x))
    });
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let (d, id) = scales(_mm_cvtss_f32(m));
    let idv = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let mut i = [_mm256_setzero_si256(); 4];
    for (o, &xv) in i.iter_mut().zip(&v) {
        let y = _mm256_mul_ps(xv, idv);
        // roundf: truncate, then step away from zero when the dropped part is >= 1/2
        // (y - trunc(y) is exact; adding 0.5 first would round some values wrongly).
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
        let step = _mm256_or_ps(one, _mm256_and_ps(sign, y));
        *o = _mm256_cvtps_epi32(_mm256_add_ps(t, _mm256_and_ps(away, step)));
    }
    // Packs work per 128-bit lane; the permute puts the 4-byte groups back in order.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q[..QK].as_mut_ptr() as *mut __m256i, w);
    d
}

#[cfg(target_arch = "aarch64")]
unsafe fn block_neon(x: &[f32], q: &mut [i8]) -> f32 {
    use std::arch::aarch64::*;
    let p = x[..QK].as_ptr();
    let mut v = [vdupq_n_f32(0.0); 8];
    let mut m = vdupq_n_f32(0.0);
    for (j, vj) in v.iter_mut().enumerate() {
        *vj = vld1q_f32(p.add(4 * j));
        m = vmaxq_f32(m, vabsq_f32(*vj));
    }
    let (d, id) = scales(vmaxvq_f32(m));
    let idv = vdupq_n_f32(id);
    let out = q[..QK].as_mut_ptr();
    for h in 0..4 {
        // vrndaq: round to nearest, ties away from zero, exactly roundf.
        let a = vcvtq_s32_f32(vrndaq_f32(vmulq_f32(v[2 * h], idv)));
        let b = vcvtq_s32_f32(vrndaq_f32(vmulq_f32(v[2 * h + 1], idv)));
        let n = vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b)));
        vst1_s8(out.add(8 * h), n);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_half_away_from_zero_on_every_isa() {
        // Scale 1 (amax 127): x * id lands on exact halves and just below them.
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49999997;
        x[4] = -0.5;
        x[5] = 126.5;
        for isa in Isa::available() {
            let a = quantize(isa, &x, 32).unwrap();
            assert_eq!(&a.q[..6], &[127, 3, -3, 0, -1, 127], "{isa:?}");
        }
    }
}
