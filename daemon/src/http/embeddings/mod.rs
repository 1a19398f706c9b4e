//! `POST /v1/embeddings`: each input becomes an embedding pass, a prompt-only sequence
//! that goes through the engine's one queue (admission, the thermal gate, cancellation
//! when the client leaves, the request metrics), and comes back as one pooled,
//! L2-normalised vector (see [`crate::engine::embed`]).
//!
//! # Layout
//! - [`wire`]: the request, the list answered, base64.

pub mod wire;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::generate::{read_body, wait_cancelled};
use super::validate::{self, EmbedInputs, ValidEmbeddings};
use super::AppState;
use crate::engine::chat::{Limit, PromptError};
use crate::engine::embed::Pooling;
use crate::engine::{Engine, EngineError, Event, GenerationRequest, SamplingParams};
use wire::{EmbeddingData, EmbeddingList, EmbeddingUsage, Vector};

pub async fn embeddings(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    let parsed = read_body(&state, &headers, body).await.and_then(|b| {
        let wire = validate::parse_json(&b)?;
        Ok(validate::embeddings(wire)?)
    });
    let answer = match parsed {
        Ok(req) => run(state, req, received_at).await,
        Err(e) => Err(e),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

async fn run(
    state: AppState,
    req: ValidEmbeddings,
    received_at: Instant,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let info = engine.model().info().clone();
    if let Some(m) = req.model.as_deref() {
        if m != info.id {
            return Err(ApiError::model_not_found(m));
        }
    }
    if !engine.capabilities().embeddings {
        return Err(ApiError::invalid(
            "input",
            format!(
                "embeddings are not computed by the {} backend on this device (the native \
                 backend computes them on the CPU only); serve with `--backend llama` or \
                 `--device cpu`",
                engine.backend_name()
            ),
        ));
    }
    let pooling = Pooling::from_gguf(info.pooling_type)
        .map_err(|e| ApiError::invalid("model", e.to_string()))?;
    validate::check_dimensions(req.dimensions, info.n_embd)?;
    let ctx = engine.plan().ctx;
    let prompts = match req.inputs {
        EmbedInputs::Texts(texts) => tokenize(&engine, texts).await?,
        EmbedInputs::Tokens { lists, flat } => {
            validate::check_token_ids(&lists, flat, info.n_vocab)?
        }
    };
    for (i, p) in prompts.iter().enumerate() {
        let param = if prompts.len() == 1 {
            "input".to_string()
        } else {
            format!("input[{i}]")
        };
        if p.is_empty() {
            return Err(ApiError::invalid(param, "tokenizes to nothing"));
        }
        if p.len() > ctx as usize {
            return Err(ApiError::input_too_long(
                param,
                format!(
                    "is {} tokens; this model's context is {ctx} tokens (one input must fit it)",
                    p.len()
                ),
            ));
        }
    }
    let cancel = state.cancel.clone();
    let slots = engine.plan().slots.max(1);
    let base64 = req.base64;
    let answer = async move {
        tokio::select! {
            biased;
            _ = wait_cancelled(cancel) => Err(EngineError::ShuttingDown.into()),
            r = embed_all(&engine, prompts, pooling, slots, received_at) => r.map(|(vectors, usage)| {
                Json(EmbeddingList {
                    object: "list",
                    data: vectors
                        .into_iter()
                        .enumerate()
                        .map(|(index, v)| EmbeddingData {
                            object: "embedding",
                            index,
                            embedding: Vector::encode(v, base64),
                        })
                        .collect(),
                    model: info.id,
                    usage,
                })
                .into_response()
            }),
        }
    };
    // A half-closed client is kept served; one that left gives its places up (see `conn`).
    super::conn::json_or_probe(answer).await
}

/// Submits the passes `slots` at a time (a long list never floods the queue by itself),
/// and gathers their vectors in input order.
async fn embed_all(
    engine: &Engine,
    prompts: Vec<Vec<i32>>,
    pooling: Pooling,
    slots: usize,
    received_at: Instant,
) -> Result<(Vec<Vec<f32>>, EmbeddingUsage), ApiError> {
    let mut vectors = Vec::with_capacity(prompts.len());
    let mut usage = EmbeddingUsage::default();
    let mut prompts = prompts.into_iter().peekable();
    while prompts.peek().is_some() {
        let mut pending = Vec::with_capacity(slots);
        for prompt in prompts.by_ref().take(slots) {
            let events = engine
                .submit(GenerationRequest {
                    prompt_tokens: prompt,
                    max_tokens: 0,
                    stop: Vec::new(),
                    sampling: SamplingParams::default(),
                    received_at,
                    embed: Some(pooling),
                    speculative: false,
                })
                .await?;
            pending.push(events);
        }
        for events in pending {
            let (v, tokens) = one(events).await?;
            usage.prompt_tokens += tokens;
            usage.total_tokens += tokens;
            vectors.push(v);
        }
    }
    Ok((vectors, usage))
}

/// One pass's vector and prompt tokens.
async fn one(mut events: UnboundedReceiver<Event>) -> Result<(Vec<f32>, u32), ApiError> {
    let mut vector = None;
    loop {
        match events.recv().await {
            Some(Event::Admitted { .. } | Event::Text { .. }) => {}
            Some(Event::Embedding(v)) => vector = Some(v),
            Some(Event::Finished { usage, .. }) => {
                return vector
                    .map(|v| (v, usage.prompt_tokens))
                    .ok_or_else(|| ApiError::internal("the engine finished without an embedding"))
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            None => return Err(ApiError::internal("engine stopped before finishing")),
        }
    }
}

/// Tokenizes each string as a raw prompt (the model's BOS when it wants one, specials as
/// text), off the async runtime; held to the context before and after.
async fn tokenize(engine: &Engine, texts: Vec<String>) -> Result<Vec<Vec<i32>>, ApiError> {
    let model = engine.model().clone();
    let ctx = engine.plan().ctx;
    let bounds = model.prompt_bounds();
    let single = texts.len() == 1;
    let param = move |i: usize| {
        if single {
            "input".to_string()
        } else {
            format!("input[{i}]")
        }
    };
    let too_long = move |i: usize, e: PromptError| {
        let message = format!("`{}` {e}", param(i));
        if e.is_too_long() {
            ApiError::input_too_long(param(i), message)
        } else {
            ApiError::invalid(param(i), message)
        }
    };
    for (i, t) in texts.iter().enumerate() {
        bounds
            .check_bytes(t.len(), ctx)
            .map_err(|e| too_long(i, e))?;
    }
    let gone = Arc::new(AtomicBool::new(false));
    let _leave = super::generate::SetOnDrop(gone.clone());
    // An embedding uses the whole context: nothing is generated after it.
    let limit = Limit {
        tokens: ctx as usize,
        ctx,
    };
    tokio::task::spawn_blocking(move || {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                model
                    .text_prompt(t, false, limit, &gone)
                    .map(|p| p.tokens)
                    .map_err(|e| too_long(i, e))
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
}

#[cfg(test)]
mod tests;
