//! What validation yields and refuses: [`ValidRequest`], its [`Input`], and
//! [`InvalidRequest`], whose message names the field at fault.

use crate::engine::chat::ChatTurn;
use crate::engine::constraint::Grammar;
use crate::engine::SamplingParams;
use crate::tools::ToolUse;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvalidRequest {
    #[error("We could not parse the JSON body of your request: {0}")]
    Json(String),
    #[error("`{param}` {message}")]
    Field { param: String, message: String },
}

impl InvalidRequest {
    pub(super) fn field(param: &str, message: impl Into<String>) -> Self {
        Self::Field {
            param: param.to_string(),
            message: message.into(),
        }
    }
}

/// A field OpenAI defines and this server does not implement.
pub(super) fn unsupported(param: &str, what: &str) -> InvalidRequest {
    InvalidRequest::field(param, format!("is not supported by this server ({what})"))
}

/// The request fields a grammar came from, for the errors that name them once the model
/// compiles it: the field that asked for it, and where its schema sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarFrom {
    pub field: &'static str,
    pub schema: &'static str,
}

impl GrammarFrom {
    pub(super) const fn same(field: &'static str, schema: &'static str) -> Self {
        Self { field, schema }
    }
}

/// What to generate from: chat turns to render, or a raw prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Chat(Vec<ChatTurn>),
    Text(String),
}

/// A request that passed every check the wire allows; the context-length check follows
/// tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub model: Option<String>,
    pub input: Input,
    /// `None`: up to the end of the slot's context.
    pub max_tokens: Option<u32>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    /// Raw prompts only: special-token text becomes control tokens (an explicit opt-in).
    pub parse_special: bool,
    /// What the output must match (`response_format`, a forced tool call); compiled
    /// against the model's vocabulary once the model is known.
    pub grammar: Option<Grammar>,
    /// Which fields `grammar` came from, when not the route's own `response_format` /
    /// `text.format` (llama-server's `json_schema` and `grammar`, a bare schema).
    pub grammar_from: Option<GrammarFrom>,
    /// The tools the model may call; its output is then parsed for calls.
    pub tools: Option<ToolUse>,
    /// Speculative decoding may serve it (`"speculative": false` opts out). It changes how
    /// many steps generation takes, not the distribution of what is generated.
    pub speculative: bool,
    /// Choices to generate (`n`), each its own sequence sampled with `seed + index`.
    pub n: u32,
}
