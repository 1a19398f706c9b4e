//! The native backend's model: a Llama-family forward pass (llama, qwen2) over Q8_0 weights
//! with an f16 KV cache, on the CPU or a CUDA GPU, served to the scheduler as a
//! [`super::backend::Backend`] by [`NativeBackend`].
//!
//! # Layout
//! - [`error`]: [`NativeError`], what could not load or compute.
//! - [`hparams`]: [`HParams`] from a model's metadata, read through the [`Metadata`] trait
//!   (which the GGUF reader implements).
//! - [`weights`]: [`Weights`], the tensors borrowed zero-copy from a [`TensorSource`]; any
//!   linear weight that is not Q8_0 is refused at load, by name.
//! - [`batch`]: what every pass reads: [`BatchToken`], the micro-batch size [`UBATCH`],
//!   [`Activations`].
//! - [`kv`]: the KV cache's bookkeeping ([`Kv`], [`KvCache`]), per layer
//!   `[n_seq][n_ctx][n_head_kv][head_dim]` f16 over a device's cells; truncate, clear,
//!   copy a prefix between sequences.
//! - [`saved`]: the bytes of a KV prefix saved for the prompt cache, and their
//!   [`saved::layout`], shared by the CPU and the CUDA pass.
//! - [`pass`]: the device seam, [`Pass`]: one micro-batch through the layers, and the KV
//!   cache the pass owns.
//! - [`cpu`]: [`CpuPass`], the pass on `inferloop-kernels`' CPU twins, its cells in host
//!   memory.
//! - [`cuda`]: [`CudaPass`], the pass on its CUDA kernels, weights and cells in GPU memory.
//! - [`forward`]: [`Model::forward`], a batch of `(seq, token, pos)` checked, cut into
//!   micro-batches and run on the model's pass.
//! - [`gguf`]: the traits for `inferloop-gguf`'s reader, and [`open_model`] /
//!   [`open_model_cuda`] from a file (the latter checked against the CPU twins).
//! - [`sampling`]: [`sampling::Sampler`], llama.cpp's sampling chain in Rust, seeded.
//! - [`backend`]: [`NativeBackend`], the scheduler's `Backend` on [`Model::forward`].

pub mod backend;
pub mod batch;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod forward;
pub mod gguf;
pub mod hparams;
pub mod kv;
pub mod pass;
pub mod sampling;
pub mod saved;
pub mod synth;
pub mod weights;

#[cfg(test)]
mod save_tests;
#[cfg(test)]
mod tests;

pub use backend::NativeBackend;
pub use batch::{Activations, BatchToken, UBATCH};
pub use cpu::CpuPass;
pub use cuda::CudaPass;
pub use error::NativeError;
pub use forward::Model;
pub use gguf::{open_model, open_model_cuda};
pub use hparams::{Arch, HParams, Metadata};
pub use kv::{Kv, KvCache};
pub use pass::Pass;
pub use weights::{TensorKind, TensorRef, TensorSource, Weights};
