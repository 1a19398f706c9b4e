//! Launch wrappers for `layer.cu`: a decode layer of 1..=[`GEMV_MAX_COLS`] tokens in four
//! launches (Q|K|V with RoPE, KV store and attention; the output projection into the
//! residual with the FFN norm; gate|up with silu·up; down into the residual with the next
//! norm). Each kernel's twin is the composition of existing twins ([`crate::cpu::fused`]'s
//! `layer_*`), and like [`super::fused`] every per-token value is read on the device.
//!
//! The kernels that finish in their last block take a counter from the caller: zeros in
//! GPU memory ([`COUNTERS`] of them), which every launch leaves at zero again.

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig};

use super::ops::OpError;
use super::q8::{gemv_q8_rows_per_warp, GEMV_MAX_COLS, GEMV_Q8_BLOCKS_PER_SM, GEMV_Q8_WARPS};
use super::Gpu;
use crate::cpu::attention::{self, AttnShape};
use crate::cpu::rope::{Rope, RopeMode};
use crate::cpu::vector::{check_len, ShapeError};
use crate::q8::{row_bytes, QK};

/// Threads per block of every `layer.cu` kernel (the matvec's).
pub const THREADS: usize = 32 * GEMV_Q8_WARPS;

/// Counters a pass keeps for these kernels: one per kv group for [`qkv`] (at most this
/// many kv heads), one for [`residual_norm`] after them.
pub const COUNTERS: usize = 65;

fn int(what: &'static str, n: usize) -> Result<i32, ShapeError> {
    i32::try_from(n).map_err(|_| ShapeError::Unsupported(format!("{what} = {n} exceeds i32")))
}

fn cols(ncols: usize) -> Result<(), ShapeError> {
    if !(1..=GEMV_MAX_COLS).contains(&ncols) {
        return Err(ShapeError::Unsupported(format!(
            "{ncols} tokens: the layer kernels take 1 to {GEMV_MAX_COLS}"
        )));
    }
    Ok(())
}

fn weights(w: &CudaSlice<u8>, rows: usize, k: usize) -> Result<(), ShapeError> {
    if k == 0 || k % QK != 0 {
        return Err(ShapeError::NotMultiple {
            what: "layer matvec k",
            got: k,
            of: QK,
        });
    }
    if w.len() < rows * row_bytes(k) {
        return Err(ShapeError::Len {
            what: "layer weights",
            expected: rows * row_bytes(k),
            got: w.len(),
        });
    }
    Ok(())
}

