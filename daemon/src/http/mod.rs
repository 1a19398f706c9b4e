//! The HTTP layer: routes, OpenAI wire types, errors and SSE framing. It knows hyper and
//! status codes; it hands validated, tokenized work to the [`Engine`](crate::engine::Engine).

pub mod error;
mod generate;
mod routes;
mod sse;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::boot::Passed;
use crate::config::ServeConfig;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::thermal::ThermalWatch;
use error::ApiError;

/// Everything a handler may need. Cloned per request (it is a handful of `Arc`s).
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServeConfig>,
    pub metrics: Arc<Metrics>,
    /// `None` until the model is loaded and the decode thread runs.
    pub engine: watch::Receiver<Option<Engine>>,
    pub started: Instant,
    /// What the boot gates established (memory ledger, pinned hashes).
    pub boot: Arc<Passed>,
    /// The detected board and the thermal sampler.
    pub thermal: Arc<ThermalWatch>,
    /// Becomes `true` when shutdown gives up on in-flight requests.
    pub cancel: watch::Receiver<bool>,
}

impl AppState {
    /// The engine, or 503 while the model loads.
    fn engine(&self) -> Result<Engine, ApiError> {
        self.engine.borrow().clone().ok_or_else(ApiError::not_ready)
    }
}

/// Builds the router with auth, metrics and error fallbacks.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completion))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/status", get(routes::status))
        .route("/v1/thermal", get(routes::thermal))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .route("/metrics", get(routes::metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::route_not_found(req.uri().path())
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path())
}

/// `Authorization: Bearer KEY` on /v1 routes when a key is configured.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(expected) = state.config.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        None => ApiError::unauthorized("Missing API key: send it as `Authorization: Bearer KEY`.")
            .into_response(),
        Some(k) if constant_time_eq(k.as_bytes(), expected.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("Incorrect API key provided.").into_response(),
    }
}

/// Compares secrets without an early exit, so timing does not leak the key's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let is_head = req.method() == Method::HEAD;
    let resp = next.run(req).await;
    if !is_head {
        state.metrics.record_request(&route, resp.status().as_u16());
    }
    resp
}

/// Accepts connections until `shutdown` resolves, then stops accepting and returns a handle
/// that resolves once every open connection has finished.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Usually EMFILE: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = TowerToHyperService::new(app.clone());
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(read_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful
}
