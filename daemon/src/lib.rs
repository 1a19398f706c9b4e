//! `inferloopd`: an OpenAI-compatible LLM server for edge boxes, on llama.cpp or the native
//! Q8_0 backend (CPU twins or CUDA).
//!
//! # Layout
//! - [`boot`]: the gates before load: weights vs manifest (exit 3), the engine plan and the
//!   backend selection (exit 2), the memory ledger (exit 1).
//! - [`config`]: serve settings from file, flags and environment, checked as a whole.
//! - [`http`]: routes, OpenAI wire types, errors, SSE; nothing below it knows HTTP.
//!   [`http::validate`]: wire request → [`http::validate::ValidRequest`], one module per
//!   request kind; bad input stops here.
//! - [`tools`]: tool calls in the model's own form (Hermes, Llama 3, Mistral): the system
//!   text, the grammar that forces a call, the parser of the model's text (whole or streamed).
//! - [`engine`]: the handle, the plan, the backends behind one seam (`engine::backend`), the
//!   scheduler thread (`engine::schedule`) and the chat path (`engine::chat`).
//! - [`ledger`]: the memory ledger (GGUF header → bytes per term) and the limits it
//!   is checked against (cgroup v1/v2, MemAvailable, budget).
//! - [`metrics`]: Prometheus series in a `prometheus-client` registry; series computed at
//!   scrape time are written through [`metrics::TextWriter`].
//! - [`thermal`]: board detection and the thermal watch: the sampler, the admission gate the
//!   decode thread reads, the thermal metrics, and the readings for `inferloopd thermal`.
//! - [`heap`]: glibc's mmap threshold fixed at start, so RSS follows what is live.
//! - [`notify`]: systemd readiness and watchdog notifications.
//! - [`server`]: the process lifecycle: bind, load, ready, drain on shutdown.
//! - [`quantize`]: `inferloopd quantize`, a GGUF model rewritten at another weight type by
//!   llama.cpp's quantizer (temporary file, renamed on success).
//! - [`golden`]: `inferloopd golden`, llama.cpp and the native forward pass compared on the
//!   same tokens (top-1 agreement, KL, logit difference per position).
//! - [`exit`]: the documented exit codes.
//! - [`stats`]: chi-square tests, with which the tests check that sampling keeps a law
//!   (speculative decoding against plain decoding).

pub mod boot;
pub mod config;
pub mod engine;
pub mod exit;
pub mod golden;
pub mod heap;
pub mod http;
pub mod kv_events;
pub mod ledger;
pub mod metrics;
pub mod notify;
pub mod quantize;
pub mod server;
pub mod stats;
pub mod thermal;
pub mod tools;
/// Validation lives under the HTTP layer; the old path stays for callers that use it.
pub use http::validate;
