//! The two generation routes: read and validate the body, render and tokenize the prompt,
//! check the context, submit, then answer as JSON or as an SSE stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use rand::distributions::{Alphanumeric, DistString};

use super::error::ApiError;
use super::sse::{self, Framer, Shape};
use super::validate::{self, Input, ValidRequest};
use super::wire::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, Completion, CompletionChoice,
    CompletionLogprobs, WireFunctionCall, WireToolCall, FINGERPRINT,
};
use super::AppState;
use crate::engine::chat::{Limit, PromptError};
use crate::engine::constraint::{Constraint, Grammar};
use crate::engine::{
    Engine, Event, FinishReason, GenerationRequest, SamplingParams, Timings, TokenLogprob, Usage,
};
use crate::tools::{Format, ToolUse};

pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    match read_request(&state, &headers, body, Shape::Chat).await {
        Ok(req) => run(state, req, Shape::Chat, received_at).await,
        Err(e) => e.into_response(),
    }
}

pub async fn completion(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    match read_request(&state, &headers, body, Shape::Completion).await {
        Ok(req) => run(state, req, Shape::Completion, received_at).await,
        Err(e) => e.into_response(),
    }
}

/// Reads and validates a chat or completion body: the generation routes and their render
/// routes ([`super::render`]) take exactly the same requests.
pub(super) async fn read_request(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    shape: Shape,
) -> Result<ValidRequest, ApiError> {
    let bytes = read_body(state, headers, body).await?;
    Ok(match shape {
        Shape::Chat => validate::chat(validate::parse_json(&bytes)?)?,
        Shape::Completion => validate::completion(validate::parse_json(&bytes)?)?,
    })
}

/// Reads the whole body within the size limit and the read timeout.
pub(super) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::body_too_large(limit));
    }
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(state.config.read_timeout, collect).await {
        Err(_) => Err(ApiError::read_timeout()),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::body_too_large(limit))
        }
        Ok(Err(e)) => Err(ApiError::invalid(
            "body",
            format!("could not read body: {e}"),
        )),
    }
}

async fn run(state: AppState, req: ValidRequest, shape: Shape, received_at: Instant) -> Response {
    match start(&state, req, shape, received_at).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// The request fields an error before generation names: they differ by route.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fields {
    /// The input that holds the prompt (context errors).
    pub prompt: &'static str,
    /// Where a grammar came from when no tool forced it.
    pub format: &'static str,
    /// Where a JSON schema that cannot be compiled came from.
    pub schema: &'static str,
}

impl Fields {
    fn of(shape: Shape) -> Self {
        Fields {
            prompt: shape.prompt_param(),
            format: "response_format",
            schema: "response_format.json_schema.schema",
        }
    }
}

/// A request the engine accepted: its events (one receiver per choice), and what answering
/// them needs.
pub(super) struct Submitted {
    pub choices: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    pub model_id: String,
    /// The rendered prompt (completions' `echo`).
    pub prompt_text: String,
    /// The form tool calls are parsed in, when the request offered tools.
    pub tools: Option<Format>,
    pub logprobs: bool,
    pub include_usage: bool,
    pub echo: bool,
    pub stream: bool,
}

