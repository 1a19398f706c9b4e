//! Twin of `kernels/attention.cu`: decode attention, one query token per sequence over an f16
//! KV cache, grouped-query, split along the sequence into chunks (split-K) then combined.
//!
//! Layouts (f16 as u16 bits; one layer's cache):
//! - `q`: `[n_seq][n_head][head_dim]` f32; `out` the same.
//! - `k`, `v`: `[n_seq][n_ctx][n_head_kv][head_dim]`; sequence `s` attends to positions
//!   `0..kv_len[s]` (its own token already stored at `kv_len[s] - 1`).
//! - q head `h` reads kv head `h / (n_head / n_head_kv)`.
//!
//! Each chunk replays a CUDA block of [`THREADS`] threads: a score is a warp's dot product
//! (lane `l` fuses `q[l + 32j] * k[l + 32j]` for `j = 0, 1, …`, then the xor butterfly)
//! times `scale`; then `e = expf(score - max)` and the block sum of those as in softmax; then
//! `o[d]` fuses `e_p * v_p[d]` over the chunk's positions in order. The combine weighs chunk
//! `c` by `expf(m_c - M)`, fusing `l_c * w` and `o_c[d] * w` in chunk order, and divides.
//! The vector paths run the 32 lanes, or the dims of `o`, 8 or 4 at a time: the same
//! operation per lane, so every [`Isa`] gives the GPU's bits for the same `chunk`. Another
//! chunk size changes the rounding only (see the split-versus-unsplit test).

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::simd::Isa;
use super::softmax::exp_and_sum;
use super::vector::{axpy, check_len, div, expf, fma_acc, warp_sum, ShapeError};

/// Threads per block of both kernels (at most the kernel's `ATTN_THREADS`).
pub const THREADS: usize = 128;
/// Positions per chunk by default; the kernel's `ATTN_CHUNK`, the most it can take.
pub const CHUNK: usize = 256;
/// The largest head the kernel holds (4 values per lane).
pub const MAX_HEAD_DIM: usize = 128;

/// The shape of one layer's decode attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Sequences, one query token each.
    pub n_seq: usize,
    pub n_head: usize,
    /// Divides `n_head`.
    pub n_head_kv: usize,
    /// A multiple of 32, at most [`MAX_HEAD_DIM`].
    pub head_dim: usize,
    /// Positions the cache holds per sequence.
    pub n_ctx: usize,
}

impl AttnShape {
    pub fn check(&self) -> Result<(), ShapeError> {
        let bad = |why: &str| {
            Err(ShapeError::Unsupported(format!(
                "attention {self:?}: {why}"
            )))
        };
        if self.head_dim == 0 || self.head_dim % 32 != 0 || self.head_dim > MAX_HEAD_DIM {
            return bad("head_dim must be a multiple of 32 up to 128");
        }
        if self.n_head_kv == 0 || self.n_head % self.n_head_kv != 0 {
            return bad("n_head must be a multiple of n_head_kv");
        }
        if self.n_seq == 0 || self.n_ctx == 0 {
            return bad("no sequence or no context");
        }
        Ok(())
    }

    /// `1 / sqrt(head_dim)`, the kernel's `scale` argument (computed here for both).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Values of `q` and `out`.
    pub fn q_len(&self) -> usize {
        self.n_seq * self.n_head * self.head_dim
    }

    /// Values of `k` and of `v`.
    pub fn kv_len(&self) -> usize {
        self.n_seq * self.n_ctx * self.n_head_kv * self.head_dim
    }

    /// Chunks of `chunk` positions that cover `max_kv` positions.
    pub fn chunks(max_kv: usize, chunk: usize) -> usize {
        max_kv.div_ceil(chunk.max(1))
    }

    /// Floats of the GPU's partial-result workspace for `max_kv` positions in `chunk`s (at
    /// least one chunk: the launch has one even when no sequence has a position).
    pub fn workspace_len(&self, max_kv: usize, chunk: usize) -> usize {
        self.n_seq * self.n_head * Self::chunks(max_kv, chunk).max(1) * (self.head_dim + 2)
    }
}

