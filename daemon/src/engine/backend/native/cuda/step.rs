//! The kernels of one pass, launched on the GPU's stream in order. A step of 1..=8 tokens
//! (every step: the micro-batch is 8) takes four launches a layer ([`launch_layers`],
//! `layer.cu`): Q|K|V with RoPE, the KV store and attention; the output matmul into the
//! residual with the FFN norm; gate|up with silu·up; the down matmul into the residual with
//! the next norm. A larger step would take nine (`fused.cu` and the GEMM): rmsnorm+quantize,
//! the Q|K|V matmul (bias added in its epilogue), RoPE+KV store, the step's attention (its
//! output quantized), the output matmul added into the residual, then rmsnorm+quantize, the
//! gate|up matmul, silu·up+quantize, the down matmul added into the residual. Nothing here
//! depends on a token's values: positions, KV cells and the wanted rows are read on the
//! device, so the same launches, captured once, replay any step with the same token and
//! wanted-row counts ([`super::graph`]).

use inferloop_kernels::cpu::attention::CHUNK;
use inferloop_kernels::cuda::cudarc::driver::{CudaSlice, CudaViewMut};
use inferloop_kernels::cuda::fused::{self, AttnOut};
use inferloop_kernels::cuda::{layer, ops, q8 as gq8, Gpu};
use inferloop_kernels::q8::QK;

use super::super::error::NativeError;
use super::super::hparams::HParams;
use super::kv::DeviceKv;
use super::memory::{attn_shape, op, DevQ8, DevScratch, DevWeights, Input};

/// A pass's launch shapes: `n` tokens, `m` of them wanting logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub(super) n: usize,
    pub(super) m: usize,
}

/// Launches every kernel of a pass of `sh.n` tokens whose inputs are in `s` (tokens,
/// positions, cells, wanted rows), leaving `sh.m` logits rows in `s.logits`.
pub(super) fn launch(
    g: &Gpu,
    hp: &HParams,
    w: &DevWeights,
    s: &mut DevScratch,
    cells: &mut DeviceKv,
    n_ctx: usize,
    sh: Shape,
) -> Result<(), NativeError> {
    let Shape { n, m } = sh;
    let (e, qd, ff, eps) = (hp.n_embd, hp.q_dim(), hp.n_ff, hp.rms_eps);
    let rope = hp.rope(hp.n_head);
    let shape = attn_shape(hp, n_ctx, 1);
    let none = None::<&CudaSlice<i32>>;
    ops::embed(
        g,
        &w.token_embd.bytes,
        hp.n_vocab,
        e,
        &Input::Tokens.of(&s.inputs, n),
        &mut s.x.slice_mut(..n * e),
    )
    .map_err(op(None, "token_embd"))?;
    if (1..=gq8::GEMV_MAX_COLS).contains(&n) && !w.layers.is_empty() {
        return launch_layers(g, hp, w, s, cells, n_ctx, sh);
    }
    for (l, ly) in w.layers.iter().enumerate() {
        let le = Some(l);
        let (qa_q, qa_d) = (&mut s.qa_q, &mut s.qa_d);
        fused::rmsnorm_quantize(
            g,
            &s.x.slice(..n * e),
            none,
            n,
            &ly.attn_norm,
            eps,
            &mut qa_q.slice_mut(..n * e),
            &mut qa_d.slice_mut(..n * e / QK),
        )
        .map_err(op(le, "attn_norm"))?;
        let wqkv = &ly.wqkv;
        linear(g, wqkv, n, s, ly.bqkv.as_ref(), Out::Qkv).map_err(op(le, "attn_qkv"))?;
        fused::rope_store(
            g,
            &rope,
            hp.n_head_kv,
            &mut s.qkv.slice_mut(..n * wqkv.rows),
            &Input::Pos.of(&s.inputs, n),
            &Input::Cells.of(&s.inputs, n),
            &mut cells.k[l],
            &mut cells.v[l],
        )
        .map_err(op(le, "rope"))?;
        fused::attention_step(
            g,
            &shape,
            &s.qkv.slice(..n * wqkv.rows),
            &cells.k[l],
            &cells.v[l],
            &Input::Pos.of(&s.inputs, n),
            &Input::Cells.of(&s.inputs, n),
            CHUNK,
            AttnOut {
                out: &mut s.attn.slice_mut(..n * qd),
                q: &mut s.qa_q.slice_mut(..n * qd),
                d: &mut s.qa_d.slice_mut(..n * qd / QK),
                workspace: &mut s.attn_ws,
            },
        )
        .map_err(op(le, "attention"))?;
        linear(g, &ly.wo, n, s, None, Out::Residual).map_err(op(le, "attn_output"))?;
        fused::rmsnorm_quantize(
            g,
            &s.x.slice(..n * e),
            none,
            n,
            &ly.ffn_norm,
            eps,
            &mut s.qa_q.slice_mut(..n * e),
            &mut s.qa_d.slice_mut(..n * e / QK),
        )
        .map_err(op(le, "ffn_norm"))?;
        linear(g, &ly.ffn_gate_up, n, s, None, Out::GateUp).map_err(op(le, "ffn_gate_up"))?;
        fused::silu_mul_quantize(
            g,
            &s.gate_up.slice(..n * 2 * ff),
            ff,
            &mut s.qa_q.slice_mut(..n * ff),
            &mut s.qa_d.slice_mut(..n * ff / QK),
        )
        .map_err(op(le, "silu_mul"))?;
        linear(g, &ly.ffn_down, n, s, None, Out::Residual).map_err(op(le, "ffn_down"))?;
    }
    if m == 0 {
        return Ok(());
    }
    // The wanted rows, gathered, normalized and quantized in one launch, then projected.
    fused::rmsnorm_quantize(
        g,
        &s.x.slice(..n * e),
        Some(&Input::Rows.of(&s.inputs, m)),
        m,
        &w.output_norm,
        eps,
        &mut s.qa_q.slice_mut(..m * e),
        &mut s.qa_d.slice_mut(..m * e / QK),
    )
    .map_err(op(None, "output_norm"))?;
    let output = w.output.as_ref().unwrap_or(&w.token_embd);
    linear(g, output, m, s, None, Out::Logits).map_err(op(None, "output"))
}

