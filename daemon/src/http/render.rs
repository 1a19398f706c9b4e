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

use super::generate::{prompt_tokens, read_request};
use super::sse::Shape;
use super::AppState;

/// The chat request's prompt tokens: `{"token_ids": [id, …]}`.
pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(&state, &headers, body, Shape::Chat).await
}

/// The completion request's prompt tokens: `{"token_ids": [id, …]}`.
pub async fn completion(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(&state, &headers, body, Shape::Completion).await
}

async fn answer(state: &AppState, headers: &HeaderMap, body: Body, shape: Shape) -> Response {
    let tokens = match read_request(state, headers, body, shape).await {
        Ok(req) => prompt_tokens(state, req, shape).await,
        Err(e) => Err(e),
    };
    match tokens {
        Ok(ids) => Json(json!({ "token_ids": ids })).into_response(),
        Err(e) => e.into_response(),
    }
}
