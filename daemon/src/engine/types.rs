//! What travels between the HTTP layer, the scheduler and the backends: the validated
//! request, its sampling settings, the events that answer it, and the engine's errors.

use std::time::Instant;

use serde::Serialize;

use super::chat::constraint;
use super::embed::Pooling;

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
    /// llama.cpp's multiplicative repeat penalty (`repeat_penalty`): a recent token's
    /// logit is divided by it when positive and multiplied when not; 1 is off.
    pub repeat_penalty: f32,
    /// Sampled tokens all three penalties look back over (`repeat_last_n`); 0 turns them
    /// off.
    pub penalty_last_n: u32,
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
    /// OpenAI's defaults: temperature 1, nucleus and top-k off, no penalties (looking back
    /// over llama.cpp's default window when one is set).
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            penalty_last_n: super::backend::sampling_chain::PENALTY_LAST_N,
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
    /// `Some`: an embedding pass, not generation. The prompt is fed once (no prefix reuse,
    /// no sampling, `max_tokens` 0) and answered with [`Event::Embedding`].
    pub embed: Option<Pooling>,
    /// Speculative decoding may serve it (when the daemon's `--spec` allows); `false` is a
    /// request's `"speculative": false`.
    pub speculative: bool,
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
    /// Drafted tokens verified, and those accepted (llama-server's names; both left out
    /// when nothing was drafted, as llama-server does).
    #[serde(skip_serializing_if = "is_zero")]
    pub draft_n: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub draft_n_accepted: u32,
}

impl Usage {
    /// A request's usage over its choices: the prompt once (with the first choice's cached
    /// tokens, the prompt as the client sent it), every choice's completion tokens.
    pub fn of_choices(choices: &[Usage]) -> Usage {
        let Some(first) = choices.first() else {
            return Usage::default();
        };
        let completion_tokens = choices.iter().map(|u| u.completion_tokens).sum();
        Usage {
            prompt_tokens: first.prompt_tokens,
            completion_tokens,
            total_tokens: first.prompt_tokens + completion_tokens,
            prompt_tokens_details: first.prompt_tokens_details,
        }
    }
}

impl Timings {
    /// A request's timings over its choices, which ran side by side: tokens evaluated,
    /// reused, generated and drafted summed over them (so `prompt_n` shows whether the
    /// prompt was evaluated once or once per choice), the longest phases, the first token.
    pub fn of_choices(choices: &[Timings]) -> Timings {
        if let [one] = choices {
            return *one;
        }
        let max = |f: fn(&Timings) -> f64| choices.iter().map(f).fold(0.0, f64::max);
        let sum = |f: fn(&Timings) -> u32| choices.iter().map(f).sum::<u32>();
        let (prompt_n, prompt_ms) = (sum(|t| t.prompt_n), max(|t| t.prompt_ms));
        let (predicted_n, predicted_ms) = (sum(|t| t.predicted_n), max(|t| t.predicted_ms));
        Timings {
            queue_ms: max(|t| t.queue_ms),
            cache_n: sum(|t| t.cache_n),
            prompt_n,
            prompt_ms,
            prompt_per_second: per_second(f64::from(prompt_n), prompt_ms),
            predicted_n,
            predicted_ms,
            predicted_per_second: per_second(f64::from(predicted_n), predicted_ms),
            ttft_ms: choices
                .iter()
                .map(|t| t.ttft_ms)
                .reduce(f64::min)
                .unwrap_or(0.0),
            draft_n: sum(|t| t.draft_n),
            draft_n_accepted: sum(|t| t.draft_n_accepted),
        }
    }
}

/// `n` things in `ms` milliseconds, per second (0 when no time passed).
pub(crate) fn per_second(n: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        n * 1000.0 / ms
    } else {
        0.0
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What the decode thread tells a request, in order: `Admitted`, `Text`* (or one
/// `Embedding`), then `Finished` or `Failed`.
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
    /// An embedding pass's vector (pooled, L2-normalised), just before its `Finished`.
    Embedding(Vec<f32>),
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
