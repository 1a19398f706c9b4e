//! The Responses API on the wire: the request as clients send it, and the response object
//! and output items we answer with (field names as in OpenAI's API reference and the
//! `openai` package's `types/responses`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::engine::Usage;

/// `POST /v1/responses`. A field this server does not know is refused by name, as OpenAI
/// refuses an unrecognised argument; fields that ask for what a stateless server cannot
/// do are read loosely so that validation refuses them by name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string, or a list of items (`message`, `function_call`, `function_call_output`).
    pub input: Option<Value>,
    pub instructions: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}, "verbosity"}`.
    pub text: Option<Value>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not in OpenAI's Responses API; accepted as on chat, for reproducible sampling.
    pub seed: Option<i64>,
    /// InferLoop extension: `false` opts out of speculative decoding (`--spec`).
    pub speculative: Option<bool>,
    pub metadata: Option<Value>,
    pub stream: Option<bool>,
    // Refused unless they ask for nothing (see `validate::responses`).
    pub previous_response_id: Option<Value>,
    pub conversation: Option<Value>,
    pub store: Option<Value>,
    pub background: Option<Value>,
    pub prompt: Option<Value>,
    pub include: Option<Value>,
    pub truncation: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub max_tool_calls: Option<Value>,
    pub service_tier: Option<Value>,
    /// Accepted with no effect: the model writes no reasoning (`{"summary": …}`, `effort`).
    pub reasoning: Option<Value>,
    /// Accepted with no effect: `include_obfuscation` pads events this server never pads.
    pub stream_options: Option<Value>,
    // Labels: they name or group a request and change nothing in the answer
    // (`client_metadata` is the Codex CLI's).
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<String>,
    pub client_metadata: Option<Map<String, Value>>,
}

/// What a response repeats of its request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Echo {
    pub instructions: Option<String>,
    pub metadata: Map<String, Value>,
    pub max_output_tokens: Option<u32>,
    pub parallel_tool_calls: bool,
    pub temperature: f32,
    pub top_p: f32,
    /// `{"format": {...}}` as given, `{"format": {"type": "text"}}` by default.
    pub text: Value,
    pub tool_choice: Value,
    /// The function tools as given.
    pub tools: Vec<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

/// The response object: in a whole answer, and inside the lifecycle events of a stream.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub status: Status,
    pub completed_at: Option<u64>,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    #[serde(flatten)]
    pub echo: Echo,
    /// Always null: nothing is stored, so there is nothing to continue from.
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub background: bool,
    pub truncation: &'static str,
}

impl ResponseObject {
    pub fn new(id: String, created_at: u64, model: String, echo: Echo) -> Self {
        Self {
            id,
            object: "response",
            created_at,
            status: Status::InProgress,
            completed_at: None,
            error: None,
            incomplete_details: None,
            model,
            output: Vec::new(),
            usage: None,
            echo,
            previous_response_id: None,
            store: false,
            background: false,
            truncation: "disabled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

/// OpenAI's `ResponseUsage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens whose KV cells were reused from an earlier request.
    pub cached_tokens: u32,
    /// Nothing is written to a cache a client pays for: always 0.
    pub cache_write_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

impl From<Usage> for ResponseUsage {
    fn from(u: Usage) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: u.total_tokens,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// One output item.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        status: ItemStatus,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        status: ItemStatus,
        call_id: String,
        name: String,
        /// JSON text, as OpenAI sends it.
        arguments: String,
    },
}

/// A message's `output_text` content part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}
