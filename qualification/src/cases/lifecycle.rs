//! `lifecycle`: readiness before and after the model loads, draining on SIGTERM, the drain
//! deadline, restarts, and the documented exit codes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::EXPLAIN;
use crate::case::{Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::daemon::{Daemon, READY_TIMEOUT};
use crate::http::{self, Request};
use crate::sse;
use crate::target::{chat_body, counting, text_of, with};
use crate::{ensure, ensure_eq};

const G: Group = Group::Lifecycle;
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// What the routes answered between bind and readiness.
#[derive(Clone)]
struct Boot {
    /// (path, status, body) seen while /readyz still said loading.
    loading: Vec<(String, u16, String, Option<String>)>,
    first_ready_ms: f64,
    ready_body: String,
}

fn boot(c: &Ctx) -> Result<Boot, Stop> {
    let cfg = c.need_spawn("watches a daemon start")?.clone();
    (*c.memo("lifecycle boot", move || -> Result<Boot, Stop> {
        let d = cfg
            .spawn(cfg.serve_argv(&["--slots", "1", "--ctx", "256"]), None)
            .map_err(|e| Stop::fail("the daemon starts", e))?;
        let ep = d
            .wait_address(READY_TIMEOUT)
            .map_err(|e| Stop::fail("the daemon binds", e))?;
        let t0 = Instant::now();
        let mut loading: Vec<(String, u16, String, Option<String>)> = Vec::new();
        let get = |path: &str| {
            http::send(&ep, &Request::get(path).timeout(Duration::from_secs(10)))
                .map_err(|e| Stop::fail(format!("GET {path} while loading"), e.to_string()))
        };
        loop {
            for path in ["/healthz", "/v1/models"] {
                let r = get(path)?;
                // Only an answer followed by a still-loading /readyz surely came while loading.
                let ready = get("/readyz")?;
                if ready.status() == 200 {
                    return Ok(Boot {
                        loading,
                        first_ready_ms: t0.elapsed().as_secs_f64() * 1000.0,
                        ready_body: ready.text(),
                    });
                }
                for (p, r) in [(path, &r), ("/readyz", &ready)] {
                    if !loading.iter().any(|(q, ..)| q == p) {
                        loading.push((
                            p.to_string(),
                            r.status(),
                            r.text(),
                            r.header("retry-after").map(str::to_string),
                        ));
                    }
                }
            }
            if t0.elapsed() > READY_TIMEOUT {
                return Err(Stop::fail("ready within the timeout", d.log_tail(20)));
            }
        }
    }))
    .clone()
}

fn while_loading(b: &Boot, path: &str) -> Result<(u16, String, Option<String>), Stop> {
    b.loading
        .iter()
        .find(|(p, ..)| p == path)
        .map(|(_, s, body, ra)| (*s, body.clone(), ra.clone()))
        .ok_or_else(|| {
            Stop::skip(format!(
                "the model loaded before {path} could be asked ({:.0} ms after bind); nothing to observe",
                b.first_ready_ms
            ))
        })
}

/// A drained stream: SIGTERM while a 40-token stream runs with a long deadline.
#[derive(Clone)]
struct Drain {
    cap: sse::Capture,
    frames_before: usize,
    refused_after: Option<Duration>,
    exit: Option<i32>,
}

fn drain(c: &Ctx) -> Result<Drain, Stop> {
    let cfg = c.need_spawn("sends SIGTERM to a daemon")?.clone();
    (*c.memo("lifecycle drain", move || -> Result<Drain, Stop> {
        let d = cfg
            .start(&["--slots", "1", "--ctx", "512", "--shutdown-timeout", "300"])
            .map_err(|e| Stop::fail("the daemon starts", e))?;
        let t = d.target();
        let body = with(
            counting(40, true),
            "stream_options",
            json!({"include_usage": true}),
        );
        let req = Request::post("/v1/completions")
            .json(&body)
            .timeout(Duration::from_secs(300));
        let mut ex =
            http::open(&t.ep, &req).map_err(|e| Stop::fail("the stream starts", e.to_string()))?;
        let mut raw = Vec::new();
        while !raw.windows(6).any(|w| w == b"data: ") {
            match ex.body.next_piece() {
                Ok(Some(p)) => raw.extend_from_slice(&p),
                other => return Err(Stop::fail("a first frame", format!("{other:?}"))),
            }
        }
        let frames_before = raw.windows(6).filter(|w| w == b"data: ").count();
        d.sigterm().map_err(|e| Stop::fail("SIGTERM", e))?;
        let t0 = Instant::now();
        let mut refused_after = None;
        while t0.elapsed() < Duration::from_secs(5) {
            if t.ep.connect(Duration::from_millis(500)).is_err() {
                refused_after = Some(t0.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        loop {
            match ex.body.next_piece() {
                Ok(Some(p)) => raw.extend_from_slice(&p),
                Ok(None) => break,
                Err(e) => {
                    return Err(Stop::fail(
                        "the stream to finish after SIGTERM",
                        e.to_string(),
                    ))
                }
            }
        }
        let cap = sse::parse_body(&String::from_utf8_lossy(&raw));
        let exit = d.wait_exit(Duration::from_secs(30)).and_then(|s| s.code());
        Ok(Drain {
            cap,
            frames_before,
            refused_after,
            exit,
        })
    }))
    .clone()
}

fn exit_of(c: &Ctx, args: &[&str]) -> Result<crate::daemon::Exit, Stop> {
    let cfg = c.need_spawn("starts the daemon with a bad setting")?;
    cfg.run_to_exit(args, EXIT_WAIT)
        .map_err(|e| Stop::fail("the daemon exits on its own", e))
}

fn wait_code(d: &Daemon, within: Duration) -> Option<i32> {
    d.wait_exit(within).and_then(|s| s.code())
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "lifecycle.readyz.loading_before_ready",
        "Before the model is loaded /readyz says loading",
        "503 {\"status\":\"loading\"} with Retry-After between bind and readiness",
        |c, ev| {
            let b = boot(c)?;
            let (status, body, ra) = while_loading(&b, "/readyz")?;
            ev.put(
                "readyz",
                json!({"status": status, "body": body, "retry_after": ra}),
            );
            ensure_eq!("status", status, 503);
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            ensure_eq!("body", v, json!({"status": "loading"}));
            ensure!(ra.is_some(), "a Retry-After header", "none");
            Ok(format!("loading; ready after {:.0} ms", b.first_ready_ms))
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.readyz.ready_after_load",
        "Once loaded /readyz says ready",
        "200 {\"status\":\"ready\"}",
        |c, ev| {
            let b = boot(c)?;
            ev.put("body", b.ready_body.clone());
            let v: Value = serde_json::from_str(&b.ready_body).unwrap_or_default();
            ensure_eq!("body", v, json!({"status": "ready"}));
            Ok(format!("ready after {:.0} ms", b.first_ready_ms))
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.healthz.up_while_loading",
        "/healthz is up while the model loads",
        "200 {\"status\":\"ok\"} before readiness",
        |c, ev| {
            let b = boot(c)?;
            let (status, body, _) = while_loading(&b, "/healthz")?;
            ev.put("healthz", json!({"status": status, "body": body}));
            ensure_eq!("status", status, 200);
            Ok("up while loading".into())
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.v1.503_while_loading",
        "/v1 routes answer 503 while the model loads",
        "503 model_loading in the error shape",
        |c, ev| {
            let b = boot(c)?;
            let (status, body, _) = while_loading(&b, "/v1/models")?;
            ev.put("models", json!({"status": status, "body": body}));
            ensure_eq!("status", status, 503);
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            crate::target::error_shape(&v).map_err(|e| Stop::fail("the OpenAI error shape", e))?;
            ensure_eq!("code", v["error"]["code"], json!("model_loading"));
            Ok("503 model_loading".into())
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.sigterm.drains_inflight",
        "SIGTERM lets the in-flight stream finish",
        "the running stream completes: all 40 tokens, finish_reason length, [DONE]",
        |c, ev| {
            let d = drain(c)?;
            ev.text("stream", &d.cap.describe());
            ensure!(
                d.frames_before < d.cap.frames.len(),
                "the stream still running at SIGTERM",
                format!(
                    "{} of {} frames before",
                    d.frames_before,
                    d.cap.frames.len()
                )
            );
            ensure!(
                d.cap.ends_with_done(),
                "[DONE] at the end",
                d.cap.describe()
            );
            ensure_eq!(
                "finish_reason",
                d.cap.final_finish_reason().ok(),
                Some("length".to_string())
            );
            ensure_eq!(
                "completion_tokens",
                d.cap.usage().map(|u| u["completion_tokens"].clone()),
                Some(json!(40))
            );
            Ok(format!(
                "{} frames after SIGTERM",
                d.cap.frames.len() - d.frames_before
            ))
        },
    )
    .heavy()
    .timeout_s(300);
    r.add(
        G,
        "lifecycle.sigterm.exit_0",
        "After draining the daemon exits 0",
        "exit code 0",
        |c, ev| {
            let d = drain(c)?;
            ev.put("exit_code", json!(d.exit));
            ensure_eq!("exit code", d.exit, Some(0));
            Ok("exit 0".into())
        },
    )
    .heavy()
    .timeout_s(300);
    r.add(
        G,
        "lifecycle.sigterm.stops_accepting",
        "After SIGTERM no new connection is accepted",
        "connect refused within 3 s of SIGTERM",
        |c, ev| {
            let d = drain(c)?;
            ev.put(
                "refused_after_ms",
                json!(d.refused_after.map(|t| t.as_secs_f64() * 1000.0)),
            );
            ensure!(
                d.refused_after.is_some_and(|t| t <= Duration::from_secs(3)),
                "refused within 3 s",
                format!("{:?}", d.refused_after)
            );
            Ok(format!(
                "refused after {:?}",
                d.refused_after.unwrap_or_default()
            ))
        },
    )
    .heavy()
    .timeout_s(300);
    r.add(
        G,
        "lifecycle.sigterm.deadline_cancels",
        "Past --shutdown-timeout the rest is cancelled",
        "timeout 1 s: exit 0 between 1 and 8 s after SIGTERM, the long stream cut without [DONE]",
        |c, ev| {
            let cfg = c.need_spawn("sends SIGTERM to a daemon")?;
            let d = cfg
                .start(&["--slots", "1", "--ctx", "4096", "--shutdown-timeout", "1"])
                .map_err(|e| Stop::fail("the daemon starts", e))?;
            let t = d.target();
            let mut ex = http::open(
                &t.ep,
                &Request::post("/v1/completions")
                    .json(&counting(3000, true))
                    .timeout(Duration::from_secs(60)),
            )
            .map_err(|e| Stop::fail("the stream starts", e.to_string()))?;
            let mut raw = ex.body.next_piece().ok().flatten().unwrap_or_default();
            let t0 = Instant::now();
            d.sigterm().map_err(|e| Stop::fail("SIGTERM", e))?;
            while let Ok(Some(p)) = ex.body.next_piece() {
                raw.extend_from_slice(&p);
            }
            let code = wait_code(&d, Duration::from_secs(10));
            let took = t0.elapsed();
            let text = String::from_utf8_lossy(&raw).into_owned();
            ev.put("exit_after_ms", took.as_secs_f64() * 1000.0);
            let mut cut = text.len().saturating_sub(600);
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            ev.text("stream_tail", &text[cut..]);
            ensure_eq!("exit code", code, Some(0));
            ensure!(
                took >= Duration::from_secs(1) && took <= Duration::from_secs(8),
                "exit 1–8 s after SIGTERM",
                format!("{took:?}")
            );
            ensure!(
                !text.contains("[DONE]"),
                "no [DONE] on a cancelled stream",
                "it claimed completion"
            );
            Ok(format!("exit 0 after {took:?}"))
        },
    )
    .heavy()
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.sigterm.idle_exits_fast",
        "An idle daemon exits promptly on SIGTERM",
        "exit 0 within 3 s",
        |c, ev| {
            let cfg = c.need_spawn("sends SIGTERM to a daemon")?;
            let d = cfg
                .start(&["--slots", "1", "--ctx", "256"])
                .map_err(|e| Stop::fail("the daemon starts", e))?;
            let t0 = Instant::now();
            d.sigterm().map_err(|e| Stop::fail("SIGTERM", e))?;
            let code = wait_code(&d, Duration::from_secs(10));
            ev.put("exit_after_ms", t0.elapsed().as_secs_f64() * 1000.0);
            ensure_eq!("exit code", code, Some(0));
            ensure!(
                t0.elapsed() <= Duration::from_secs(3),
                "≤ 3 s",
                format!("{:?}", t0.elapsed())
            );
            Ok(format!("exit 0 after {:?}", t0.elapsed()))
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.sigint.exit_0",
        "SIGINT shuts down like SIGTERM",
        "exit 0",
        |c, ev| {
            let cfg = c.need_spawn("sends SIGINT to a daemon")?;
            let d = cfg
                .start(&["--slots", "1", "--ctx", "256"])
                .map_err(|e| Stop::fail("the daemon starts", e))?;
            d.signal(libc::SIGINT)
                .map_err(|e| Stop::fail("SIGINT", e))?;
            let code = wait_code(&d, Duration::from_secs(10));
            ev.text("log_tail", &d.log_tail(5));
            ensure_eq!("exit code", code, Some(0));
            Ok("exit 0".into())
        },
    )
    .timeout_s(180);
    r.add(
        G,
        "lifecycle.restart.same_port",
        "A restarted daemon binds the same port again",
        "stop, start with --port P: ready and serving on P",
        |c, ev| {
            let cfg = c.need_spawn("restarts a daemon")?;
            let first = cfg
                .start(&["--slots", "1", "--ctx", "256"])
                .map_err(|e| Stop::fail("the daemon starts", e))?;
            let port = first.endpoint().map(|e| e.port).unwrap_or(0).to_string();
            first.stop();
            drop(first);
            let second = cfg
                .start(&["--slots", "1", "--ctx", "256", "--port", &port])
                .map_err(|e| Stop::fail(format!("a restart on port {port}"), e))?;
            let got = second
                .endpoint()
                .map(|e| e.port.to_string())
                .unwrap_or_default();
            ev.put("port", port.clone());
            ensure_eq!("port", got, port);
            text_of(&second.target().chat(&chat_body("Hi", 2))?)?;
            Ok(format!("serving again on {port}"))
        },
    )
    .timeout_s(240);
    r.add(
        G,
        "lifecycle.restart.same_answer",
        "A restart does not change greedy answers",
        "the same temperature-0 text before and after a restart",
        |c, ev| {
            let cfg = c.need_spawn("restarts a daemon")?;
            let mut texts = Vec::new();
            for _ in 0..2 {
                let d = cfg
                    .start(&["--slots", "1", "--ctx", "256"])
                    .map_err(|e| Stop::fail("the daemon starts", e))?;
                texts.push(text_of(&d.target().chat(&chat_body(EXPLAIN, 12))?)?);
            }
            ev.put("texts", json!(texts));
            ensure_eq!("text after restart", texts[1], texts[0]);
            Ok("identical".into())
        },
    )
    .timeout_s(240);
    r.add(
        G,
        "lifecycle.exit.bad_config_key_2",
        "An unknown key in the config file is a usage error",
        "exit 2 naming the key",
        |c, ev| {
            let file = c.work.join("bad-config.toml");
            std::fs::write(&file, "slots = 2\nprot = 8080\n")
                .map_err(|e| Stop::fail("write the config", e.to_string()))?;
            let f = file.to_string_lossy().into_owned();
            let e = exit_of(c, &["--config", &f])?;
            ev.text("log", &e.log);
            ensure_eq!("exit code", e.code, Some(2));
            ensure!(
                e.log.contains("prot"),
                "the message names `prot`",
                crate::case::snippet(&e.log, 800)
            );
            Ok("exit 2".into())
        },
    );
    r.add(
        G,
        "lifecycle.exit.public_bind_2",
        "Binding a public address without a key is refused",
        "--host 0.0.0.0 without --api-key: exit 2, the message names --api-key",
        |c, ev| {
            let e = exit_of(c, &["--host", "0.0.0.0"])?;
            ev.text("log", &e.log);
            ensure_eq!("exit code", e.code, Some(2));
            ensure!(
                e.log.contains("--api-key"),
                "names --api-key",
                crate::case::snippet(&e.log, 800)
            );
            ensure!(
                !e.log.contains("listening on"),
                "nothing listening",
                "it bound"
            );
            Ok("exit 2".into())
        },
    );
    r.add(
        G,
        "lifecycle.exit.missing_model_4",
        "A missing model file fails the load",
        "exit 4, the message names the path",
        |c, ev| {
            let path = "/nonexistent/inferloop-qual/model.gguf";
            let e = exit_of(c, &["--model", path])?;
            ev.text("log", &e.log);
            ensure_eq!("exit code", e.code, Some(4));
            ensure!(
                e.log.contains(path),
                "names the path",
                crate::case::snippet(&e.log, 800)
            );
            Ok("exit 4".into())
        },
    );
}
