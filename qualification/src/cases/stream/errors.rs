//! `stream` cases: errors before the first chunk, and concurrent streams.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.no_error_frames",
        "A healthy stream carries no error event",
        "no chunk with an `error` key",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let errs = cap.errors();
            ensure!(errs.is_empty(), "no error events", format!("{errs:?}"));
            Ok("no errors".into())
        },
    );
    r.add(G, "stream.heartbeat.no_long_silence", "A stream is never silent beyond the keep-alive period", "no gap between frames (or before the first) longer than 15 s, unless filled by a `:` comment", |c, ev| {
        // A prompt near the context makes the first gap (prefill) as long as this box allows.
        let long = "Tell me more about the weather in the mountains. ".repeat(60);
        let cap = c.target.stream_ok(CHAT, &streaming(chat_body(&long, 8)))?;
        ev.text("stream", &cap.describe());
        let mut last = cap.head_at;
        let mut worst = Duration::ZERO;
        for t in &cap.frames {
            worst = worst.max(t.at.saturating_sub(last));
            last = t.at;
        }
        ev.put("longest_gap_ms", worst.as_secs_f64() * 1000.0);
        ensure!(worst <= SILENCE_LIMIT, format!("gaps ≤ {SILENCE_LIMIT:?}"), format!("{worst:?}"));
        let comments = cap.frames.iter().filter(|t| matches!(t.frame, Frame::Comment(_))).count();
        Ok(format!("longest gap {worst:?}, {comments} keep-alive comments"))
    });
    r.add(
        G,
        "stream.errors.context_overflow_is_json",
        "A context overflow on a stream is a 400, not a stream",
        "400 context_length_exceeded JSON, not text/event-stream",
        |c, ev| {
            let body = streaming(chat_body("Hello", c.facts.ctx.max(1) as u32));
            let resp = c.target.post(CHAT, &body)?;
            ev.text("response", &resp.describe());
            let ct = resp.header("content-type").unwrap_or_default().to_string();
            ensure!(
                !ct.starts_with("text/event-stream"),
                "not an event stream",
                ct
            );
            expect_error(
                &resp,
                400,
                Some("messages"),
                Some("context_length_exceeded"),
            )?;
            Ok("400 context_length_exceeded before any chunk".into())
        },
    );
    r.add(
        G,
        "stream.errors.bad_param_is_json",
        "A bad parameter on a stream is a 400, not a stream",
        "temperature 5 with stream → 400 JSON naming temperature",
        |c, ev| {
            let resp = c.target.post(
                CHAT,
                &with(streaming(chat_body("Hi", 4)), "temperature", json!(5)),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 400, Some("temperature"), None)?;
            Ok("400 temperature".into())
        },
    );
    r.add(
        G,
        "stream.errors.unknown_model_is_json",
        "An unknown model on a stream is a 404, not a stream",
        "404 model_not_found JSON",
        |c, ev| {
            let resp = c.target.post(
                CHAT,
                &with(streaming(chat_body("Hi", 4)), "model", json!("gpt-4")),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 404, Some("model"), Some("model_not_found"))?;
            Ok("404 model_not_found".into())
        },
    );
    r.add(
        G,
        "stream.errors.options_without_stream",
        "stream_options without stream is refused",
        "400 naming stream_options",
        |c, ev| {
            let resp = c.target.post(
                CHAT,
                &with(
                    chat_body("Hi", 4),
                    "stream_options",
                    json!({"include_usage": true}),
                ),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 400, Some("stream_options"), None)?;
            Ok("400 stream_options".into())
        },
    );
    r.add(
        G,
        "stream.concurrent_ids_distinct",
        "Concurrent streams are distinct",
        "two parallel streams complete with different ids and the same greedy text",
        |c, ev| {
            let caps: Vec<Result<Capture, Stop>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| c.target.stream_ok(CHAT, &streaming(chat_body(EXPLAIN, 16))))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(Stop::fail("stream thread", "panicked")))
                    })
                    .collect()
            });
            let caps = caps.into_iter().collect::<Result<Vec<_>, _>>()?;
            let ids: Vec<Value> = caps
                .iter()
                .map(|c| {
                    c.chunks()
                        .ok()
                        .and_then(|ch| ch.first().map(|x| x["id"].clone()))
                        .unwrap_or_default()
                })
                .collect();
            ev.put("ids", json!(ids));
            ensure!(ids[0] != ids[1], "different ids", format!("{ids:?}"));
            ensure_eq!("texts", caps[0].text(), caps[1].text());
            Ok("distinct ids, same text".into())
        },
    );
    r.add(
        G,
        "stream.errors.queue_full_is_json",
        "A full queue refuses a stream with 429 before any chunk",
        "429 queue_full JSON with Retry-After, not an event stream",
        |c, ev| {
            let fx = c.fixture("queue1")?;
            let t = fx.target();
            crate::cases::load::fill_queue(&t, ev, |t, ev| {
                let cap = t.stream("/v1/completions", &counting(4, true))?;
                ev.text("overflow", &cap.describe());
                ensure!(
                    !cap.is_event_stream(),
                    "not an event stream",
                    cap.describe()
                );
                ensure_eq!("status", cap.status(), 429);
                let body: Value = serde_json::from_slice(&cap.raw)
                    .map_err(|e| Stop::fail("a JSON error body", e.to_string()))?;
                ensure_eq!("error.code", body["error"]["code"], json!("queue_full"));
                ensure!(
                    cap.head.header("retry-after").is_some(),
                    "a Retry-After header",
                    cap.head.describe()
                );
                Ok("429 queue_full before any chunk".into())
            })
        },
    )
    .fixture("queue1");
}
