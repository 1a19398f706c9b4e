//! Launch wrappers for the Q8_0 linear kernels (`q8_gemv.cu`, `quantize.cu`, `q8_gemm.cu`);
//! their CPU twins are [`crate::cpu::gemv`], [`crate::cpu::quantize`], [`crate::cpu::gemm`].
//! Layouts are the twins': `x` / `y` are consecutive column vectors (one per token).
//! Weights are in the kernels' device layout ([`Q8Matrix::to_device_layout`], uploaded by
//! [`upload_weights`]): the GGUF's bytes rearranged, the same size, so that the decode
//! matvec reads them with aligned, coalesced 16-byte loads.
//!
//! The launch shapes below mirror the kernels' default tuning macros; a module compiled
//! with other `-D` values needs matching constants.

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DriverError,
    LaunchConfig, PushKernelArg,
};

use super::{Gpu, GpuError};
use crate::cpu::gemv::ShapeError;
use crate::q8::{row_bytes, LayoutError, Q8Matrix, QK};

/// Columns one GEMV launch takes (the kernel's `Q8_GEMV_MAX_COLS`); more go in passes.
pub const GEMV_MAX_COLS: usize = 8;
/// Warps (rows) per GEMV thread block: `Q8_GEMV_ROWS_PER_BLOCK`.
pub const GEMV_ROWS_PER_BLOCK: usize = 4;
/// Warps per thread block of `q8_gemv_q8`: `Q8_GEMV_Q8_WARPS`.
pub const GEMV_Q8_WARPS: usize = 4;
/// Rows each `q8_gemv_q8` warp takes at a time with one column and k from past
/// [`GEMV_Q8_PAIR_K`] up to [`GEMV_Q8_XREG_K`]: one (its lanes take a unit's 32 blocks, the
/// activations sit in registers).
pub const GEMV_Q8_ROWS_PER_WARP: usize = 1;
/// Rows a warp takes side by side otherwise (`Q8_ANY_ROWS`): each activation read, from
/// shared memory or global, serves them all.
pub const GEMV_Q8_ANY_ROWS: usize = 2;
/// The largest k whose activations (one column) `q8_gemv_q8` holds in registers (four
/// units of 1024: `q8_gemv_q8_x1`'s instances in `q8_gemv_q8_rows`).
pub const GEMV_Q8_XREG_K: usize = 4096;

/// The largest k at which `q8_gemv_q8` takes one column's rows in pairs, a half warp each
/// (`q8_gemv_q8_x1h`: one unit of at most 32 blocks a row, which alone fills 18 of 32
/// lanes at the default model's k = 576).
pub const GEMV_Q8_PAIR_K: usize = 1024;

/// Rows a `q8_gemv_q8` warp takes at a time for `ncols` columns of `k`.
pub fn gemv_q8_rows_per_warp(k: usize, ncols: usize) -> usize {
    if ncols == 1 && k <= GEMV_Q8_PAIR_K {
        2
    } else if ncols == 1 && k <= GEMV_Q8_XREG_K {
        GEMV_Q8_ROWS_PER_WARP
    } else {
        GEMV_Q8_ANY_ROWS
    }
}
/// `q8_gemv_q8` thread blocks per SM at most (its warps walk the rows with a grid stride):
/// 5 x 4 warps, as many as an SM holds at its 96 registers a thread (sm_87; the kernel's
/// launch bound `Q8_GEMV_Q8_MIN_BLOCKS` keeps it there), so that every SM keeps 20 warps'
/// loads in flight (tuned on GPGPU-Sim, docs/native-and-cuda.md).
pub const GEMV_Q8_BLOCKS_PER_SM: usize = 5;

/// `q8_gemv_q8`'s grid for `rows` on `sm_count` SMs: at most [`GEMV_Q8_BLOCKS_PER_SM`] blocks
/// an SM, and only as many warps as give every warp the same number of row groups (passes
/// of the grid stride), rounded up to whole SMs: 512 rows on 8 SMs take 32 blocks, four
/// rows a warp, not 40 blocks where a fifth of the warps make a fourth pass that the SMs
/// run under-filled.
pub fn gemv_q8_blocks(rows: usize, rows_per_warp: usize, sm_count: usize) -> usize {
    let sms = sm_count.max(1);
    let cap = sms * GEMV_Q8_BLOCKS_PER_SM;
    let groups = rows.div_ceil(rows_per_warp.max(1));
    let passes = groups.div_ceil(cap * GEMV_Q8_WARPS).max(1);
    let blocks = groups.div_ceil(passes).div_ceil(GEMV_Q8_WARPS);
    // Whole SMs, but no block without a row group in the first pass.
    (blocks.div_ceil(sms) * sms)
        .min(cap)
        .min(groups.div_ceil(GEMV_Q8_WARPS))
}