fn config(blocks: usize) -> Result<LaunchConfig, ShapeError> {
    Ok(LaunchConfig {
        grid_dim: (int("layer blocks", blocks)? as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A matvec's input: `ncols` rows of `k` quantized (16-byte aligned quants, their scales).
pub struct Act<'a> {
    pub q: CudaView<'a, i8>,
    pub d: CudaView<'a, f32>,
    pub ncols: usize,
}

impl Act<'_> {
    fn check(&self, k: usize) -> Result<(), ShapeError> {
        cols(self.ncols)?;
        check_len("layer activations", self.q.len(), self.ncols * k)?;
        check_len("layer activation scales", self.d.len(), self.ncols * k / QK)
    }
}

/// A layer's KV cache and the step's per-token inputs, as [`super::fused::attention_step`]
/// takes them.
pub struct Attn<'a> {
    pub shape: AttnShape,
    pub rope: Rope,
    pub pos: CudaView<'a, i32>,
    pub cells: CudaView<'a, i32>,
    pub k: &'a mut CudaSlice<u16>,
    pub v: &'a mut CudaSlice<u16>,
    pub chunk: usize,
    pub workspace: CudaViewMut<'a, f32>,
}

/// `layer_qkv`: `qkv = Wqkv a (+ bias)` (`[ncols][q_dim + 2 kv_dim]`), RoPE of its q and k
/// heads, k and v stored as f16 into cell `cells[t]`, and each token's attention quantized
/// into `oq` / `od` (`[ncols][q_dim]`).
#[allow(clippy::too_many_arguments)]
pub fn qkv(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    a: &Act<'_>,
    bias: Option<&CudaSlice<f32>>,
    qkv: &mut CudaViewMut<'_, f32>,
    mut at: Attn<'_>,
    oq: &mut CudaViewMut<'_, i8>,
    od: &mut CudaViewMut<'_, f32>,
    counters: &mut CudaSlice<i32>,
) -> Result<(), OpError> {
    let sh = at.shape;
    sh.check()?;
    at.rope.check()?;
    let (hd, n) = (sh.head_dim, a.ncols);
    if at.rope.head_dim != hd || at.rope.n_head != sh.n_head {
        return Err(
            ShapeError::Unsupported("layer_qkv: rope and attention shapes differ".into()).into(),
        );
    }
    if hd > THREADS || sh.n_head_kv > COUNTERS - 1 || counters.len() < COUNTERS {
        return Err(ShapeError::Unsupported(format!(
            "layer_qkv: head_dim {hd} over {THREADS} threads, or {} kv heads over {} counters",
            sh.n_head_kv,
            counters.len()
        ))
        .into());
    }
    if at.chunk == 0 || at.chunk > attention::CHUNK {
        return Err(ShapeError::Unsupported(format!("attention chunk {}", at.chunk)).into());
    }
    let (qd, kvd) = (sh.n_head * hd, sh.n_head_kv * hd);
    let heads = sh.n_head + 2 * sh.n_head_kv;
    let k = a.q.len() / n;
    weights(w, heads * hd, k)?;
    a.check(k)?;
    if let Some(b) = bias {
        check_len("layer_qkv bias", b.len(), qd + 2 * kvd)?;
    }
    check_len("layer_qkv qkv", qkv.len(), n * (qd + 2 * kvd))?;
    check_len("layer_qkv pos", at.pos.len(), n)?;
    check_len("layer_qkv cells", at.cells.len(), n)?;
    check_len("layer_qkv v cache", at.v.len(), at.k.len())?;
    check_len("layer_qkv oq", oq.len(), n * qd)?;
    check_len("layer_qkv od", od.len(), n * qd / QK)?;
    let step = AttnShape { n_seq: n, ..sh };
    let max_chunks = AttnShape::chunks(sh.n_ctx, at.chunk).max(1);
    let ws = step.workspace_len(sh.n_ctx, at.chunk);
    if at.workspace.len() < ws {
        return Err(ShapeError::Len {
            what: "layer_qkv attention workspace",
            expected: ws,
            got: at.workspace.len(),
        }
        .into());
    }
    let f = gpu.function("layer", "layer_qkv")?;
    let s = &gpu.stream;
    let (wp, _g0) = w.device_ptr(s);
    let (xq, _g1) = a.q.device_ptr(s);
    let (xd, _g2) = a.d.device_ptr(s);
    let (bp, _g3) = match bias {
        Some(b) => {
            let (p, g) = b.device_ptr(s);
            (p, Some(g))
        }
        None => (0, None),
    };
    let (yp, _g4) = qkv.device_ptr_mut(s);
    let (pp, _g5) = at.pos.device_ptr(s);
    let (cp, _g6) = at.cells.device_ptr(s);
    let n_cells = int("layer_qkv cells", at.k.len() / kvd)?;
    let (kp, _g7) = at.k.device_ptr_mut(s);
    let (vp, _g8) = at.v.device_ptr_mut(s);
    let (wsp, _g9) = at.workspace.device_ptr_mut(s);
    let (oqp, _g10) = oq.device_ptr_mut(s);
    let (odp, _g11) = od.device_ptr_mut(s);
    let (ctp, _g12) = counters.device_ptr_mut(s);
    if xq % 16 != 0 {
        return Err(
            ShapeError::Unsupported("layer_qkv: activations not 16-byte aligned".into()).into(),
        );
    }
    let ints = [
        int("k", k)?,
        int("ncols", n)?,
        int("n_head", sh.n_head)?,
        int("n_head_kv", sh.n_head_kv)?,
        int("head_dim", hd)?,
        int("rot_dims", at.rope.rot_dims)?,
    ];
    let freq_scale = at.rope.freq_scale();
    let neox = i32::from(at.rope.mode == RopeMode::Neox);
    let n_ctx = int("n_ctx", sh.n_ctx)?;
    let mc = int("chunks", max_chunks)?;
    let chunk = int("chunk", at.chunk)?;
    let scale = sh.scale();
    let mut l = s.launch_builder(&f);
    l.arg(&wp)
        .arg(&xq)
        .arg(&xd)
        .arg(&bp)
        .arg(&yp)
        .arg(&ints[0])
        .arg(&ints[1]);
    l.arg(&pp).arg(&cp).arg(&kp).arg(&vp);
    l.arg(&ints[2]).arg(&ints[3]).arg(&ints[4]).arg(&ints[5]);
    l.arg(&freq_scale)
        .arg(&neox)
        .arg(&n_cells)
        .arg(&n_ctx)
        .arg(&mc)
        .arg(&chunk)
        .arg(&scale);
    l.arg(&wsp).arg(&oqp).arg(&odp).arg(&ctp);
    // SAFETY: the argument list matches the kernel; every buffer is checked against the
    // shapes above; cells and positions outside the caches are skipped on the device; the
    // counters are the caller's zeros, left at zero.
    unsafe { l.launch(config(heads)?) }?;
    Ok(())
}

/// The norm [`residual_norm`] runs after its matvec: `w` (the next op's norm weights) on
/// rows `sel[m]` of the new residual (all `n_out` first rows without `sel`), into `q` / `d`.
pub struct Norm<'a> {
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub sel: Option<CudaView<'a, i32>>,
    pub n_out: usize,
    pub q: CudaViewMut<'a, i8>,
    pub d: CudaViewMut<'a, f32>,
}

