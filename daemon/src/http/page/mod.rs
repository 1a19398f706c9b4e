//! The page on the box at `/`: one HTML file, its script and its style sheet, compiled into
//! the binary. They hold no data: everything shown comes from the API at run time (the
//! public `/metrics`, and `/v1/*` with the key the user types when one is set).

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// Only this origin's own script, style and API; no inline code, no other host; nothing may
/// frame the page. The icon is an empty `data:` URL, so the browser asks for no favicon.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// An embedded asset with the headers every page answer carries: revalidate on each load
/// (a new binary may serve a new page), the CSP, and no type sniffing.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

/// What the page needs before it can call the API: whether to ask for a key. Public, like
/// the 401 a keyless call would get, and nothing more; asking here spares the browser a
/// failed request (which it logs as a console error) on every load.
pub async fn config(State(state): State<AppState>) -> Response {
    let mut resp = Json(json!({
        "api_key_required": state.config.api_key.is_some(),
    }))
    .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page is static: no data of the box is baked in, and nothing loads from elsewhere.
    #[test]
    fn assets_reference_only_their_own_origin() {
        for (name, text) in [
            ("index.html", INDEX_HTML),
            ("app.js", APP_JS),
            ("style.css", STYLE_CSS),
        ] {
            // The SVG namespace is a name, not a fetch.
            let text = text.replace("http://www.w3.org/2000/svg", "");
            for banned in [
                "http://",
                "https://",
                "//cdn",
                "localStorage",
                "sessionStorage",
                "document.cookie",
            ] {
                assert!(!text.contains(banned), "{name} contains {banned:?}");
            }
        }
        // No inline script or style: the CSP would refuse it.
        assert!(!INDEX_HTML.contains("<script>"), "inline script");
        assert!(!INDEX_HTML.contains("style="), "inline style");
        assert!(!INDEX_HTML.contains("<style"), "inline style sheet");
        assert!(INDEX_HTML.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"href="/ui/style.css""#));
    }

    #[test]
    fn csp_allows_only_self() {
        assert!(CSP.starts_with("default-src 'none';"));
        assert!(!CSP.contains("unsafe"));
        assert!(!CSP.contains("http"));
    }
}
