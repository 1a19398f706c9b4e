//! Launch wrappers for `fused.cu`, the decode step's fused kernels; their twins are in
//! [`crate::cpu::fused`] and the layouts are the twins'. Every per-token value (tokens'
//! positions, KV cells, wanted rows) is read on the device, so a launch's arguments depend
//! only on the shapes and the buffers: a captured launch replays right for any step of the
//! same token count.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::ops::OpError;
use super::Gpu;
use crate::cpu::attention::{self, AttnShape};
use crate::cpu::rmsnorm;
use crate::cpu::rope::{Rope, RopeMode};
use crate::cpu::vector::ShapeError;
use crate::q8::QK;

/// Threads per block of `rope_store_f32` (`ROPE_THREADS`).
pub const ROPE_THREADS: usize = 64;
/// Q8 blocks (warps) per thread block of `silu_mul_quantize_f32`.
pub const SILU_BLOCKS_PER_CTA: usize = 8;

fn int(what: &'static str, n: usize) -> Result<i32, ShapeError> {
    i32::try_from(n).map_err(|_| ShapeError::Unsupported(format!("{what} = {n} exceeds i32")))
}

fn grid(x: usize, y: usize, threads: usize) -> Result<LaunchConfig, ShapeError> {
    let x = u32::try_from(x)
        .map_err(|_| ShapeError::Unsupported(format!("{x} blocks in one launch")))?;
    let y = u32::try_from(y)
        .ok()
        .filter(|&y| y <= 65_535)
        .ok_or_else(|| ShapeError::Unsupported(format!("grid y of {y}")))?;
    Ok(LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn same(what: &'static str, got: usize, expected: usize) -> Result<(), ShapeError> {
    crate::cpu::vector::check_len(what, got, expected)
}

fn blocks_of(what: &'static str, n: usize) -> Result<(), ShapeError> {
    if n == 0 || n % QK != 0 {
        return Err(ShapeError::NotMultiple {
            what,
            got: n,
            of: QK,
        });
    }
    Ok(())
}

/// `rmsnorm_quantize_f32`: row `rows[m]` of `x` (rows of `w.len()`, `rows` on the device)
/// normalized and quantized into row `m` of `q` / `d`, for `m < n_rows`; without `rows`, row
/// `m` of `x` (name a type for the `None`: `None::<&CudaSlice<i32>>`).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_quantize<R: DevicePtr<i32>>(
    gpu: &Gpu,
    x: &impl DevicePtr<f32>,
    rows: Option<&R>,
    n_rows: usize,
    w: &impl DevicePtr<f32>,
    eps: f32,
    q: &mut impl DevicePtrMut<i8>,
    d: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    let n = w.len();
    blocks_of("rmsnorm_quantize row", n)?;
    same("rmsnorm_quantize q", q.len(), n_rows * n)?;
    same("rmsnorm_quantize d", d.len(), n_rows * n / QK)?;
    if rows.is_none() && x.len() < n_rows * n {
        same("rmsnorm_quantize x", x.len(), n_rows * n)?;
    }
    if let Some(r) = rows {
        same("rmsnorm_quantize rows", r.len(), n_rows)?;
    }
    if n_rows == 0 {
        return Ok(());
    }
    let f = gpu.function("fused", "rmsnorm_quantize_f32")?;
    let (xp, _gx) = x.device_ptr(&gpu.stream);
    let (rp, _gr) = match rows {
        Some(r) => {
            let (p, g) = r.device_ptr(&gpu.stream);
            (p, Some(g))
        }
        None => (0, None),
    };
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let (qp, _gq) = q.device_ptr_mut(&gpu.stream);
    let (dp, _gd) = d.device_ptr_mut(&gpu.stream);
    let n_i = int("rmsnorm_quantize n", n)?;
    let cfg = grid(n_rows, 1, rmsnorm::THREADS)?;
    // SAFETY: q and d hold n_rows rows (checked); the row indices are the caller's, into x
    // (the pass builds them from its own batch); the argument list matches the kernel.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&rp)
            .arg(&wp)
            .arg(&qp)
            .arg(&dp)
            .arg(&n_i)
            .arg(&eps)
            .launch(cfg)?;
    }
    Ok(())
}