/// `layer_residual_norm`: `x += W a` (`x`: `[ncols][rows]`), then `norm` of the new `x`.
pub fn residual_norm(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    rows: usize,
    a: &Act<'_>,
    x: &mut CudaViewMut<'_, f32>,
    norm: Option<Norm<'_>>,
    counters: &mut CudaSlice<i32>,
) -> Result<(), OpError> {
    let n = a.ncols;
    cols(n)?;
    let k = a.q.len() / n;
    weights(w, rows, k)?;
    a.check(k)?;
    check_len("layer_residual_norm x", x.len(), n * rows)?;
    if counters.len() < COUNTERS {
        return Err(ShapeError::Len {
            what: "layer counters",
            expected: COUNTERS,
            got: counters.len(),
        }
        .into());
    }
    let f = gpu.function("layer", "layer_residual_norm")?;
    let s = &gpu.stream;
    let (wp, _g0) = w.device_ptr(s);
    let (xq, _g1) = a.q.device_ptr(s);
    let (xd, _g2) = a.d.device_ptr(s);
    let (yp, _g3) = x.device_ptr_mut(s);
    let mut ct = counters.slice_mut(COUNTERS - 1..);
    let (ctp, _g4) = ct.device_ptr_mut(s);
    if xq % 16 != 0 {
        return Err(ShapeError::Unsupported(
            "layer_residual_norm: activations not 16-byte aligned".into(),
        )
        .into());
    }
    let (rows_i, k_i, n_i) = (int("rows", rows)?, int("k", k)?, int("ncols", n)?);
    let blocks = rows
        .div_ceil(GEMV_Q8_WARPS * gemv_q8_rows_per_warp(k, n))
        .min(gpu.sm_count.max(1) * GEMV_Q8_BLOCKS_PER_SM);
    // Without a norm its pointers are null and the kernel stops after the matvec.
    let (mut nwp, mut eps, mut selp, mut n_out, mut qp, mut dp) = (0u64, 0f32, 0u64, 0i32, 0, 0);
    let mut norm = norm;
    let mut guards = Vec::new();
    if let Some(nm) = norm.as_mut() {
        if rows % QK != 0 {
            return Err(ShapeError::NotMultiple {
                what: "layer norm rows",
                got: rows,
                of: QK,
            }
            .into());
        }
        check_len("layer norm weights", nm.w.len(), rows)?;
        check_len("layer norm q", nm.q.len(), nm.n_out * rows)?;
        check_len("layer norm d", nm.d.len(), nm.n_out * rows / QK)?;
        match &nm.sel {
            Some(sel) => check_len("layer norm rows", sel.len(), nm.n_out)?,
            None => check_len("layer norm rows", nm.n_out.min(n), nm.n_out)?,
        }
        let (p, g) = nm.w.device_ptr(s);
        (nwp, eps) = (p, nm.eps);
        guards.push(g);
        if let Some(sel) = &nm.sel {
            let (p, g) = sel.device_ptr(s);
            selp = p;
            guards.push(g);
        }
        n_out = int("n_out", nm.n_out)?;
        let (p, g) = nm.q.device_ptr_mut(s);
        qp = p;
        guards.push(g);
        let (p, g) = nm.d.device_ptr_mut(s);
        dp = p;
        guards.push(g);
    }
    let mut l = s.launch_builder(&f);
    l.arg(&wp)
        .arg(&xq)
        .arg(&xd)
        .arg(&yp)
        .arg(&rows_i)
        .arg(&k_i)
        .arg(&n_i);
    l.arg(&nwp)
        .arg(&eps)
        .arg(&selp)
        .arg(&n_out)
        .arg(&qp)
        .arg(&dp)
        .arg(&ctp);
    // SAFETY: the argument list matches the kernel; the buffers are checked above; the
    // selected rows are the caller's, into x; the counter is left at zero.
    unsafe { l.launch(config(blocks)?) }?;
    drop(guards);
    Ok(())
}

