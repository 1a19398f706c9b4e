//! `stream` cases: the text: equal to the non-streamed answer, stops, deltas, arrival.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.equals_non_stream.text",
        "A stream's text equals the non-streamed text",
        "same text at temperature 0",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let whole = text_of(&reference(c, CHAT, &chat_body(EXPLAIN, 16))?)?;
            ensure_eq!("text", cap.text(), whole);
            Ok("identical text".into())
        },
    );
    r.add(
        G,
        "stream.equals_non_stream.finish_reason",
        "A stream finishes for the same reason",
        "same finish_reason as the non-streamed answer",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let whole = reference(c, CHAT, &chat_body(EXPLAIN, 16))?;
            let f = cap
                .final_finish_reason()
                .map_err(|e| Stop::fail("one finish_reason", e))?;
            ensure_eq!("finish_reason", f, finish_of(&whole));
            Ok(format!("both {f}"))
        },
    );
    r.add(
        G,
        "stream.stop.no_leak",
        "A streamed stop never leaks",
        "text equals the non-streamed stopped text and holds no stop",
        |c, ev| {
            let free = text_of(&reference(c, CHAT, &chat_body(EXPLAIN, 16))?)?;
            let (stop, before) = pick_stop(&free)?;
            let cap = c.target.stream_ok(
                CHAT,
                &with(streaming(chat_body(EXPLAIN, 16)), "stop", json!(stop)),
            )?;
            ev.text("stream", &cap.describe());
            ensure_eq!("text", cap.text(), before);
            ensure!(
                !cap.raw_text().contains(&stop),
                format!("{stop:?} nowhere in the body"),
                "present"
            );
            Ok(format!("cut before {stop:?}"))
        },
    );
    r.add(
        G,
        "stream.stop.across_chunks",
        "A stop spanning two chunks is held back and caught",
        "a stop made of the end of one word and the start of the next cuts there",
        |c, ev| {
            let free = text_of(&reference(c, CHAT, &chat_body(EXPLAIN, 16))?)?;
            let words: Vec<&str> = free.split(' ').collect();
            let i = (2..words.len().saturating_sub(1))
                .find(|&i| {
                    words[i].len() >= 4
                        && words[i].is_ascii()
                        && words[i + 1].len() >= 3
                        && words[i + 1].is_ascii()
                })
                .ok_or_else(|| Stop::fail("two long words in the reference", free.clone()))?;
            let stop = format!("{} {}", &words[i][words[i].len() - 2..], &words[i + 1][..2]);
            let at = free
                .find(&stop)
                .ok_or_else(|| Stop::fail("the stop in the reference", free.clone()))?;
            let cap = c.target.stream_ok(
                CHAT,
                &with(streaming(chat_body(EXPLAIN, 16)), "stop", json!(stop)),
            )?;
            ev.text("stream", &cap.describe());
            ev.put("stop", stop.clone());
            ensure_eq!("text", cap.text(), free[..at].to_string());
            Ok(format!("cut before {stop:?}"))
        },
    );
    r.add(
        G,
        "stream.delta.content_strings",
        "Deltas carry text as strings",
        "every delta after the first has string content, or is empty on the finish chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for (i, ch) in chunks(&cap)?.iter().enumerate().skip(1) {
                let d = &ch["choices"][0]["delta"];
                let ok = d["content"].is_string()
                    || (d.as_object().is_some_and(|o| o.is_empty())
                        && !ch["choices"][0]["finish_reason"].is_null());
                ensure!(
                    ok,
                    format!("chunk {i}: delta.content a string (or {{}} with finish_reason)"),
                    d.to_string()
                );
            }
            Ok("string deltas".into())
        },
    );
    r.add(
        G,
        "stream.incremental.many_chunks",
        "Text arrives token by token, not in one piece",
        "at least 8 content frames for 16 tokens",
        |c, ev| {
            let body = streaming(chat_body("Write a long story about a dragon.", 16));
            let cap = c.target.stream_ok(CHAT, &body)?;
            ev.text("stream", &cap.describe());
            let n = cap.content_times().len();
            ensure!(n >= 8, "≥ 8 content frames", n.to_string());
            Ok(format!("{n} content frames"))
        },
    );
    r.add(
        G,
        "stream.incremental.arrival_spread",
        "Frames arrive as they are generated",
        "content frames arrive at ≥ 3 distinct times, the first well before the last",
        |c, ev| {
            let body = streaming(chat_body("Write a long story about a dragon.", 16));
            let cap = c.target.stream_ok(CHAT, &body)?;
            let times = cap.content_times();
            ev.put(
                "arrivals_ms",
                json!(times
                    .iter()
                    .map(|t| t.as_secs_f64() * 1000.0)
                    .collect::<Vec<_>>()),
            );
            let distinct: std::collections::BTreeSet<u128> =
                times.iter().map(|t| t.as_micros()).collect();
            ensure!(
                distinct.len() >= 3,
                "≥ 3 distinct arrival times",
                format!("{} over {} frames", distinct.len(), times.len())
            );
            let spread = times
                .last()
                .copied()
                .unwrap_or_default()
                .saturating_sub(times.first().copied().unwrap_or_default());
            ensure!(
                spread >= Duration::from_millis(2),
                "first and last frame ≥ 2 ms apart",
                format!("{spread:?}")
            );
            Ok(format!("{} arrival times over {spread:?}", distinct.len()))
        },
    );
    r.add(
        G,
        "stream.timings_on_finish",
        "The finish chunk carries the timings",
        "timings on the finish chunk, predicted_n = completion tokens",
        |c, ev| {
            let cap = usage_stream(c, ev)?;
            let finish = cap.choice_chunks().into_iter().last().unwrap_or_default();
            ensure!(
                finish["timings"].is_object(),
                "timings on the finish chunk",
                finish.to_string()
            );
            let u = cap
                .usage()
                .ok_or_else(|| Stop::fail("a usage chunk", cap.describe()))?;
            ensure_eq!(
                "predicted_n",
                finish["timings"]["predicted_n"],
                u["completion_tokens"]
            );
            Ok(format!("timings {}", finish["timings"]))
        },
    )
    .inferloopd_only("`timings` on the finish chunk (not in OpenAI's API)");
}
