//! The CUDA pass's KV cells in GPU memory.

use std::sync::Arc;

use inferloop_kernels::cuda::cudarc::driver::{
    result, CudaSlice, CudaStream, DevicePtrMut, DriverError,
};

use super::super::error::NativeError;
use super::super::kv::Cells;
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
}

fn kv_err(e: DriverError) -> NativeError {
    NativeError::Kv(format!("CUDA: {e}"))
}