/// `rope_store_f32`: RoPE of the q heads (shape `rope`) and the `n_head_kv` k heads of each
/// fused q|k|v row of `qkv`, token `t` at `pos[t]`, then its k and v as f16 into cell
/// `cells[t]` of `kc` / `vc` (cells outside the caches are skipped on the device).
#[allow(clippy::too_many_arguments)]
pub fn rope_store(
    gpu: &Gpu,
    rope: &Rope,
    n_head_kv: usize,
    qkv: &mut impl DevicePtrMut<f32>,
    pos: &impl DevicePtr<i32>,
    cells: &impl DevicePtr<i32>,
    kc: &mut impl DevicePtrMut<u16>,
    vc: &mut impl DevicePtrMut<u16>,
) -> Result<(), OpError> {
    rope.check()?;
    let n_tok = pos.len();
    let kvd = n_head_kv * rope.head_dim;
    same(
        "rope_store qkv",
        qkv.len(),
        n_tok * (rope.n_head * rope.head_dim + 2 * kvd),
    )?;
    same("rope_store cells", cells.len(), n_tok)?;
    same("rope_store v cache", vc.len(), kc.len())?;
    if n_tok == 0 || kvd == 0 {
        return Ok(());
    }
    let f = gpu.function("fused", "rope_store_f32")?;
    let (xp, _gx) = qkv.device_ptr_mut(&gpu.stream);
    let (pp, _gp) = pos.device_ptr(&gpu.stream);
    let (cp, _gc) = cells.device_ptr(&gpu.stream);
    let n_cells = int("rope_store cells", kc.len() / kvd)?;
    let (kp, _gk) = kc.device_ptr_mut(&gpu.stream);
    let (vp, _gv) = vc.device_ptr_mut(&gpu.stream);
    let n_head = int("rope_store n_head", rope.n_head)?;
    let n_head_kv = int("rope_store n_head_kv", n_head_kv)?;
    let head_dim = int("rope_store head_dim", rope.head_dim)?;
    let rot_dims = int("rope_store rot_dims", rope.rot_dims)?;
    let freq_scale = rope.freq_scale();
    let neox = i32::from(rope.mode == RopeMode::Neox);
    let cfg = grid(n_tok, 1, ROPE_THREADS)?;
    // SAFETY: qkv holds n_tok fused rows and pos / cells n_tok entries (checked); the kernel
    // bounds every cell by n_cells, the caches' size.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&pp)
            .arg(&cp)
            .arg(&kp)
            .arg(&vp)
            .arg(&n_head)
            .arg(&n_head_kv)
            .arg(&head_dim)
            .arg(&rot_dims)
            .arg(&freq_scale)
            .arg(&neox)
            .arg(&n_cells)
            .launch(cfg)?;
    }
    Ok(())
}

/// The buffers [`attention_step`] writes: the result, its quantization, and the split-K
/// workspace ([`AttnShape::workspace_len`] floats for `n_tok` sequences and `n_ctx`).
pub struct AttnOut<'a, O, Q, D, W> {
    pub out: &'a mut O,
    pub q: &'a mut Q,
    pub d: &'a mut D,
    pub workspace: &'a mut W,
}

