//! What the server under test is: when it is ready (`/readyz`, `/health` or `/v1/models`,
//! whichever it has) and whether it is an `inferloopd`, which decides the cases that need
//! more than OpenAI's API (`/v1/status`, `/metrics`, its CLI and exit codes).

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::http::{self, Request};
use crate::target::Target;

/// The readiness routes, asked in this order: inferloopd's `/readyz`, llama-server's (and
/// many others') `/health`, and `/v1/models`, which every OpenAI-compatible server has.
pub const READY_PROBES: [&str; 3] = ["/readyz", "/health", "/v1/models"];

/// Longest single probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one probe saw: a status, or the I/O error in words.
fn probe(t: &Target, path: &str) -> Result<u16, String> {
    let req = t.authed(Request::get(path).timeout(PROBE_TIMEOUT));
    http::send(&t.ep, &req)
        .map(|r| r.status())
        .map_err(|e| e.to_string())
}

/// A route the server does not have: it says nothing about readiness.
fn absent(status: u16) -> bool {
    matches!(status, 404 | 405 | 501)
}

/// Waits until the server is ready and returns the route that said so.
///
/// Each round asks [`READY_PROBES`] in order. A 200 is ready. A route the server lacks
/// (404, 405, 501) passes the question to the next one. Any other answer (503 while the
/// model loads, a refused connection) ends the round: the first route the server has is
/// the one that decides, so a `/health` that is only a liveness check cannot declare an
/// inferloopd ready while its `/readyz` still answers 503.
pub fn wait_ready(t: &Target, timeout: Duration) -> Result<&'static str, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut seen = Vec::with_capacity(READY_PROBES.len());
        for path in READY_PROBES {
            match probe(t, path) {
                Ok(200) => return Ok(path),
                Ok(s) if absent(s) => seen.push(format!("{path} {s}")),
                Ok(s) => {
                    seen.push(format!("{path} {s}"));
                    break;
                }
                Err(e) => {
                    seen.push(format!("{path}: {e}"));
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} never answered 200 on GET {} within {timeout:?} (last round: {})",
                t.ep.url(""),
                READY_PROBES.join(", "),
                seen.join("; ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The server under test, as far as the suite needs to know it.
#[derive(Debug, Clone, Serialize)]
pub struct Server {
    /// `/v1/status` answered in inferloopd's shape: its status, metrics, CLI and exit codes
    /// may be checked.
    pub inferloopd: bool,
    /// What it calls itself: `inferloopd 0.9.0`, `llama.cpp llama-server (b1234-abc)`, or
    /// `an OpenAI-compatible server` when nothing says.
    pub name: String,
    /// The route that said it was ready.
    pub ready_via: &'static str,
}

impl Server {
    /// A server that is an inferloopd (spawn mode, and the default before detection).
    pub fn inferloopd(version: &str) -> Server {
        Server {
            inferloopd: true,
            name: format!("inferloopd {version}").trim().to_string(),
            ready_via: READY_PROBES[0],
        }
    }

    /// A server that only promises OpenAI's API.
    pub fn other(name: &str, ready_via: &'static str) -> Server {
        Server {
            inferloopd: false,
            name: name.to_string(),
            ready_via,
        }
    }
}

/// Whether `status` (a `GET /v1/status` body) has inferloopd's shape: a version, a ready
/// flag, the slot count and the queue capacity.
pub fn is_inferloopd_status(status: &Value) -> bool {
    status["version"].is_string()
        && status["ready"].is_boolean()
        && status["slots"]["total"].is_u64()
        && status["queue"]["capacity"].is_u64()
}

/// Asks the server what it is: `/v1/status` in inferloopd's shape makes it an inferloopd;
/// otherwise llama-server's `/props` or the `Server` header name it. Returns the server and
/// its `/v1/status` body (`Null` on other servers).
pub fn detect(t: &Target, ready_via: &'static str) -> (Server, Value) {
    let get = |path: &str| {
        let req = t.authed(Request::get(path).timeout(PROBE_TIMEOUT));
        http::send(&t.ep, &req).ok()
    };
    let status = get("/v1/status")
        .filter(|r| r.status() == 200)
        .and_then(|r| r.json().ok())
        .unwrap_or(Value::Null);
    if is_inferloopd_status(&status) {
        let mut s = Server::inferloopd(status["version"].as_str().unwrap_or_default());
        s.ready_via = ready_via;
        return (s, status);
    }
    let props = get("/props")
        .filter(|r| r.status() == 200)
        .and_then(|r| r.json().ok())
        .unwrap_or(Value::Null);
    let name = if props["default_generation_settings"].is_object() {
        match props["build_info"].as_str() {
            Some(b) => format!("llama.cpp llama-server ({b})"),
            None => "llama.cpp llama-server".to_string(),
        }
    } else {
        get("/v1/models")
            .and_then(|r| r.header("server").map(str::to_string))
            .unwrap_or_else(|| "an OpenAI-compatible server".to_string())
    };
    (Server::other(&name, ready_via), props)
}

/// The skip reason of a case that needs `what` on a server that is not an inferloopd.
pub fn only_reason(what: &str) -> String {
    format!("inferloopd-only: {what}")
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::case::{Group, Registry, Status};
    use crate::ctx::{Ctx, Facts, Mode};
    use crate::http::Endpoint;

    /// A tiny HTTP server: each request's path gets its status and body from `routes`,
    /// anything else 404.
    fn serve(routes: &'static [(&'static str, u16, &'static str)]) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in listener.incoming().map_while(Result::ok) {
                let mut line = String::new();
                let mut r = BufReader::new(s.try_clone().expect("clone"));
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                // Drain the head so the client's write never meets a reset.
                let mut h = String::new();
                while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                    h.clear();
                }
                let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                let (status, body) = routes
                    .iter()
                    .find(|(p, _, _)| *p == path)
                    .map_or((404, "{}"), |(_, s, b)| (*s, *b));
                let mut s = s;
                let _ = write!(
                    s,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Target::new(Endpoint::from_addr(addr), None)
    }

    #[test]
    fn a_server_without_readyz_is_ready_when_health_answers_200() {
        let t = serve(&[("/health", 200, r#"{"status":"ok"}"#)]);
        assert_eq!(wait_ready(&t, Duration::from_secs(5)), Ok("/health"));
    }

    #[test]
    fn readyz_decides_while_it_answers_503_even_if_health_says_200() {
        // inferloopd while its model loads: /readyz 503; a liveness /health must not win.
        let t = serve(&[("/readyz", 503, "{}"), ("/health", 200, "{}")]);
        let e = wait_ready(&t, Duration::from_millis(300)).expect_err("not ready");
        assert!(e.contains("/readyz 503"), "{e}");
        assert!(!e.contains("/health 200"), "{e}");
    }

    #[test]
    fn models_is_the_last_resort() {
        let t = serve(&[("/v1/models", 200, r#"{"data":[]}"#)]);
        assert_eq!(wait_ready(&t, Duration::from_secs(5)), Ok("/v1/models"));
    }

    #[test]
    fn a_server_that_never_answers_200_is_an_error_naming_every_route_tried() {
        let t = serve(&[]);
        let e = wait_ready(&t, Duration::from_millis(300)).expect_err("never ready");
        assert!(
            e.contains("never answered 200 on GET /readyz, /health, /v1/models within 300ms"),
            "{e}"
        );
        assert!(
            e.contains("last round: /readyz 404; /health 404; /v1/models 404"),
            "{e}"
        );
    }

    #[test]
    fn nothing_listening_is_an_error_naming_the_refused_connection() {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr");
        // The listener is dropped: nothing listens on that port any more.
        let t = Target::new(Endpoint::from_addr(port), None);
        let e = wait_ready(&t, Duration::from_millis(300)).expect_err("nothing there");
        assert!(e.contains("/readyz: "), "{e}");
    }

    #[test]
    fn inferloopd_is_told_by_its_status_shape() {
        let t = serve(&[(
            "/v1/status",
            200,
            r#"{"version":"0.9.0","ready":true,"slots":{"total":4},"queue":{"capacity":64}}"#,
        )]);
        let (s, status) = detect(&t, "/readyz");
        assert!(s.inferloopd);
        assert_eq!(s.name, "inferloopd 0.9.0");
        assert_eq!(status["slots"]["total"], 4);
        assert!(!is_inferloopd_status(
            &json!({"version": "1", "ready": true})
        ));
    }

    #[test]
    fn llama_server_is_named_from_its_props() {
        let t = serve(&[(
            "/props",
            200,
            r#"{"default_generation_settings":{"n_ctx":2048},"total_slots":4,"build_info":"b1-abc"}"#,
        )]);
        let (s, props) = detect(&t, "/health");
        assert!(!s.inferloopd);
        assert_eq!(s.name, "llama.cpp llama-server (b1-abc)");
        assert_eq!(s.ready_via, "/health");
        let facts = Facts::learn(
            &json!({"data": [{"id": "m"}]}),
            &props,
            String::new(),
            String::new(),
        );
        assert_eq!((facts.slots, facts.ctx, facts.queue), (4, 2048, 0));
        assert_eq!(facts.version, "b1-abc");
    }

    fn ctx_on(server: Server) -> Arc<Ctx> {
        // Nothing listens there: a case that sent a request would fail, not skip.
        let ep = Endpoint::parse("http://127.0.0.1:9").expect("url");
        let ctx = Ctx::new(
            Mode::Attach,
            Target::new(ep, None),
            None,
            Facts::default(),
            std::env::temp_dir(),
            None,
        );
        Arc::new(ctx.with_server(server))
    }

    #[test]
    fn an_inferloopd_only_case_is_skipped_with_its_reason_on_another_server() {
        let mut r = Registry::default();
        r.add(Group::Api, "api.x", "t", "e", |_, _| panic!("must not run"))
            .inferloopd_only("/v1/status");
        r.add(Group::Api, "api.y", "t", "e", |c, _| {
            c.target.status().map(|_| "answered".to_string())
        });
        r.add(Group::Api, "api.z", "t", "e", |c, _| {
            c.target.metrics().map(|_| "answered".to_string())
        });
        r.add(Group::Api, "api.openai", "t", "e", |_, _| Ok("ran".into()));
        let ctx = ctx_on(Server::other("llama.cpp llama-server", "/health"));
        let results: Vec<_> = r
            .cases
            .into_iter()
            .map(|c| crate::runner::run_one(&ctx, &Arc::new(c), None))
            .collect();
        let got: Vec<_> = results
            .iter()
            .map(|r| (r.status, r.skip_reason.as_deref().unwrap_or(&r.observation)))
            .collect();
        assert_eq!(
            got,
            [
                (Status::Skipped, "inferloopd-only: /v1/status"),
                (Status::Skipped, "inferloopd-only: /v1/status"),
                (Status::Skipped, "inferloopd-only: /metrics"),
                (Status::Passed, "ran"),
            ]
        );
    }

    #[test]
    fn an_inferloopd_only_case_runs_on_inferloopd() {
        let mut r = Registry::default();
        r.add(Group::Api, "api.x", "t", "e", |_, _| Ok("ran".into()))
            .inferloopd_only("/v1/status");
        let ctx = ctx_on(Server::inferloopd("0.9.0"));
        let res = crate::runner::run_one(&ctx, &Arc::new(r.cases.remove(0)), None);
        assert_eq!(
            (res.status, res.observation.as_str()),
            (Status::Passed, "ran")
        );
    }
}
