//! Twin of `kernels/fused.cu`: the decode step's fused kernels, each the composition of
//! existing twins in the order the kernel runs them (the kernel replays their kernels'
//! arithmetic operation for operation), so each gives the GPU's bits exactly when its parts
//! do. The rows of a fused projection are `[n_tok][width]` with the parts side by side:
//! q|k|v (`n_head + 2 n_head_kv` heads) and gate|up (`2 n_ff`).

use half::f16;

use super::attention::{attention_decode, AttnShape};
use super::elementwise::silu_mul;
use super::quantize;
use super::rmsnorm::rmsnorm;
use super::rope::{rope_inplace, Rope};
use super::simd::Isa;
use super::vector::{check_len, ShapeError};
use crate::q8::QK;

/// [`quantize::quantize_into`] with its error as the op twins' [`ShapeError`].
fn quantize_into(isa: Isa, x: &[f32], q: &mut [i8], d: &mut [f32]) -> Result<(), ShapeError> {
    quantize::quantize_into(isa, x, q, d).map_err(|e| ShapeError::Unsupported(e.to_string()))
}

/// `rmsnorm_quantize_f32`: row `rows[m]` of `x` (rows of `w.len()`) normalized, then
/// quantized into row `m` of `q` / `d`.
pub fn rmsnorm_quantize(
    isa: Isa,
    x: &[f32],
    rows: &[usize],
    w: &[f32],
    eps: f32,
    q: &mut [i8],
    d: &mut [f32],
) -> Result<(), ShapeError> {
    let n = w.len();
    check_len("rmsnorm_quantize q", q.len(), rows.len() * n)?;
    check_len("rmsnorm_quantize d", d.len(), rows.len() * n / QK)?;
    let mut y = vec![0f32; n];
    for (m, &r) in rows.iter().enumerate() {
        let xr = x.get(r * n..(r + 1) * n).ok_or_else(|| {
            ShapeError::Unsupported(format!("rmsnorm_quantize: row {r} outside x"))
        })?;
        rmsnorm(isa, xr, w, eps, &mut y)?;
        quantize_into(
            isa,
            &y,
            &mut q[m * n..(m + 1) * n],
            &mut d[m * n / QK..(m + 1) * n / QK],
        )?;
    }
    Ok(())
}

/// `rope_store_f32`: in each fused q|k|v row of `qkv`, the q heads (shape `rope`) and the
/// `n_head_kv` k heads rotated for position `pos[t]`, then k and v rounded to f16 into cell
/// `cells[t]` of `kc` / `vc`.
pub fn rope_store(
    rope: &Rope,
    n_head_kv: usize,
    qkv: &mut [f32],
    pos: &[i32],
    cells: &[usize],
    kc: &mut [u16],
    vc: &mut [u16],
) -> Result<(), ShapeError> {
    let (qd, kvd) = (rope.n_head * rope.head_dim, n_head_kv * rope.head_dim);
    let width = qd + 2 * kvd;
    check_len("rope_store qkv", qkv.len(), pos.len() * width)?;
    check_len("rope_store cells", cells.len(), pos.len())?;
    check_len("rope_store v cache", vc.len(), kc.len())?;
    let qk = Rope {
        n_head: rope.n_head + n_head_kv,
        ..*rope
    };
    for ((row, &p), &cell) in qkv.chunks_exact_mut(width).zip(pos).zip(cells) {
        rope_inplace(&qk, &mut row[..qd + kvd], &[p])?;
        let dst = kc
            .get_mut(cell * kvd..(cell + 1) * kvd)
            .ok_or_else(|| ShapeError::Unsupported(format!("rope_store: cell {cell} outside")))?;
        for (o, &x) in dst.iter_mut().zip(&row[qd..qd + kvd]) {
            *o = f16::from_f32(x).to_bits();
        }
        for (o, &x) in vc[cell * kvd..(cell + 1) * kvd]
            .iter_mut()
            .zip(&row[qd + kvd..])
        {
            *o = f16::from_f32(x).to_bits();
        }
    }
    Ok(())
}

/// `attn_step_f16`: token `t` (its q heads in fused q|k|v row `t`) attends positions
/// `0..=pos[t]` of the sequence whose position 0 is cell `cells[t] - pos[t]` of the caches
/// `k` / `v` (sequences of `shape.n_ctx` cells; `shape.n_seq` is 1), in chunks of `chunk`;
/// the result goes to row `t` of `out` and, quantized, of `q` / `d`.
#[allow(clippy::too_many_arguments)]
pub fn attention_step(
    isa: Isa,
    shape: &AttnShape,
    qkv: &[f32],
    k: &[u16],
    v: &[u16],
    pos: &[i32],
    cells: &[usize],
    chunk: usize,
    out: &mut [f32],
    q: &mut [i8],
    d: &mut [f32],
) -> Result<(), ShapeError> {
    shape.check()?;
    let (qd, kvd) = (shape.q_len(), shape.n_head_kv * shape.head_dim);
    let width = qd + 2 * kvd;
    let n_tok = pos.len();
    check_len("attention_step qkv", qkv.len(), n_tok * width)?;
    check_len("attention_step cells", cells.len(), n_tok)?;
    check_len("attention_step out", out.len(), n_tok * qd)?;
    let seq = shape.kv_len();
    for (t, (&p, &cell)) in pos.iter().zip(cells).enumerate() {
        let p = usize::try_from(p)
            .map_err(|_| ShapeError::Unsupported(format!("attention_step: position {p}")))?;
        let cell0 = cell.checked_sub(p).map(|c| c * kvd);
        let (Some(ks), Some(vs)) = (
            cell0.and_then(|c| k.get(c..c + seq)),
            cell0.and_then(|c| v.get(c..c + seq)),
        ) else {
            return Err(ShapeError::Unsupported(format!(
                "attention_step: token {t}'s sequence lies outside the caches"
            )));
        };
        let o = &mut out[t * qd..(t + 1) * qd];
        let kv_len = [(p + 1).min(shape.n_ctx)];
        attention_decode(
            isa,
            shape,
            &qkv[t * width..t * width + qd],
            ks,
            vs,
            &kv_len,
            chunk,
            o,
        )?;
    }
    quantize_into(isa, out, q, d)
}

/// `silu_mul_quantize_f32`: `silu(gate) * up` of each fused gate|up row of `gu` (rows of
/// `2 n_ff`), quantized into `q` / `d`.
pub fn silu_mul_quantize(
    isa: Isa,
    gu: &[f32],
    n_ff: usize,
    q: &mut [i8],
    d: &mut [f32],
) -> Result<(), ShapeError> {
    let rows = gu.len() / (2 * n_ff).max(1);
    check_len("silu_mul_quantize gu", gu.len(), rows * 2 * n_ff)?;
    let mut a = vec![0f32; rows * n_ff];
    for (row, o) in gu.chunks_exact(2 * n_ff).zip(a.chunks_exact_mut(n_ff)) {
        silu_mul(&row[..n_ff], &row[n_ff..], o)?;
    }
    quantize_into(isa, &a, q, d)
}
