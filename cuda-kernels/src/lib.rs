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
//! - [`sim`]: the CUDA emulator's build (the kernels compiled for the host CPU and a stand-in
//!   `libcuda`), so that the CUDA path runs where there is no GPU.

pub mod bandwidth;
pub mod cpu;
pub mod cuda;
pub mod kernels;
pub mod nvrtc;
pub mod q8;
pub mod sim;