/// Copies `m` to the device in the kernels' layout: the weights every wrapper here takes.
pub fn upload_weights(
    stream: &std::sync::Arc<CudaStream>,
    m: &Q8Matrix<'_>,
) -> Result<CudaSlice<u8>, DriverError> {
    stream.clone_htod(&m.to_device_layout())
}

/// Quantization blocks (warps) per thread block of `quantize_q8_f32`.
pub const QUANTIZE_BLOCKS_PER_CTA: usize = 8;
/// GEMM tile: `16 * Q8_GEMM_TR` rows by `16 * Q8_GEMM_TT` tokens, 16 x 16 threads.
pub const GEMM_TILE_ROWS: usize = 64;
pub const GEMM_TILE_TOKENS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum Q8Error {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("{what} = {value} does not fit the kernel's launch limits")]
    TooLarge { what: &'static str, value: usize },
    #[error("ncols = {0}: the kernel takes 1 to {GEMV_MAX_COLS} columns")]
    Cols(usize),
    #[error("{what} lies at device address {addr:#x}, not {align}-byte aligned")]
    Misaligned {
        what: &'static str,
        addr: u64,
        align: u64,
    },
}

impl From<DriverError> for Q8Error {
    fn from(e: DriverError) -> Self {
        Q8Error::Gpu(GpuError::Driver(e))
    }
}

impl From<LayoutError> for Q8Error {
    fn from(e: LayoutError) -> Self {
        Q8Error::Shape(e.into())
    }
}

/// Activations quantized on the device: `q[rows * k]` int8, `d[rows * k / 32]` f32 (the
/// layout of [`crate::cpu::quantize::Q8Act`]).
pub struct DeviceQ8Act {
    pub q: CudaSlice<i8>,
    pub d: CudaSlice<f32>,
    pub rows: usize,
    pub k: usize,
}

fn check_len(what: &'static str, got: usize, a: usize, b: usize) -> Result<(), Q8Error> {
    match a.checked_mul(b) {
        Some(expected) if expected == got => Ok(()),
        expected => Err(ShapeError::Len {
            what,
            expected: expected.unwrap_or(usize::MAX),
            got,
        }
        .into()),
    }
}

fn int(what: &'static str, value: usize) -> Result<i32, Q8Error> {
    i32::try_from(value).map_err(|_| Q8Error::TooLarge { what, value })
}

fn check_weights(w: &impl DevicePtr<u8>, rows: usize, k: usize) -> Result<(), Q8Error> {
    if k == 0 || k % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k }.into());
    }
    let need = rows.checked_mul(row_bytes(k)).ok_or(Q8Error::TooLarge {
        what: "rows",
        value: rows,
    })?;
    if w.len() != need {
        return Err(LayoutError::Size {
            rows,
            k,
            need,
            got: w.len(),
        }
        .into());
    }
    Ok(())
}

/// `y = W x` for `ncols` columns into a new buffer of `ncols * rows` floats.
pub fn gemv(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    rows: usize,
    k: usize,
    x: &CudaSlice<f32>,
    ncols: usize,
) -> Result<CudaSlice<f32>, Q8Error> {
    let n = ncols.checked_mul(rows).ok_or(Q8Error::TooLarge {
        what: "ncols",
        value: ncols,
    })?;
    let mut y = gpu.stream.alloc_zeros::<f32>(n)?;
    gemv_into(gpu, w, rows, k, x, ncols, &mut y)?;
    Ok(y)
}

