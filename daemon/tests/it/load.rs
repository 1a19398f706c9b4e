//! Scheduling under load: parallel streams stay independent, a full queue answers 429, a
//! long wait answers 503, and a client that leaves gives its slot back.

use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::harness::{
    assert_error, chat_body, counting_body, header, http, metric, parse_sse, shared,
    stream_finish_reason, stream_text, text_of, Daemon, SETTLE,
};

#[tokio::test]
async fn parallel_streams_each_match_their_solo_output() {
    let d = shared();
    let prompts = [
        "What is the capital of France?",
        "Name three colours of the rainbow.",
        "Why do cats purr?",
    ];
    let mut solo = Vec::new();
    for p in prompts {
        solo.push(text_of(&d.chat(&chat_body(p, 24)).await));
    }
    assert!(
        solo[0] != solo[1] && solo[1] != solo[2],
        "prompts must differ in output to prove independence: {solo:?}"
    );

    // Eight streams on four slots: half decode together, half wait in the queue.
    let streams = (0..8).map(|i| async move {
        let mut body = chat_body(prompts[i % 3], 24);
        body["stream"] = json!(true);
        let chunks = d.stream("/v1/chat/completions", &body).await;
        (i, stream_text(&chunks))
    });
    for (i, text) in join_all(streams).await {
        assert_eq!(text, solo[i % 3], "stream {i} ({:?})", prompts[i % 3]);
    }
}

/// Starts a streaming request that keeps its slot busy, and waits until it has a slot.
async fn occupy_slot(d: &Daemon, max_tokens: u32) -> reqwest::Response {
    let resp = d
        .post("/v1/completions", &counting_body(max_tokens, true))
        .await;
    assert_eq!(resp.status(), 200, "{}", d.log_tail());
    resp
}

async fn status_field(d: &Daemon, section: &str, field: &str) -> u64 {
    d.status().await[section][field]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[tokio::test]
async fn queue_wait_past_the_timeout_answers_503() {
    let d = Daemon::start(&[
        "--slots",
        "1",
        "--queue",
        "4",
        "--queue-timeout-ms",
        "300",
        "--ctx",
        "1024",
    ]);
    let _running = occupy_slot(&d, 900).await;
    let t0 = Instant::now();
    let (plain, stream) = (counting_body(4, false), counting_body(4, true));
    let (plain, stream) = tokio::join!(
        d.post("/v1/completions", &plain),
        d.post("/v1/completions", &stream),
    );
    let waited = t0.elapsed();
    assert_eq!(
        status_field(&d, "slots", "active").await,
        1,
        "first still running"
    );
    for resp in [plain, stream] {
        assert_eq!(header(&resp, "retry-after"), "1", "{:?}", resp.headers());
        let err = assert_error(resp, 503, None, Some("queue_timeout")).await;
        assert_eq!(err["type"], "server_error");
    }
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}, before the 300 ms timeout"
    );
}

/// Long enough that a slot that is not freed would stay busy for many seconds.
const LONG: u32 = 3000;

fn long_daemon() -> Daemon {
    Daemon::start(&["--slots", "1", "--ctx", "4096"])
}

/// After a client left: the next request is admitted at once, the gauges return to zero and
/// the cancellation is counted.
async fn assert_slot_freed(d: &Daemon, cancelled_before: f64) {
    let v = d.complete(&counting_body(4, false)).await;
    let queue_ms = v["timings"]["queue_ms"].as_f64().expect("queue_ms");
    assert!(
        queue_ms < 2000.0,
        "follow-up waited {queue_ms} ms for a slot: the request that left kept it"
    );
    let m = d
        .wait_metrics(SETTLE, "gauges back to zero", |m| {
            metric(m, "inferloop_active_slots") == 0.0 && metric(m, "inferloop_queue_depth") == 0.0
        })
        .await;
    assert_eq!(
        metric(&m, "inferloop_cancelled_total"),
        cancelled_before + 1.0,
        "one cancellation counted\n{m}"
    );
}

