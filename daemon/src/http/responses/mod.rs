//! `POST /v1/responses`, stateless. A Responses request is validated into the same
//! request a chat completion becomes and goes through the same lifecycle
//! ([`generate::submit`]: admission, cancellation when the client leaves, prefix reuse,
//! metrics); only the answer's shape differs: the response object whole, or its typed
//! events as they happen.
//!
//! # Layout
//! - [`wire`]: the request, the response object and its output items.
//! - [`output`]: the model's text as output items and the events that describe them.
//! - [`stream`]: the events framed with their sequence numbers.

mod output;
mod stream;
pub mod wire;

/// The stream framers, reachable from outside the crate for the fuzz targets in `fuzz/`
/// only (`http::sse` is private to `http`): not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::stream::ResponseFramer;
    pub use crate::http::sse::{Framer, Frames, Shape, ToolFramer};
}

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::generate::{self, new_id, unix_now, Fields};
use super::validate::{self, ValidResponses};
use super::AppState;
use crate::engine::{EngineError, Event};
use crate::tools::Format;
use output::Output;
use stream::{complete, ResponseFramer};
use wire::ResponseObject;

/// The fields an error before generation names.
const FIELDS: Fields = Fields {
    prompt: "input",
    format: "text.format",
    schema: "text.format.schema",
};

pub async fn responses(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let received_at = Instant::now();
    let parsed = generate::read_body(&state, &headers, body)
        .await
        .and_then(|b| {
            let wire = validate::parse_json(&b)?;
            Ok(validate::responses(wire)?)
        });
    let answer = match parsed {
        Ok(req) => run(state, req, received_at).await,
        Err(e) => Err(e),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

async fn run(
    state: AppState,
    req: ValidResponses,
    received_at: Instant,
) -> Result<Response, ApiError> {
    let mut sub = generate::submit(&state, req.request, FIELDS, received_at).await?;
    // The Responses API has no `n`: one choice.
    let events = sub
        .choices
        .pop()
        .ok_or_else(|| ApiError::internal("a request without choices"))?;
    let response = ResponseObject::new(new_id("resp_"), unix_now(), sub.model_id, req.echo);
    let cancel = state.cancel.clone();
    if sub.stream {
        let mut framer = ResponseFramer::new(response, sub.tools);
        let opening = framer.opening();
        generate::stream(events, cancel, framer, Some(opening)).await
    } else {
        let tools = sub.tools;
        let answer = async move {
            tokio::select! {
                biased;
                _ = generate::wait_cancelled(cancel) => Err(EngineError::ShuttingDown.into()),
                r = collect(events, response, tools) => r,
            }
        };
        super::conn::json_or_probe(answer).await
    }
}

/// The whole response, once the engine finished.
async fn collect(
    mut events: UnboundedReceiver<Event>,
    mut response: ResponseObject,
    tools: Option<Format>,
) -> Result<Response, ApiError> {
    let mut output = Output::new(tools);
    loop {
        match events.recv().await {
            Some(Event::Admitted { .. } | Event::Embedding(_)) => {}
            Some(Event::Text { text, .. }) => output.push(&text),
            Some(Event::Finished { reason, usage, .. }) => {
                complete(&mut response, &mut output, reason, usage, unix_now());
                return Ok(Json(response).into_response());
            }
            Some(Event::Failed(e)) => return Err(e.into()),
            None => return Err(ApiError::internal("engine stopped before finishing")),
        }
    }
}

#[cfg(test)]
mod tests;
