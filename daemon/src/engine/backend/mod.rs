//! What computes tokens, behind one seam: the [`seam::Backend`] trait with its
//! [`seam::Capabilities`], the boot-time [`select::Selection`] and [`open`], each backend's
//! memory [`footprint`], the one [`sampling_chain`] both follow, and the backends themselves.
//!
//! # Layout
//! - [`seam`]: the trait, the step plan a backend computes, what it returns, its capabilities.
//! - [`select`]: `--backend`/`--device` resolved against the machine, the weights and the plan.
//! - [`open`]: a selection turned into the backend that serves (and the native model for
//!   `golden`).
//! - [`footprint`]: each backend's memory terms for a plan (the ledger decides on them).
//! - [`sampling_chain`]: the order, penalty window and defaults of sampling.
//! - [`logprobs`]: log-probabilities of a logits row (bias applied as sampled).
//! - [`llama`]: llama.cpp on the CPU (`llama_embed`: its embeddings context).
//! - [`native`]: the native Q8_0 forward pass on the kernels' CPU twins or CUDA.
//! - `fake` (tests): a scripted backend on a manual clock.

#[cfg(test)]
pub(crate) mod fake;
pub mod footprint;
pub mod llama;
mod llama_embed;
pub mod logprobs;
pub mod native;
pub mod open;
pub mod sampling_chain;
pub mod seam;
pub mod select;