/// The one request lifecycle every generation route shares: model check, vocabulary,
/// grammar, prompt, context, then the engine's queue (admission, cancellation, prefix
/// reuse and metrics all live behind [`Engine::submit`]).
pub(super) async fn submit(
    state: &AppState,
    req: ValidRequest,
    fields: Fields,
    received_at: Instant,
) -> Result<Submitted, ApiError> {
    let engine = state.engine()?;
    let max_n = state.config.max_n;
    if req.n as usize > max_n {
        return Err(ApiError::invalid(
            "n",
            format!(
                "`n` must be at most {max_n} on this server: each choice decodes in a slot \
                 of its own (--max-n, at most --slots)"
            ),
        ));
    }
    let model_id = served_model(&engine, req.model.as_deref())?;
    validate::check_vocab(&req.sampling, engine.model().info().n_vocab)?;
    let mut req = req;
    let tool_format = engine.model().tool_format();
    if let Some(lark) = req.tools.as_ref().and_then(|t| t.grammar(tool_format)) {
        req.grammar = Some(Grammar::Lark(lark));
    }
    // The fields a grammar came from, when not the route's own format field.
    let (format, schema) = req
        .grammar_from
        .map_or((fields.format, fields.schema), |f| (f.field, f.schema));
    if req.grammar.is_some() {
        let param = if req.tools.is_some() {
            "tool_choice"
        } else {
            format
        };
        let what = format!("`{param}`");
        if let Some(why) = engine
            .capabilities()
            .refuse_constraint(engine.backend_name(), &what)
        {
            return Err(ApiError::invalid(param, why));
        }
    }
    if let Some(grammar) = req.grammar.take() {
        let param = if req.tools.is_some() { "tools" } else { schema };
        req.sampling.constraint = Some(compile(&engine, grammar, param).await?);
    }
    let logprobs = req.sampling.logprobs.is_some();
    let ctx = engine.plan().ctx;
    let (prompt_text, tokens) = tokenize(
        &engine,
        req.input.clone(),
        req.tools.clone(),
        req.parse_special,
        fields.prompt,
    )
    .await?;
    if tokens.is_empty() {
        return Err(ApiError::invalid(fields.prompt, "tokenizes to nothing"));
    }
    let room = (ctx as usize).saturating_sub(tokens.len()) as u32;
    let max_tokens = req.max_tokens.unwrap_or(room);
    if room == 0 || max_tokens > room {
        return Err(ApiError::context_length_exceeded(
            fields.prompt,
            ctx,
            tokens.len(),
            max_tokens.max(1),
        ));
    }
    // Choice `i` samples with `seed + i`: each is reproducible on its own, and no two
    // choices of one request draw the same numbers.
    let choices = (0..req.n)
        .map(|i| GenerationRequest {
            prompt_tokens: tokens.clone(),
            max_tokens,
            stop: req.stop.clone(),
            sampling: SamplingParams {
                seed: req.sampling.seed.wrapping_add(i),
                ..req.sampling.clone()
            },
            received_at,
            embed: None,
            speculative: req.speculative,
        })
        .collect();
    let choices = engine.submit_choices(choices).await?;
    Ok(Submitted {
        choices,
        model_id,
        prompt_text,
        tools: req.tools.is_some().then_some(tool_format),
        logprobs,
        include_usage: req.include_usage,
        echo: req.echo,
        stream: req.stream,
    })
}

/// A fresh id after OpenAI's prefix (`chatcmpl-`, `resp_`, `msg_`, ...).
pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 24)
    )
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn start(
    state: &AppState,
    req: ValidRequest,
    shape: Shape,
    received_at: Instant,
) -> Result<Response, ApiError> {
    let sub = submit(state, req, Fields::of(shape), received_at).await?;
    let (prefix, object) = match shape {
        Shape::Chat => ("chatcmpl-", "chat.completion"),
        Shape::Completion => ("cmpl-", "text_completion"),
    };
    let id = new_id(prefix);
    let created = unix_now();
    let echo = (sub.echo && shape == Shape::Completion).then_some(sub.prompt_text);
    let cancel = state.cancel.clone();
    let (tools, model_id, logprobs, mut choices) =
        (sub.tools, sub.model_id, sub.logprobs, sub.choices);
    if sub.stream {
        let mut framers: Vec<Framer> = (0..choices.len())
            .map(|i| Framer {
                shape,
                index: i as u32,
                id: id.clone(),
                created,
                model: model_id.clone(),
                include_usage: sub.include_usage,
                text_offset: 0,
                tools: tools.map(sse::ToolFramer::new),
            })
            .collect();
        let mut openings: Vec<Bytes> = framers
            .iter()
            .filter_map(|f| f.opening(echo.as_deref()))
            .collect();
        if let ([_], [_]) = (&framers[..], &choices[..]) {
            let (framer, events) = (framers.remove(0), choices.remove(0));
            return stream(events, cancel, framer, openings.pop()).await;
        }
        stream_choices(choices, cancel, framers, openings).await
    } else {
        let answer = async move {
            let outs = tokio::select! {
                biased;
                _ = wait_cancelled(cancel) => Err(crate::engine::EngineError::ShuttingDown.into()),
                r = collect_all(choices, echo) => r,
            }?;
            Ok(respond(
                outs, shape, id, object, created, model_id, logprobs, tools,
            ))
        };
        // A client that closed its sending side may be half-closed or gone: the answer then
        // probes the connection while it is generated (see `conn`).
        super::conn::json_or_probe(answer).await
    }
}

/// Compiles the request's grammar on the blocking pool (the first one also walks the
/// vocabulary). What llguidance cannot compile is a 400 naming the field it came from.
async fn compile(
    engine: &Engine,
    grammar: Grammar,
    param: &'static str,
) -> Result<Constraint, ApiError> {
    let model = engine.model().clone();
    tokio::task::spawn_blocking(move || model.compile_grammar(&grammar))
        .await
        .map_err(|e| ApiError::internal(format!("grammar task failed: {e}")))?
        .map_err(|e| ApiError::invalid(param, format!("`{param}` cannot be enforced: {e}")))
}