/// `attn_step_f16`: each token of the step (its q heads in fused q|k|v row `t` of `qkv`)
/// attends positions `0..=pos[t]` of the sequence whose position 0 is cell
/// `cells[t] - pos[t]` of the layer's caches `k` / `v` (`shape.n_ctx` cells per sequence,
/// `shape.n_seq` ignored), in chunks of `chunk`; one launch for the whole step, its grid
/// independent of the lengths.
#[allow(clippy::too_many_arguments)]
pub fn attention_step<O, Q, D, W>(
    gpu: &Gpu,
    shape: &AttnShape,
    qkv: &impl DevicePtr<f32>,
    k: &impl DevicePtr<u16>,
    v: &impl DevicePtr<u16>,
    pos: &impl DevicePtr<i32>,
    cells: &impl DevicePtr<i32>,
    chunk: usize,
    o: AttnOut<'_, O, Q, D, W>,
) -> Result<(), OpError>
where
    O: DevicePtrMut<f32>,
    Q: DevicePtrMut<i8>,
    D: DevicePtrMut<f32>,
    W: DevicePtrMut<f32>,
{
    shape.check()?;
    if chunk == 0 || chunk > attention::CHUNK {
        return Err(ShapeError::Unsupported(format!(
            "attention chunk {chunk}: the kernel takes 1 to {}",
            attention::CHUNK
        ))
        .into());
    }
    let n_tok = pos.len();
    let hd = shape.head_dim;
    let (qd, kvd) = (shape.n_head * hd, shape.n_head_kv * hd);
    same("attention_step qkv", qkv.len(), n_tok * (qd + 2 * kvd))?;
    same("attention_step cells", cells.len(), n_tok)?;
    same("attention_step out", o.out.len(), n_tok * qd)?;
    same("attention_step q", o.q.len(), n_tok * qd)?;
    same("attention_step d", o.d.len(), n_tok * qd / QK)?;
    same("attention_step v", v.len(), k.len())?;
    let step = AttnShape {
        n_seq: n_tok.max(1),
        ..*shape
    };
    let max_chunks = AttnShape::chunks(shape.n_ctx, chunk).max(1);
    let ws = step.workspace_len(shape.n_ctx, chunk);
    if o.workspace.len() < ws {
        return Err(ShapeError::Len {
            what: "attention workspace",
            expected: ws,
            got: o.workspace.len(),
        }
        .into());
    }
    if n_tok == 0 {
        return Ok(());
    }
    let f = gpu.function("fused", "attn_step_f16")?;
    let n_cells = int("attention_step cells", k.len() / kvd)?;
    let (qp, _g0) = qkv.device_ptr(&gpu.stream);
    let (kp, _g1) = k.device_ptr(&gpu.stream);
    let (vp, _g2) = v.device_ptr(&gpu.stream);
    let (pp, _g3) = pos.device_ptr(&gpu.stream);
    let (cp, _g4) = cells.device_ptr(&gpu.stream);
    let (wp, _g5) = o.workspace.device_ptr_mut(&gpu.stream);
    let (op, _g6) = o.out.device_ptr_mut(&gpu.stream);
    let (oqp, _g7) = o.q.device_ptr_mut(&gpu.stream);
    let (odp, _g8) = o.d.device_ptr_mut(&gpu.stream);
    let n_head = int("attention n_head", shape.n_head)?;
    let n_head_kv = int("attention n_head_kv", shape.n_head_kv)?;
    let head_dim = int("attention head_dim", hd)?;
    let n_ctx = int("attention n_ctx", shape.n_ctx)?;
    let mc = int("attention chunks", max_chunks)?;
    let chunk_i = int("attention chunk", chunk)?;
    let scale = shape.scale();
    let cfg = grid(shape.n_head, n_tok, attention::THREADS)?;
    // SAFETY: every buffer's length is checked above; positions and cells come from the
    // device and the kernel attends nothing where they would read outside the caches.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&pp)
            .arg(&cp)
            .arg(&wp)
            .arg(&op)
            .arg(&oqp)
            .arg(&odp)
            .arg(&n_head)
            .arg(&n_head_kv)
            .arg(&head_dim)
            .arg(&n_ctx)
            .arg(&n_cells)
            .arg(&mc)
            .arg(&chunk_i)
            .arg(&scale)
            .launch(cfg)?;
    }
    Ok(())
}

/// `silu_mul_quantize_f32`: `silu(gate) * up` of each fused gate|up row of `gu` (rows of
/// `2 n_ff`), quantized into `q` / `d`.
pub fn silu_mul_quantize(
    gpu: &Gpu,
    gu: &impl DevicePtr<f32>,
    n_ff: usize,
    q: &mut impl DevicePtrMut<i8>,
    d: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    blocks_of("silu_mul_quantize n_ff", n_ff)?;
    let rows = gu.len() / (2 * n_ff);
    same("silu_mul_quantize gu", gu.len(), rows * 2 * n_ff)?;
    same("silu_mul_quantize q", q.len(), rows * n_ff)?;
    same("silu_mul_quantize d", d.len(), rows * n_ff / QK)?;
    let nblocks = rows * n_ff / QK;
    if nblocks == 0 {
        return Ok(());
    }
    let f = gpu.function("fused", "silu_mul_quantize_f32")?;
    let (gp, _gg) = gu.device_ptr(&gpu.stream);
    let (qp, _gq) = q.device_ptr_mut(&gpu.stream);
    let (dp, _gd) = d.device_ptr_mut(&gpu.stream);
    let n_ff_i = int("silu_mul_quantize n_ff", n_ff)?;
    let nb = int("silu_mul_quantize blocks", nblocks)?;
    let cfg = grid(
        nblocks.div_ceil(SILU_BLOCKS_PER_CTA),
        1,
        32 * SILU_BLOCKS_PER_CTA,
    )?;
    // SAFETY: gu holds rows fused rows, q and d their quantization (checked).
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&gp)
            .arg(&qp)
            .arg(&dp)
            .arg(&n_ff_i)
            .arg(&nb)
            .launch(cfg)?;
    }
    Ok(())
}