#[tokio::test]
async fn dropped_stream_frees_its_slot() {
    let d = long_daemon();
    let before = metric(&d.metrics().await, "inferloop_cancelled_total");
    let resp = occupy_slot(&d, LONG).await;
    let mut body = resp.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        let chunk = body.next().await.expect("stream open").expect("chunk");
        seen += chunk.windows(6).filter(|w| w == b"data: ").count();
    }
    assert_eq!(status_field(&d, "slots", "active").await, 1);
    drop(body);
    assert_slot_freed(&d, before).await;
}

#[tokio::test]
async fn non_stream_client_that_times_out_frees_its_slot() {
    let d = long_daemon();
    let before = metric(&d.metrics().await, "inferloop_cancelled_total");
    let client = tokio::spawn({
        let url = d.url("/v1/completions");
        async move {
            http()
                .post(url)
                .json(&counting_body(LONG, false))
                .timeout(Duration::from_secs(3))
                .send()
                .await
        }
    });
    // The client must leave while its request decodes, not while it waits to be admitted.
    d.wait_status(Duration::from_secs(3), "request admitted", |s| {
        s["slots"]["active"] == 1
    })
    .await;
    let err = client
        .await
        .expect("task")
        .expect_err("a 3000-token answer cannot arrive within 3 s");
    assert!(err.is_timeout(), "{err}");
    assert_slot_freed(&d, before).await;
}

/// Sends a request from a task that can be aborted, which closes its connection.
fn abortable(d: &Daemon, body: serde_json::Value) -> tokio::task::JoinHandle<Option<u16>> {
    let url = d.url("/v1/completions");
    tokio::spawn(async move {
        let resp = http().post(url).json(&body).send().await;
        resp.ok().map(|r| r.status().as_u16())
    })
}

#[tokio::test]
async fn waiter_that_left_gives_up_its_queue_place() {
    waiter_that_left(false).await;
}

/// A queued stream that left must not keep its place either: its connection is probed
/// (its read-EOF alone may be a half-close).
#[tokio::test]
async fn streaming_waiter_that_left_gives_up_its_queue_place() {
    waiter_that_left(true).await;
}

async fn waiter_that_left(stream: bool) {
    let d = Daemon::start(&["--slots", "1", "--queue", "1", "--ctx", "2048"]);
    let running = occupy_slot(&d, 1500).await;
    let leaver = abortable(&d, counting_body(4, stream));
    d.wait_status(SETTLE, "second request queued", |s| {
        s["queue"]["depth"] == 1
    })
    .await;
    leaver.abort();
    d.wait_status(SETTLE, "the waiter that left is dropped", |s| {
        s["queue"]["depth"] == 0
    })
    .await;

    // The queue's only place is free again: the next request waits instead of a 429.
    let next = abortable(&d, counting_body(4, false));
    d.wait_status(SETTLE, "next request queued", |s| {
        next.is_finished() || s["queue"]["depth"] == 1
    })
    .await;
    if next.is_finished() {
        let status = next.await.expect("task");
        panic!("next request was answered while the slot was busy: {status:?}");
    }
    drop(running);
    assert_eq!(next.await.expect("task"), Some(200));
}

/// What each client of a burst saw within the wait: the status code, or nothing (still queued).
fn burst_statuses(addr: std::net::SocketAddr, n: usize, wait: Duration) -> Vec<Option<u16>> {
    use std::io::{Read, Write};
    let body = counting_body(LONG, true).to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        addr,
        body.len()
    );
    let (head, last) = request.as_bytes().split_at(request.len() - 1);
    // Everything but the last byte first; then the last bytes back to back, so the daemon
    // receives n complete requests at (nearly) the same instant: the barrier.
    let mut socks: Vec<std::net::TcpStream> = (0..n)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_nodelay(true).expect("nodelay");
            s.write_all(head).expect("head");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    for s in &mut socks {
        s.write_all(last).expect("last byte");
    }
    let readers: Vec<_> = socks
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(wait)).expect("timeout");
                let mut line = [0u8; 12];
                let status = s
                    .read_exact(&mut line)
                    .ok()
                    .and_then(|()| std::str::from_utf8(&line[9..12]).ok()?.parse().ok());
                (status, s)
            })
        })
        .collect();
    let results: Vec<_> = readers
        .into_iter()
        .map(|r| r.join().expect("reader"))
        .collect();
    // Dropping the sockets cancels every request of the burst.
    results.into_iter().map(|(status, _sock)| status).collect()
}

