//! The CPU pass's buffers and linear layers: one micro-batch's activations, allocated once,
//! and the matmul in either activation mode.

use inferloop_kernels::cpu::gemm::gemm;
use inferloop_kernels::cpu::gemv::{gemv, ShapeError};
use inferloop_kernels::cpu::gemv_q8::{gemv_q8, MAX_COLS};
use inferloop_kernels::cpu::quantize::{quantize_into, Q8Act};
use inferloop_kernels::cpu::simd::Isa;
use inferloop_kernels::q8::{Q8Matrix, QK};

use super::super::batch::{Activations, UBATCH};
use super::super::hparams::HParams;

/// Activations of one pass, `UBATCH` rows of each width.
pub(super) struct Scratch {
    /// The residual stream, `[n][n_embd]`.
    pub(super) x: Vec<f32>,
    /// Its normalized copy, the matmuls' input.
    pub(super) xn: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) attn: Vec<f32>,
    /// A projection back to `n_embd` (attention output, FFN down) before the residual add.
    pub(super) o: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) act: Vec<f32>,
    /// The quantized input of the matmuls, sized once for the widest (`n_ff`).
    pub(super) qa: Q8Act,
    pub(super) tokens: Vec<i32>,
    pub(super) pos: Vec<i32>,
}

impl Scratch {
    pub(super) fn new(hp: &HParams) -> Self {
        let rows = |width: usize| vec![0.0; UBATCH * width];
        Self {
            x: rows(hp.n_embd),
            xn: rows(hp.n_embd),
            q: rows(hp.q_dim()),
            k: rows(hp.kv_dim()),
            v: rows(hp.kv_dim()),
            attn: rows(hp.q_dim()),
            o: rows(hp.n_embd),
            gate: rows(hp.n_ff),
            up: rows(hp.n_ff),
            act: rows(hp.n_ff),
            qa: Q8Act {
                q: Vec::with_capacity(UBATCH * hp.n_ff.max(hp.n_embd).max(hp.q_dim())),
                d: Vec::with_capacity(UBATCH * hp.n_ff.max(hp.n_embd).max(hp.q_dim()) / QK),
                rows: 0,
                k: 0,
            },
            tokens: vec![0; UBATCH],
            pos: vec![0; UBATCH],
        }
    }
}

/// The linear layers of one pass: [`Matmul::input`] once per input (it quantizes it for
/// [`Activations::Q8`]), then [`Matmul::run`] for each weight that reads it.
pub(super) struct Matmul {
    pub(super) isa: Isa,
    pub(super) threads: usize,
    pub(super) activations: Activations,
}

impl Matmul {
    /// Prepares the `n` rows of `x` in `a`, reusing its buffers (no allocation once they
    /// have held the widest input).
    pub(super) fn input(&self, x: &[f32], n: usize, a: &mut Q8Act) -> Result<(), ShapeError> {
        if self.activations == Activations::F32 {
            return Ok(());
        }
        a.q.resize(x.len(), 0);
        a.d.resize(x.len() / QK, 0.0);
        (a.rows, a.k) = (n, x.len() / n.max(1));
        quantize_into(self.isa, x, &mut a.q, &mut a.d)
    }

    /// `y = W . x` for the input last prepared: `x` itself in f32, `a` quantized. Up to
    /// [`MAX_COLS`] quantized rows take the decode GEMV's order (the CUDA pass's choice
    /// too), more the GEMM's.
    pub(super) fn run(
        &self,
        w: &Q8Matrix,
        x: &[f32],
        n: usize,
        a: &Q8Act,
        y: &mut [f32],
    ) -> Result<(), ShapeError> {
        match self.activations {
            Activations::Q8 if a.rows <= MAX_COLS => {
                gemv_q8(self.isa, self.threads, w, a, None, false, y)
            }
            Activations::Q8 => gemm(self.isa, self.threads, w, a, y),
            Activations::F32 => gemv(self.isa, self.threads, w, x, n, y),
        }
    }
}
