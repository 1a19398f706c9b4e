//! The two generation routes: read and validate the body, render and tokenize the prompt,
//! check the context, submit, then answer as JSON or as an SSE stream.

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
use super::wire::{AssistantMessage, ChatChoice, ChatCompletion, Completion, CompletionChoice};
use super::AppState;
use crate::engine::{Engine, Event, GenerationRequest};
use crate::validate::{self, Input, ValidRequest};

/// Reported as `system_fingerprint`: the daemon build that produced the output.
pub const FINGERPRINT: &str = concat!("inferloop-", env!("CARGO_PKG_VERSION"));

pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    let parsed = read_body(&state, &headers, body).await.and_then(|b| {
        let wire = validate::parse_json(&b)?;
        Ok(validate::chat(wire)?)
    });
    match parsed {
        Ok(req) => run(state, req, Shape::Chat, received_at).await,
        Err(e) => e.into_response(),
    }
}

pub async fn completion(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    let parsed = read_body(&state, &headers, body).await.and_then(|b| {
        let wire = validate::parse_json(&b)?;
        Ok(validate::completion(wire)?)
    });
    match parsed {
        Ok(req) => run(state, req, Shape::Completion, received_at).await,
        Err(e) => e.into_response(),
    }
}

/// Reads the whole body within the size limit and the read timeout.
async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
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

async fn start(
    state: &AppState,
    req: ValidRequest,
    shape: Shape,
    received_at: Instant,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let model_id = engine.model().info().id.clone();
    if let Some(m) = req.model.as_deref() {
        if m != model_id {
            return Err(ApiError::model_not_found(m));
        }
    }
    let (prompt_text, tokens) = tokenize(&engine, req.input.clone()).await?;
    let ctx = engine.config().ctx;
    if tokens.is_empty() {
        return Err(ApiError::invalid("prompt", "tokenizes to nothing"));
    }
    let room = (ctx as usize).saturating_sub(tokens.len()) as u32;
    let max_tokens = req.max_tokens.unwrap_or(room);
    if room == 0 || max_tokens > room {
        return Err(ApiError::context_length_exceeded(
            ctx,
            tokens.len(),
            max_tokens.max(1),
        ));
    }
    let events = engine
        .submit(GenerationRequest {
            prompt_tokens: tokens,
            max_tokens,
            stop: req.stop,
            sampling: req.sampling,
            received_at,
        })
        .await?;
    let (prefix, object) = match shape {
        Shape::Chat => ("chatcmpl", "chat.completion"),
        Shape::Completion => ("cmpl", "text_completion"),
    };
    let id = format!(
        "{prefix}-{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 24)
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let echo = (req.echo && shape == Shape::Completion).then_some(prompt_text);
    let cancel = state.cancel.clone();
    if req.stream {
        stream(
            events,
            cancel,
            Framer {
                shape,
                id,
                created,
                model: model_id,
                include_usage: req.include_usage,
            },
            echo,
        )
        .await
    } else {
        tokio::select! {
            biased;
            _ = wait_cancelled(cancel) => Err(crate::engine::EngineError::ShuttingDown.into()),
            r = collect(events, shape, id, object, created, model_id, echo) => r,
        }
    }
}

/// Renders the chat template and tokenizes off the async runtime: a 1 MiB prompt takes a
/// while and must not stall other connections.
async fn tokenize(engine: &Engine, input: Input) -> Result<(String, Vec<i32>), ApiError> {
    let model = engine.model().clone();
    tokio::task::spawn_blocking(move || {
        let text = match input {
            Input::Chat(turns) => model
                .render_chat(&turns)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?,
            Input::Text(t) => t,
        };
        let tokens = model.tokenize(&text);
        Ok((text, tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
}

/// Waits for a slot before sending headers, so queue errors (503) keep their status code.
async fn stream(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cancel: tokio::sync::watch::Receiver<bool>,
    framer: Framer,
    echo: Option<String>,
) -> Result<Response, ApiError> {
    match events.recv().await {
        Some(Event::Admitted { .. }) => {}
        Some(Event::Failed(e)) => return Err(e.into()),
        Some(_) | None => return Err(ApiError::internal("engine sent no admission")),
    }
    let opening = framer.opening(echo.as_deref());
    Ok(sse::response(sse::events_to_body(
        framer, opening, events, cancel,
    )))
}

/// Resolves once shutdown cancels in-flight requests (never, if the sender is kept).
async fn wait_cancelled(mut cancel: tokio::sync::watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn collect(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    echo: Option<String>,
) -> Result<Response, ApiError> {
    let mut text = echo.unwrap_or_default();
    loop {
        match events.recv().await {
            Some(Event::Admitted { .. }) => {}
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Finished {
                reason,
                usage,
                timings,
            }) => {
                let resp = match shape {
                    Shape::Chat => Json(ChatCompletion {
                        id,
                        object,
                        created,
                        model,
                        system_fingerprint: FINGERPRINT,
                        choices: vec![ChatChoice {
                            index: 0,
                            message: AssistantMessage {
                                role: "assistant",
                                content: text,
                            },
                            logprobs: None,
                            finish_reason: reason,
                        }],
                        usage,
                        timings,
                    })
                    .into_response(),
                    Shape::Completion => Json(Completion {
                        id,
                        object,
                        created,
                        model,
                        system_fingerprint: FINGERPRINT,
                        choices: vec![CompletionChoice {
                            index: 0,
                            text,
                            logprobs: None,
                            finish_reason: Some(reason),
                        }],
                        usage,
                        timings,
                    })
                    .into_response(),
                };
                return Ok(resp);
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            None => return Err(ApiError::internal("engine stopped before finishing")),
        }
    }
}
