//! `load`: parallel streams stay independent and correct, requests fan out across the slots,
//! a full queue answers 429 with Retry-After, a long wait 503, a client that leaves gives its
//! slot back within a step, and the metrics return to zero.

use std::io::Write;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::reference;
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::http::{self, Conn, Exchange, Request, Response};
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
fn send_and_hold(t: &Target, path: &str, body: &Value) -> Result<Conn, Stop> {
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
    /// From seeing the extra request queued to releasing the slots: a floor on its queue time.
    held_ms: f64,
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
        let seen_queued = Instant::now();
        // Hold the slots a while longer so the waiter's queue time has a known floor.
        std::thread::sleep(Duration::from_millis(150));
        let held_ms = seen_queued.elapsed().as_secs_f64() * 1000.0;
        drop(held);
        let waiter = crate::target::json_200(&join(extra)?, "the queued request")?;
        Ok(FanOut {
            slots,
            status_full,
            status_queued,
            waiter,
            held_ms,
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

mod cancel;
mod counts;
mod fanout;
mod parallel;
mod queue;

/// The group's cases, section by section, in report order.
pub fn register(r: &mut Registry) {
    parallel::register(r);
    fanout::register(r);
    queue::register(r);
    cancel::register(r);
    counts::register(r);
}
