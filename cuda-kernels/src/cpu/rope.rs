//! Twin of `kernels/rope.cu`: rotary position embedding in place on `[n_tok][n_head][head_dim]`.
//!
//! Pair `i < rot_dims / 2` of a head at position `pos` turns by `pos * base^(-2i/rot_dims)`;
//! [`RopeMode::Normal`] pairs dims `(2i, 2i+1)` (llama), [`RopeMode::Neox`] pairs
//! `(i, i + rot_dims/2)` (qwen2); dims from `rot_dims` on are untouched.
//!
//! The angle, its sine and its cosine are computed in f64 from fused multiply-adds and
//! correctly rounded products only (no libm: its sin/cos/pow differ from CUDA's), exactly as
//! the kernel does, so the results are the GPU's bits. The rotation itself is elementwise
//! (two fused operations per value) and runs scalar.

use super::vector::{check_rows, ShapeError};

/// Which dims a rotation pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)`: llama.
    Normal,
    /// Halves `(i, i + rot_dims/2)`: GPT-NeoX, qwen2.
    Neox,
}

/// The shape of one rotation: heads of `head_dim`, the first `rot_dims` rotated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub n_head: usize,
    pub head_dim: usize,
    /// Even, at most `head_dim`.
    pub rot_dims: usize,
    /// The frequency base (10000 for llama 2, 500000 for llama 3, 100000 for SmolLM2).
    pub theta_base: f32,
    pub mode: RopeMode,
}

impl Rope {
    pub(crate) fn check(&self) -> Result<(), ShapeError> {
        if self.rot_dims % 2 != 0 || self.rot_dims > self.head_dim || self.n_head == 0 {
            return Err(ShapeError::Unsupported(format!(
                "rope over {} of {} dims in {} heads: rot_dims must be even and at most head_dim",
                self.rot_dims, self.head_dim, self.n_head
            )));
        }
        if self.theta_base.is_nan() || self.theta_base <= 0.0 {
            return Err(ShapeError::Unsupported(format!(
                "rope base {}",
                self.theta_base
            )));
        }
        Ok(())
    }

    /// `base^(-2 / rot_dims)`, the kernel's `freq_scale` argument (computed here, on the host,
    /// for both).
    pub fn freq_scale(&self) -> f64 {
        (self.theta_base as f64).powf(-2.0 / self.rot_dims as f64)
    }
}

/// `b^e` by binary powering, the kernel's `powi`.
fn powi(mut b: f64, mut e: usize) -> f64 {
    let mut p = 1.0;
    while e > 0 {
        if e & 1 == 1 {
            p *= b;
        }
        b *= b;
        e >>= 1;
    }
    p
}

// The f64 constants are the same values as rope.cu's literals (printed shortest there):
// 2/pi is 0.6366197723675814.
const TWO_OVER_PI: f64 = std::f64::consts::FRAC_2_PI;
// pi/2 in three 33-bit parts (fdlibm's), so that k * part is exact for the k that occur.
const PIO2: [f64; 3] = [
    1.5707963267341256,
    6.077100506303966e-11,
    2.0222662487111665e-21,
];
// (-1)^k / (2k+1)!, k = 7 down to 1, and (-1)^k / (2k)!, k = 8 down to 1.
const SIN: [f64; 7] = [
    -7.647163731819816e-13,
    1.6059043836821613e-10,
    -2.505210838544172e-08,
    2.7557319223985893e-06,
    -0.0001984126984126984,
    0.008333333333333333,
    -0.16666666666666666,
];
const COS: [f64; 8] = [
    4.779477332387385e-14,
    -1.1470745597729725e-11,
    2.08767569878681e-09,
    -2.755731922398589e-07,
    2.48015873015873e-05,
    -0.001388888888888889,
    0.041666666666666664,
    -0.5,
];

/// `(sin a, cos a)` rounded to f32, the kernel's `rope_sincos`.
pub fn sincos(a: f64) -> (f32, f32) {
    let k = (a * TWO_OVER_PI).round_ties_even();
    let mut r = (-k).mul_add(PIO2[0], a);
    r = (-k).mul_add(PIO2[1], r);
    r = (-k).mul_add(PIO2[2], r);
    let r2 = r * r;
    let sp = SIN[1..].iter().fold(SIN[0], |p, &c| p.mul_add(r2, c));
    let sn = (r * r2).mul_add(sp, r);
    let cp = COS[1..].iter().fold(COS[0], |p, &c| p.mul_add(r2, c));
    let cs = cp.mul_add(r2, 1.0);
    let (s, c) = match (k as i64) & 3 {
        0 => (sn, cs),
        1 => (cs, -sn),
        2 => (-sn, -cs),
        _ => (-cs, sn),
    };
    (s as f32, c as f32)
}

/// Rotates `x` (`[pos.len()][n_head][head_dim]`) in place, token `t` at position `pos[t]`.
pub fn rope_inplace(rope: &Rope, x: &mut [f32], pos: &[i32]) -> Result<(), ShapeError> {
    rope.check()?;
    let tok_len = rope.n_head * rope.head_dim;
    let n_tok = check_rows("rope x", x.len(), tok_len)?;
    super::vector::check_len("rope positions", pos.len(), n_tok)?;
    let half = rope.rot_dims / 2;
    let fs = rope.freq_scale();
    for (xt, &p) in x.chunks_exact_mut(tok_len).zip(pos) {
        for i in 0..half {
            let (s, c) = sincos(p as f64 * powi(fs, i));
            let (i0, i1) = match rope.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            for head in xt.chunks_exact_mut(rope.head_dim) {
                let (x0, x1) = (head[i0], head[i1]);
                head[i0] = x0.mul_add(c, -(x1 * s));
                head[i1] = x0.mul_add(s, x1 * c);
            }
        }
    }
    Ok(())
}
