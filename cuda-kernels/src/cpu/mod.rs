//! The CPU twins: every CUDA kernel's math in Rust, with the same reduction order, so the
//! GPU results can be checked against them and boards without a GPU can run them.

pub mod simd;