/// `y = W x`: `q8_gemv_f32(w, x, y, rows, k, ncols)`, block 32 * [`GEMV_ROWS_PER_BLOCK`],
/// grid ceil(rows / [`GEMV_ROWS_PER_BLOCK`]), one launch per [`GEMV_MAX_COLS`] columns.
pub fn gemv_into(
    gpu: &Gpu,
    w: &impl DevicePtr<u8>,
    rows: usize,
    k: usize,
    x: &impl DevicePtr<f32>,
    ncols: usize,
    y: &mut impl DevicePtrMut<f32>,
) -> Result<(), Q8Error> {
    check_weights(w, rows, k)?;
    check_len("x", x.len(), ncols, k)?;
    check_len("y", y.len(), ncols, rows)?;
    let (rows_i, k_i) = (int("rows", rows)?, int("k", k)?);
    if rows == 0 || ncols == 0 {
        return Ok(());
    }
    let f = gpu.function("q8_gemv", "q8_gemv_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (
            int("rows", rows.div_ceil(GEMV_ROWS_PER_BLOCK))? as u32,
            1,
            1,
        ),
        block_dim: (32 * GEMV_ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let (xp, _gx) = x.device_ptr(&gpu.stream);
    let (yp, _gy) = y.device_ptr_mut(&gpu.stream);
    let f32_bytes = std::mem::size_of::<f32>() as u64;
    let mut c0 = 0;
    while c0 < ncols {
        let n = (ncols - c0).min(GEMV_MAX_COLS);
        // Columns c0.. of x and y: byte offsets into the buffers checked above.
        let xv = xp + (c0 * k) as u64 * f32_bytes;
        let yv = yp + (c0 * rows) as u64 * f32_bytes;
        let n_i = n as i32;
        let mut launch = gpu.stream.launch_builder(&f);
        launch
            .arg(&wp)
            .arg(&xv)
            .arg(&yv)
            .arg(&rows_i)
            .arg(&k_i)
            .arg(&n_i);
        // SAFETY: the argument list matches the kernel's signature; x and y hold ncols
        // columns (checked), so columns c0..c0 + n lie inside them.
        unsafe { launch.launch(cfg) }?;
        c0 += n;
    }
    Ok(())
}

fn aligned(what: &'static str, addr: u64, align: u64) -> Result<(), Q8Error> {
    if addr % align != 0 {
        return Err(Q8Error::Misaligned { what, addr, align });
    }
    Ok(())
}

/// `y = W x (+ bias) (+ y)` on int8 activations: `q8_gemv_q8` (its twin is
/// [`crate::cpu::gemv_q8`]). `xq` / `xd` are `ncols` rows of `k` quantized as by
/// [`quantize_into`] (`ncols * k` quants, `ncols * k / 32` scales; `xq` 16-byte aligned, as
/// any view from the start of a buffer is), `y` holds `ncols` consecutive vectors of `rows`,
/// `bias` has `rows` entries (added to every column). With `accumulate`, the result is added
/// to what `y` holds (the residual add, in place) instead of replacing it.
///
/// Block 32 * [`GEMV_Q8_WARPS`], grid [`gemv_q8_blocks`]; one launch for every column.
#[allow(clippy::too_many_arguments)]
pub fn gemv_q8_into(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    rows: usize,
    k: usize,
    xq: &CudaView<i8>,
    xd: &CudaView<f32>,
    ncols: usize,
    bias: Option<&CudaView<f32>>,
    accumulate: bool,
    y: &mut CudaViewMut<f32>,
) -> Result<(), Q8Error> {
    if !(1..=GEMV_MAX_COLS).contains(&ncols) {
        return Err(Q8Error::Cols(ncols));
    }
    check_weights(w, rows, k)?;
    check_len("x.q", xq.len(), ncols, k)?;
    check_len("x.d", xd.len(), ncols, k / QK)?;
    check_len("y", y.len(), ncols, rows)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), rows, 1)?;
    }
    let (rows_i, k_i, n_i) = (int("rows", rows)?, int("k", k)?, ncols as i32);
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function("q8_gemv", "q8_gemv_q8")?;
    let blocks = gemv_q8_blocks(rows, gemv_q8_rows_per_warp(k, ncols), gpu.sm_count);
    let cfg = LaunchConfig {
        grid_dim: (int("rows", blocks)? as u32, 1, 1),
        block_dim: (32 * GEMV_Q8_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let (qp, _gq) = xq.device_ptr(&gpu.stream);
    let (dp, _gd) = xd.device_ptr(&gpu.stream);
    let (bp, _gb) = match bias {
        Some(b) => {
            let (p, g) = b.device_ptr(&gpu.stream);
            (p, Some(g))
        }
        None => (0, None),
    };
    let (yp, _gy) = y.device_ptr_mut(&gpu.stream);
    aligned("x.q", qp, 16)?;
    let acc_i = i32::from(accumulate);
    let mut launch = gpu.stream.launch_builder(&f);
    launch
        .arg(&wp)
        .arg(&qp)
        .arg(&dp)
        .arg(&bp)
        .arg(&yp)
        .arg(&rows_i)
        .arg(&k_i)
        .arg(&n_i)
        .arg(&acc_i);
    // SAFETY: the argument list matches the kernel's signature; every buffer was checked
    // against rows, k and ncols above (bias is null or holds rows floats), and xq's
    // alignment, which its 16-byte loads need.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Quantizes `rows` rows of `k` floats into a new [`DeviceQ8Act`].
pub fn quantize(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    k: usize,
) -> Result<DeviceQ8Act, Q8Error> {
    if k == 0 || k % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k }.into());
    }
    check_len("x", x.len(), rows, k)?;
    let mut act = DeviceQ8Act {
        q: gpu.stream.alloc_zeros::<i8>(x.len())?,
        d: gpu.stream.alloc_zeros::<f32>(x.len() / QK)?,
        rows,
        k,
    };
    quantize_into(gpu, x, &mut act.q, &mut act.d)?;
    Ok(act)
}

