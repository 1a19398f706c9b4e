//! The inference engine: one model, a scheduler thread doing continuous batching over a
//! backend, and the handle the HTTP layer talks to.
//!
//! # Layout
//! - [`handle`]: [`Engine`], the cloneable handle (an actor's sender) and its one `start`.
//! - [`types`]: what crosses the engine's edges: [`GenerationRequest`], [`SamplingParams`],
//!   [`Event`], [`EngineError`], [`Usage`], [`Timings`], [`Load`].
//! - [`plan`]: [`EnginePlan`], the one derivation of slots, KV cells, sequences and sharing.
//! - [`embed`]: pooling per-token hidden states into one normalised embedding.
//! - [`clock`]: the scheduler's time, a parameter (the system clock, or a manual one in tests).
//! - [`backend`]: what computes tokens: the [`backend::seam::Backend`] trait and its
//!   [`Capabilities`], the [`Selection`] made at boot, `open`, each backend's memory footprint,
//!   the one sampling chain, llama.cpp and the native Q8_0 backend (CPU or CUDA).
//! - [`schedule`]: the scheduler thread: its queue and slots, the sequences, prompt reuse,
//!   the text stream with stop strings.
//! - [`prompt_cache`]: the prompt cache's RAM and disk tiers: prefixes saved beyond the KV
//!   cells, found by longest prefix, restored when that beats recomputing.
//! - [`chat`]: the chat path: the loaded model (tokenizer), chat templates, prompt rendering
//!   and bounds, constrained-decoding grammars.
//!
//! ARCHITECTURE.md follows a request through them.

pub mod backend;
pub mod chat;
pub mod clock;
pub mod embed;
mod handle;
pub mod plan;
pub mod prompt_cache;
pub mod schedule;
pub mod types;

pub use backend::seam::{Capabilities, Device};
pub use backend::select::Selection;
pub use backend::{footprint, logprobs, native, open::open_native, select};
pub use chat::{constraint, template};
pub use chat::{llama_system_info, LoadedModel, ModelInfo};
pub use handle::Engine;
pub use plan::{EnginePlan, PlanSpec};
pub use types::{
    EngineError, Event, FinishReason, GenerationRequest, Load, PromptTokensDetails, SamplingParams,
    Timings, TokenLogprob, Usage,
};
