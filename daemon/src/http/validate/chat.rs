//! `/v1/chat/completions`: messages become chat turns; the OpenAI fields this server does
//! not implement are refused by name.

use serde_json::Value;

use super::extensions;
use super::format::output_grammar;
use super::output::{check_max_tokens, check_n, stops, stream_usage};
use super::request::{unsupported, Input, InvalidRequest, ValidRequest};
use super::sampling::{logit_bias, sampling};
use super::tools::tool_use;
use crate::engine::chat::ChatTurn;
use crate::engine::logprobs::MAX_TOP_LOGPROBS;
use crate::http::wire::{ChatCompletionRequest, MessageContent};
use crate::tools::{PastCall, ToolUse};

/// A `/v1/chat/completions` body, checked field by field.
pub fn chat(req: ChatCompletionRequest) -> Result<ValidRequest, InvalidRequest> {
    let n = check_n(req.n)?;
    unsupported_chat(&req)?;
    extensions::check(&req.llama_extensions())?;
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
        (Some(n), _) => Some((
            "max_completion_tokens",
            check_max_tokens("max_completion_tokens", n)?,
        )),
        (None, Some(n)) => Some(("max_tokens", check_max_tokens("max_tokens", n)?)),
        (None, None) => None,
    };
    let max_tokens = extensions::n_predict(req.n_predict, max_tokens)?;
    let stream = req.stream.unwrap_or(false);
    let tools = tool_use(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let format = output_grammar(
        req.response_format.as_ref(),
        req.json_schema.as_ref(),
        req.grammar.as_ref(),
    )?;
    // A forced call's grammar depends on the model's form: it is built when the request
    // meets the model (see `http::generate`).
    if let Some((_, from)) = &format {
        if tools.as_ref().is_some_and(ToolUse::forces) {
            return Err(InvalidRequest::field(
                from.field,
                "cannot be combined with a `tool_choice` that forces a call",
            ));
        }
    }
    let (grammar, grammar_from) = format.unzip();
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
        grammar_from,
        tools,
        speculative: req.speculative.unwrap_or(true),
        n,
    })
}

/// Fields OpenAI defines for chat that would change the answer and that this server does
/// not implement: each is refused by name unless its value asks for nothing. `user`,
/// `metadata`, `safety_identifier`, `prompt_cache_key` and `prompt_cache_retention` only
/// label a request, so they are accepted and change nothing. `tools`, `tool_choice`, `parallel_tool_calls` and
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

/// A call id the client sends back. Templates write it into the prompt as markup (Mistral's
/// `"call_id": "…"`), so it is held to the characters ids are made of: no text in it can
/// become a control token.
pub(super) fn check_call_id(param: &str, id: String) -> Result<String, InvalidRequest> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if id.is_empty() || id.len() > 128 || !id.chars().all(ok) {
        return Err(InvalidRequest::field(
            param,
            "must be 1 to 128 characters of letters, digits, `_`, `-`, `.` and `:`",
        ));
    }
    Ok(id)
}
