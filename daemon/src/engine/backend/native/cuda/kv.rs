//! The CUDA pass's KV cells in GPU memory.

use std::sync::Arc;

use inferloop_kernels::cuda::cudarc::driver::{
    result, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
};

use super::super::error::NativeError;
use super::super::kv::{check_rows, Cells};
use super::memory::op;

/// The KV cache's cells in GPU memory: per layer, K and V as f16 bits,
/// `[n_seq][n_ctx][kv_dim]` (the attention kernel's layout for one sequence at a time).
pub struct DeviceKv {
    stream: Arc<CudaStream>,
    pub(super) k: Vec<CudaSlice<u16>>,
    pub(super) v: Vec<CudaSlice<u16>>,
}

impl DeviceKv {
    /// Zeroed cells on `st` for `n_layer` layers of `n_seq` sequences × `n_ctx` positions.
    pub fn new(
        st: &Arc<CudaStream>,
        n_layer: usize,
        n_seq: usize,
        n_ctx: usize,
        kv_dim: usize,
    ) -> Result<Self, NativeError> {
        let cells = n_seq * n_ctx * kv_dim;
        let cache = || {
            (0..n_layer)
                .map(|_| st.alloc_zeros::<u16>(cells).map_err(op(None, "KV cache")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            stream: st.clone(),
            k: cache()?,
            v: cache()?,
        })
    }

    /// Values per layer of K (and of V).
    fn cells(&self) -> usize {
        self.k.first().map_or(0, CudaSlice::len)
    }
}

impl Cells for DeviceKv {
    fn copy(&mut self, src: usize, dst: usize, n: usize) -> Result<(), NativeError> {
        let bytes = n * std::mem::size_of::<u16>();
        let off = |i: usize| (i * std::mem::size_of::<u16>()) as u64;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            if src + n > buf.len() || dst + n > buf.len() {
                return Err(NativeError::Kv(format!(
                    "copy of {n} values from {src} to {dst} outside a layer of {}",
                    buf.len()
                )));
            }
            let (base, _guard) = buf.device_ptr_mut(&self.stream);
            // SAFETY: both ranges lie inside this layer's buffer (checked above); they are
            // different sequences' cells, so they do not overlap.
            unsafe {
                result::memcpy_dtod_async(
                    base + off(dst),
                    base + off(src),
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(kv_err)?;
        }
        self.stream.synchronize().map_err(kv_err)
    }

    /// One device-to-host copy per layer for K and one for V, then one wait. The cells'
    /// f16 bits lie in GPU memory little-endian, as the saved bytes want them.
    fn read(&mut self, at: usize, n: usize, out: &mut [u8]) -> Result<(), NativeError> {
        check_rows(at, n, self.cells(), self.k.len(), out.len())?;
        if n == 0 {
            return Ok(()); // `chunks_exact` takes no empty chunks
        }
        let parts = self.k.iter().zip(&self.v).flat_map(|(k, v)| [k, v]);
        for (buf, host) in parts.zip(out.chunks_exact_mut(2 * n)) {
            let (base, _guard) = buf.device_ptr(&self.stream);
            // SAFETY: `at..at + n` lies inside this layer's buffer (checked above) and
            // `host` is its `2n` bytes; `out` stays borrowed until the stream is synchronised.
            unsafe {
                result::memcpy_dtoh_async(host, base + byte_offset(at), self.stream.cu_stream())
            }
            .map_err(kv_err)?;
        }
        self.stream.synchronize().map_err(kv_err)
    }

    /// One host-to-device copy per layer for K and one for V, then one wait.
    fn write(&mut self, at: usize, n: usize, src: &[u8]) -> Result<(), NativeError> {
        check_rows(at, n, self.cells(), self.k.len(), src.len())?;
        if n == 0 {
            return Ok(()); // `chunks_exact` takes no empty chunks
        }
        let parts = self.k.iter_mut().zip(self.v.iter_mut());
        let parts = parts.flat_map(|(k, v)| [k, v]);
        for (buf, host) in parts.zip(src.chunks_exact(2 * n)) {
            let (base, _guard) = buf.device_ptr_mut(&self.stream);
            // SAFETY: as in `read`: the range lies inside the buffer, `host` is its bytes and
            // stays borrowed until the stream is synchronised.
            unsafe {
                result::memcpy_htod_async(base + byte_offset(at), host, self.stream.cu_stream())
            }
            .map_err(kv_err)?;
        }
        self.stream.synchronize().map_err(kv_err)
    }
}

/// Where value `i` of a layer's buffer starts, in bytes.
fn byte_offset(i: usize) -> u64 {
    (i * std::mem::size_of::<u16>()) as u64
}

fn kv_err(e: DriverError) -> NativeError {
    NativeError::Kv(format!("CUDA: {e}"))
}
