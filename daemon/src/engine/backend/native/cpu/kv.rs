//! The CPU pass's KV cells in host memory: per layer, K and V as f16 bits,
//! `[n_seq][n_ctx][kv_dim]`, what the attention twin reads one sequence at a time.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::super::error::NativeError;
use super::super::kv::{check_rows, Cells};

/// Per layer, `n_seq * n_ctx * kv_dim` f16 bits of K and of V.
pub struct HostKv {
    n_ctx: usize,
    kv_dim: usize,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl HostKv {
    /// Zeroed cells for `n_layer` layers of `n_seq` sequences × `n_ctx` positions.
    pub fn new(n_layer: usize, n_seq: usize, n_ctx: usize, kv_dim: usize) -> Self {
        let cells = n_seq * n_ctx * kv_dim;
        Self {
            n_ctx,
            kv_dim,
            k: (0..n_layer).map(|_| vec![0; cells]).collect(),
            v: (0..n_layer).map(|_| vec![0; cells]).collect(),
        }
    }

    /// Stores one token's K and V (`kv_dim` f32 each, rounded to f16) at `(seq, pos)` of
    /// `layer`. Does not change the sequence's length (the cache's `hold` does, once per
    /// pass); the caller has checked `seq` and `pos`.
    pub fn write(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        let at = (seq * self.n_ctx + pos) * self.kv_dim;
        let cell = at..at + self.kv_dim;
        self.k[layer][cell.clone()]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(k);
        self.v[layer][cell]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(v);
    }

    /// Values per layer of K (and of V).
    fn cells(&self) -> usize {
        self.k.first().map_or(0, Vec::len)
    }

    /// `seq`'s K and V in `layer`: `[n_ctx][n_head_kv][head_dim]` each, what the attention
    /// twin takes as one sequence.
    pub fn seq_layer(&self, layer: usize, seq: usize) -> (&[u16], &[u16]) {
        let stride = self.n_ctx * self.kv_dim;
        let r = seq * stride..(seq + 1) * stride;
        (&self.k[layer][r.clone()], &self.v[layer][r])
    }
}

impl Cells for HostKv {
    fn copy(&mut self, src: usize, dst: usize, n: usize) -> Result<(), NativeError> {
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            if src + n > buf.len() || dst + n > buf.len() {
                return Err(NativeError::Kv(format!(
                    "copy of {n} values from {src} to {dst} outside a layer of {}",
                    buf.len()
                )));
            }
            buf.copy_within(src..src + n, dst);
        }
        Ok(())
    }

    fn read(&mut self, at: usize, n: usize, out: &mut [u8]) -> Result<(), NativeError> {
        check_rows(at, n, self.cells(), self.k.len(), out.len())?;
        if n == 0 {
            return Ok(()); // `chunks_exact` takes no empty chunks
        }
        let parts = self.k.iter().zip(&self.v).flat_map(|(k, v)| [k, v]);
        for (buf, host) in parts.zip(out.chunks_exact_mut(2 * n)) {
            for (b, &x) in host.chunks_exact_mut(2).zip(&buf[at..at + n]) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        Ok(())
    }

    fn write(&mut self, at: usize, n: usize, src: &[u8]) -> Result<(), NativeError> {
        check_rows(at, n, self.cells(), self.k.len(), src.len())?;
        if n == 0 {
            return Ok(()); // `chunks_exact` takes no empty chunks
        }
        let parts = self.k.iter_mut().zip(self.v.iter_mut());
        let parts = parts.flat_map(|(k, v)| [k, v]);
        for (buf, host) in parts.zip(src.chunks_exact(2 * n)) {
            for (x, b) in buf[at..at + n].iter_mut().zip(host.chunks_exact(2)) {
                *x = u16::from_le_bytes([b[0], b[1]]);
            }
        }
        Ok(())
    }
}
