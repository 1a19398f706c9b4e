//! Launch wrappers for the non-matmul ops of a forward pass (`rmsnorm.cu`, `rope.cu`,
//! `elementwise.cu`, `embed.cu`, `softmax.cu`, `attention.cu`); their twins are in
//! [`crate::cpu`] and the layouts are the twins'. Buffers are any cudarc slice or view
//! (`CudaSlice`, `CudaView`, `CudaViewMut`), so a layer's part of a KV cache can be passed
//! as it lies; f16 data is stored as `u16` bits. Every launch is asynchronous on
//! `gpu.stream`.
//!
//! Block sizes are the twins' `THREADS` constants (the reduction order depends on them);
//! they must not exceed the kernels' tuning macros.

use cudarc::driver::{DevicePtr, DevicePtrMut, DriverError, LaunchConfig, PushKernelArg};

use super::{Gpu, GpuError};
use crate::cpu::attention::{self, AttnShape};
use crate::cpu::rope::{Rope, RopeMode};
use crate::cpu::vector::ShapeError;
use crate::cpu::{rmsnorm, softmax};
use crate::q8::{row_bytes, LayoutError, QK};

/// Threads per block of the elementwise kernels (`EW_THREADS`).
pub const EW_THREADS: usize = 256;
/// Threads per block of `embed_q8_0` (`EMBED_THREADS`).
pub const EMBED_THREADS: usize = 256;
/// Threads per block of the rope kernels (`ROPE_THREADS`).
pub const ROPE_THREADS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// A count as the kernels' `int`.
fn int(what: &'static str, n: usize) -> Result<i32, ShapeError> {
    i32::try_from(n).map_err(|_| ShapeError::Unsupported(format!("{what} = {n} exceeds i32")))
}

fn grid_1d(blocks: usize, threads: usize) -> Result<LaunchConfig, ShapeError> {
    let blocks = u32::try_from(blocks)
        .map_err(|_| ShapeError::Unsupported(format!("{blocks} blocks in one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn same_len(what: &'static str, got: usize, expected: usize) -> Result<(), ShapeError> {
    crate::cpu::vector::check_len(what, got, expected)
}

fn rows_of(what: &'static str, got: usize, n: usize) -> Result<usize, ShapeError> {
    if n == 0 || got % n != 0 {
        Err(ShapeError::NotMultiple { what, got, of: n })
    } else {
        Ok(got / n)
    }
}

/// `y = rmsnorm(x) * w` for each row of `w.len()` values (`rmsnorm_f32`, one block per row).
pub fn rmsnorm(
    gpu: &Gpu,
    x: &impl DevicePtr<f32>,
    w: &impl DevicePtr<f32>,
    eps: f32,
    y: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    let n = w.len();
    let rows = rows_of("rmsnorm x", x.len(), n)?;
    same_len("rmsnorm y", y.len(), x.len())?;
    let (xp, _gx) = x.device_ptr(&gpu.stream);
    let (yp, _gy) = y.device_ptr_mut(&gpu.stream);
    rmsnorm_ptrs(gpu, xp, w, eps, yp, rows, n)
}

/// [`rmsnorm`] in place on `x`.
pub fn rmsnorm_inplace(
    gpu: &Gpu,
    x: &mut impl DevicePtrMut<f32>,
    w: &impl DevicePtr<f32>,
    eps: f32,
) -> Result<(), OpError> {
    let n = w.len();
    let rows = rows_of("rmsnorm x", x.len(), n)?;
    // The kernel reads and rewrites each element in one thread, so x may be y.
    let (xp, _gx) = x.device_ptr_mut(&gpu.stream);
    rmsnorm_ptrs(gpu, xp, w, eps, xp, rows, n)
}

fn rmsnorm_ptrs(
    gpu: &Gpu,
    xp: u64,
    w: &impl DevicePtr<f32>,
    eps: f32,
    yp: u64,
    rows: usize,
    n: usize,
) -> Result<(), OpError> {
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function("rmsnorm", "rmsnorm_f32")?;
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let n = int("rmsnorm n", n)?;
    let cfg = grid_1d(rows, rmsnorm::THREADS)?;
    // SAFETY: the pointers cover rows * n (checked above); the argument list matches the
    // kernel's signature.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&wp)
            .arg(&yp)
            .arg(&n)
            .arg(&eps)
            .launch(cfg)?;
    }
    Ok(())
}

/// Softmax of each row of `n` values of `x`, in place (`softmax_f32`, one block per row).
pub fn softmax_inplace(gpu: &Gpu, x: &mut impl DevicePtrMut<f32>, n: usize) -> Result<(), OpError> {
    let rows = rows_of("softmax x", x.len(), n)?;
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function("softmax", "softmax_f32")?;
    let (xp, _gx) = x.device_ptr_mut(&gpu.stream);
    let n = int("softmax n", n)?;
    let cfg = grid_1d(rows, softmax::THREADS)?;
    // SAFETY: x covers rows * n; the kernel reads then rewrites each element in one thread.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&xp)
            .arg(&n)
            .launch(cfg)?;
    }
    Ok(())
}

/// RoPE in place on `x` (`[pos.len()][n_head][head_dim]`), token `t` at position `pos[t]`
/// (`rope_norm_f32` / `rope_neox_f32`, one block per token).
pub fn rope_inplace(
    gpu: &Gpu,
    rope: &Rope,
    x: &mut impl DevicePtrMut<f32>,
    pos: &impl DevicePtr<i32>,
) -> Result<(), OpError> {
    rope.check()?;
    let n_tok = rows_of("rope x", x.len(), rope.n_head * rope.head_dim)?;
    same_len("rope positions", pos.len(), n_tok)?;
    if n_tok == 0 || rope.rot_dims == 0 {
        return Ok(());
    }
    let entry = match rope.mode {
        RopeMode::Normal => "rope_norm_f32",
        RopeMode::Neox => "rope_neox_f32",
    };
    let f = gpu.function("rope", entry)?;
    let (xp, _gx) = x.device_ptr_mut(&gpu.stream);
    let (pp, _gp) = pos.device_ptr(&gpu.stream);
    let n_head = int("rope n_head", rope.n_head)?;
    let head_dim = int("rope head_dim", rope.head_dim)?;
    let rot_dims = int("rope rot_dims", rope.rot_dims)?;
    let freq_scale = rope.freq_scale();
    let cfg = grid_1d(n_tok, ROPE_THREADS)?;
    // SAFETY: x covers n_tok tokens and pos n_tok positions (checked above).
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&pp)
            .arg(&n_head)
            .arg(&head_dim)
            .arg(&rot_dims)
            .arg(&freq_scale)
            .launch(cfg)?;
    }
    Ok(())
}