/// `quantize_q8_f32(x, q, d, nblocks)`, nblocks = x.len() / 32, block 32 *
/// [`QUANTIZE_BLOCKS_PER_CTA`], grid ceil(nblocks / [`QUANTIZE_BLOCKS_PER_CTA`]).
pub fn quantize_into(
    gpu: &Gpu,
    x: &impl DevicePtr<f32>,
    q: &mut impl DevicePtrMut<i8>,
    d: &mut impl DevicePtrMut<f32>,
) -> Result<(), Q8Error> {
    if x.len() % QK != 0 {
        return Err(LayoutError::RowNotBlocks { k: x.len() }.into());
    }
    let nblocks = x.len() / QK;
    check_len("q", q.len(), x.len(), 1)?;
    check_len("d", d.len(), nblocks, 1)?;
    let nb_i = int("blocks", nblocks)?;
    if nblocks == 0 {
        return Ok(());
    }
    let f = gpu.function("quantize", "quantize_q8_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (
            int("blocks", nblocks.div_ceil(QUANTIZE_BLOCKS_PER_CTA))? as u32,
            1,
            1,
        ),
        block_dim: (32 * QUANTIZE_BLOCKS_PER_CTA as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (xp, _gx) = x.device_ptr(&gpu.stream);
    let (qp, _gq) = q.device_ptr_mut(&gpu.stream);
    let (dp, _gd) = d.device_ptr_mut(&gpu.stream);
    let mut launch = gpu.stream.launch_builder(&f);
    launch.arg(&xp).arg(&qp).arg(&dp).arg(&nb_i);
    // SAFETY: the argument list matches the kernel's signature; q and d were checked to
    // hold nblocks blocks.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// `Y = W X` for the quantized tokens `x` into a new buffer of `x.rows * rows` floats.
pub fn gemm(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    rows: usize,
    k: usize,
    x: &DeviceQ8Act,
) -> Result<CudaSlice<f32>, Q8Error> {
    let n = x.rows.checked_mul(rows).ok_or(Q8Error::TooLarge {
        what: "tokens",
        value: x.rows,
    })?;
    let mut y = gpu.stream.alloc_zeros::<f32>(n)?;
    gemm_into(gpu, w, rows, k, x, &mut y)?;
    Ok(y)
}

/// `q8_gemm_f32(w, xq, xd, y, rows, k, tokens)`, block (16, 16), grid
/// (ceil(rows / [`GEMM_TILE_ROWS`]), ceil(tokens / [`GEMM_TILE_TOKENS`])), static shared
/// memory only (about 19 KiB).
pub fn gemm_into(
    gpu: &Gpu,
    w: &impl DevicePtr<u8>,
    rows: usize,
    k: usize,
    x: &DeviceQ8Act,
    y: &mut impl DevicePtrMut<f32>,
) -> Result<(), Q8Error> {
    if x.k != k {
        return Err(ShapeError::Len {
            what: "an activation row",
            expected: k,
            got: x.k,
        }
        .into());
    }
    gemm_parts(gpu, w, rows, k, &x.q, &x.d, x.rows, y)
}

/// [`gemm_into`] on the quants `xq` and scales `xd` of `tokens` rows of `k` held in any
/// device buffers (e.g. the first rows of a scratch sized for more).
#[allow(clippy::too_many_arguments)]
pub fn gemm_parts(
    gpu: &Gpu,
    w: &impl DevicePtr<u8>,
    rows: usize,
    k: usize,
    xq: &impl DevicePtr<i8>,
    xd: &impl DevicePtr<f32>,
    tokens: usize,
    y: &mut impl DevicePtrMut<f32>,
) -> Result<(), Q8Error> {
    check_weights(w, rows, k)?;
    check_len("x.q", xq.len(), tokens, k)?;
    check_len("x.d", xd.len(), tokens, k / QK)?;
    check_len("y", y.len(), tokens, rows)?;
    let (rows_i, k_i, t_i) = (int("rows", rows)?, int("k", k)?, int("tokens", tokens)?);
    if rows == 0 || tokens == 0 {
        return Ok(());
    }
    let gy = tokens.div_ceil(GEMM_TILE_TOKENS);
    if gy > 65535 {
        return Err(Q8Error::TooLarge {
            what: "tokens",
            value: tokens,
        });
    }
    let f = gpu.function("q8_gemm", "q8_gemm_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (
            int("rows", rows.div_ceil(GEMM_TILE_ROWS))? as u32,
            gy as u32,
            1,
        ),
        block_dim: (16, 16, 1),
        shared_mem_bytes: 0,
    };
    let (wp, _gw) = w.device_ptr(&gpu.stream);
    let (qp, _gq) = xq.device_ptr(&gpu.stream);
    let (dp, _gd) = xd.device_ptr(&gpu.stream);
    let (yp, _gy) = y.device_ptr_mut(&gpu.stream);
    let mut launch = gpu.stream.launch_builder(&f);
    launch
        .arg(&wp)
        .arg(&qp)
        .arg(&dp)
        .arg(&yp)
        .arg(&rows_i)
        .arg(&k_i)
        .arg(&t_i);
    // SAFETY: the argument list matches the kernel's signature; every buffer was checked
    // against rows, k and tokens above.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row group gets a warp, no warp more passes than another, no more than the cap.
    #[test]
    fn gemv_q8_grid_balances_the_passes() {
        for (sms, per) in [(1, 1), (8, 1), (16, 1), (8, 2), (132, 2)] {
            for rows in [1, 7, 192, 512, 576, 1024, 1536, 4096, 14336] {
                let blocks = gemv_q8_blocks(rows, per, sms);
                let groups = rows.div_ceil(per);
                let warps = blocks * GEMV_Q8_WARPS;
                assert!(
                    blocks >= 1 && blocks <= sms * GEMV_Q8_BLOCKS_PER_SM,
                    "{rows} on {sms}"
                );
                let cap = sms * GEMV_Q8_BLOCKS_PER_SM * GEMV_Q8_WARPS;
                // As few passes as the full grid would make, with the blocks needed for them.
                assert_eq!(
                    groups.div_ceil(warps),
                    groups.div_ceil(cap),
                    "{rows} on {sms}"
                );
                // Whole SMs unless the rows run out first.
                assert!(blocks % sms == 0 || blocks == groups.div_ceil(GEMV_Q8_WARPS));
            }
        }
        assert_eq!(gemv_q8_blocks(512, 1, 8), 32);
        assert_eq!(gemv_q8_blocks(4096, 1, 8), 40);
        assert_eq!(gemv_q8_rows_per_warp(576, 1), 2);
        assert_eq!(gemv_q8_rows_per_warp(1024, 1), 2);
        assert_eq!(gemv_q8_rows_per_warp(1056, 1), 1);
        assert_eq!(gemv_q8_rows_per_warp(4096, 1), 1);
        assert_eq!(gemv_q8_rows_per_warp(4096, 2), 2);
        assert_eq!(gemv_q8_rows_per_warp(14336, 1), 2);
    }
}
