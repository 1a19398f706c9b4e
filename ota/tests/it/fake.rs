//! A fake DDI server on 127.0.0.1:0 (axum): scripted replies, recorded requests, and an
//! artifact served with HTTP Range support that can cut the connection half-way.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::Value;

#[derive(Default)]
pub struct Script {
    /// The poll reply; `None` answers garbage.
    pub base: Option<Value>,
    pub deployment: Value,
    pub cancel: Value,
    pub artifact: Vec<u8>,
    /// Serve at most this many bytes of the artifact, then drop the connection (once).
    pub cut_after: Option<usize>,
    /// Every request: method, path, Range header, JSON body.
    pub log: Vec<(String, String, Option<String>, Value)>,
}

#[derive(Clone)]
pub struct Fake {
    pub script: Arc<Mutex<Script>>,
    pub url: String,
}

impl Fake {
    pub async fn start(script: Script) -> Self {
        let script = Arc::new(Mutex::new(script));
        let app = Router::new().fallback(handle).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self { script, url }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Script) -> R) -> R {
        f(&mut self.script.lock().expect("lock"))
    }

    /// Recorded requests whose path ends with `suffix`, as (method, body).
    pub fn requests(&self, suffix: &str) -> Vec<(String, Value)> {
        self.with(|s| {
            s.log
                .iter()
                .filter(|(_, p, _, _)| p.ends_with(suffix))
                .map(|(m, _, _, b)| (m.clone(), b.clone()))
                .collect()
        })
    }

    /// Feedback bodies posted to deploymentBase/{id}/feedback.
    pub fn feedback(&self) -> Vec<Value> {
        self.requests("/feedback")
            .into_iter()
            .filter(|(m, _)| m == "POST")
            .map(|(_, b)| b)
            .collect()
    }
}

async fn handle(State(script): State<Arc<Mutex<Script>>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let headers: HeaderMap = req.headers().clone();
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut s = script.lock().expect("lock");
    s.log
        .push((method.to_string(), path.clone(), range.clone(), json));
    if path == "/artifact" {
        return artifact(&mut s, range);
    }
    if method == Method::GET && path.contains("/deploymentBase/") {
        return axum::Json(s.deployment.clone()).into_response();
    }
    if method == Method::GET && path.contains("/cancelAction/") {
        return axum::Json(s.cancel.clone()).into_response();
    }
    if method == Method::GET && path.starts_with("/DEFAULT/controller/v1/") {
        return match &s.base {
            Some(b) => axum::Json(b.clone()).into_response(),
            None => (StatusCode::OK, "<html>proxy error</html>").into_response(),
        };
    }
    if method == Method::PUT || method == Method::POST {
        return axum::Json(serde_json::json!({})).into_response();
    }
    StatusCode::NOT_FOUND.into_response()
}

fn artifact(s: &mut Script, range: Option<String>) -> Response {
    let total = s.artifact.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
    let (status, from) = match start {
        Some(n) if n >= total => {
            return (StatusCode::RANGE_NOT_SATISFIABLE, "").into_response();
        }
        Some(n) => (StatusCode::PARTIAL_CONTENT, n),
        None => (StatusCode::OK, 0),
    };
    let bytes = s.artifact[from..].to_vec();
    let mut builder = Response::builder()
        .status(status)
        .header("content-length", bytes.len());
    if status == StatusCode::PARTIAL_CONTENT {
        builder = builder.header(
            "content-range",
            format!("bytes {from}-{}/{total}", total - 1),
        );
    }
    let body = match s.cut_after.take() {
        Some(cut) => {
            let head = bytes[..cut.min(bytes.len())].to_vec();
            // The head goes out, then (after hyper flushed it) the connection breaks.
            let stream = futures::stream::unfold(0u8, move |step| {
                let head = head.clone();
                async move {
                    match step {
                        0 => Some((Ok(axum::body::Bytes::from(head)), 1)),
                        1 => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            Some((Err(std::io::Error::other("cut")), 2))
                        }
                        _ => None,
                    }
                }
            });
            Body::from_stream(stream)
        }
        None => Body::from(bytes),
    };
    builder.body(body).expect("response")
}
