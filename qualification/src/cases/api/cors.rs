//! `api` cases: CORS for browser pages (`--cors-origin`, on the `cors` daemon) and the
//! unversioned aliases. They keep the ids of three cases they replaced: two of the six
//! 405 rows (`PUT /healthz`, `POST /metrics`: the other four cover the same rule) and the
//! third 404 row (`/healthz/extra`, beside `/` and an unknown `/v1` path).

use crate::fixtures::{CORS_ORIGIN, KEY};
use crate::target::Target;

use super::*;

fn cors_daemon(c: &crate::ctx::Ctx) -> Result<(Target, std::sync::Arc<crate::ctx::Fixture>), Stop> {
    let fx = c.fixture("cors")?;
    Ok((fx.target(), fx))
}

fn auth() -> String {
    format!("Bearer {KEY}")
}

/// The `access-control-*` headers of an answer, for the evidence and the checks.
fn cors_headers(resp: &http::Response) -> Vec<String> {
    resp.head
        .headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect()
}

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.method.put_healthz_405",
        "A CORS preflight from an allowed origin is answered",
        "OPTIONS with Origin and Access-Control-Request-Method: 204 before auth, Allow-Origin \
         the origin, Allow-Methods with POST, Allow-Headers with Authorization and \
         Content-Type, Vary: Origin, no Allow-Credentials",
        |c, ev| {
            let (t, _fx) = cors_daemon(c)?;
            let resp = t.send_raw(
                Request::new("OPTIONS", "/v1/chat/completions")
                    .header("Origin", CORS_ORIGIN)
                    .header("Access-Control-Request-Method", "POST")
                    .header(
                        "Access-Control-Request-Headers",
                        "authorization,content-type",
                    ),
            )?;
            ev.text("response", &resp.describe());
            ensure_eq!("status", resp.status(), 204);
            ensure_eq!(
                "Access-Control-Allow-Origin",
                resp.header("access-control-allow-origin"),
                Some(CORS_ORIGIN)
            );
            let methods = resp
                .header("access-control-allow-methods")
                .unwrap_or_default();
            ensure!(
                methods.split(',').any(|m| m.trim() == "POST"),
                "Allow-Methods lists POST",
                methods.to_string()
            );
            let headers = resp
                .header("access-control-allow-headers")
                .unwrap_or_default()
                .to_ascii_lowercase();
            ensure!(
                headers.contains("authorization") && headers.contains("content-type"),
                "Allow-Headers lists Authorization and Content-Type",
                headers
            );
            let vary = resp.header("vary").unwrap_or_default().to_ascii_lowercase();
            ensure!(vary.contains("origin"), "Vary: Origin", vary);
            ensure!(
                resp.header("access-control-allow-credentials").is_none(),
                "no Allow-Credentials",
                cors_headers(&resp).join("; ")
            );
            Ok(format!("204: {}", cors_headers(&resp).join("; ")))
        },
    );
    r.add(
        G,
        "api.method.post_metrics_405",
        "CORS headers go to allowed origins only, on JSON, SSE and error answers",
        "another origin gets no Access-Control-* header (preflight or GET); the allowed origin \
         gets Access-Control-Allow-Origin on a 200 JSON answer, an SSE stream and a 401",
        |c, ev| {
            let (t, _fx) = cors_daemon(c)?;
            let evil = "http://elsewhere.qual.lan";
            let pre = t.send_raw(
                Request::new("OPTIONS", "/v1/chat/completions")
                    .header("Origin", evil)
                    .header("Access-Control-Request-Method", "POST"),
            )?;
            ev.text("other origin preflight", &pre.describe());
            ensure!(
                cors_headers(&pre).is_empty() && pre.status() != 204,
                "no CORS headers and no 204 for another origin",
                pre.describe()
            );
            let get = t.send_raw(
                Request::get("/v1/models")
                    .header("Origin", evil)
                    .header("Authorization", &auth()),
            )?;
            ensure!(
                get.status() == 200 && cors_headers(&get).is_empty(),
                "200 without CORS headers for another origin",
                get.describe()
            );
            let body = chat_body("Hi", 2);
            let json_resp = t.send_raw(
                Request::post("/v1/chat/completions")
                    .json(&body)
                    .header("Origin", CORS_ORIGIN)
                    .header("Authorization", &auth()),
            )?;
            let mut stream_body = body.clone();
            stream_body["stream"] = json!(true);
            let sse = t.send_raw(
                Request::post("/v1/chat/completions")
                    .json(&stream_body)
                    .header("Origin", CORS_ORIGIN)
                    .header("Authorization", &auth()),
            )?;
            let unauthorized = t.send_raw(
                Request::post("/v1/chat/completions")
                    .json(&body)
                    .header("Origin", CORS_ORIGIN),
            )?;
            for (what, resp, status) in [
                ("JSON", &json_resp, 200),
                ("SSE", &sse, 200),
                ("401", &unauthorized, 401),
            ] {
                ev.text(what, &resp.head.describe());
                ensure_eq!(format!("{what} status"), resp.status(), status);
                ensure_eq!(
                    format!("{what} Access-Control-Allow-Origin"),
                    resp.header("access-control-allow-origin"),
                    Some(CORS_ORIGIN)
                );
            }
            ensure!(
                sse.header("content-type")
                    .is_some_and(|c| c.starts_with("text/event-stream")),
                "the SSE answer is an event stream",
                sse.head.describe()
            );
            Ok("other origin: none; allowed origin: JSON, SSE and 401 carry it".into())
        },
    );
    r.add(
        G,
        "api.route.extra_segment_404",
        "The unversioned aliases answer as /v1 does, with the same auth",
        "/chat/completions, /completions, /responses and /models: 200 like their /v1 routes \
         (the same model list); on a daemon with a key, 401 without it",
        |c, ev| {
            let list = c.target.get_ok("/v1/models")?;
            let alias = c.target.get_ok("/models")?;
            ensure_eq!("GET /models", alias, list);
            for (path, body, object) in [
                ("/chat/completions", chat_body("Hi", 2), "chat.completion"),
                (
                    "/completions",
                    json!({"prompt": "Hello", "max_tokens": 2}),
                    "text_completion",
                ),
                (
                    "/responses",
                    json!({"input": "Hi", "max_output_tokens": 2}),
                    "response",
                ),
            ] {
                let resp = c.target.post(path, &body)?;
                ev.text(path, &crate::case::snippet(&resp.describe(), 800));
                let v = json_200(&resp, &format!("POST {path}"))?;
                ensure_eq!(format!("{path} object"), v["object"], json!(object));
            }
            let auth_note = match cors_daemon(c) {
                Ok((t, _fx)) => {
                    for path in ["/chat/completions", "/responses", "/models"] {
                        let req = if path == "/models" {
                            Request::get(path)
                        } else {
                            Request::post(path).json(&chat_body("Hi", 1))
                        };
                        let resp = t.send_raw(req)?;
                        expect_error(&resp, 401, None, Some("invalid_api_key"))?;
                    }
                    "; 401 without the key"
                }
                Err(Stop::Skip(_)) => "; auth not checked (no dedicated daemon)",
                Err(e) => return Err(e),
            };
            Ok(format!("aliases answer like /v1{auth_note}"))
        },
    );
}
