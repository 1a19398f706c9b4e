//! Validation: turns a wire request into a [`ValidRequest`]. An invalid request never
//! reaches the scheduler, and every message names the field at fault.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::engine::constraint::Grammar;
use crate::engine::logprobs::MAX_TOP_LOGPROBS;
use crate::engine::model::ChatTurn;
use crate::engine::SamplingParams;
use crate::http::wire::{
    ChatCompletionRequest, CompletionRequest, MessageContent, PromptField, StopField,
    StreamOptions, WireSampling,
};
use crate::tools::{PastCall, Tool, ToolChoice, ToolUse};

/// The legacy completions endpoint's `logprobs` limit, as OpenAI sets it.
const MAX_COMPLETION_LOGPROBS: u32 = 5;
/// `logit_bias` values are clamped to this range by OpenAI's definition.
const MAX_BIAS: f64 = 100.0;

/// Most stop sequences per request, and their longest length in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 512;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvalidRequest {
    #[error("We could not parse the JSON body of your request: {0}")]
    Json(String),
    #[error("`{param}` {message}")]
    Field { param: String, message: String },
}

impl InvalidRequest {
    fn field(param: &str, message: impl Into<String>) -> Self {
        Self::Field {
            param: param.to_string(),
            message: message.into(),
        }
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
    /// The tools the model may call; its output is then parsed for calls.
    pub tools: Option<ToolUse>,
}

/// Parses a JSON body, naming the offending field on a type error.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, InvalidRequest> {
    // serde would happily read a struct from a JSON array; requests are objects.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(InvalidRequest::Json(
            "the body must be a JSON object".to_string(),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut *de);
    let err = match result {
        // Anything after the object (`{...} garbage`) makes the body malformed.
        Ok(v) => {
            return de
                .end()
                .map(|()| v)
                .map_err(|e| InvalidRequest::Json(e.to_string()))
        }
        Err(e) => e,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    // serde reports `{"model":"a","model":"b"}` at the object holding the key, naming the
    // key only in its message; name the key itself.
    if let Some(key) = strip_position(&inner)
        .strip_prefix("duplicate field `")
        .and_then(|r| r.split('`').next())
    {
        let param = match path.as_str() {
            "." => key.to_string(),
            object => format!("{object}.{key}"),
        };
        return Err(InvalidRequest::field(
            &param,
            "appears more than once: duplicate keys are ambiguous",
        ));
    }
    match inner.classify() {
        serde_json::error::Category::Data if path != "." => Err(InvalidRequest::field(
            &path,
            format!("has the wrong type or value: {}", strip_position(&inner)),
        )),
        serde_json::error::Category::Data => {
            let msg = strip_position(&inner);
            // serde reports a missing field at the root path; name the field itself.
            match msg
                .strip_prefix("missing field `")
                .and_then(|r| r.split('`').next())
            {
                Some(field) => Err(InvalidRequest::field(field, "is required")),
                None => Err(InvalidRequest::Json(format!(
                    "the body must be a JSON object ({msg})"
                ))),
            }
        }
        _ => Err(InvalidRequest::Json(inner.to_string())),
    }
}

fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