/// The id of the model this server serves; a request naming another is a 404.
fn served_model(engine: &Engine, asked: Option<&str>) -> Result<String, ApiError> {
    let id = &engine.model().info().id;
    match asked {
        Some(m) if m != id => Err(ApiError::model_not_found(m)),
        _ => Ok(id.clone()),
    }
}

/// The token ids a generation request's prompt would feed (model check, template, tools,
/// special tokens), without generating: the render routes ([`super::render`]).
pub(super) async fn prompt_tokens(
    state: &AppState,
    req: ValidRequest,
    shape: Shape,
) -> Result<Vec<i32>, ApiError> {
    let engine = state.engine()?;
    served_model(&engine, req.model.as_deref())?;
    let fields = Fields::of(shape);
    let (_, tokens) = tokenize(
        &engine,
        req.input,
        req.tools,
        req.parse_special,
        fields.prompt,
    )
    .await?;
    Ok(tokens)
}

/// Bounds the input by the context, then renders the chat template and tokenizes off the
/// async runtime. The bounds come first so an oversized body is refused before any work
/// that grows with it; if the client leaves meanwhile, the blocking work stops too.
async fn tokenize(
    engine: &Engine,
    input: Input,
    tools: Option<ToolUse>,
    parse_special: bool,
    param: &'static str,
) -> Result<(String, Vec<i32>), ApiError> {
    let model = engine.model().clone();
    let ctx = engine.plan().ctx;
    let bounds = model.prompt_bounds();
    let limit = Limit::for_context(ctx);
    let too_long = move |e: PromptError| {
        if e.is_too_long() {
            ApiError::prompt_too_long(param, e.to_string())
        } else {
            ApiError::invalid(param, e.to_string())
        }
    };
    match &input {
        Input::Chat(turns) => bounds.check_chat(turns, ctx),
        Input::Text(t) => bounds.check_bytes(t.len(), ctx),
    }
    .map_err(too_long)?;
    // Dropped with this future when the client leaves: the blocking task sees the flag.
    let gone = Arc::new(AtomicBool::new(false));
    let _leave = SetOnDrop(gone.clone());
    tokio::task::spawn_blocking(move || {
        let prompt = match input {
            Input::Chat(turns) => model.chat_prompt(&turns, tools.as_ref(), limit, &gone),
            Input::Text(t) => model.text_prompt(&t, parse_special, limit, &gone),
        }
        .map_err(too_long)?;
        Ok((prompt.text, prompt.tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
}

fn wire_calls(calls: Vec<crate::tools::ToolCall>, format: Format) -> Vec<WireToolCall> {
    calls
        .into_iter()
        .map(|c| WireToolCall {
            id: format.call_id(),
            kind: "function".into(),
            function: WireFunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect()
}

/// Sets its flag when dropped: tells blocking work that the request it serves is gone.
pub(super) struct SetOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Waits for a slot before sending headers, so queue errors (503) keep their status code.
/// `opening` goes first (chat's role chunk, a response's `response.created`).
pub(super) async fn stream(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cancel: tokio::sync::watch::Receiver<bool>,
    framer: impl sse::Frames,
    opening: Option<Bytes>,
) -> Result<Response, ApiError> {
    let keepalive = admitted(&mut events).await?;
    Ok(sse::response(sse::events_to_body(
        framer, opening, events, cancel, keepalive,
    )))
}

/// [`stream`] for a request with several choices, admitted together: the first one's
/// admission stands for all.
async fn stream_choices(
    mut choices: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    cancel: tokio::sync::watch::Receiver<bool>,
    framers: Vec<Framer>,
    openings: Vec<Bytes>,
) -> Result<Response, ApiError> {
    let first = choices
        .first_mut()
        .ok_or_else(|| ApiError::internal("a request without choices"))?;
    let keepalive = admitted(first).await?;
    Ok(sse::response(sse::choices_to_body(
        framers, openings, choices, cancel, keepalive,
    )))
}

/// Waits for the engine's admission of a streamed request; returns how often the stream
/// then sends keep-alives.
async fn admitted(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<std::time::Duration, ApiError> {
    let peer = super::conn::Peer::current();
    let read_closed = async {
        match &peer {
            Some(p) => p.read_closed().await,
            None => std::future::pending().await,
        }
    };
    // A client that closes its sending side while queued may be half-closed or gone: start
    // the stream at once and probe it often, so one that left gives up its queue place
    // (see `conn`). Queue errors then arrive as an error frame under the 200.
    tokio::select! {
        biased;
        first = events.recv() => {
            match first {
                Some(Event::Admitted { .. }) => {}
                Some(Event::Failed(e)) => return Err(e.into()),
                Some(_) | None => return Err(ApiError::internal("engine sent no admission")),
            }
            Ok(sse::KEEPALIVE_EVERY)
        }
        () = read_closed => Ok(super::conn::PROBE_EVERY),
    }
}

/// Resolves once shutdown cancels in-flight requests (never, if the sender is kept).
pub(super) async fn wait_cancelled(mut cancel: tokio::sync::watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What one choice generated.
struct ChoiceOut {
    text: String,
    tokens: Vec<TokenLogprob>,
    reason: FinishReason,
    usage: Usage,
    timings: Timings,
}

/// Every choice to its end, side by side; the first failure fails the request (the other
/// choices are cancelled as their receivers drop).
async fn collect_all(
    choices: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    echo: Option<String>,
) -> Result<Vec<ChoiceOut>, ApiError> {
    futures::future::try_join_all(
        choices
            .into_iter()
            .map(|events| collect(events, echo.clone().unwrap_or_default())),
    )
    .await
}

async fn collect(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    mut text: String,
) -> Result<ChoiceOut, ApiError> {
    let mut tokens = Vec::new();
    loop {
        match events.recv().await {
            Some(Event::Admitted { .. } | Event::Embedding(_)) => {}
            Some(Event::Text { text: t, logprobs }) => {
                text.push_str(&t);
                tokens.extend(logprobs);
            }
            Some(Event::Finished {
                reason,
                usage,
                timings,
            }) => {
                return Ok(ChoiceOut {
                    text,
                    tokens,
                    reason,
                    usage,
                    timings,
                })
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            None => return Err(ApiError::internal("engine stopped before finishing")),
        }
    }
}

/// The JSON answer over every choice: each with its index, text (or tool calls), logprobs
/// and finish reason; usage and timings over them all.
#[allow(clippy::too_many_arguments)]
fn respond(
    outs: Vec<ChoiceOut>,
    shape: Shape,
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    logprobs: bool,
    tools: Option<Format>,
) -> Response {
    let usage = Usage::of_choices(&outs.iter().map(|o| o.usage).collect::<Vec<_>>());
    let timings = Timings::of_choices(&outs.iter().map(|o| o.timings).collect::<Vec<_>>());
    match shape {
        Shape::Chat => {
            let choices = (0u32..).zip(outs).map(|(index, o)| {
                let (content, tool_calls, reason) = match tools {
                    Some(format) => with_calls(o.text, o.reason, format),
                    None => (Some(o.text), None, o.reason),
                };
                ChatChoice {
                    index,
                    message: AssistantMessage {
                        role: "assistant",
                        content,
                        tool_calls,
                    },
                    logprobs: logprobs.then(|| ChatLogprobs::of(&o.tokens)),
                    finish_reason: reason,
                }
            });
            Json(ChatCompletion {
                id,
                object,
                created,
                model,
                system_fingerprint: FINGERPRINT,
                choices: choices.collect(),
                usage,
                timings,
            })
            .into_response()
        }
        Shape::Completion => {
            let choices = (0u32..).zip(outs).map(|(index, o)| CompletionChoice {
                index,
                logprobs: logprobs.then(|| {
                    let mut l = CompletionLogprobs::default();
                    l.extend(&o.tokens, &mut 0);
                    l
                }),
                text: o.text,
                finish_reason: Some(o.reason),
            });
            Json(Completion {
                id,
                object,
                created,
                model,
                system_fingerprint: FINGERPRINT,
                choices: choices.collect(),
                usage,
                timings,
            })
            .into_response()
        }
    }
}

/// A chat answer's text parsed for tool calls: its content, the calls, and `tool_calls`
/// as the finish reason when it stopped on its own after calling.
fn with_calls(
    text: String,
    reason: FinishReason,
    format: Format,
) -> (Option<String>, Option<Vec<WireToolCall>>, FinishReason) {
    let (content, calls) = crate::tools::parse(&text, format);
    if calls.is_empty() {
        (Some(text), None, reason)
    } else if reason != FinishReason::Stop {
        // Cut by `max_tokens`: `length`, with what was written, as OpenAI.
        (content, Some(wire_calls(calls, format)), reason)
    } else {
        (
            content,
            Some(wire_calls(calls, format)),
            FinishReason::ToolCalls,
        )
    }
}
