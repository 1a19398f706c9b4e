//! What every pass reads, whatever the device: a batch's tokens, the micro-batch size, the
//! linear layers' activation mode, and the naming of a failed op.

use inferloop_kernels::cpu::gemv::MAX_COLS;

use super::error::NativeError;

/// Tokens per pass through the layers (the CUDA GEMV's columns per launch).
pub const UBATCH: usize = MAX_COLS;

/// What the linear layers multiply the weights with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// Inputs quantized to Q8_0 blocks, then the int8 GEMM (`dp4a` on the GPU): llama.cpp's
    /// own numerics for Q8_0 weights.
    #[default]
    Q8,
    /// Inputs kept in f32, the GEMV: the numerics of f32 weights.
    F32,
}

/// One token of a batch: fed to sequence `seq` at position `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    pub seq: usize,
    pub token: i32,
    pub pos: u32,
}

/// Maps a kernel's error to one naming the device, tensor or op (`cuda blk.3.attn_q`; the
/// CPU's prefix is empty).
pub fn op_on<E: std::fmt::Display>(
    device: &'static str,
    layer: Option<usize>,
    what: &'static str,
) -> impl FnOnce(E) -> NativeError {
    move |e| NativeError::Kernel {
        what: match layer {
            Some(l) => format!("{device}blk.{l}.{what}"),
            None => format!("{device}{what}"),
        },
        why: e.to_string(),
    }
}