pub fn chat(req: ChatCompletionRequest) -> Result<ValidRequest, InvalidRequest> {
    check_n(req.n)?;
    unsupported_chat(&req)?;
    let mut sampling = sampling(&req.sampling())?;
    sampling.logit_bias = logit_bias(req.logit_bias.as_ref())?;
    sampling.logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), n) => Some(top_logprobs(n.unwrap_or(0))?),
        (_, Some(_)) => {
            return Err(InvalidRequest::field(
                "top_logprobs",
                "requires `logprobs` to be true",
            ))
        }
        (_, None) => None,
    };
    if req.messages.is_empty() {
        return Err(InvalidRequest::field(
            "messages",
            "must contain at least one message",
        ));
    }
    let mut turns = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].role"),
                    format!(
                        "must be one of system, developer, user, assistant, tool (got `{other}`)"
                    ),
                ))
            }
        };
        let tool_calls = match (role, m.tool_calls) {
            (_, None) => Vec::new(),
            ("assistant", Some(calls)) => calls
                .into_iter()
                .map(|c| PastCall {
                    id: c.id,
                    name: c.function.name,
                    arguments: c.function.arguments,
                })
                .collect(),
            (_, Some(_)) => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].tool_calls"),
                    "is only allowed on assistant messages",
                ))
            }
        };
        let tool_call_id = match (role, m.tool_call_id) {
            ("tool", None) => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].tool_call_id"),
                    "is required on tool messages",
                ))
            }
            ("tool", Some(id)) => Some(check_call_id(&format!("messages[{i}].tool_call_id"), id)?),
            // Meaningless elsewhere; ignored, as OpenAI does.
            (_, _) => None,
        };
        for (j, c) in tool_calls.iter().enumerate() {
            check_call_id(&format!("messages[{i}].tool_calls[{j}].id"), c.id.clone())?;
        }
        let content = match m.content {
            None if role == "assistant" => String::new(),
            None => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].content"),
                    "is required",
                ))
            }
            Some(MessageContent::Text(t)) => t,
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(InvalidRequest::field(
                            &format!("messages[{i}].content[{j}].type"),
                            format!("`{}` is not supported; only `text` parts are", p.kind),
                        ));
                    }
                    match p.text {
                        Some(t) => text.push_str(&t),
                        None => {
                            return Err(InvalidRequest::field(
                                &format!("messages[{i}].content[{j}].text"),
                                "is required",
                            ))
                        }
                    }
                }
                text
            }
        };
        if content.contains('\0') {
            return Err(InvalidRequest::field(
                &format!("messages[{i}].content"),
                "must not contain NUL characters",
            ));
        }
        turns.push(ChatTurn {
            role: role.to_string(),
            content,
            tool_calls,
            tool_call_id,
        });
    }
    let max_tokens = match (req.max_completion_tokens, req.max_tokens) {
        (Some(n), _) => Some(check_max_tokens("max_completion_tokens", n)?),
        (None, Some(n)) => Some(check_max_tokens("max_tokens", n)?),
        (None, None) => None,
    };
    let stream = req.stream.unwrap_or(false);
    let tools = tool_use(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let format = response_format(req.response_format.as_ref())?;
    // A forced call's grammar depends on the model's form: it is built when the request
    // meets the model (see `http::generate`).
    if format.is_some() && tools.as_ref().is_some_and(ToolUse::forces) {
        return Err(InvalidRequest::field(
            "response_format",
            "cannot be combined with a `tool_choice` that forces a call",
        ));
    }
    let grammar = format;
    Ok(ValidRequest {
        model: req.model,
        input: Input::Chat(turns),
        max_tokens,
        sampling,
        stop: stops(req.stop)?,
        include_usage: stream_usage(stream, req.stream_options)?,
        stream,
        echo: false,
        parse_special: false,
        grammar,
        tools,
    })
}

pub fn completion(req: CompletionRequest) -> Result<ValidRequest, InvalidRequest> {
    check_n(req.n)?;
    unsupported_completion(&req)?;
    let mut sampling = sampling(&req.sampling())?;
    sampling.logit_bias = logit_bias(req.logit_bias.as_ref())?;
    sampling.logprobs = match req.logprobs {
        None => None,
        Some(n) if n > MAX_COMPLETION_LOGPROBS => {
            return Err(InvalidRequest::field(
                "logprobs",
                format!("must be between 0 and {MAX_COMPLETION_LOGPROBS}"),
            ))
        }
        // Prompt tokens would need logits at every prompt position, which are not kept.
        Some(_) if req.echo == Some(true) => {
            return Err(InvalidRequest::field(
                "logprobs",
                "is not supported together with `echo`: prompt tokens have no \
                 log-probabilities on this server",
            ))
        }
        Some(n) => Some(n as u8),
    };
    let prompt = match req.prompt {
        PromptField::One(p) => p,
        PromptField::Many(mut v) if v.len() == 1 => v.remove(0),
        PromptField::Many(_) => {
            return Err(InvalidRequest::field(
                "prompt",
                "must be a string or a list of exactly one string",
            ))
        }
    };
    if prompt.is_empty() {
        return Err(InvalidRequest::field("prompt", "must not be empty"));
    }
    if prompt.contains('\0') {
        return Err(InvalidRequest::field(
            "prompt",
            "must not contain NUL characters",
        ));
    }
    // The legacy endpoint's default, as OpenAI documents it.
    let max_tokens = check_max_tokens("max_tokens", req.max_tokens.unwrap_or(16))?;
    let stream = req.stream.unwrap_or(false);
    Ok(ValidRequest {
        model: req.model,
        input: Input::Text(prompt),
        max_tokens: Some(max_tokens),
        sampling,
        stop: stops(req.stop)?,
        include_usage: stream_usage(stream, req.stream_options)?,
        stream,
        echo: req.echo.unwrap_or(false),
        parse_special: req.parse_special.unwrap_or(false),
        grammar: None,
        tools: None,
    })
}

