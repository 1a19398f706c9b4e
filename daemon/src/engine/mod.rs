//! The inference engine: one model, a scheduler thread doing continuous batching over a
//! [`backend::Backend`], and the handle the HTTP layer talks to.
//!
//! The scheduler is an actor: `Engine` is a cloneable sender; the thread owns the queue and
//! slots ([`state::State`]), every live [`sequence::Sequence`] and the backend
//! ([`llama::LlamaCpp`] on the CPU, or [`native::NativeBackend`], chosen by [`select`]). See
//! ARCHITECTURE.md for the request path.

pub mod backend;
pub mod chat;
pub mod clock;
#[cfg(test)]
mod fake;
pub mod footprint;
mod llama;
pub mod logprobs;
pub mod native;
mod open;
pub mod plan;
mod prefix;
pub mod sampling_chain;
mod scheduler;
#[cfg(test)]
mod scheduler_tests;
pub mod select;
mod sequence;
pub mod state;
pub mod text;
mod thread;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

pub use backend::{Capabilities, Device};
pub use chat::{constraint, template};
pub use chat::{llama_system_info, LoadedModel, ModelInfo};
pub use open::open_native;
pub use plan::{EnginePlan, PlanSpec};
pub use select::Selection;

use crate::metrics::Metrics;
use crate::thermal::ThermalGate;

/// The chat path's items at their paths from before it had its own folder ([`chat`]), for
/// callers not yet moved.
pub mod model {
    pub(crate) use super::chat::model::llama_backend;
    pub use super::chat::model::{llama_system_info, LoadedModel, ModelInfo};
    pub use super::chat::ChatTurn;
}

/// See [`model`](self::model): `prompt`'s old paths.
pub mod prompt {
    pub use super::chat::prompt::{chat, render_marked, text, Piece};
    pub use super::chat::{Limit, Prompt, PromptBounds, PromptError, Vocabulary};
}

/// Errors the engine reports for one request or at start-up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("all {slots} slots are busy and the queue is full ({capacity} waiting); retry later")]
    QueueFull { slots: usize, capacity: usize },
    #[error("request waited {waited_ms} ms in the queue, longer than the {timeout_ms} ms limit")]
    QueueTimeout { waited_ms: u64, timeout_ms: u64 },
    #[error(
        "the board is overheating ({celsius:.1} °C, critical at {critical:.1} °C): new requests \
         are refused until it cools down; retry later"
    )]
    Overheated { celsius: f64, critical: f64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("decode failed: {0}")]
    Decode(String),
    #[error("failed to load model {path}: {reason}")]
    ModelLoad { path: String, reason: String },
    #[error("failed to create the llama.cpp context: {0}")]
    Context(String),
}

impl EngineError {
    /// Stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::Overheated { .. } => "overheated",
            Self::ShuttingDown => "shutting_down",
            Self::Decode(_) => "decode_failed",
            Self::ModelLoad { .. } => "model_load_failed",
            Self::Context(_) => "context_failed",
        }
    }
}

impl From<crate::thermal::Overheat> for EngineError {
    /// A critical board refuses new work.
    fn from(o: crate::thermal::Overheat) -> Self {
        Self::Overheated {
            celsius: o.celsius,
            critical: o.critical,
        }
    }
}

/// Sampling settings for one sequence, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u32,
    /// `(token, bias)` added to the logits before anything else in the chain.
    pub logit_bias: Vec<(i32, f32)>,
    /// `Some(n)`: report each sampled token's log-probability and the `n` most likely
    /// tokens at its position. `None` costs nothing.
    pub logprobs: Option<u8>,
    /// A grammar the output must match (`response_format`, a forced tool call), compiled.
    pub constraint: Option<constraint::Constraint>,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, nucleus and top-k off, no penalties.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
        }
    }
}

/// A tokenized request ready for a slot.
#[derive(Debug)]
pub struct GenerationRequest {
    pub prompt_tokens: Vec<i32>,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// When the HTTP layer received the request: TTFT counts from here.
    pub received_at: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    /// Set by the HTTP layer when the output it parsed holds tool calls.
    ToolCalls,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV cells were reused from an earlier request, not recomputed.
    pub cached_tokens: u32,
}

