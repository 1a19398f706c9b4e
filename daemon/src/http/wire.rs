//! OpenAI wire types: what clients send and what we answer. Unknown request fields are
//! ignored, as OpenAI does; wrong types are caught by serde and named by path.

use serde::{Deserialize, Serialize};

use crate::engine::{FinishReason, Timings, Usage};

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptField,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub echo: Option<bool>,
    /// InferLoop extension: parse special-token text in `prompt` (e.g. `<|im_start|>`) into
    /// control tokens. Off by default, so text pasted into a prompt stays text.
    pub parse_special: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

/// Sampling fields shared by both generation routes. They are repeated in each request
/// type rather than `#[serde(flatten)]`ed, because flattening loses the field path that
/// type errors must name.
#[derive(Debug, Default)]
pub struct WireSampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

macro_rules! sampling_of {
    ($req:expr) => {
        WireSampling {
            temperature: $req.temperature,
            top_p: $req.top_p,
            top_k: $req.top_k,
            min_p: $req.min_p,
            seed: $req.seed,
            presence_penalty: $req.presence_penalty,
            frequency_penalty: $req.frequency_penalty,
        }
    };
}

impl ChatCompletionRequest {
    pub fn sampling(&self) -> WireSampling {
        sampling_of!(self)
    }
}

impl CompletionRequest {
    pub fn sampling(&self) -> WireSampling {
        sampling_of!(self)
    }
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    pub content: Option<MessageContent>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

// ---- responses ----

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChunkChoice<'a>>,
    /// Present (as null) on every chunk when usage was asked for, set on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub system_fingerprint: &'static str,
    pub choices: Vec<CompletionChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChunkChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}
