//! The CPU twins: every CUDA kernel's math in Rust, with the same reduction order, so the
//! GPU results can be checked against them and boards without a GPU can run them.

pub mod gemm;
pub mod gemv;
pub mod gemv_q8;
mod pool;
pub mod quantize;
pub mod simd;
// The ops a Llama-family forward needs besides the matmuls; `vector` holds what they share.
pub mod attention;
pub mod elementwise;
pub mod embed;
pub mod fused;
pub mod layer;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
pub mod vector;