fn elementwise(gpu: &Gpu, entry: &str, a: u64, b: u64, out: u64, n: usize) -> Result<(), OpError> {
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function("elementwise", entry)?;
    let n_i = int("elementwise n", n)?;
    let cfg = grid_1d(n.div_ceil(EW_THREADS), EW_THREADS)?;
    // SAFETY: the three pointers cover n values (checked by the callers).
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&a)
            .arg(&b)
            .arg(&out)
            .arg(&n_i)
            .launch(cfg)?;
    }
    Ok(())
}

/// `out = silu(gate) * up` (`silu_mul_f32`).
pub fn silu_mul(
    gpu: &Gpu,
    gate: &impl DevicePtr<f32>,
    up: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    same_len("silu_mul up", up.len(), gate.len())?;
    same_len("silu_mul out", out.len(), gate.len())?;
    let n = gate.len();
    let (gp, _gg) = gate.device_ptr(&gpu.stream);
    let (up_, _gu) = up.device_ptr(&gpu.stream);
    let (op, _go) = out.device_ptr_mut(&gpu.stream);
    elementwise(gpu, "silu_mul_f32", gp, up_, op, n)
}

/// `gate = silu(gate) * up` in place.
pub fn silu_mul_inplace(
    gpu: &Gpu,
    gate: &mut impl DevicePtrMut<f32>,
    up: &impl DevicePtr<f32>,
) -> Result<(), OpError> {
    same_len("silu_mul up", up.len(), gate.len())?;
    let n = gate.len();
    let (up_, _gu) = up.device_ptr(&gpu.stream);
    let (gp, _gg) = gate.device_ptr_mut(&gpu.stream);
    elementwise(gpu, "silu_mul_f32", gp, up_, gp, n)
}

/// `out = a + b` (`add_f32`).
pub fn add(
    gpu: &Gpu,
    a: &impl DevicePtr<f32>,
    b: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    same_len("add b", b.len(), a.len())?;
    same_len("add out", out.len(), a.len())?;
    let n = a.len();
    let (ap, _ga) = a.device_ptr(&gpu.stream);
    let (bp, _gb) = b.device_ptr(&gpu.stream);
    let (op, _go) = out.device_ptr_mut(&gpu.stream);
    elementwise(gpu, "add_f32", ap, bp, op, n)
}