/// `response_format`: `text` (nothing), `json_object` (any JSON object) or `json_schema`
/// (`{"name", "schema", "strict"}`; the schema is always enforced, `strict` or not).
/// Whether llguidance can compile the schema is known once the model is (a 400 then too).
fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, InvalidRequest> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| InvalidRequest::field("response_format.type", "is required"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonSchema(
            serde_json::json!({"type": "object"}),
        ))),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or_else(|| {
                    InvalidRequest::field("response_format.json_schema", "must be an object")
                })?;
            match js.get("name") {
                Some(Value::String(n)) if valid_name(n) => {}
                _ => {
                    return Err(InvalidRequest::field(
                        "response_format.json_schema.name",
                        "is required: a-z, A-Z, 0-9, underscores and dashes, at most 64",
                    ))
                }
            }
            if js
                .get("strict")
                .is_some_and(|s| !s.is_null() && !s.is_boolean())
            {
                return Err(InvalidRequest::field(
                    "response_format.json_schema.strict",
                    "must be a boolean",
                ));
            }
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(Grammar::JsonSchema(serde_json::json!({})))),
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Grammar::JsonSchema(schema.clone())))
                }
                Some(_) => Err(InvalidRequest::field(
                    "response_format.json_schema.schema",
                    "must be a JSON schema object",
                )),
            }
        }
        other => Err(InvalidRequest::field(
            "response_format.type",
            format!("must be one of text, json_object, json_schema (got `{other}`)"),
        )),
    }
}

