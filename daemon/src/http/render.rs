//! `POST /v1/chat/completions/render` and `POST /v1/completions/render`: a request's prompt
//! as the token ids a generation would feed (chat template, tools, special tokens), without
//! generating. vLLM serves these routes, and vllm-router's `cache_aware` and `kv_aware`
//! policies call them on every worker to match a request against what each one has cached;
//! a worker without them is routed to by load alone.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::generate::{prompt_tokens, read_body};
use super::sse::Shape;
use super::validate;
use super::AppState;

/// The chat request's prompt tokens: `{"token_ids": [id, …]}`.
pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let parsed = read_body(&state, &headers, body).await.and_then(|b| {
        let wire = validate::parse_json(&b)?;
        Ok(validate::chat(wire)?)
    });
    answer(&state, parsed, Shape::Chat).await
}

/// The completion request's prompt tokens: `{"token_ids": [id, …]}`.
pub async fn completion(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let parsed = read_body(&state, &headers, body).await.and_then(|b| {
        let wire = validate::parse_json(&b)?;
        Ok(validate::completion(wire)?)
    });
    answer(&state, parsed, Shape::Completion).await
}

async fn answer(
    state: &AppState,
    parsed: Result<validate::ValidRequest, super::error::ApiError>,
    shape: Shape,
) -> Response {
    let tokens = match parsed {
        Ok(req) => prompt_tokens(state, req, shape).await,
        Err(e) => Err(e),
    };
    match tokens {
        Ok(ids) => Json(json!({ "token_ids": ids })).into_response(),
        Err(e) => e.into_response(),
    }
}
