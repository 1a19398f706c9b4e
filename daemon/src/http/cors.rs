//! CORS for browser clients on the LAN: origins named by `--cors-origin` get
//! `Access-Control-Allow-Origin` on every answer (JSON, SSE and errors alike), and their
//! preflight `OPTIONS` is answered here with 204, before auth (a browser sends no
//! credentials on a preflight). Other origins get no CORS headers: their browser then
//! refuses the answer. No credentials are allowed (the API key travels in a header the
//! page sets, not in cookies).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Methods the API answers.
const ALLOW_METHODS: &str = "GET, POST, OPTIONS";
/// Headers a page may send: the API key and the JSON body's type.
const ALLOW_HEADERS: &str = "Authorization, Content-Type";
/// How long a browser may cache a preflight answer, in seconds.
const MAX_AGE_SECS: &str = "600";

/// The `Access-Control-Allow-Origin` value for `origin`, when it is allowed.
pub(super) fn allowed(origins: &[String], origin: &str) -> Option<HeaderValue> {
    if origins.iter().any(|o| o == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let lower = origin.to_ascii_lowercase();
    origins
        .contains(&lower)
        .then(|| HeaderValue::from_str(origin).ok())
        .flatten()
}

pub(super) async fn cors(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let origins = &state.config.cors_origins;
    if origins.is_empty() {
        return next.run(req).await;
    }
    let allow = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .and_then(|o| allowed(origins, o));
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = match (&allow, preflight) {
        (Some(_), true) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_METHODS),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(ALLOW_HEADERS),
            );
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(MAX_AGE_SECS),
            );
            r
        }
        _ => next.run(req).await,
    };
    decorate(resp.headers_mut(), allow);
    resp
}

/// The answer depends on `Origin` whenever CORS is on, so caches must key on it.
fn decorate(h: &mut HeaderMap, allow: Option<HeaderValue>) {
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(v) = allow {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_origins_are_allowed_and_star_allows_any() {
        let listed = vec!["http://box.lan:3000".to_string()];
        assert_eq!(
            allowed(&listed, "http://box.lan:3000"),
            Some(HeaderValue::from_static("http://box.lan:3000"))
        );
        assert_eq!(
            allowed(&listed, "http://BOX.lan:3000"),
            Some(HeaderValue::from_static("http://BOX.lan:3000"))
        );
        assert_eq!(allowed(&listed, "http://evil.lan:3000"), None);
        assert_eq!(allowed(&listed, "http://box.lan:3001"), None);
        let any = vec!["*".to_string()];
        assert_eq!(
            allowed(&any, "http://x"),
            Some(HeaderValue::from_static("*"))
        );
    }
}