/// Decode attention into `out` (`[n_seq][n_head][head_dim]`) with chunks of `chunk`
/// positions ([`CHUNK`] is what the GPU uses by default). A sequence with no positions gets
/// zeros, as on the GPU.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    isa: Isa,
    shape: &AttnShape,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    kv_len: &[usize],
    chunk: usize,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    shape.check()?;
    check_len("attention q", q.len(), shape.q_len())?;
    check_len("attention out", out.len(), shape.q_len())?;
    check_len("attention k", k.len(), shape.kv_len())?;
    check_len("attention v", v.len(), shape.kv_len())?;
    check_len("attention kv_len", kv_len.len(), shape.n_seq)?;
    if chunk == 0 {
        return Err(ShapeError::Unsupported(
            "attention chunk of 0 positions".into(),
        ));
    }
    if let Some(&n) = kv_len.iter().find(|&&n| n > shape.n_ctx) {
        return Err(ShapeError::Unsupported(format!(
            "attention over {n} positions in a cache of {}",
            shape.n_ctx
        )));
    }
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let seq_kv = shape.n_ctx * shape.n_head_kv * hd;
    let scale = shape.scale();
    let mut scores = Vec::with_capacity(chunk);
    let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::new();
    for s in 0..shape.n_seq {
        let (ks, vs) = (
            &k[s * seq_kv..(s + 1) * seq_kv],
            &v[s * seq_kv..(s + 1) * seq_kv],
        );
        for h in 0..shape.n_head {
            let at = (s * shape.n_head + h) * hd;
            let qh = &q[at..at + hd];
            let kv = Head {
                k: ks,
                v: vs,
                off: h / group * hd,
                stride: shape.n_head_kv * hd,
                hd,
            };
            parts.clear();
            let n = kv_len[s];
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                parts.push(partial(isa, qh, &kv, start, len, scale, &mut scores));
                start += chunk;
            }
            combine(isa, &parts, &mut out[at..at + hd]);
        }
    }
    Ok(())
}

/// One kv head of one sequence's cache.
struct Head<'a> {
    k: &'a [u16],
    v: &'a [u16],
    /// Of the head within a position.
    off: usize,
    /// Between positions.
    stride: usize,
    hd: usize,
}

impl Head<'_> {
    fn row(&self, cache: &[u16], p: usize, out: &mut [f32]) {
        let at = p * self.stride + self.off;
        let bits: &[f16] = cache[at..at + self.hd].reinterpret_cast();
        bits.convert_to_f32_slice(&mut out[..self.hd]);
    }
}

/// One block of `attn_partial_f16`: `(max, sum, o)` over positions `start..start + len`.
fn partial(
    isa: Isa,
    q: &[f32],
    kv: &Head<'_>,
    start: usize,
    len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
) -> (f32, f32, Vec<f32>) {
    let mut row = [0f32; MAX_HEAD_DIM];
    scores.clear();
    for p in start..start + len {
        kv.row(kv.k, p, &mut row);
        let mut lanes = [0f32; 32];
        for (qj, kj) in q.chunks_exact(32).zip(row[..kv.hd].chunks_exact(32)) {
            fma_acc(isa, &mut lanes, qj, kj);
        }
        scores.push(warp_sum(&mut lanes) * scale);
    }
    let (m, l) = exp_and_sum(isa, scores, THREADS);
    let mut o = vec![0f32; kv.hd];
    for (p, &e) in (start..start + len).zip(scores.iter()) {
        kv.row(kv.v, p, &mut row);
        axpy(isa, &mut o, e, &row[..kv.hd]);
    }
    (m, l, o)
}

/// `attn_combine_f32` for one head: the chunks weighed by `expf(m_c - M)`, in order.
fn combine(isa: Isa, parts: &[(f32, f32, Vec<f32>)], out: &mut [f32]) {
    out.fill(0.0);
    if parts.is_empty() {
        return;
    }
    let mx = parts.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p.0));
    let mut l = 0f32;
    for (m, lc, o) in parts {
        let w = expf(m - mx);
        l = lc.mul_add(w, l);
        axpy(isa, out, w, o);
    }
    div(isa, out, l);
}