/// OpenAI's rule for function and schema names.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls`. `None` when no tool may be called
/// (no tools, or `tool_choice: "none"`): the tools are then not shown to the model.
fn tool_use(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolUse>, InvalidRequest> {
    let list = match tools.filter(|t| !t.is_null()) {
        None => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err(InvalidRequest::field("tools", "must be an array")),
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        if kind != Some("function") {
            return Err(InvalidRequest::field(
                &format!("tools[{i}].type"),
                "must be `function` (the only tool type this server supports)",
            ));
        }
        let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
            InvalidRequest::field(&format!("tools[{i}].function"), "must be an object")
        })?;
        let name = match f.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            _ => {
                return Err(InvalidRequest::field(
                    &format!("tools[{i}].function.name"),
                    "is required: a-z, A-Z, 0-9, underscores and dashes, at most 64",
                ))
            }
        };
        if parsed.iter().any(|p| p.name == name) {
            return Err(InvalidRequest::field(
                &format!("tools[{i}].function.name"),
                format!("`{name}` names two tools"),
            ));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => {
                return Err(InvalidRequest::field(
                    &format!("tools[{i}].function.description"),
                    "must be a string",
                ))
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(InvalidRequest::field(
                    &format!("tools[{i}].function.parameters"),
                    "must be a JSON schema object",
                ))
            }
        };
        parsed.push(Tool {
            name,
            description,
            parameters,
        });
    }
    let choice = match choice.filter(|c| !c.is_null()) {
        None if parsed.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(InvalidRequest::field(
                    "tool_choice",
                    format!(
                        "must be none, auto, required or {{\"type\": \"function\", \"function\": \
                         {{\"name\": …}}}} (got `{other}`)"
                    ),
                ))
            }
        },
        Some(obj) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    InvalidRequest::field(
                        "tool_choice",
                        "must be none, auto, required or {\"type\": \"function\", \
                         \"function\": {\"name\": …}}",
                    )
                })?;
            if !parsed.iter().any(|t| t.name == name) {
                return Err(InvalidRequest::field(
                    "tool_choice.function.name",
                    format!("`{name}` is not one of `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
    };
    if parsed.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Auto) {
        return Err(InvalidRequest::field(
            "tool_choice",
            "needs `tools`: there is no tool to call",
        ));
    }
    Ok((choice != ToolChoice::None).then(|| ToolUse {
        tools: parsed,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// A field OpenAI defines and this server does not implement.
fn unsupported(param: &str, what: &str) -> InvalidRequest {
    InvalidRequest::field(param, format!("is not supported by this server ({what})"))
}

/// Fields OpenAI defines for chat that would change the answer and that this server does
/// not implement: each is refused by name unless its value asks for nothing. `user`,
/// `metadata`, `safety_identifier` and `prompt_cache_key` only label a request, so they
/// are ignored, as unknown fields are. `tools`, `tool_choice`, `parallel_tool_calls` and
/// `response_format` are checked by [`tool_use`] and [`response_format`].
fn unsupported_chat(req: &ChatCompletionRequest) -> Result<(), InvalidRequest> {
    let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    if given(&req.audio) {
        return Err(unsupported("audio", "audio output"));
    }
    if let Some(m) = req.modalities.as_ref().filter(|m| !m.is_null()) {
        let text_only = m
            .as_array()
            .is_some_and(|a| a.iter().all(|x| x.as_str() == Some("text")));
        if !text_only {
            return Err(unsupported("modalities", "only [\"text\"] is"));
        }
    }
    if given(&req.prediction) {
        return Err(unsupported("prediction", "predicted outputs"));
    }
    if given(&req.web_search_options) {
        return Err(unsupported("web_search_options", "web search"));
    }
    if let Some(t) = req.service_tier.as_ref().filter(|t| !t.is_null()) {
        if !matches!(t.as_str(), Some("auto" | "default")) {
            return Err(unsupported("service_tier", "only `auto` and `default` are"));
        }
    }
    if let Some(s) = req.store.as_ref().filter(|s| !s.is_null()) {
        if s.as_bool() != Some(false) {
            return Err(unsupported("store", "completions are never stored"));
        }
    }
    if given(&req.reasoning_effort) {
        return Err(unsupported("reasoning_effort", "not a reasoning model"));
    }
    if given(&req.verbosity) {
        return Err(unsupported("verbosity", "output verbosity"));
    }
    if given(&req.functions) {
        return Err(unsupported("functions", "function calling"));
    }
    if given(&req.function_call) {
        return Err(unsupported("function_call", "function calling"));
    }
    Ok(())
}

/// Fields OpenAI defines for legacy completions that this server does not implement.
fn unsupported_completion(req: &CompletionRequest) -> Result<(), InvalidRequest> {
    match req.best_of {
        None | Some(1) => {}
        Some(0) => return Err(InvalidRequest::field("best_of", "must be at least 1")),
        Some(_) => {
            return Err(unsupported(
                "best_of",
                "only 1; send separate requests and compare",
            ))
        }
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("suffix", "text insertion"));
    }
    Ok(())
}

fn top_logprobs(n: u32) -> Result<u8, InvalidRequest> {
    u8::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_TOP_LOGPROBS)
        .ok_or_else(|| {
            InvalidRequest::field(
                "top_logprobs",
                format!("must be between 0 and {MAX_TOP_LOGPROBS}"),
            )
        })
}

/// `{"token id": bias}` → `(id, bias)` sorted by id. Ids are checked against the
/// vocabulary later ([`check_vocab`]), once the model is known.
fn logit_bias(map: Option<&Map<String, Value>>) -> Result<Vec<(i32, f32)>, InvalidRequest> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id = key
            .parse::<i64>()
            .ok()
            .filter(|id| *id >= 0)
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| {
                InvalidRequest::field(
                    "logit_bias",
                    format!("key `{key}` is not a token id (a non-negative integer)"),
                )
            })?;
        let bias = value
            .as_f64()
            .filter(|b| (-MAX_BIAS..=MAX_BIAS).contains(b))
            .ok_or_else(|| {
                InvalidRequest::field(
                    "logit_bias",
                    format!(
                        "value for key `{key}` must be a number between -{MAX_BIAS} and \
                         {MAX_BIAS} (got {value})"
                    ),
                )
            })?;
        out.push((id, bias as f32));
    }
    out.sort_by_key(|b| b.0);
    // "01" and "1" name the same token: one bias per token, or the sum would exceed 100.
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(InvalidRequest::field(
            "logit_bias",
            format!("token id {} appears more than once", w[0].0),
        ));
    }
    Ok(out)
}

/// Every `logit_bias` id must be a token of the model's vocabulary.
pub fn check_vocab(sampling: &SamplingParams, n_vocab: i32) -> Result<(), InvalidRequest> {
    match sampling.logit_bias.iter().find(|b| b.0 >= n_vocab) {
        Some((id, _)) => Err(InvalidRequest::field(
            "logit_bias",
            format!(
                "key `{id}` is not a token id of this model (its vocabulary has {n_vocab} tokens)"
            ),
        )),
        None => Ok(()),
    }
}

