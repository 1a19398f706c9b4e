//! OpenAI wire types: what clients send and what we answer. A request field this server
//! does not know is refused by name, as OpenAI refuses an unrecognised argument, so that
//! no client believes a field acted when it was dropped; wrong types are caught by serde
//! and named by path. Fields OpenAI or llama-server define that this server does not
//! implement are read loosely (`Value`) so that validation can accept the values that ask
//! for nothing and refuse the rest by name (see `validate::extensions`).

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::engine::{FinishReason, Timings, TokenLogprob, Usage};

/// Reported as `system_fingerprint`: the daemon build that produced the output.
pub const FINGERPRINT: &str = concat!("inferloop-", env!("CARGO_PKG_VERSION"));

/// llama-server's request fields that this server reads only to judge (its
/// `tools/server/server-schema.cpp` and chat parameters), and the SGLang fields that
/// vllm-router writes into every request it forwards (`no_stop_trim` … `return_hidden_states`,
/// at their defaults; its `protocols/spec.rs`): each generation request type
/// gets them as loose `Value`s, and `llama_extensions()` lists those a request set, for
/// `validate::extensions` to accept as no-ops or refuse by name. `json_schema`,
/// `grammar`, `n_predict`, `repeat_penalty` and `repeat_last_n` act, and are typed fields
/// of their own.
macro_rules! llama_extensions {
    ($(#[$m:meta])* pub struct $name:ident { $($field:tt)* }) => {
        llama_extensions!(@with $(#[$m])* $name { $($field)* } [
            cache_prompt, n_probs, id_slot, samplers, typical_p, penalize_nl, dry_multiplier, dry_base, dry_allowed_length,
            dry_penalty_last_n, dry_sequence_breakers, xtc_probability, xtc_threshold,
            mirostat, mirostat_tau, mirostat_eta, dynatemp_range, dynatemp_exponent,
            top_n_sigma, min_keep, adaptive_target, adaptive_decay, ignore_eos,
            t_max_predict_ms, t_max_prompt_ms, n_keep, n_discard, n_indent, n_cmpl,
            n_cache_reuse, return_tokens, post_sampling_probs, timings_per_token,
            return_progress, verbose, lora, image_data, response_fields, grammar_lazy,
            grammar_triggers, grammar_type, preserved_tokens, backend_sampling,
            sse_ping_interval, chat_format, chat_parser, generation_prompt,
            parse_tool_calls, reasoning_format, reasoning_budget_tokens,
            reasoning_budget_message, thinking_budget_tokens, reasoning_control,
            chat_template_kwargs, add_generation_prompt, continue_final_message,
            no_stop_trim, skip_special_tokens, separate_reasoning, stream_reasoning,
            include_reasoning, return_hidden_states
        ]);
    };
    (@with $(#[$m:meta])* $name:ident { $($field:tt)* } [$($ext:ident),*]) => {
        $(#[$m])*
        pub struct $name {
            $($field)*
            $(pub $ext: Option<::serde_json::Value>,)*
        }

        impl $name {
            /// The llama-server fields this request set (not null), by name.
            pub fn llama_extensions(&self) -> Vec<(&'static str, &::serde_json::Value)> {
                [$((stringify!($ext), &self.$ext)),*]
                    .into_iter()
                    .filter_map(|(name, v)| v.as_ref().filter(|v| !v.is_null()).map(|v| (name, v)))
                    .collect()
            }

            /// Every llama-server field the request type reads loosely.
            #[cfg(test)]
            pub const LLAMA_EXTENSIONS: &'static [&'static str] = &[$(stringify!($ext)),*];
        }
    };
}

llama_extensions! {
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// llama-server's multiplicative repeat penalty and the window of all penalties.
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logit_bias: Option<Map<String, Value>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// InferLoop extension: `false` opts out of speculative decoding (`--spec`).
    pub speculative: Option<bool>,
    // Read loosely and checked in `validate`, so that every error names its field.
    pub response_format: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    // OpenAI fields refused unless they ask for nothing (see `validate::chat`).
    pub audio: Option<Value>,
    pub modalities: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
    pub service_tier: Option<Value>,
    pub store: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub verbosity: Option<Value>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    // OpenAI's labels: they name or group a request and change nothing in the answer.
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<String>,
    pub metadata: Option<Map<String, Value>>,
    /// llama-server: the longest answer, in tokens (`-1`: no limit); `max_tokens` by
    /// another name.
    pub n_predict: Option<i64>,
    /// llama-server: a JSON schema the answer must match, as `response_format` would set.
    pub json_schema: Option<Value>,
    /// llama-server: a grammar the answer must match (see `validate::format::grammar`).
    pub grammar: Option<Value>,
}
}

llama_extensions! {
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// llama-server's multiplicative repeat penalty and the window of all penalties.
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub echo: Option<bool>,
    /// InferLoop extension: parse special-token text in `prompt` (e.g. `<|im_start|>`) into
    /// control tokens. Off by default, so text pasted into a prompt stays text.
    pub parse_special: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logit_bias: Option<Map<String, Value>>,
    pub logprobs: Option<u32>,
    /// InferLoop extension: `false` opts out of speculative decoding (`--spec`).
    pub speculative: Option<bool>,
    // OpenAI fields refused unless they ask for nothing.
    pub best_of: Option<u32>,
    pub suffix: Option<String>,
    /// OpenAI's end-user label; changes nothing in the answer.
    pub user: Option<String>,
    /// llama-server: `max_tokens` by another name (`-1`: up to the context's end).
    pub n_predict: Option<i64>,
    /// llama-server: a JSON schema the text must match.
    pub json_schema: Option<Value>,
    /// llama-server: a grammar the text must match (see `validate::format::grammar`).
    pub grammar: Option<Value>,
}
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
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
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
            repeat_penalty: $req.repeat_penalty,
            repeat_last_n: $req.repeat_last_n,
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
    /// An assistant turn's calls, sent back with the conversation.
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
}