/// `acc += b`: the residual add in place.
pub fn add_inplace(
    gpu: &Gpu,
    acc: &mut impl DevicePtrMut<f32>,
    b: &impl DevicePtr<f32>,
) -> Result<(), OpError> {
    same_len("add b", b.len(), acc.len())?;
    let n = acc.len();
    let (bp, _gb) = b.device_ptr(&gpu.stream);
    let (ap, _ga) = acc.device_ptr_mut(&gpu.stream);
    elementwise(gpu, "add_f32", ap, bp, ap, n)
}

/// The KV cache write (`kv_store_f16`): token `t`'s `width` values of `x` (f32), rounded
/// to f16, into cell `cells[t]` of `cache` (`width` values per cell, f16 bits). Cells
/// outside the cache are skipped on the device (the twin refuses them).
pub fn kv_store_f16(
    gpu: &Gpu,
    x: &impl DevicePtr<f32>,
    width: usize,
    cells: &impl DevicePtr<i32>,
    cache: &mut impl DevicePtrMut<u16>,
) -> Result<(), OpError> {
    let n_tok = cells.len();
    same_len("kv_store x", x.len(), n_tok * width)?;
    if n_tok == 0 || width == 0 {
        return Ok(());
    }
    let n_cells = int("kv_store cells", cache.len() / width)?;
    let f = gpu.function("elementwise", "kv_store_f16")?;
    let (xp, _gx) = x.device_ptr(&gpu.stream);
    let (cp, _gc) = cells.device_ptr(&gpu.stream);
    let (kp, _gk) = cache.device_ptr_mut(&gpu.stream);
    let width_i = int("kv_store width", width)?;
    let tokens = u32::try_from(n_tok)
        .ok()
        .filter(|&t| t <= 65_535)
        .ok_or_else(|| ShapeError::Unsupported(format!("{n_tok} tokens in one KV write")))?;
    let cfg = LaunchConfig {
        grid_dim: (width.div_ceil(EW_THREADS) as u32, tokens, 1),
        block_dim: (EW_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds n_tok rows of width (checked); the kernel bounds every cell by
    // n_cells, the cache's size.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&xp)
            .arg(&cp)
            .arg(&kp)
            .arg(&width_i)
            .arg(&n_cells)
            .launch(cfg)?;
    }
    Ok(())
}

/// `out[t] = row tokens[t]` of the Q8_0 matrix `w` (`[n_vocab][n_embd]`, GGUF bytes),
/// dequantized (`embed_q8_0`, one block per token). Tokens outside the vocabulary give
/// zero rows (they live on the device; the CPU twin reports them).
pub fn embed(
    gpu: &Gpu,
    w: &impl DevicePtr<u8>,
    n_vocab: usize,
    n_embd: usize,
    tokens: &impl DevicePtr<i32>,
    out: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    if n_embd == 0 || n_embd % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k: n_embd }.into());
    }
    let need = n_vocab * row_bytes(n_embd);
    if w.len() != need {
        return Err(LayoutError::Size {
            rows: n_vocab,
            k: n_embd,
            need,
            got: w.len(),
        }
        .into());
    }
    let n_tok = tokens.len();
    same_len("embed out", out.len(), n_tok * n_embd)?;
    if n_tok == 0 {
        return Ok(());
    }
    let f = gpu.function("embed", "embed_q8_0")?;
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let (tp, _gt) = tokens.device_ptr(&gpu.stream);
    let (op, _go) = out.device_ptr_mut(&gpu.stream);
    let n_embd = int("embed n_embd", n_embd)?;
    let n_vocab = int("embed n_vocab", n_vocab)?;
    let cfg = grid_1d(n_tok, EMBED_THREADS)?;
    // SAFETY: w holds n_vocab rows, out n_tok rows (checked); bad tokens are not read.
    unsafe {
        gpu.stream
            .launch_builder(&f)
            .arg(&wp)
            .arg(&tp)
            .arg(&op)
            .arg(&n_embd)
            .arg(&n_vocab)
            .launch(cfg)?;
    }
    Ok(())
}