/// llama-server style timings, plus the queue wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    pub queue_ms: f64,
    /// Prompt tokens reused from the prefix cache (llama-server's `cache_n`).
    pub cache_n: u32,
    /// Prompt tokens evaluated: the prompt less `cache_n`.
    pub prompt_n: u32,
    pub prompt_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: u32,
    pub predicted_ms: f64,
    pub predicted_per_second: f64,
    /// Request received → first token sampled (queue + tokenize + prompt eval + first sample).
    pub ttft_ms: f64,
}

/// What the decode thread tells a request, in order: `Admitted`, `Text`*, then `Finished`
/// or `Failed`.
#[derive(Debug)]
pub enum Event {
    Admitted {
        queue_ms: f64,
    },
    /// Text that can go out now, with the log-probabilities of the tokens it begins (empty
    /// unless the request asked for them).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
    },
    Failed(EngineError),
}

/// One generated token for `logprobs`: its bytes (specials rendered), its log-probability
/// and the most likely alternatives at its position (see [`logprobs`] for which logits).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

/// Live counters the status route reads.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Load {
    pub active: usize,
    pub queued: usize,
    /// KV cells reserved by running requests (prompt + max_tokens each).
    pub kv_reserved: u64,
    /// Sequences that may decode at once now: the slots, fewer while the board is hot.
    pub max_active: usize,
    /// When the decode loop last went round; the systemd watchdog is fed only while this
    /// stays fresh.
    #[serde(skip)]
    pub beat: Option<std::time::Instant>,
}

/// Handle to the scheduler thread and the model it serves. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    core: thread::Handle,
    model: Arc<LoadedModel>,
    plan: EnginePlan,
    selection: Selection,
}

impl Engine {
    /// Starts the scheduler on the backend `selection` names, around an already loaded
    /// `model` (its weights, or only its vocabulary when the backend maps the weights
    /// itself: [`Capabilities::own_weights`]). Returns once the backend exists, so a failure
    /// here is a start-up failure, not a request failure. `thermal` lowers the admission cap
    /// while the board is hot and refuses new work when critical.
    pub fn start(
        model: Arc<LoadedModel>,
        selection: Selection,
        plan: EnginePlan,
        metrics: Arc<Metrics>,
        thermal: ThermalGate,
    ) -> Result<Self, EngineError> {
        let thread_model = model.clone();
        let thread_selection = selection.clone();
        let thread_plan = plan.clone();
        let clock = Arc::new(clock::SystemClock);
        let core = thread::spawn(plan.clone(), metrics, thermal, clock, move |runner| {
            let model = thread_model;
            match open::open(&thread_selection, &thread_plan, &model) {
                Ok(backend) => runner.run(backend, &*model),
                Err(e) => runner.fail(e),
            };
        })?;
        Ok(Self {
            core,
            model,
            plan,
            selection,
        })
    }

    /// What the serving backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.selection.capabilities()
    }

    /// The serving backend's name, for messages.
    pub fn backend_name(&self) -> &'static str {
        self.selection.name()
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    pub fn plan(&self) -> &EnginePlan {
        &self.plan
    }

    /// How long since the decode loop last went round (`None` before its first turn).
    pub fn since_heartbeat(&self) -> Option<Duration> {
        let now = self.core.now();
        self.load().beat.map(|t| now.saturating_duration_since(t))
    }

    pub fn load(&self) -> Load {
        self.core.load()
    }

    /// Queues a request. Resolves once the scheduler accepted it (or refused it, e.g.
    /// because the queue is full); events then arrive on the returned receiver.
    /// Dropping the receiver cancels the request.
    pub async fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<Event>, EngineError> {
        self.core.submit(request).await
    }

    /// Cancels everything still running or waiting; the scheduler thread then exits.
    pub fn shutdown(&self) {
        self.core.shutdown();
    }

    /// Blocks until the scheduler thread has returned, up to `timeout`; true if it did.
    /// The process must not exit while llama.cpp still runs a step on that thread: exit
    /// handlers would free what the step is using.
    pub fn wait_stopped(&self, timeout: Duration) -> bool {
        self.core.wait_stopped(timeout)
    }
}
