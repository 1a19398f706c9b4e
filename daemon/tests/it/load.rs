//! Scheduling under load: parallel streams stay independent, a full queue answers 429, a
//! long wait answers 503, and a client that leaves gives its slot back.

use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use serde_json::json;

use crate::harness::{
    assert_error, chat_body, counting_body, header, http, metric, shared, stream_text, text_of,
    Daemon, SETTLE,
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
async fn full_queue_answers_429_with_retry_after() {
    let d = Daemon::start(&["--slots", "1", "--queue", "1", "--ctx", "512"]);
    let running = occupy_slot(&d, 400).await;
    let waiting = tokio::spawn({
        let url = d.url("/v1/completions");
        async move {
            http()
                .post(url)
                .json(&counting_body(4, false))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    d.wait_status(SETTLE, "second request queued", |s| {
        s["queue"]["depth"] == 1
    })
    .await;
    assert_eq!(
        status_field(&d, "slots", "active").await,
        1,
        "first still running"
    );

    let resp = d.post("/v1/completions", &counting_body(4, false)).await;
    assert_eq!(header(&resp, "retry-after"), "1", "{:?}", resp.headers());
    let err = assert_error(resp, 429, None, Some("queue_full")).await;
    assert_eq!(err["type"], "rate_limit_error");

    drop(running);
    let queued = waiting.await.expect("task").expect("queued request");
    assert_eq!(
        queued, 200,
        "the queued request is served once the slot frees"
    );
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
    let d = Daemon::start(&["--slots", "1", "--queue", "1", "--ctx", "2048"]);
    let running = occupy_slot(&d, 1500).await;
    let leaver = abortable(&d, counting_body(4, false));
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
