//! The KV cache: per layer, K and V as f16 bits in the attention kernel's layout
//! `[n_seq][n_ctx][n_head_kv][head_dim]`, cell `p` of a sequence holding position `p`.
//!
//! Each sequence keeps a length: positions `0..len` are valid. The forward pass writes at
//! `pos <= len` and the sequence then holds `0..=pos`; attention reads only `0..=pos`, so
//! what lies beyond a sequence's length is never read and is not cleared.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::NativeError;

pub struct KvCache {
    n_seq: usize,
    n_ctx: usize,
    /// Values per cell: `n_head_kv * head_dim`.
    kv_dim: usize,
    n_layer: usize,
    store: Store,
    len: Vec<usize>,
}

/// Where the cells live: host memory for the CPU pass, GPU memory for the CUDA pass.
pub(super) enum Store {
    Host(HostKv),
    Device(super::cuda::DeviceKv),
}

/// Per layer, `n_seq * n_ctx * kv_dim` f16 bits of K and of V.
pub(super) struct HostKv {
    n_ctx: usize,
    kv_dim: usize,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("n_seq", &self.n_seq)
            .field("n_ctx", &self.n_ctx)
            .field("kv_dim", &self.kv_dim)
            .field("on_device", &matches!(self.store, Store::Device(_)))
            .field("len", &self.len)
            .finish()
    }
}

impl KvCache {
    /// An empty cache (every sequence of length 0) of `n_seq` sequences × `n_ctx` cells.
    pub fn new(n_layer: usize, n_seq: usize, n_ctx: usize, kv_dim: usize) -> Self {
        let cells = n_seq * n_ctx * kv_dim;
        let host = HostKv {
            n_ctx,
            kv_dim,
            k: (0..n_layer).map(|_| vec![0; cells]).collect(),
            v: (0..n_layer).map(|_| vec![0; cells]).collect(),
        };
        Self::with_store(n_layer, n_seq, n_ctx, kv_dim, Store::Host(host))
    }

    pub(super) fn with_store(
        n_layer: usize,
        n_seq: usize,
        n_ctx: usize,
        kv_dim: usize,
        store: Store,
    ) -> Self {
        Self {
            n_seq,
            n_ctx,
            kv_dim,
            n_layer,
            store,
            len: vec![0; n_seq],
        }
    }

    pub(super) fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Bytes the cache holds (K and V of every layer).
    pub fn bytes(&self) -> usize {
        2 * self.n_layer * self.n_seq * self.n_ctx * self.kv_dim * std::mem::size_of::<u16>()
    }

    /// Positions `seq` holds (`0..len`); 0 for a sequence outside the cache.
    pub fn seq_len(&self, seq: usize) -> usize {
        self.len.get(seq).copied().unwrap_or(0)
    }

    /// Keeps positions `0..len` of `seq` (no more than it holds) and drops the rest.
    pub fn truncate(&mut self, seq: usize, len: usize) -> Result<(), NativeError> {
        self.check_seq(seq)?;
        self.len[seq] = self.len[seq].min(len);
        Ok(())
    }

    /// Drops everything `seq` holds.
    pub fn clear(&mut self, seq: usize) -> Result<(), NativeError> {
        self.truncate(seq, 0)
    }

    /// Replaces what `dst` holds with positions `0..len` of `src`, copied in every layer.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), NativeError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if len > self.len[src] {
            return Err(NativeError::Kv(format!(
                "cannot copy {len} positions of sequence {src}, which holds {}",
                self.len[src]
            )));
        }
        if src != dst {
            let stride = self.n_ctx * self.kv_dim;
            let n = len * self.kv_dim;
            match &mut self.store {
                Store::Host(h) => {
                    for buf in h.k.iter_mut().chain(h.v.iter_mut()) {
                        buf.copy_within(src * stride..src * stride + n, dst * stride);
                    }
                }
                Store::Device(d) => d.copy(src * stride, dst * stride, n)?,
            }
        }
        self.len[dst] = len;
        Ok(())
    }

    pub(super) fn set_len(&mut self, seq: usize, len: usize) {
        self.len[seq] = len;
    }

    fn check_seq(&self, seq: usize) -> Result<(), NativeError> {
        if seq < self.n_seq {
            Ok(())
        } else {
            Err(NativeError::Kv(format!(
                "sequence {seq} is outside the cache's {}",
                self.n_seq
            )))
        }
    }
}

impl HostKv {
    /// Stores one token's K and V (`kv_dim` f32 each, rounded to f16) at `(seq, pos)` of
    /// `layer`. Does not change the sequence's length ([`Self::set_len`] does, once per
    /// batch); the caller has checked `seq` and `pos`.
    pub(super) fn write(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        let at = (seq * self.n_ctx + pos) * self.kv_dim;
        let cell = at..at + self.kv_dim;
        self.k[layer][cell.clone()]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(k);
        self.v[layer][cell]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(v);
    }

    /// `seq`'s K and V in `layer`: `[n_ctx][n_head_kv][head_dim]` each, what the attention
    /// twin takes as one sequence.
    pub(super) fn seq_layer(&self, layer: usize, seq: usize) -> (&[u16], &[u16]) {
        let stride = self.n_ctx * self.kv_dim;
        let r = seq * stride..(seq + 1) * stride;
        (&self.k[layer][r.clone()], &self.v[layer][r])
    }
}