/// A tool call, in requests (an earlier assistant turn) and in answers.
#[derive(Debug, Deserialize, Serialize)]
pub struct WireToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunctionCall,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct WireFunctionCall {
    pub name: String,
    /// JSON text, as OpenAI sends it.
    pub arguments: String,
}

/// A streamed call: the first delta of a call has its id, type and name; the ones after it
/// only more `arguments` text.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta<'a> {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta<'a>,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    pub arguments: &'a str,
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
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls, as OpenAI sends it.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<WireToolCall>>,
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
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
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
    pub logprobs: Option<CompletionLogprobs>,
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
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// OpenAI's floor for a token too unlikely to be worth a number (JSON has no -inf).
const LOGPROB_FLOOR: f32 = -9999.0;

fn logprob(l: f32) -> f32 {
    if l.is_nan() {
        LOGPROB_FLOOR
    } else {
        l.max(LOGPROB_FLOOR)
    }
}

/// A token's bytes as text; bytes that are not whole UTF-8 characters show as U+FFFD (the
/// exact bytes are in `bytes`).
fn token_string(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat `choices[].logprobs`.
#[derive(Debug, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
    pub refusal: Option<()>,
}

#[derive(Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    pub fn of(tokens: &[TokenLogprob]) -> Self {
        let content = tokens
            .iter()
            .map(|t| ChatTokenLogprob {
                token: token_string(&t.token),
                logprob: logprob(t.logprob),
                bytes: t.token.clone(),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(b, l)| TopLogprob {
                        token: token_string(b),
                        logprob: logprob(*l),
                        bytes: b.clone(),
                    })
                    .collect(),
            })
            .collect();
        Self {
            content,
            refusal: None,
        }
    }
}

/// Legacy completions `choices[].logprobs`: parallel lists, one entry per token.
#[derive(Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<TopMap>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends `tokens`; `offset` is the character offset of the first one and moves past
    /// each (characters are counted as UTF-8 lead bytes, so a character split over two
    /// tokens is counted once, at the token holding its first byte).
    pub fn extend(&mut self, tokens: &[TokenLogprob], offset: &mut usize) {
        for t in tokens {
            self.tokens.push(token_string(&t.token));
            self.token_logprobs.push(logprob(t.logprob));
            let mut top: Vec<(String, f32)> = Vec::with_capacity(t.top.len() + 1);
            for (b, l) in &t.top {
                let s = token_string(b);
                // A JSON object holds each key once; keep the likelier entry.
                if !top.iter().any(|(k, _)| *k == s) {
                    top.push((s, logprob(*l)));
                }
            }
            // OpenAI's legacy shape always includes the sampled token ("up to logprobs+1").
            let chosen = token_string(&t.token);
            if !top.iter().any(|(k, _)| *k == chosen) {
                top.push((chosen, logprob(t.logprob)));
            }
            self.top_logprobs.push(TopMap(top));
            self.text_offset.push(*offset);
            *offset += t.token.iter().filter(|b| (**b & 0xC0) != 0x80).count();
        }
    }
}

/// `{token: logprob}` in the order given (most likely first), which a map would lose.
#[derive(Debug, Default)]
pub struct TopMap(pub Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// `POST /tokenize`, as llama-server takes it (its other fields are refused by name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub content: String,
    pub add_special: Option<bool>,
    pub parse_special: Option<bool>,
    pub with_pieces: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub tokens: Vec<i64>,
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