async fn burst(d: &Daemon, n: usize, wait: Duration) -> Vec<Option<u16>> {
    let addr = d.addr();
    tokio::task::spawn_blocking(move || burst_statuses(addr, n, wait))
        .await
        .expect("burst task")
}

fn count(statuses: &[Option<u16>], want: Option<u16>) -> usize {
    statuses.iter().filter(|s| **s == want).count()
}

async fn wait_idle(d: &Daemon) {
    d.wait_metrics(SETTLE, "gauges back to zero after the burst", |m| {
        metric(m, "inferloop_active_slots") == 0.0 && metric(m, "inferloop_queue_depth") == 0.0
    })
    .await;
}

/// Regression: simultaneous arrivals on an idle server were judged against the raw queue
/// length before any of them was admitted, so `--slots 4 --queue 1` refused two of four.
#[tokio::test]
async fn simultaneous_burst_is_refused_only_when_slots_and_queue_are_full() {
    let d = Daemon::start(&["--slots", "4", "--queue", "1", "--ctx", "4096"]);
    for trial in 0..10 {
        let s = burst(&d, 4, Duration::from_secs(5)).await;
        assert_eq!(count(&s, Some(200)), 4, "trial {trial}: {s:?}");
        wait_idle(&d).await;
    }
    for trial in 0..3 {
        let s = burst(&d, 6, Duration::from_secs(3)).await;
        assert_eq!(count(&s, Some(200)), 4, "trial {trial}: {s:?}");
        assert_eq!(count(&s, None), 1, "one waits in the queue: {s:?}");
        assert_eq!(count(&s, Some(429)), 1, "trial {trial}: {s:?}");
        wait_idle(&d).await;
    }
}

#[tokio::test]
async fn burst_of_32_over_4_slots_and_8_queued_gets_exactly_20_refusals() {
    let d = Daemon::start(&["--slots", "4", "--queue", "8", "--ctx", "4096"]);
    for trial in 0..3 {
        let s = burst(&d, 32, Duration::from_secs(3)).await;
        assert_eq!(count(&s, Some(429)), 20, "trial {trial}: {s:?}");
        assert_eq!(count(&s, Some(200)), 4, "trial {trial}: {s:?}");
        assert_eq!(count(&s, None), 8, "trial {trial}: {s:?}");
        wait_idle(&d).await;
    }
}

/// Sends a complete request, half-closes (`shutdown(SHUT_WR)`, as `nc -N` does) and reads
/// the answer to its end: the status and the de-chunked body.
fn half_closed_exchange(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, String) {
    use std::io::{Read, Write};
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(request.as_bytes()).expect("request");
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    s.set_read_timeout(Some(SETTLE)).expect("timeout");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer to EOF");
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer after a half-close: {text:?}"));
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line: {head:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").expect("chunk end");
    }
}

/// Regression: hyper took the read-EOF of a half-close as "client gone" and dropped the
/// connection, so such a client got no answer at all.
#[tokio::test]
async fn half_closed_client_gets_the_whole_json_answer() {
    let addr = shared().addr();
    let (status, body) = tokio::task::spawn_blocking(move || {
        half_closed_exchange(addr, "/v1/completions", &counting_body(40, false))
    })
    .await
    .expect("client thread");
    assert_eq!(status, 200, "{body}");
    // While the answer is generated the daemon writes newlines to tell a half-closed client
    // from one that left; leading whitespace is valid JSON.
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
}

#[tokio::test]
async fn half_closed_client_gets_the_whole_stream() {
    let addr = shared().addr();
    let (status, body) = tokio::task::spawn_blocking(move || {
        half_closed_exchange(addr, "/v1/completions", &counting_body(40, true))
    })
    .await
    .expect("client thread");
    assert_eq!(status, 200, "{body}");
    // A half-closed stream is probed with SSE comments, which every SSE client skips.
    let body = body.replace(": keep-alive\n\n", "");
    let chunks = parse_sse(&body);
    assert_eq!(stream_finish_reason(&chunks), "length");
    assert!(!stream_text(&chunks).is_empty(), "{body}");
}
