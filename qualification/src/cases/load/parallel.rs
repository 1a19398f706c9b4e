//! `load` cases: parallel streams on the shared daemon.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
        "usage counts of each parallel answer equal its solo usage's; cached_tokens within the prompt",
        |c, ev| {
            let solos: Vec<Value> = (0..3).map(|i| solo(c, i)).collect::<Result<_, _>>()?;
            let out = parallel(3, |i| c.target.chat(&chat_body(PROMPTS[i], 8)))?;
            // The counts, not the whole object: `prompt_tokens_details.cached_tokens` rightly
            // differs when a request finds its prompt (the solo run's) cached.
            let counts = |v: &Value| {
                json!({
                    "prompt_tokens": v["prompt_tokens"],
                    "completion_tokens": v["completion_tokens"],
                    "total_tokens": v["total_tokens"],
                })
            };
            for (i, v) in out.iter().enumerate() {
                ev.put(&format!("usage_{i}"), v["usage"].clone());
                ensure_eq!(
                    format!("usage counts of request {i}"),
                    counts(&v["usage"]),
                    counts(&solos[i]["usage"])
                );
                let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
                ensure!(
                    cached.is_none_or(|n| Some(n) < v["usage"]["prompt_tokens"].as_u64()),
                    format!("request {i}: cached_tokens below prompt_tokens"),
                    format!("{}", v["usage"])
                );
            }
            Ok("usage independent".into())
        },
    );
}