/// `layer_gate_up`: `gu = Wgu a` (`[ncols][2 n_ff]`, gate rows then up rows), then
/// `silu(gate) * up` quantized into `q` / `d` (`[ncols][n_ff]`).
pub fn gate_up(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    n_ff: usize,
    a: &Act<'_>,
    gu: &mut CudaViewMut<'_, f32>,
    q: &mut CudaViewMut<'_, i8>,
    d: &mut CudaViewMut<'_, f32>,
) -> Result<(), OpError> {
    let n = a.ncols;
    cols(n)?;
    if n_ff == 0 || n_ff % QK != 0 {
        return Err(ShapeError::NotMultiple {
            what: "layer_gate_up n_ff",
            got: n_ff,
            of: QK,
        }
        .into());
    }
    let k = a.q.len() / n;
    weights(w, 2 * n_ff, k)?;
    a.check(k)?;
    check_len("layer_gate_up gu", gu.len(), n * 2 * n_ff)?;
    check_len("layer_gate_up q", q.len(), n * n_ff)?;
    check_len("layer_gate_up d", d.len(), n * n_ff / QK)?;
    let f = gpu.function("layer", "layer_gate_up")?;
    let s = &gpu.stream;
    let (wp, _g0) = w.device_ptr(s);
    let (xq, _g1) = a.q.device_ptr(s);
    let (xd, _g2) = a.d.device_ptr(s);
    let (yp, _g3) = gu.device_ptr_mut(s);
    let (qp, _g4) = q.device_ptr_mut(s);
    let (dp, _g5) = d.device_ptr_mut(s);
    if xq % 16 != 0 {
        return Err(ShapeError::Unsupported(
            "layer_gate_up: activations not 16-byte aligned".into(),
        )
        .into());
    }
    let (ff_i, k_i, n_i) = (int("n_ff", n_ff)?, int("k", k)?, int("ncols", n)?);
    let mut l = s.launch_builder(&f);
    l.arg(&wp)
        .arg(&xq)
        .arg(&xd)
        .arg(&yp)
        .arg(&ff_i)
        .arg(&k_i)
        .arg(&n_i)
        .arg(&qp)
        .arg(&dp);
    // SAFETY: the argument list matches the kernel; every buffer is checked above.
    unsafe { l.launch(config(n_ff / QK)?) }?;
    Ok(())
}
