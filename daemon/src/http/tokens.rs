//! `POST /tokenize` and `POST /detokenize`, as llama-server has them: the model's tokenizer
//! on its own, for debugging prompts and templates.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generate::read_body;
use super::validate;
use super::wire::{DetokenizeRequest, TokenizeRequest};
use super::AppState;

/// `{"content", "add_special": false, "parse_special": true, "with_pieces": false}` →
/// `{"tokens": [id, …]}`, or `[{"id", "piece"}, …]` with pieces (a piece that is not whole
/// UTF-8 is given as its bytes), llama-server's defaults.
pub async fn tokenize(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    match tokenize_inner(&state, &headers, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tokenize_inner(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let body = read_body(state, headers, body).await?;
    let req: TokenizeRequest = validate::parse_json(&body)?;
    let model = state.engine()?.model().clone();
    let add_special = req.add_special.unwrap_or(false);
    let parse_special = req.parse_special.unwrap_or(true);
    let with_pieces = req.with_pieces.unwrap_or(false);
    // Tokenizing a body near the size limit takes a while: not on the async workers.
    tokio::task::spawn_blocking(move || {
        let tokens = model.tokenize(&req.content, add_special, parse_special);
        if !with_pieces {
            return json!({ "tokens": tokens });
        }
        let pieces: Vec<Value> = tokens
            .iter()
            .map(|&id| {
                let bytes = model.token_bytes(id);
                let piece = match String::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({ "id": id, "piece": piece })
            })
            .collect();
        json!({ "tokens": pieces })
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))
}

/// `{"tokens": [id, …]}` → `{"content": text}`; special tokens are spelled out, as
/// llama-server does. An id outside the vocabulary is a 400 naming its index.
pub async fn detokenize(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    match detokenize_inner(&state, &headers, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn detokenize_inner(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let body = read_body(state, headers, body).await?;
    let req: DetokenizeRequest = validate::parse_json(&body)?;
    let model = state.engine()?.model().clone();
    let tokens = validate::token_ids(&req.tokens, model.info().n_vocab)?;
    let content = tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::new();
        for t in tokens {
            bytes.extend(model.token_bytes(t));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?;
    Ok(json!({ "content": content }))
}
