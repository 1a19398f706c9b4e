//! `load`: parallel streams stay independent and correct, requests fan out across the slots,
//! a full queue answers 429 with Retry-After, a long wait 503, a client that leaves gives its
//! slot back within a step, and the metrics return to zero.

use std::io::Write;
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::reference;
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::http::{self, Exchange, Request, Response};
use crate::sse::Capture;
use crate::target::{
    chat_body, counting, expect_error, expect_retry_after, metric, metric_of, streaming, text_of,
    u64_at, Target, SETTLE,
};
use crate::{ensure, ensure_eq};

const G: Group = Group::Load;
const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
/// Prompts whose greedy answers differ, to prove parallel outputs do not mix.
const PROMPTS: [&str; 3] = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Why do cats purr?",
];

fn solo(c: &Ctx, i: usize) -> Result<Value, Stop> {
    reference(c, CHAT, &chat_body(PROMPTS[i % 3], 8))
}

/// Starts a streaming completion that keeps its slot busy and returns once its first frames
/// arrived (so it holds a slot). Dropping the exchange closes the connection.
pub fn occupy(t: &Target, max_tokens: u32) -> Result<Exchange, Stop> {
    let req = t.authed(
        Request::post(COMPLETIONS)
            .json(&counting(max_tokens, true))
            .timeout(Duration::from_secs(600)),
    );
    let mut ex =
        http::open(&t.ep, &req).map_err(|e| Stop::fail("a long stream to start", e.to_string()))?;
    if ex.head.status != 200 {
        let body = ex.body.read_all().unwrap_or_default();
        return Err(Stop::fail(
            "the occupying stream answers 200",
            format!("{} {}", ex.head.status, String::from_utf8_lossy(&body)),
        ));
    }
    let mut frames = 0;
    while frames < 2 {
        match ex.body.next_piece() {
            Ok(Some(p)) => frames += p.windows(6).filter(|w| w == b"data: ").count(),
            Ok(None) => {
                return Err(Stop::fail(
                    "the occupying stream stays open",
                    "it ended early",
                ))
            }
            Err(e) => return Err(Stop::fail("the occupying stream stays open", e.to_string())),
        }
    }
    Ok(ex)
}

/// Sends `body` to `path` from a thread.
fn spawn_request(
    t: &Target,
    path: &'static str,
    body: Value,
) -> JoinHandle<Result<Response, Stop>> {
    let t = t.clone();
    std::thread::spawn(move || t.post(path, &body))
}

/// Sends a request on a raw connection and keeps it open without reading: dropping the
/// stream is a client that leaves.
fn send_and_hold(t: &Target, path: &str, body: &Value) -> Result<TcpStream, Stop> {
    let req = t.authed(Request::post(path).json(body));
    let mut s =
        t.ep.connect(Duration::from_secs(10))
            .map_err(|e| Stop::fail("connect", e.to_string()))?;
    s.write_all(&req.encode(&t.ep))
        .map_err(|e| Stop::fail("send", e.to_string()))?;
    Ok(s)
}

fn join<T>(h: JoinHandle<Result<T, Stop>>) -> Result<T, Stop> {
    h.join()
        .unwrap_or_else(|_| Err(Stop::fail("request thread", "panicked")))
}

/// Occupies the one slot, queues one waiter, runs `f` while slot and queue are full, then
/// frees the slot and requires the waiter to be served.
pub fn fill_queue<T>(
    t: &Target,
    ev: &mut Evidence,
    f: impl FnOnce(&Target, &mut Evidence) -> Result<T, Stop>,
) -> Result<T, Stop> {
    let running = occupy(t, 460)?;
    let waiter = spawn_request(t, COMPLETIONS, counting(4, false));
    let s = t.wait_status(SETTLE, "one request queued", |s| s["queue"]["depth"] == 1)?;
    ev.put(
        "status_when_full",
        json!({"slots": s["slots"], "queue": s["queue"]}),
    );
    let out = f(t, ev);
    drop(running);
    let w = join(waiter)?;
    ev.text("waiter", &w.describe());
    let out = out?;
    ensure_eq!(
        "the queued request's status once the slot freed",
        w.status(),
        200
    );
    Ok(out)
}

/// Runs `n` requests at once; returns them in order.
fn parallel<T: Send>(
    n: usize,
    f: impl Fn(usize) -> Result<T, Stop> + Sync,
) -> Result<Vec<T>, Stop> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                s.spawn(move || f(i))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Stop::fail("request thread", "panicked")))
            })
            .collect()
    })
}

