//! InferLoop's Q8_0 kernels: CUDA sources compiled at run time by the device's own NVRTC
//! (or loaded as PTX through the driver alone), and a CPU twin of every kernel with the same
//! math and the same reduction order, which the tests (and boards without a GPU) run.
//!
//! - [`q8`]: ggml's Q8_0 block layout, read as it lies in a GGUF file.
//! - [`kernels`]: the `.cu` sources (header-free, one NVRTC program each) and their entry points.
//! - [`cpu`]: the twins (AVX2 on x86-64, NEON on aarch64, scalar otherwise, chosen at run time).
//! - [`nvrtc`]: compiling a source for one architecture (the runtime and `kernels-check` share it).
//! - [`cuda`]: finding a GPU without panicking, loading the kernels, launching them.
//! - [`bandwidth`]: the copy-bandwidth ceiling a kernel's throughput is read against.
//!
//! The CUDA emulator that runs the CUDA path where there is no GPU is its own crate,
//! `inferloop-cuda-sim` (`sim/`), used by tests and the `cuda-sim` tool only.

pub mod bandwidth;
pub mod cpu;
pub mod cuda;
pub mod kernels;
pub mod nvrtc;
pub mod q8;