/// `/detokenize` ids: each must be a token of the vocabulary.
pub fn token_ids(tokens: &[i64], n_vocab: i32) -> Result<Vec<i32>, InvalidRequest> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            i32::try_from(t)
                .ok()
                .filter(|t| (0..n_vocab).contains(t))
                .ok_or_else(|| {
                    InvalidRequest::field(
                        &format!("tokens[{i}]"),
                        format!(
                            "is not a token id of this model (0 to {}, got {t})",
                            n_vocab - 1
                        ),
                    )
                })
        })
        .collect()
}

/// A call id the client sends back. Templates write it into the prompt as markup (Mistral's
/// `"call_id": "…"`), so it is held to the characters ids are made of: no text in it can
/// become a control token.
fn check_call_id(param: &str, id: String) -> Result<String, InvalidRequest> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if id.is_empty() || id.len() > 128 || !id.chars().all(ok) {
        return Err(InvalidRequest::field(
            param,
            "must be 1 to 128 characters of letters, digits, `_`, `-`, `.` and `:`",
        ));
    }
    Ok(id)
}

fn check_n(n: Option<u32>) -> Result<(), InvalidRequest> {
    match n {
        None | Some(1) => Ok(()),
        Some(0) => Err(InvalidRequest::field("n", "must be at least 1")),
        Some(_) => Err(InvalidRequest::field(
            "n",
            "greater than 1 is not supported by this server; send separate requests",
        )),
    }
}

fn check_max_tokens(param: &str, n: u32) -> Result<u32, InvalidRequest> {
    if n == 0 {
        return Err(InvalidRequest::field(param, "must be at least 1"));
    }
    Ok(n)
}

fn stream_usage(stream: bool, opts: Option<StreamOptions>) -> Result<bool, InvalidRequest> {
    match opts {
        None => Ok(false),
        Some(_) if !stream => Err(InvalidRequest::field(
            "stream_options",
            "is only allowed when `stream` is true",
        )),
        Some(o) => Ok(o.include_usage.unwrap_or(false)),
    }
}

fn stops(stop: Option<StopField>) -> Result<Vec<String>, InvalidRequest> {
    let list = match stop {
        None => return Ok(Vec::new()),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if list.len() > MAX_STOPS {
        return Err(InvalidRequest::field(
            "stop",
            format!("may hold at most {MAX_STOPS} sequences"),
        ));
    }
    for s in &list {
        if s.is_empty() {
            return Err(InvalidRequest::field(
                "stop",
                "must not contain empty strings",
            ));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(InvalidRequest::field(
                "stop",
                format!("sequences must be at most {MAX_STOP_BYTES} bytes"),
            ));
        }
    }
    Ok(list)
}

fn sampling(w: &WireSampling) -> Result<SamplingParams, InvalidRequest> {
    let d = SamplingParams::default();
    let temperature = in_range("temperature", w.temperature, d.temperature, 0.0, 2.0)?;
    let top_p = w.top_p.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(InvalidRequest::field("top_p", "must be in (0, 1]"));
    }
    let top_k = w.top_k.unwrap_or(d.top_k);
    if top_k < 0 {
        return Err(InvalidRequest::field(
            "top_k",
            "must be 0 (disabled) or positive",
        ));
    }
    let min_p = in_range("min_p", w.min_p, d.min_p, 0.0, 1.0)?;
    let presence_penalty = in_range(
        "presence_penalty",
        w.presence_penalty,
        d.presence_penalty,
        -2.0,
        2.0,
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        w.frequency_penalty,
        d.frequency_penalty,
        -2.0,
        2.0,
    )?;
    // Only the low 32 bits reach llama.cpp's sampler; without a seed every request differs.
    let seed = match w.seed {
        Some(s) => s as u64 as u32,
        None => rand::random(),
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        presence_penalty,
        frequency_penalty,
        seed,
        ..SamplingParams::default()
    })
}

fn in_range(
    param: &str,
    v: Option<f32>,
    default: f32,
    lo: f32,
    hi: f32,
) -> Result<f32, InvalidRequest> {
    let v = v.unwrap_or(default);
    if !(v.is_finite() && (lo..=hi).contains(&v)) {
        return Err(InvalidRequest::field(
            param,
            format!("must be between {lo} and {hi}"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