/// N streams matching their solo answers.
fn streams_match_solo(c: &Ctx, ev: &mut Evidence, n: usize) -> Result<String, Stop> {
    let solos: Vec<String> = (0..3)
        .map(|i| solo(c, i).and_then(|v| text_of(&v)))
        .collect::<Result<_, _>>()?;
    let caps: Vec<Capture> = parallel(n, |i| {
        c.target
            .stream_ok(CHAT, &streaming(chat_body(PROMPTS[i % 3], 8)))
    })?;
    for (i, cap) in caps.iter().enumerate() {
        ev.put(&format!("stream_{i}"), cap.text());
        ensure!(
            cap.text() == solos[i % 3],
            format!("stream {i}: its solo answer {:?}", solos[i % 3]),
            cap.text()
        );
    }
    Ok(format!("{n}/{n} streams match their solo answers"))
}

/// What happened when more requests arrived than there are slots: every slot held by a
/// stream until the suite let go, so the scenario does not depend on the box's speed.
#[derive(Clone)]
struct FanOut {
    slots: u64,
    status_full: Value,
    status_queued: Value,
    waiter: Value,
}

fn fan_out(c: &Ctx) -> Result<FanOut, Stop> {
    let t = c.target.clone();
    let slots = c.facts.slots.max(1);
    (*c.memo("load fanout", move || -> Result<FanOut, Stop> {
        let mut held = Vec::new();
        for _ in 0..slots {
            held.push(occupy(&t, 900)?);
        }
        let status_full = t.wait_status(SETTLE, "every slot busy", |s| {
            s["slots"]["active"].as_u64() == Some(slots)
        })?;
        let extra = spawn_request(&t, COMPLETIONS, counting(8, false));
        let status_queued = t.wait_status(SETTLE, "the extra request queued", |s| {
            s["queue"]["depth"].as_u64() == Some(1)
        })?;
        drop(held);
        let waiter = crate::target::json_200(&join(extra)?, "the queued request")?;
        Ok(FanOut {
            slots,
            status_full,
            status_queued,
            waiter,
        })
    }))
    .clone()
}

/// Eight streams on the shared daemon, with /v1/status polled while they run.
#[derive(Clone)]
struct Burst {
    texts: Vec<String>,
    statuses: Vec<Value>,
}

