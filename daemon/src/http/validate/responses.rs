//! `/v1/responses`, stateless: the request becomes the same [`ValidRequest`] a chat request
//! does (so it shares chat's lifecycle), plus what the response echoes. What needs stored
//! state, a background job or a built-in tool is refused by name.

use serde_json::{json, Map, Value};

use super::format::named_schema;
use super::items::turns;
use super::output::check_max_tokens;
use super::request::{unsupported, Input, InvalidRequest, ValidRequest};
use super::sampling::sampling;
use super::tools::{self, finish, function, push_tool};
use crate::engine::constraint::Grammar;
use crate::http::responses::wire::{Echo, ResponsesRequest};
use crate::http::wire::WireSampling;
use crate::tools::{Tool, ToolUse};

/// OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
const MAX_METADATA: usize = 16;

/// A Responses request, checked: what to generate, and what the response repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidResponses {
    pub request: ValidRequest,
    pub echo: Echo,
}

/// A `/v1/responses` body, checked field by field.
pub fn responses(req: ResponsesRequest) -> Result<ValidResponses, InvalidRequest> {
    refuse_stateful(&req)?;
    let sampling = sampling(&WireSampling {
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        ..WireSampling::default()
    })?;
    let instructions = match &req.instructions {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(InvalidRequest::field(
                "instructions",
                "must be a string (stored prompts are not supported)",
            ))
        }
    };
    let turns = turns(instructions.as_deref(), req.input.as_ref())?;
    let max_tokens = req
        .max_output_tokens
        .map(|n| check_max_tokens("max_output_tokens", n))
        .transpose()?;
    let (tools, tool_values) = tool_use(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let (grammar, text) = text_format(req.text.as_ref())?;
    if grammar.is_some() && tools.as_ref().is_some_and(ToolUse::forces) {
        return Err(InvalidRequest::field(
            "text.format",
            "cannot be combined with a `tool_choice` that forces a call",
        ));
    }
    let metadata = metadata(req.metadata.as_ref())?;
    let echo = Echo {
        instructions,
        metadata,
        max_output_tokens: max_tokens,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        text,
        tool_choice: req
            .tool_choice
            .clone()
            .filter(|c| !c.is_null())
            .unwrap_or_else(|| json!("auto")),
        tools: tool_values,
    };
    let request = ValidRequest {
        model: req.model,
        input: Input::Chat(turns),
        max_tokens,
        sampling,
        stop: Vec::new(),
        stream: req.stream.unwrap_or(false),
        include_usage: false,
        echo: false,
        parse_special: false,
        grammar,
        grammar_from: None,
        tools,
        speculative: req.speculative.unwrap_or(true),
        n: 1,
    };
    Ok(ValidResponses { request, echo })
}

/// What a stateless server cannot do, each refused by its field unless it asks for
/// nothing. `reasoning` is accepted and has no effect: the model writes no reasoning.
fn refuse_stateful(req: &ResponsesRequest) -> Result<(), InvalidRequest> {
    let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    if given(&req.previous_response_id) {
        return Err(unsupported(
            "previous_response_id",
            "responses are not stored; send the whole conversation in `input`",
        ));
    }
    if given(&req.conversation) {
        return Err(unsupported(
            "conversation",
            "conversations are not stored; send the whole conversation in `input`",
        ));
    }
    if req
        .store
        .as_ref()
        .is_some_and(|s| s.as_bool() == Some(true))
    {
        return Err(unsupported(
            "store",
            "responses are never stored; send `store: false` or leave it out",
        ));
    }
    if let Some(s) = req
        .store
        .as_ref()
        .filter(|s| !s.is_null() && !s.is_boolean())
    {
        return Err(InvalidRequest::field(
            "store",
            format!("must be a boolean (got {s})"),
        ));
    }
    if req
        .background
        .as_ref()
        .is_some_and(|b| b.as_bool() != Some(false) && !b.is_null())
    {
        return Err(unsupported(
            "background",
            "background responses need storage; leave it out and wait for the answer",
        ));
    }
    if given(&req.prompt) {
        return Err(unsupported("prompt", "stored prompt templates"));
    }
    if let Some(inc) = req.include.as_ref().filter(|v| !v.is_null()) {
        let list = inc
            .as_array()
            .ok_or_else(|| InvalidRequest::field("include", "must be an array of strings"))?;
        // Nothing to include for a model that does not reason: asking costs nothing.
        if let Some(other) = list
            .iter()
            .find(|v| v.as_str() != Some("reasoning.encrypted_content"))
        {
            return Err(unsupported(
                "include",
                &format!(
                    "{other} cannot be included; only `reasoning.encrypted_content` is accepted"
                ),
            ));
        }
    }
    if let Some(t) = req.truncation.as_ref().filter(|t| !t.is_null()) {
        if t.as_str() != Some("disabled") {
            return Err(unsupported(
                "truncation",
                "only `disabled`: an input over the context is a 400",
            ));
        }
    }
    if req
        .top_logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.as_u64() != Some(0))
    {
        return Err(unsupported(
            "top_logprobs",
            "log-probabilities on responses",
        ));
    }
    if given(&req.max_tool_calls) {
        return Err(unsupported(
            "max_tool_calls",
            "a limit on built-in tool calls",
        ));
    }
    if let Some(t) = req.service_tier.as_ref().filter(|t| !t.is_null()) {
        if !matches!(t.as_str(), Some("auto" | "default")) {
            return Err(unsupported("service_tier", "only `auto` and `default` are"));
        }
    }
    Ok(())
}

