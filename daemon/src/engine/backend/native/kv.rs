//! The KV cache's bookkeeping, whatever memory holds its cells: per layer, K and V as f16
//! bits in the attention kernel's layout `[n_seq][n_ctx][n_head_kv][head_dim]`, cell `p` of
//! a sequence holding position `p`. Each pass owns a [`KvCache`] over its own [`Cells`].
//!
//! Each sequence keeps a length: positions `0..len` are valid. The forward pass writes at
//! `pos <= len` and the sequence then holds `0..=pos`; attention reads only `0..=pos`, so
//! what lies beyond a sequence's length is never read and is not cleared.
//!
//! A sequence's prefix can also leave the cells as bytes and come back into any sequence
//! ([`Kv::save_prefix`], [`Kv::restore_prefix`]; the bytes are [`super::saved`]'s).

use super::batch::BatchToken;
use super::error::NativeError;
use super::saved::{self, Geometry, HEADER_BYTES};

/// A KV cache as its users see it: the geometry, the sequences' lengths, and what is done
/// to a sequence between passes.
pub trait Kv {
    fn n_seq(&self) -> usize;

    fn n_ctx(&self) -> usize;

    /// Bytes the cache holds (K and V of every layer).
    fn bytes(&self) -> usize;

    /// Positions `seq` holds (`0..len`); 0 for a sequence outside the cache.
    fn seq_len(&self, seq: usize) -> usize;

    /// Keeps positions `0..len` of `seq` (no more than it holds) and drops the rest.
    fn truncate(&mut self, seq: usize, len: usize) -> Result<(), NativeError>;

    /// Drops everything `seq` holds.
    fn clear(&mut self, seq: usize) -> Result<(), NativeError> {
        self.truncate(seq, 0)
    }

    /// Replaces what `dst` holds with positions `0..len` of `src`, copied in every layer.
    fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), NativeError>;

    /// Positions `0..len` of `seq` (no more than it holds) as [`super::saved`] bytes;
    /// afterwards `seq` holds exactly `0..len`.
    fn save_prefix(&mut self, seq: usize, len: usize) -> Result<Vec<u8>, NativeError>;

    /// Replaces what `seq` holds with the positions `saved` holds (bytes
    /// [`save_prefix`](Kv::save_prefix) wrote for this geometry) and returns how many. On
    /// an error, malformed bytes included, `seq` holds nothing.
    fn restore_prefix(&mut self, seq: usize, saved: &[u8]) -> Result<usize, NativeError>;
}

/// Where a cache's cells live (host or GPU memory): `n_seq * n_ctx * kv_dim` values of K
/// and of V per layer.
pub trait Cells {
    /// Copies `n` values from offset `src` to offset `dst` in every layer's K and V; the two
    /// ranges are different sequences' cells and do not overlap.
    fn copy(&mut self, src: usize, dst: usize, n: usize) -> Result<(), NativeError>;

    /// Copies `n` values from offset `at` of every layer's K and V into `out`: per layer,
    /// K's then V's, as little-endian f16 bits (`out` holds `4 * n_layer * n` bytes).
    fn read(&mut self, at: usize, n: usize, out: &mut [u8]) -> Result<(), NativeError>;

    /// The other way: `src`, laid out as [`read`](Cells::read) writes it, into `n` values
    /// from offset `at` of every layer's K and V.
    fn write(&mut self, at: usize, n: usize, src: &[u8]) -> Result<(), NativeError>;
}

/// Refuses a [`Cells::read`] or [`Cells::write`] outside a layer of `cells` values or with
/// a host buffer of the wrong size; used by every [`Cells`].
pub fn check_rows(
    at: usize,
    n: usize,
    cells: usize,
    n_layer: usize,
    host: usize,
) -> Result<(), NativeError> {
    let need = n.checked_mul(4 * n_layer);
    if at.checked_add(n).is_none_or(|end| end > cells) || need != Some(host) {
        return Err(NativeError::Kv(format!(
            "{n} values at {at} of {n_layer} layers of {cells} through {host} host bytes"
        )));
    }
    Ok(())
}

/// The lengths and geometry of `n_seq` sequences × `n_ctx` cells, over the cells `C`.
pub struct KvCache<C> {
    n_seq: usize,
    n_ctx: usize,
    /// Values per cell: `n_head_kv * head_dim`.
    kv_dim: usize,
    n_layer: usize,
    cells: C,
    len: Vec<usize>,
}

impl<C> std::fmt::Debug for KvCache<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("n_seq", &self.n_seq)
            .field("n_ctx", &self.n_ctx)
            .field("kv_dim", &self.kv_dim)
            .field("cells", &std::any::type_name::<C>())
            .field("len", &self.len)
            .finish()
    }
}

impl<C: Cells> KvCache<C> {
    /// An empty cache (every sequence of length 0) over `cells`, which hold `n_layer` layers
    /// of `n_seq * n_ctx * kv_dim` values.
    pub fn new(n_layer: usize, n_seq: usize, n_ctx: usize, kv_dim: usize, cells: C) -> Self {
        Self {
            n_seq,
            n_ctx,
            kv_dim,
            n_layer,
            cells,
            len: vec![0; n_seq],
        }
    }

    pub fn cells(&self) -> &C {
        &self.cells
    }

    pub fn cells_mut(&mut self) -> &mut C {
        &mut self.cells
    }

    /// After a pass has stored `toks`: each sequence holds positions up to its last token
    /// there (a lower position than it held drops the rest). The pass checked the tokens.
    pub fn hold(&mut self, toks: &[BatchToken]) {
        for t in toks {
            self.len[t.seq] = t.pos as usize + 1;
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            n_layer: self.n_layer,
            kv_dim: self.kv_dim,
        }
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

impl<C: Cells> Kv for KvCache<C> {
    fn n_seq(&self) -> usize {
        self.n_seq
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn bytes(&self) -> usize {
        2 * self.n_layer * self.n_seq * self.n_ctx * self.kv_dim * std::mem::size_of::<u16>()
    }

    fn seq_len(&self, seq: usize) -> usize {
        self.len.get(seq).copied().unwrap_or(0)
    }

    fn truncate(&mut self, seq: usize, len: usize) -> Result<(), NativeError> {
        self.check_seq(seq)?;
        self.len[seq] = self.len[seq].min(len);
        Ok(())
    }

    fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), NativeError> {
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
            self.cells
                .copy(src * stride, dst * stride, len * self.kv_dim)?;
        }
        self.len[dst] = len;
        Ok(())
    }

    fn save_prefix(&mut self, seq: usize, len: usize) -> Result<Vec<u8>, NativeError> {
        self.check_seq(seq)?;
        if len > self.len[seq] {
            return Err(NativeError::Kv(format!(
                "cannot save {len} positions of sequence {seq}, which holds {}",
                self.len[seq]
            )));
        }
        let mut out = saved::buffer(self.geometry(), len)?;
        let at = seq * self.n_ctx * self.kv_dim;
        self.cells
            .read(at, len * self.kv_dim, &mut out[HEADER_BYTES..])?;
        self.len[seq] = len;
        Ok(out)
    }

    fn restore_prefix(&mut self, seq: usize, saved: &[u8]) -> Result<usize, NativeError> {
        self.check_seq(seq)?;
        self.len[seq] = 0;
        let (len, payload) = saved::parse(saved, self.geometry(), self.n_ctx)?;
        let at = seq * self.n_ctx * self.kv_dim;
        self.cells.write(at, len * self.kv_dim, payload)?;
        self.len[seq] = len;
        Ok(len)
    }
}
