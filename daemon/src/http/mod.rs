//! The HTTP layer: routes, OpenAI wire types, their validation, errors and SSE framing. It knows hyper and
//! status codes; it hands validated, tokenized work to the [`Engine`](crate::engine::Engine).

mod conn;
mod cors;
pub mod embeddings;
pub mod error;
mod generate;
pub mod limits;
mod page;
mod render;
pub mod responses;
mod routes;
mod sse;
pub mod tls;
mod tokens;
pub mod validate;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
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
    /// Becomes `true` when a stop signal starts the drain: readiness turns 503 at once.
    pub stopping: watch::Receiver<bool>,
    /// Where `--kv-events` publishes, for `/kv_event_sources`.
    pub kv_events: Option<crate::kv_events::Source>,
    /// This run of the daemon (`/get_server_info`).
    pub instance_id: String,
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
        .route("/v1/chat/completions/render", post(render::chat))
        // vllm-router's kv_aware discovery, with its --api-key.
        .route("/get_server_info", get(routes::server_info))
        .route("/kv_event_sources", get(routes::kv_event_sources))
        .route("/v1/completions/render", post(render::completion))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(embeddings::embeddings))
        // Unversioned aliases, as llama-server and vLLM accept them: same auth, same
        // handlers.
        .route("/chat/completions", post(generate::chat))
        .route("/completions", post(generate::completion))
        .route("/responses", post(responses::responses))
        .route("/embeddings", post(embeddings::embeddings))
        .route("/models", get(routes::models))
        .route("/models/{id}", get(routes::model))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/status", get(routes::status))
        .route("/v1/thermal", get(routes::thermal))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        // The page on the box needs no key: it holds no data, and asks the API for it.
        .route("/", get(page::index))
        .route("/ui/app.js", get(page::app_js))
        .route("/ui/style.css", get(page::style_css))
        .route("/ui/config", get(page::config))
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        // What vLLM serves and what routers in front of it poll (vllm-router, sglang-router):
        // the same answer as /readyz, so a router sends no work while this box cannot take it.
        .route("/health", get(routes::readyz))
        // vllm-router's power_of_two policy polls it; the same figures /metrics shows.
        .route("/get_load", get(routes::load))
        .route("/metrics", get(routes::metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        // Outermost: a preflight is answered before auth and routing, and every answer
        // (errors included) carries the CORS headers.
        .layer(middleware::from_fn_with_state(state.clone(), cors::cors))
        .with_state(state)
}

/// Unknown paths: 404, except under `/v1` without the right key, which is 401 like the
/// known routes there, so a client without the key learns nothing about which routes exist.
async fn not_found(State(state): State<AppState>, req: Request) -> ApiError {
    match v1_auth(&state, &req) {
        Err(e) => e,
        Ok(()) => ApiError::route_not_found(req.uri().path()),
    }
}

/// Like [`not_found`]: a wrong method on a `/v1` route is 401 before it is 405.
async fn method_not_allowed(State(state): State<AppState>, req: Request) -> ApiError {
    match v1_auth(&state, &req) {
        Err(e) => e,
        Ok(()) => ApiError::method_not_allowed(req.method().as_str(), req.uri().path()),
    }
}

/// The API key check for requests no `/v1` route matched (the route layer sees only those
/// that did).
fn v1_auth(state: &AppState, req: &Request) -> Result<(), ApiError> {
    let path = req.uri().path();
    if path == "/v1" || path.starts_with("/v1/") || is_unversioned_api(path) {
        check_api_key(state, req.headers())
    } else {
        Ok(())
    }
}

/// The API paths outside `/v1` that share its key: the unversioned aliases and the
/// tokenizer routes.
fn is_unversioned_api(path: &str) -> bool {
    matches!(
        path,
        "/tokenize"
            | "/detokenize"
            | "/chat/completions"
            | "/completions"
            | "/responses"
            | "/embeddings"
    ) || path == "/models"
        || path.starts_with("/models/")
}

/// `Authorization: Bearer KEY` on /v1 routes (and /tokenize, /detokenize) when a key is
/// configured.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match check_api_key(&state, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn check_api_key(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = state.config.api_key.as_deref() else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match given {
        None => Err(ApiError::missing_api_key()),
        Some(k) if constant_time_eq(k.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::wrong_api_key()),
    }
}

/// The token of a `Bearer` credential. The scheme is case-insensitive (RFC 9110 §11.1), so
/// `bearer KEY` and `BEARER KEY` count too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
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