/// `tools` (flat function tools: `{"type": "function", "name", "description",
/// "parameters", "strict"}`), `tool_choice` and `parallel_tool_calls`. Built-in tools are
/// refused by name. Also returns the tools as given, for the echo.
fn tool_use(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<(Option<ToolUse>, Vec<Value>), InvalidRequest> {
    let list = match tools.filter(|t| !t.is_null()) {
        None => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err(InvalidRequest::field("tools", "must be an array")),
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(unsupported(
                    &format!("tools[{i}].type"),
                    &format!(
                        "`{other}` is a built-in tool this server does not have; only \
                         `function` tools are"
                    ),
                ))
            }
            None => {
                return Err(InvalidRequest::field(
                    &format!("tools[{i}].type"),
                    "is required",
                ))
            }
        }
        if t.get("strict")
            .is_some_and(|s| !s.is_null() && !s.is_boolean())
        {
            return Err(InvalidRequest::field(
                &format!("tools[{i}].strict"),
                "must be a boolean",
            ));
        }
        let tool = function(&format!("tools[{i}]"), t)?;
        push_tool(&mut parsed, tool, &format!("tools[{i}].name"))?;
    }
    let choice = match choice.filter(|c| !c.is_null()) {
        None => tools::default_choice(&parsed),
        Some(Value::String(s)) => tools::choice_mode(s, "{\"type\": \"function\", \"name\": …}")?,
        Some(obj) => match obj.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = obj
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| InvalidRequest::field("tool_choice.name", "is required"))?;
                tools::named_choice(&parsed, name, "tool_choice.name")?
            }
            other => {
                return Err(unsupported(
                    "tool_choice.type",
                    &format!(
                        "{}: only `function` choices are",
                        other.map_or_else(|| "none given".to_string(), |o| format!("`{o}`"))
                    ),
                ))
            }
        },
    };
    Ok((finish(parsed, choice, parallel)?, list.to_vec()))
}

/// `text`: `format` (`text`, `json_object`, or `json_schema` with `name`, `schema` and
/// `strict` beside `type`) as a grammar, and the value the response echoes.
fn text_format(text: Option<&Value>) -> Result<(Option<Grammar>, Value), InvalidRequest> {
    let default = json!({"format": {"type": "text"}});
    let Some(text) = text.filter(|t| !t.is_null()) else {
        return Ok((None, default));
    };
    if !text.is_object() {
        return Err(InvalidRequest::field("text", "must be an object"));
    }
    if text.get("verbosity").is_some_and(|v| !v.is_null()) {
        return Err(unsupported("text.verbosity", "output verbosity"));
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok((None, default));
    };
    let kind = format
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| InvalidRequest::field("text.format.type", "is required"))?;
    let grammar = match kind {
        "text" => None,
        "json_object" => Some(Grammar::JsonSchema(json!({"type": "object"}))),
        "json_schema" => named_schema("text.format", format)?,
        other => {
            return Err(InvalidRequest::field(
                "text.format.type",
                format!("must be one of text, json_object, json_schema (got `{other}`)"),
            ))
        }
    };
    Ok((grammar, json!({ "format": format })))
}

/// `metadata`: up to 16 string pairs, echoed as given.
fn metadata(v: Option<&Value>) -> Result<Map<String, Value>, InvalidRequest> {
    let map = match v {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(InvalidRequest::field("metadata", "must be an object")),
    };
    if map.len() > MAX_METADATA {
        return Err(InvalidRequest::field(
            "metadata",
            format!("may hold at most {MAX_METADATA} pairs"),
        ));
    }
    for (k, v) in map {
        if k.chars().count() > 64 {
            return Err(InvalidRequest::field(
                "metadata",
                format!("key `{k}` is longer than 64 characters"),
            ));
        }
        match v {
            Value::String(s) if s.chars().count() <= 512 => {}
            _ => {
                return Err(InvalidRequest::field(
                    &format!("metadata.{k}"),
                    "must be a string of at most 512 characters",
                ))
            }
        }
    }
    Ok(map.clone())
}