fn burst(c: &Ctx) -> Result<Burst, Stop> {
    let t = c.target.clone();
    (*c.memo("load burst", move || -> Result<Burst, Stop> {
        let done = std::sync::atomic::AtomicBool::new(false);
        let (caps, statuses) = std::thread::scope(|s| {
            let poller = s.spawn(|| {
                let mut seen = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(st) = t.status() {
                        seen.push(json!({"slots": st["slots"], "queue": st["queue"]}));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                seen
            });
            let caps = parallel(8, |i| {
                t.stream_ok(CHAT, &streaming(chat_body(PROMPTS[i % 3], 8)))
            });
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (caps, poller.join().unwrap_or_default())
        });
        Ok(Burst {
            texts: caps?.iter().map(Capture::text).collect(),
            statuses,
        })
    }))
    .clone()
}

/// A metrics delta over four parallel requests on an otherwise idle daemon.
#[derive(Clone)]
struct Deltas {
    before: String,
    after: String,
    replies: Vec<Value>,
}

fn deltas(c: &Ctx) -> Result<Deltas, Stop> {
    let t = c.target.clone();
    (*c.memo("load deltas", move || -> Result<Deltas, Stop> {
        let before = t.metrics()?;
        let replies = parallel(4, |i| t.complete(&counting(6 + i as u32, false)))?;
        let after = t.wait_metrics(SETTLE, "gauges back to zero", |m| {
            metric(m, "inferloop_active_slots") == Some(0.0)
                && metric(m, "inferloop_queue_depth") == Some(0.0)
        })?;
        Ok(Deltas {
            before,
            after,
            replies,
        })
    }))
    .clone()
}

fn delta(d: &Deltas, series: &str) -> Result<f64, Stop> {
    Ok(metric_of(&d.after, series)? - metric_of(&d.before, series)?)
}

fn sum_usage(d: &Deltas, field: &str) -> Result<f64, Stop> {
    d.replies
        .iter()
        .map(|v| u64_at(v, &format!("/usage/{field}")).map(|n| n as f64))
        .sum()
}

/// The queue-full scenario on the `queue1` daemon.
#[derive(Clone)]
struct Overflow {
    plain: Response,
    stream: Capture,
    status: Value,
    metrics: String,
}

fn overflow(c: &Ctx) -> Result<Overflow, Stop> {
    let fx = c.fixture("queue1")?;
    (*c.memo("load overflow", move || -> Result<Overflow, Stop> {
        let t = fx.target();
        let mut ev = Evidence::default();
        fill_queue(&t, &mut ev, |t, _| {
            let status = t.status()?;
            let plain = t.post(COMPLETIONS, &counting(4, false))?;
            let stream = t.stream(COMPLETIONS, &counting(4, true))?;
            let metrics = t.metrics()?;
            Ok(Overflow {
                plain,
                stream,
                status,
                metrics,
            })
        })
    }))
    .clone()
}

/// The queue-timeout scenario on the `qtimeout` daemon.
#[derive(Clone)]
struct Timeout {
    plain: Response,
    stream: Capture,
    waited: Duration,
    status_after: Value,
}

fn timeout(c: &Ctx) -> Result<Timeout, Stop> {
    let fx = c.fixture("qtimeout")?;
    (*c.memo("load timeout", move || -> Result<Timeout, Stop> {
        let t = fx.target();
        let running = occupy(&t, 900)?;
        let t0 = Instant::now();
        let plain = spawn_request(&t, COMPLETIONS, counting(4, false));
        let st = t.clone();
        let stream = std::thread::spawn(move || st.stream(COMPLETIONS, &counting(4, true)));
        let plain = join(plain)?;
        let stream = join(stream)?;
        let waited = t0.elapsed();
        let status_after = t.status()?;
        drop(running);
        Ok(Timeout {
            plain,
            stream,
            waited,
            status_after,
        })
    }))
    .clone()
}

/// A client that left mid-generation, on the `cancel` daemon.
#[derive(Clone)]
struct Cancelled {
    /// Tokens the daemon generated for the request after its client left.
    tokens_after_leaving: f64,
    follow_up: Value,
    cancelled_before: f64,
    metrics_after: String,
    freed_after: Duration,
    status_after: Value,
}

const LONG: u32 = 3000;

fn cancelled(c: &Ctx, stream: bool) -> Result<Cancelled, Stop> {
    let fx = c.fixture("cancel")?;
    let key = if stream {
        "load cancel stream"
    } else {
        "load cancel plain"
    };
    (*c.memo(key, move || -> Result<Cancelled, Stop> {
        let t = fx.target();
        let cancelled_before = metric_of(&t.metrics()?, "inferloop_cancelled_total")?;
        let left_at;
        let generated_at_leaving;
        if stream {
            let ex = occupy(&t, LONG)?;
            t.wait_status(SETTLE, "the stream decoding", |s| s["slots"]["active"] == 1)?;
            generated_at_leaving = metric_of(&t.metrics()?, "inferloop_generated_tokens_total")?;
            left_at = Instant::now();
            drop(ex);
        } else {
            let s = send_and_hold(&t, COMPLETIONS, &counting(LONG, false))?;
            t.wait_status(SETTLE, "the request decoding", |s| {
                s["slots"]["active"] == 1
            })?;
            std::thread::sleep(Duration::from_millis(300));
            generated_at_leaving = metric_of(&t.metrics()?, "inferloop_generated_tokens_total")?;
            left_at = Instant::now();
            drop(s);
        }
        t.wait_status(SETTLE, "the slot freed", |s| s["slots"]["active"] == 0)?;
        let freed_after = left_at.elapsed();
        let tokens_after_leaving =
            metric_of(&t.metrics()?, "inferloop_generated_tokens_total")? - generated_at_leaving;
        let follow_up = t.complete(&counting(4, false))?;
        let metrics_after =
            t.wait_metrics(SETTLE, "gauges at zero and the cancellation counted", |m| {
                metric(m, "inferloop_active_slots") == Some(0.0)
                    && metric(m, "inferloop_queue_depth") == Some(0.0)
                    && metric(m, "inferloop_cancelled_total") > Some(cancelled_before)
            })?;
        let status_after = t.status()?;
        Ok(Cancelled {
            tokens_after_leaving,
            follow_up,
            cancelled_before,
            metrics_after,
            freed_after,
            status_after,
        })
    }))
    .clone()
}

/// A queued client that left, on the `queue1` daemon.
#[derive(Clone)]
struct Left {
    depth_after_leaving: Value,
    next_status: Option<u16>,
    next_was_queued: bool,
}

fn waiter_left(c: &Ctx) -> Result<Left, Stop> {
    let fx = c.fixture("queue1")?;
    (*c.memo("load waiter left", move || -> Result<Left, Stop> {
        let t = fx.target();
        let running = occupy(&t, 460)?;
        let leaver = send_and_hold(&t, COMPLETIONS, &counting(4, false))?;
        t.wait_status(SETTLE, "the waiter queued", |s| s["queue"]["depth"] == 1)?;
        drop(leaver);
        let s = t.wait_status(SETTLE, "the waiter that left dropped from the queue", |s| {
            s["queue"]["depth"] == 0
        })?;
        let next = spawn_request(&t, COMPLETIONS, counting(4, false));
        let queued = t.wait_status(SETTLE, "the next request queued (not refused)", |s| {
            next.is_finished() || s["queue"]["depth"] == 1
        })?;
        let next_was_queued = queued["queue"]["depth"] == 1;
        drop(running);
        let next_status = join(next).ok().map(|r| r.status());
        Ok(Left {
            depth_after_leaving: s["queue"].clone(),
            next_status,
            next_was_queued,
        })
    }))
    .clone()
}

pub fn register(r: &mut Registry) {
    // ---- parallel streams on the shared daemon ----
    r.add(
        G,
        "load.parallel.two_streams_match_solo",
        "Two parallel streams each equal their solo answer",
        "texts equal the sequential greedy answers",
        |c, ev| streams_match_solo(c, ev, 2),
    );
    r.add(
        G,
        "load.parallel.four_streams_match_solo",
        "Four parallel streams each equal their solo answer",
        "texts equal the sequential greedy answers",
        |c, ev| streams_match_solo(c, ev, 4),
    )
    .exclusive();
    r.add(
        G,
        "load.parallel.eight_streams_on_four_slots",
        "Eight streams on four slots all finish correctly",
        "8/8 complete, each equal to its solo answer",
        |c, ev| {
            let solos: Vec<String> = (0..3)
                .map(|i| solo(c, i).and_then(|v| text_of(&v)))
                .collect::<Result<_, _>>()?;
            let b = burst(c)?;
            for (i, t) in b.texts.iter().enumerate() {
                ev.put(&format!("stream_{i}"), t.clone());
                ensure!(
                    *t == solos[i % 3],
                    format!("stream {i}: {:?}", solos[i % 3]),
                    t.clone()
                );
            }
            Ok("8/8 correct".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.parallel.mixed_routes",
        "Chat and completions run side by side",
        "2 chats + 2 completions in parallel equal their solo answers",
        |c, ev| {
            let chat_solo = text_of(&solo(c, 0)?)?;
            let comp_solo = text_of(&reference(c, COMPLETIONS, &counting(12, false))?)?;
            let out = parallel(4, |i| {
                if i % 2 == 0 {
                    c.target.chat(&chat_body(PROMPTS[0], 8))
                } else {
                    c.target.complete(&counting(12, false))
                }
            })?;
            for (i, v) in out.iter().enumerate() {
                let want = if i % 2 == 0 { &chat_solo } else { &comp_solo };
                let got = text_of(v)?;
                ev.put(&format!("reply_{i}"), got.clone());
                ensure!(got == *want, format!("request {i}: {want:?}"), got);
            }
            Ok("4/4 correct".into())
        },
    );
    r.add(
        G,
        "load.parallel.stream_and_plain",
        "Streams and plain requests run side by side",
        "2 streams + 2 plain requests in parallel equal their solo answers",
        |c, ev| {
            let want = text_of(&solo(c, 1)?)?;
            let out = parallel(4, |i| {
                if i % 2 == 0 {
                    c.target
                        .stream_ok(CHAT, &streaming(chat_body(PROMPTS[1], 8)))
                        .map(|c| c.text())
                } else {
                    c.target
                        .chat(&chat_body(PROMPTS[1], 8))
                        .and_then(|v| text_of(&v))
                }
            })?;
            for (i, got) in out.iter().enumerate() {
                ev.put(&format!("reply_{i}"), got.clone());
                ensure!(*got == want, format!("request {i}: {want:?}"), got.clone());
            }
            Ok("4/4 correct".into())
        },
    );
    r.add(
        G,
        "load.parallel.ids_unique",
        "Concurrent answers never share an id",
        "8 parallel answers, 8 distinct ids",
        |c, ev| {
            let out = parallel(8, |_| c.target.chat(&chat_body("Hi", 2)))?;
            let ids: std::collections::BTreeSet<String> =
                out.iter().map(|v| v["id"].to_string()).collect();
            ev.put("ids", json!(ids));
            ensure_eq!("distinct ids", ids.len(), 8);
            Ok("8 distinct ids".into())
        },
    );
    r.add(
        G,
        "load.parallel.usage_independent",
        "Each parallel answer counts only its own tokens",
        "usage of each parallel answer equals its solo usage",
        |c, ev| {
            let solos: Vec<Value> = (0..3).map(|i| solo(c, i)).collect::<Result<_, _>>()?;
            let out = parallel(3, |i| c.target.chat(&chat_body(PROMPTS[i], 8)))?;
            for (i, v) in out.iter().enumerate() {
                ev.put(&format!("usage_{i}"), v["usage"].clone());
                ensure_eq!(
                    format!("usage of request {i}"),
                    v["usage"],
                    solos[i]["usage"]
                );
            }
            Ok("usage independent".into())
        },
    );

    // ---- fan-out across slots ----
    r.add(
        G,
        "load.fanout.all_slots_busy",
        "Long requests fan out over every slot",
        "with as many long requests as slots, /v1/status shows every slot active",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("status", f.status_full.clone());
            ensure_eq!(
                "slots.active",
                f.status_full["slots"]["active"].as_u64(),
                Some(f.slots)
            );
            Ok(format!("{} of {} slots active", f.slots, f.slots))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.extra_request_queued",
        "One request more than the slots waits in the queue",
        "queue.depth 1 while every slot is busy",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("status", f.status_queued.clone());
            ensure_eq!(
                "queue.depth",
                f.status_queued["queue"]["depth"].as_u64(),
                Some(1)
            );
            ensure_eq!(
                "slots.active",
                f.status_queued["slots"]["active"].as_u64(),
                Some(f.slots)
            );
            Ok("1 waiting".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.waiter_queue_ms",
        "The waiter reports its time in the queue",
        "timings.queue_ms of the request that waited > 50 ms",
        |c, ev| {
            let f = fan_out(c)?;
            let q = f.waiter["timings"]["queue_ms"].as_f64().unwrap_or(-1.0);
            ev.put("timings", f.waiter["timings"].clone());
            ensure!(q > 50.0, "> 50 ms", format!("{q} ms"));
            Ok(format!("waited {q:.0} ms"))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.waiter_served_after",
        "The waiter is served in full once a slot frees",
        "200 with completion_tokens = max_tokens (8) after the slots are released",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("usage", f.waiter["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                f.waiter["usage"]["completion_tokens"],
                json!(8)
            );
            Ok("served in full".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.status.active_plus_idle",
        "Slot accounting holds under load",
        "slots.active + slots.idle == slots.total in every sample during the burst",
        |c, ev| {
            let b = burst(c)?;
            ev.put("samples", b.statuses.len());
            for s in &b.statuses {
                let (a, i, t) = (
                    s["slots"]["active"].as_u64(),
                    s["slots"]["idle"].as_u64(),
                    s["slots"]["total"].as_u64(),
                );
                ensure!(
                    a.zip(i).map(|(a, i)| a + i) == t,
                    "active + idle = total",
                    s.to_string()
                );
            }
            ensure!(
                !b.statuses.is_empty(),
                "status samples during the burst",
                "none"
            );
            Ok(format!("{} samples consistent", b.statuses.len()))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.status.queue_bounded",
        "Queue and slots stay within their limits",
        "queue.depth ≤ capacity and active ≤ total in every sample; the queue was used",
        |c, ev| {
            let b = burst(c)?;
            let mut max_depth = 0;
            for s in &b.statuses {
                let (d, cap) = (
                    s["queue"]["depth"].as_u64().unwrap_or(u64::MAX),
                    s["queue"]["capacity"].as_u64().unwrap_or(0),
                );
                ensure!(d <= cap, format!("depth ≤ {cap}"), s.to_string());
                ensure!(
                    s["slots"]["active"].as_u64() <= s["slots"]["total"].as_u64(),
                    "active ≤ total",
                    s.to_string()
                );
                max_depth = max_depth.max(d);
            }
            ev.put("max_depth", max_depth);
            Ok(format!("max depth {max_depth}"))
        },
    )
    .exclusive();

    // ---- queue overflow ----
    r.add(
        G,
        "load.queue.overflow_429",
        "A full queue refuses with 429",
        "one slot busy, one waiting: the next request gets 429",
        |c, ev| {
            let o = overflow(c)?;
            ev.text("response", &o.plain.describe());
            ensure_eq!("status", o.plain.status(), 429);
            Ok("429".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.queue.retry_after",
        "A 429 says when to retry",
        "Retry-After: a positive integer of seconds",
        |c, ev| {
            let o = overflow(c)?;
            ev.put("retry_after", o.plain.header("retry-after"));
            let ra = expect_retry_after(&o.plain)?;
            Ok(format!("Retry-After: {ra}"))
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.queue.error_shape",
        "A 429 is an OpenAI rate-limit error",
        "type rate_limit_error, code queue_full, param null",
        |c, ev| {
            let o = overflow(c)?;
            ev.text("response", &o.plain.describe());
            let err = expect_error(&o.plain, 429, None, Some("queue_full"))?;
            ensure_eq!("type", err["type"], json!("rate_limit_error"));
            Ok("rate_limit_error/queue_full".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.queue.stream_refused_too",
        "A stream on a full queue is refused the same way",
        "429 JSON, not an event stream",
        |c, ev| {
            let o = overflow(c)?;
            ev.text("response", &o.stream.describe());
            ensure_eq!("status", o.stream.status(), 429);
            ensure!(
                !o.stream.is_event_stream(),
                "JSON, not SSE",
                o.stream.describe()
            );
            Ok("429".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.queue.counted_in_metrics",
        "Refusals are counted",
        "inferloop_requests_total{route=\"/v1/completions\",code=\"429\"} ≥ 1",
        |c, ev| {
            let o = overflow(c)?;
            let n = metric_of(
                &o.metrics,
                "inferloop_requests_total{route=\"/v1/completions\",code=\"429\"}",
            )?;
            ev.put("count", n);
            ensure!(n >= 1.0, "≥ 1", n.to_string());
            Ok(format!("{n} counted"))
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.queue.at_capacity_status",
        "/v1/status shows the full slot and queue",
        "slots.active 1 of 1 and queue.depth 1 of 1 when the 429 is sent",
        |c, ev| {
            let o = overflow(c)?;
            ev.put(
                "status",
                json!({"slots": o.status["slots"], "queue": o.status["queue"]}),
            );
            ensure_eq!("slots.active", o.status["slots"]["active"], json!(1));
            ensure_eq!("queue.depth", o.status["queue"]["depth"], json!(1));
            ensure_eq!("queue.capacity", o.status["queue"]["capacity"], json!(1));
            Ok("1/1 and 1/1".into())
        },
    )
    .fixture("queue1");

    // ---- queue timeout ----
    r.add(
        G,
        "load.timeout.503",
        "A request that waits past the queue timeout gets 503",
        "503 after the 300 ms timeout",
        |c, ev| {
            let t = timeout(c)?;
            ev.text("response", &t.plain.describe());
            ensure_eq!("status", t.plain.status(), 503);
            Ok("503".into())
        },
    )
    .fixture("qtimeout");
    r.add(
        G,
        "load.timeout.retry_after",
        "A queue-timeout 503 says when to retry",
        "Retry-After ≥ 1",
        |c, ev| {
            let t = timeout(c)?;
            ev.put("retry_after", t.plain.header("retry-after"));
            let ra = expect_retry_after(&t.plain)?;
            Ok(format!("Retry-After: {ra}"))
        },
    )
    .fixture("qtimeout");
    r.add(
        G,
        "load.timeout.error_shape",
        "A queue-timeout 503 is a server error",
        "type server_error, code queue_timeout",
        |c, ev| {
            let t = timeout(c)?;
            let err = expect_error(&t.plain, 503, None, Some("queue_timeout"))?;
            ev.put("error", err.clone());
            ensure_eq!("type", err["type"], json!("server_error"));
            Ok("server_error/queue_timeout".into())
        },
    )
    .fixture("qtimeout");
    r.add(
        G,
        "load.timeout.stream_503_json",
        "A stream that times out in the queue gets a JSON 503",
        "503 queue_timeout before any chunk, not an event stream",
        |c, ev| {
            let t = timeout(c)?;
            ev.text("response", &t.stream.describe());
            ensure_eq!("status", t.stream.status(), 503);
            ensure!(
                !t.stream.is_event_stream(),
                "JSON, not SSE",
                t.stream.describe()
            );
            Ok("503 JSON".into())
        },
    )
    .fixture("qtimeout");
    r.add(
        G,
        "load.timeout.not_before_deadline",
        "The 503 does not come early",
        "both answers arrive ≥ 300 ms after sending",
        |c, ev| {
            let t = timeout(c)?;
            ev.put("waited_ms", t.waited.as_secs_f64() * 1000.0);
            ensure!(
                t.waited >= Duration::from_millis(300),
                "≥ 300 ms",
                format!("{:?}", t.waited)
            );
            Ok(format!("after {:?}", t.waited))
        },
    )
    .fixture("qtimeout");
    r.add(
        G,
        "load.timeout.running_unaffected",
        "Timing out waiters leaves the running request alone",
        "the slot is still active after the 503s",
        |c, ev| {
            let t = timeout(c)?;
            ev.put("slots", t.status_after["slots"].clone());
            ensure_eq!("slots.active", t.status_after["slots"]["active"], json!(1));
            Ok("still running".into())
        },
    )
    .fixture("qtimeout");

    // ---- cancellation ----
    r.add(
        G,
        "load.cancel.stream_frees_slot",
        "A dropped stream gives its slot to the next request",
        "the follow-up's queue_ms < 2000",
        |c, ev| {
            let k = cancelled(c, true)?;
            let q = k.follow_up["timings"]["queue_ms"]
                .as_f64()
                .unwrap_or(f64::MAX);
            ev.put("follow_up_timings", k.follow_up["timings"].clone());
            ensure!(q < 2000.0, "< 2000 ms in the queue", format!("{q} ms"));
            Ok(format!("follow-up waited {q:.1} ms"))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.stream_counted",
        "A dropped stream is counted as cancelled",
        "inferloop_cancelled_total grows by 1",
        |c, ev| {
            let k = cancelled(c, true)?;
            let after = metric_of(&k.metrics_after, "inferloop_cancelled_total")?;
            ev.put("before", k.cancelled_before);
            ev.put("after", after);
            ensure_eq!("cancelled_total", after, k.cancelled_before + 1.0);
            Ok(format!("{} → {after}", k.cancelled_before))
        },
    )
    .fixture("cancel");
    r.add(G, "load.cancel.stream_stops_promptly", "A dropped stream stops within a few decode steps", "≤ 8 more tokens generated after the client disconnects (counted by inferloop_generated_tokens_total), then the slot is free", |c, ev| {
        let k = cancelled(c, true)?;
        ev.put("tokens_after_leaving", k.tokens_after_leaving);
        ev.put("freed_after_ms", k.freed_after.as_secs_f64() * 1000.0);
        ensure!(k.tokens_after_leaving <= 8.0, "≤ 8 tokens after the disconnect", format!("{} tokens over {:?}", k.tokens_after_leaving, k.freed_after));
        Ok(format!("{} tokens after the disconnect, slot free after {:?}", k.tokens_after_leaving, k.freed_after))
    }).fixture("cancel");
    r.add(
        G,
        "load.cancel.kv_released",
        "A dropped stream's KV cells are released",
        "kv.reserved 0 and no slot active afterwards",
        |c, ev| {
            let k = cancelled(c, true)?;
            ev.put("kv", k.status_after["kv"].clone());
            ensure_eq!("kv.reserved", k.status_after["kv"]["reserved"], json!(0));
            ensure_eq!("slots.active", k.status_after["slots"]["active"], json!(0));
            Ok("released".into())
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.plain_frees_slot",
        "A non-stream client that leaves gives its slot back",
        "after the client disconnects mid-generation, the follow-up's queue_ms < 2000",
        |c, ev| {
            let k = cancelled(c, false)?;
            let q = k.follow_up["timings"]["queue_ms"]
                .as_f64()
                .unwrap_or(f64::MAX);
            ev.put("follow_up_timings", k.follow_up["timings"].clone());
            ev.put("freed_after_ms", k.freed_after.as_secs_f64() * 1000.0);
            ensure!(q < 2000.0, "< 2000 ms", format!("{q} ms"));
            Ok(format!("follow-up waited {q:.1} ms"))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.plain_counted",
        "A non-stream client that leaves is counted",
        "inferloop_cancelled_total grows by 1",
        |c, ev| {
            let k = cancelled(c, false)?;
            let after = metric_of(&k.metrics_after, "inferloop_cancelled_total")?;
            ev.put("before", k.cancelled_before);
            ev.put("after", after);
            ensure_eq!("cancelled_total", after, k.cancelled_before + 1.0);
            Ok(format!("{} → {after}", k.cancelled_before))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.waiter_leaves_queue",
        "A queued client that leaves is dropped from the queue",
        "queue.depth back to 0 after it disconnects",
        |c, ev| {
            let l = waiter_left(c)?;
            ev.put("queue", l.depth_after_leaving.clone());
            ensure_eq!("queue.depth", l.depth_after_leaving["depth"], json!(0));
            Ok("dropped".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.cancel.queue_place_reusable",
        "The place it left is usable",
        "the next request waits (not 429) and is served 200",
        |c, ev| {
            let l = waiter_left(c)?;
            ev.put("next_status", json!(l.next_status));
            ensure!(
                l.next_was_queued,
                "the next request queued",
                "answered while the slot was busy"
            );
            ensure_eq!("next status", l.next_status, Some(200));
            Ok("queued, then 200".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.cancel.gauges_zero",
        "After cancellations the gauges read zero",
        "inferloop_active_slots 0 and inferloop_queue_depth 0",
        |c, ev| {
            let k = cancelled(c, false)?;
            let (a, q) = (
                metric_of(&k.metrics_after, "inferloop_active_slots")?,
                metric_of(&k.metrics_after, "inferloop_queue_depth")?,
            );
            ev.put("active_slots", a);
            ev.put("queue_depth", q);
            ensure!(a == 0.0 && q == 0.0, "0 and 0", format!("{a} and {q}"));
            Ok("0 and 0".into())
        },
    )
    .fixture("cancel");

    // ---- metrics return to zero, exact counts ----
    r.add(
        G,
        "load.metrics.generated_tokens_exact",
        "Generated tokens are counted exactly",
        "Δ inferloop_generated_tokens_total = Σ completion_tokens of 4 parallel requests",
        |c, ev| {
            let d = deltas(c)?;
            let (got, want) = (
                delta(&d, "inferloop_generated_tokens_total")?,
                sum_usage(&d, "completion_tokens")?,
            );
            ev.put("delta", got);
            ev.put("sum_usage", want);
            ensure_eq!("Δ generated_tokens_total", got, want);
            Ok(format!("Δ {got}"))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.prompt_tokens_exact",
        "Prompt tokens are counted exactly",
        "Δ inferloop_prompt_tokens_total = Σ prompt_tokens",
        |c, ev| {
            let d = deltas(c)?;
            let (got, want) = (
                delta(&d, "inferloop_prompt_tokens_total")?,
                sum_usage(&d, "prompt_tokens")?,
            );
            ev.put("delta", got);
            ev.put("sum_usage", want);
            ensure_eq!("Δ prompt_tokens_total", got, want);
            Ok(format!("Δ {got}"))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.ttft_count_exact",
        "Every request observes one TTFT",
        "Δ inferloop_ttft_seconds_count = 4",
        |c, ev| {
            let d = deltas(c)?;
            let got = delta(&d, "inferloop_ttft_seconds_count")?;
            ev.put("delta", got);
            ensure_eq!("Δ ttft_seconds_count", got, 4.0);
            Ok("Δ 4".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.request_count_exact",
        "Every request observes one duration",
        "Δ inferloop_request_seconds_count = 4",
        |c, ev| {
            let d = deltas(c)?;
            let got = delta(&d, "inferloop_request_seconds_count")?;
            ev.put("delta", got);
            ensure_eq!("Δ request_seconds_count", got, 4.0);
            Ok("Δ 4".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.gauges_zero_after_burst",
        "After a burst the gauges read zero",
        "inferloop_active_slots 0, inferloop_queue_depth 0, kv reserved 0",
        |c, ev| {
            let d = deltas(c)?;
            let (a, q) = (
                metric_of(&d.after, "inferloop_active_slots")?,
                metric_of(&d.after, "inferloop_queue_depth")?,
            );
            ev.put("active_slots", a);
            ev.put("queue_depth", q);
            ensure!(a == 0.0 && q == 0.0, "0 and 0", format!("{a} and {q}"));
            let s = c.target.status()?;
            ensure_eq!("kv.reserved", s["kv"]["reserved"], json!(0));
            Ok("all zero".into())
        },
    )
    .exclusive();
    r.add(G, "load.burst.sixteen_short_requests", "Sixteen short requests at once are all served", "16 × 200 (slots plus queue absorb them)", |c, ev| {
        let out = parallel(16, |_| c.target.post(CHAT, &chat_body("Hi", 2)))?;
        let codes: Vec<u16> = out.iter().map(Response::status).collect();
        ev.put("statuses", json!(codes));
        let cap = c.facts.slots + c.facts.queue;
        if cap < 16 {
            return Err(Stop::skip(format!("the daemon admits only {cap} requests at once (slots + queue); this case needs 16")));
        }
        ensure!(codes.iter().all(|s| *s == 200), "16 × 200", format!("{codes:?}"));
        Ok("16 × 200".into())
    }).exclusive();
}