/// The connections still open when accepting stopped.
pub struct Connections {
    graceful: GracefulShutdown,
    close: watch::Sender<Close>,
}

impl Connections {
    /// Lets each connection finish its current request, then close. The future resolves once
    /// every connection has closed, on its own or through [`Connections::closer`].
    pub fn drain(self) -> (impl Future<Output = ()>, Closer) {
        (self.graceful.shutdown(), Closer(self.close))
    }
}

/// Closes connections that are still open, at once.
pub struct Closer(watch::Sender<Close>);

/// Which connections [`Closer`] has closed so far.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Close {
    None,
    /// Those without a pending answer: half a request, a body that never comes, idle.
    Unanswered,
    All,
}

impl Closer {
    /// Closes the connections that hold no answer to finish.
    pub fn close_unanswered(&self) {
        self.0.send_replace(Close::Unanswered);
    }

    pub fn close_all(&self) {
        self.0.send_replace(Close::All);
    }
}

/// How long connections may take, how many may be open, and whether they speak TLS.
#[derive(Clone)]
pub struct ConnPolicy {
    pub tls: Option<Arc<tls::Tls>>,
    /// From a request's first byte to its whole head.
    pub read_timeout: Duration,
    /// From the end of an answer (or the accept) to the next request's first byte.
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// Accepts connections until `shutdown` resolves, then stops accepting and returns the open
/// connections.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    policy: ConnPolicy,
    series: Arc<crate::metrics::ConnectionSeries>,
    shutdown: impl Future<Output = ()>,
) -> Connections {
    let table = limits::ConnTable::new(policy.max_connections, series.clone());
    let (read_timeout, idle_timeout) = (policy.read_timeout, policy.idle_timeout);
    let graceful = GracefulShutdown::new();
    // A connection can hold nothing anyone waits for (half a request, a body that never
    // comes): at the drain deadline it is dropped rather than waited for.
    let (close, closed) = watch::channel(Close::None);
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
                let (io, service, peer_state) = match conn::accept(stream, app.clone(), &table) {
                    Ok(admitted) => admitted,
                    Err(stream) => {
                        tracing::debug!(%peer, max = table.max(), "connection refused at the cap");
                        tokio::spawn(limits::refuse(stream, table.max()));
                        continue;
                    }
                };
                // Watched from the accept: a drain waits for handshakes too.
                let watcher = graceful.watcher();
                let mut closed = closed.clone();
                let series = series.clone();
                let tls = policy.tls.clone();
                tokio::spawn(async move {
                    let serve = async {
                        let io = match &tls {
                            None => tls::ServeIo::Plain(io),
                            Some(tls) => match tls.acceptor().accept(io).await {
                                Ok(stream) => tls::ServeIo::Tls(Box::new(stream)),
                                Err(e) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    series.closed("tls_handshake");
                                    return;
                                }
                            },
                        };
                        // The header and idle timeouts run from the connection's phase
                        // (`Peer::expired`), so that each is separate and counted (the TLS
                        // handshake included); hyper's own header timer would also cut idle
                        // keep-alive connections.
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(None)
                            .serve_connection(TokioIo::new(io), service);
                        if let Err(e) = watcher.watch(conn).await {
                            tracing::debug!(%peer, error = %e, "connection ended with error");
                        }
                    };
                    // Counted before the select drops the connection: a peer that sees
                    // the close and then scrapes /metrics finds it counted.
                    let expired = async {
                        let expiry = peer_state.expired(read_timeout, idle_timeout).await;
                        series.closed(expiry.label());
                        expiry
                    };
                    tokio::select! {
                        () = serve => {},
                        expiry = expired => {
                            tracing::debug!(%peer, reason = expiry.label(), "connection closed");
                        }
                        _ = closed.wait_for(|c| match c {
                            Close::None => false,
                            Close::Unanswered => !peer_state.answer_pending(),
                            Close::All => true,
                        }) => {
                            tracing::debug!(%peer, "connection closed at the drain deadline");
                        }
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    Connections { graceful, close }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_matched_in_any_case() {
        for header in ["Bearer k1", "bearer k1", "BEARER k1", "bEaReR   k1 "] {
            assert_eq!(bearer_token(header), Some("k1"), "{header:?}");
        }
        for header in ["Basic k1", "Bearer", "Bearer ", "Bearerk1", "k1"] {
            assert_eq!(bearer_token(header), None, "{header:?}");
        }
    }
}
