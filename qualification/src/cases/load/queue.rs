//! `load` cases: queue overflow (429) and queue timeout (503).

use super::*;

pub(super) fn register(r: &mut Registry) {
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
}