/// Decode attention (`attn_partial_f16` then `attn_combine_f32`): layouts in
/// [`crate::cpu::attention`]. `kv_len[s]` (on the device) is sequence `s`'s position count;
/// `max_kv` must be at least every one of them (it sizes the grid: positions beyond
/// `max_kv` rounded up to chunks are ignored). `chunk` positions per block, at most
/// [`attention::CHUNK`]; `workspace` holds [`AttnShape::workspace_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    gpu: &Gpu,
    shape: &AttnShape,
    q: &impl DevicePtr<f32>,
    k: &impl DevicePtr<u16>,
    v: &impl DevicePtr<u16>,
    kv_len: &impl DevicePtr<i32>,
    max_kv: usize,
    chunk: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<f32>,
) -> Result<(), OpError> {
    shape.check()?;
    if chunk == 0 || chunk > attention::CHUNK {
        return Err(ShapeError::Unsupported(format!(
            "attention chunk {chunk}: the kernel takes 1 to {}",
            attention::CHUNK
        ))
        .into());
    }
    same_len("attention q", q.len(), shape.q_len())?;
    same_len("attention out", out.len(), shape.q_len())?;
    same_len("attention k", k.len(), shape.kv_len())?;
    same_len("attention v", v.len(), shape.kv_len())?;
    same_len("attention kv_len", kv_len.len(), shape.n_seq)?;
    let max_kv = max_kv.min(shape.n_ctx);
    let max_chunks = AttnShape::chunks(max_kv, chunk).max(1);
    let ws = shape.workspace_len(max_chunks * chunk, chunk);
    if workspace.len() < ws {
        return Err(ShapeError::Len {
            what: "attention workspace",
            expected: ws,
            got: workspace.len(),
        }
        .into());
    }
    let partial = gpu.function("attention", "attn_partial_f16")?;
    let combine = gpu.function("attention", "attn_combine_f32")?;
    let (qp, _gq) = q.device_ptr(&gpu.stream);
    let (kp, _gk) = k.device_ptr(&gpu.stream);
    let (vp, _gv) = v.device_ptr(&gpu.stream);
    let (lp, _gl) = kv_len.device_ptr(&gpu.stream);
    let (wp, _gw) = workspace.device_ptr_mut(&gpu.stream);
    let (op, _go) = out.device_ptr_mut(&gpu.stream);
    let n_head = int("attention n_head", shape.n_head)?;
    let n_head_kv = int("attention n_head_kv", shape.n_head_kv)?;
    let head_dim = int("attention head_dim", shape.head_dim)?;
    let n_ctx = int("attention n_ctx", shape.n_ctx)?;
    let mc = int("attention chunks", max_chunks)?;
    let chunk_i = int("attention chunk", chunk)?;
    let scale = shape.scale();
    let dim = |n: usize, most: usize| {
        u32::try_from(n)
            .ok()
            .filter(|&n| n as usize <= most)
            .ok_or_else(|| ShapeError::Unsupported(format!("grid of {n} (at most {most})")))
    };
    // CUDA's grid limits: 2^31 - 1 in x, 65535 in y and z.
    let (gh, gc, gs) = (
        dim(shape.n_head, i32::MAX as usize)?,
        dim(max_chunks, 65_535)?,
        dim(shape.n_seq, 65_535)?,
    );
    let block = (attention::THREADS as u32, 1, 1);
    // SAFETY: every buffer's length is checked against the shape above; kv_len entries are
    // clamped to n_ctx and to max_chunks * chunk on the device.
    unsafe {
        gpu.stream
            .launch_builder(&partial)
            .arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&lp)
            .arg(&wp)
            .arg(&n_head)
            .arg(&n_head_kv)
            .arg(&head_dim)
            .arg(&n_ctx)
            .arg(&mc)
            .arg(&chunk_i)
            .arg(&scale)
            .launch(LaunchConfig {
                grid_dim: (gh, gc, gs),
                block_dim: block,
                shared_mem_bytes: 0,
            })?;
        gpu.stream
            .launch_builder(&combine)
            .arg(&wp)
            .arg(&lp)
            .arg(&op)
            .arg(&n_head)
            .arg(&head_dim)
            .arg(&n_ctx)
            .arg(&mc)
            .arg(&chunk_i)
            .launch(LaunchConfig {
                grid_dim: (gh, gs, 1),
                block_dim: block,
                shared_mem_bytes: 0,
            })?;
    }
    Ok(())
}