/// The layers of a step of 1..=[`gq8::GEMV_MAX_COLS`] tokens, four launches each
/// (`layer.cu`): Q|K|V with RoPE, the KV store and the attention, quantized into `qb`; the
/// output projection into `x` with the FFN norm of the new `x` quantized into `qa`; gate|up
/// with silu·up into `qb`; down into `x` with the next layer's attention norm (after the
/// last layer, the output norm of the wanted rows) into `qa`. Then the logits.
fn launch_layers(
    g: &Gpu,
    hp: &HParams,
    w: &DevWeights,
    s: &mut DevScratch,
    cells: &mut DeviceKv,
    n_ctx: usize,
    sh: Shape,
) -> Result<(), NativeError> {
    let Shape { n, m } = sh;
    let (e, qd, ff, eps) = (hp.n_embd, hp.q_dim(), hp.n_ff, hp.rms_eps);
    let qkv_w = qd + 2 * hp.kv_dim();
    let none = None::<&CudaSlice<i32>>;
    fused::rmsnorm_quantize(
        g,
        &s.x.slice(..n * e),
        none,
        n,
        &w.layers[0].attn_norm,
        eps,
        &mut s.qa_q.slice_mut(..n * e),
        &mut s.qa_d.slice_mut(..n * e / QK),
    )
    .map_err(op(Some(0), "attn_norm"))?;
    let last = w.layers.len() - 1;
    for (l, ly) in w.layers.iter().enumerate() {
        let le = Some(l);
        let normed = layer::Act {
            q: s.qa_q.slice(..n * e),
            d: s.qa_d.slice(..n * e / QK),
            ncols: n,
        };
        let at = layer::Attn {
            shape: attn_shape(hp, n_ctx, 1),
            rope: hp.rope(hp.n_head),
            pos: Input::Pos.of(&s.inputs, n),
            cells: Input::Cells.of(&s.inputs, n),
            k: &mut cells.k[l],
            v: &mut cells.v[l],
            chunk: CHUNK,
            workspace: s.attn_ws.slice_mut(..),
        };
        layer::qkv(
            g,
            &ly.wqkv.bytes,
            &normed,
            ly.bqkv.as_ref(),
            &mut s.qkv.slice_mut(..n * qkv_w),
            at,
            &mut s.qb_q.slice_mut(..n * qd),
            &mut s.qb_d.slice_mut(..n * qd / QK),
            &mut s.counters,
        )
        .map_err(op(le, "attn_qkv"))?;
        let ffn_norm = layer::Norm {
            w: &ly.ffn_norm,
            eps,
            sel: None,
            n_out: n,
            q: s.qa_q.slice_mut(..n * e),
            d: s.qa_d.slice_mut(..n * e / QK),
        };
        let a = layer::Act {
            q: s.qb_q.slice(..n * qd),
            d: s.qb_d.slice(..n * qd / QK),
            ncols: n,
        };
        let x = &mut s.x.slice_mut(..n * e);
        layer::residual_norm(g, &ly.wo.bytes, e, &a, x, Some(ffn_norm), &mut s.counters)
            .map_err(op(le, "attn_output"))?;
        let normed = layer::Act {
            q: s.qa_q.slice(..n * e),
            d: s.qa_d.slice(..n * e / QK),
            ncols: n,
        };
        layer::gate_up(
            g,
            &ly.ffn_gate_up.bytes,
            ff,
            &normed,
            &mut s.gate_up.slice_mut(..n * 2 * ff),
            &mut s.qb_q.slice_mut(..n * ff),
            &mut s.qb_d.slice_mut(..n * ff / QK),
        )
        .map_err(op(le, "ffn_gate_up"))?;
        let next = match (l < last, m > 0) {
            (true, _) => Some(layer::Norm {
                w: &w.layers[l + 1].attn_norm,
                eps,
                sel: None,
                n_out: n,
                q: s.qa_q.slice_mut(..n * e),
                d: s.qa_d.slice_mut(..n * e / QK),
            }),
            (false, true) => Some(layer::Norm {
                w: &w.output_norm,
                eps,
                sel: Some(Input::Rows.of(&s.inputs, m)),
                n_out: m,
                q: s.qa_q.slice_mut(..m * e),
                d: s.qa_d.slice_mut(..m * e / QK),
            }),
            (false, false) => None,
        };
        let a = layer::Act {
            q: s.qb_q.slice(..n * ff),
            d: s.qb_d.slice(..n * ff / QK),
            ncols: n,
        };
        let x = &mut s.x.slice_mut(..n * e);
        layer::residual_norm(g, &ly.ffn_down.bytes, e, &a, x, next, &mut s.counters)
            .map_err(op(le, "ffn_down"))?;
    }
    if m == 0 {
        return Ok(());
    }
    let output = w.output.as_ref().unwrap_or(&w.token_embd);
    linear(g, output, m, s, None, Out::Logits).map_err(op(None, "output"))
}

/// Where a matmul's result goes.
#[derive(Clone, Copy)]
enum Out {
    Qkv,
    GateUp,
    /// Added into the residual stream `x`.
    Residual,
    Logits,
}

/// A matmul's failure: the matmul's own, or the add after it.
#[derive(Debug, thiserror::Error)]
enum LinearError {
    #[error(transparent)]
    Q8(#[from] gq8::Q8Error),
    #[error(transparent)]
    Op(#[from] ops::OpError),
}

/// `y = W . x (+ bias)`, or `x += W . x'` for [`Out::Residual`], for the `n` rows last
/// quantized into the scratch's `qa_q` / `qa_d`: one decode GEMV launch (bias and residual
/// add in its epilogue) up to [`gq8::GEMV_MAX_COLS`] rows, the pass's micro-batch size;
/// beyond, the GEMM and separate adds (the same arithmetic, more launches).
fn linear(
    g: &Gpu,
    m: &DevQ8,
    n: usize,
    s: &mut DevScratch,
    bias: Option<&CudaSlice<f32>>,
    out: Out,
) -> Result<(), LinearError> {
    let rows = n * m.rows;
    let (xq, xd) = (s.qa_q.slice(..n * m.k), s.qa_d.slice(..n * m.k / QK));
    let (mut y, accumulate): (CudaViewMut<'_, f32>, bool) = match out {
        Out::Qkv => (s.qkv.slice_mut(..rows), false),
        Out::GateUp => (s.gate_up.slice_mut(..rows), false),
        Out::Residual => (s.x.slice_mut(..rows), true),
        Out::Logits => (s.logits.slice_mut(..rows), false),
    };
    if (1..=gq8::GEMV_MAX_COLS).contains(&n) {
        let bias = bias.map(|b| b.slice(..));
        let (w, k) = (&m.bytes, m.k);
        gq8::gemv_q8_into(
            g,
            w,
            m.rows,
            k,
            &xq,
            &xd,
            n,
            bias.as_ref(),
            accumulate,
            &mut y,
        )?;
        return Ok(());
    }
    let mut o = s.o.slice_mut(..rows);
    let t = if accumulate { &mut o } else { &mut y };
    gq8::gemm_parts(g, &m.bytes, m.rows, m.k, &xq, &xd, n, t)?;
    if let Some(b) = bias {
        for r in 0..n {
            ops::add_inplace(g, &mut t.slice_mut(r * m.rows..(r + 1) * m.rows), b)?;
        }
    }
    if accumulate {
        ops::add_inplace(g, &mut y, &o)?;
    }
    Ok(())
}
