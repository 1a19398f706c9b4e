//! `stream` cases: the usage chunk.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.usage.absent_by_default",
        "Without include_usage no chunk has usage",
        "no `usage` key on any chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let with_usage = chunks(&cap)?
                .iter()
                .filter(|c| c.get("usage").is_some())
                .count();
            ensure_eq!("chunks with a usage key", with_usage, 0);
            Ok("no usage".into())
        },
    );
    r.add(
        G,
        "stream.usage.final_chunk",
        "include_usage adds a final usage chunk",
        "last chunk: choices [] and a usage object, same id",
        |c, ev| {
            let cap = usage_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let last = ch.last().cloned().unwrap_or_default();
            ensure_eq!("last chunk choices", last["choices"], json!([]));
            ensure!(
                last["usage"].is_object(),
                "a usage object",
                last.to_string()
            );
            ensure_eq!("id", last["id"], ch[0]["id"]);
            Ok(format!("usage {}", last["usage"]))
        },
    );
    r.add(
        G,
        "stream.usage.null_before_last",
        "Earlier chunks carry usage: null",
        "every chunk before the last has usage null",
        |c, ev| {
            let cap = usage_stream(c, ev)?;
            let ch = chunks(&cap)?;
            for (i, chunk) in ch[..ch.len() - 1].iter().enumerate() {
                ensure!(
                    chunk
                        .as_object()
                        .is_some_and(|o| o.get("usage") == Some(&Value::Null)),
                    format!("chunk {i}: usage null"),
                    chunk.to_string()
                );
            }
            Ok(format!("{} chunks with usage null", ch.len() - 1))
        },
    );
    r.add(
        G,
        "stream.usage.adds_up",
        "Streamed usage adds up",
        "total = prompt + completion, 1 ≤ completion ≤ max_tokens",
        |c, ev| {
            let cap = usage_stream(c, ev)?;
            let u = cap
                .usage()
                .ok_or_else(|| Stop::fail("a usage chunk", cap.describe()))?;
            let (p, q, t) = (
                u64_at(&u, "/prompt_tokens")?,
                u64_at(&u, "/completion_tokens")?,
                u64_at(&u, "/total_tokens")?,
            );
            ensure_eq!("total_tokens", t, p + q);
            ensure!(
                (1..=16).contains(&q) && p > 0,
                "prompt > 0, completion in 1..=16",
                u.to_string()
            );
            Ok(format!("{p} + {q} = {t}"))
        },
    );
    r.add(
        G,
        "stream.usage.matches_non_stream",
        "Streamed usage equals the non-streamed usage",
        "same prompt and completion tokens",
        |c, ev| {
            let cap = usage_stream(c, ev)?;
            let whole = reference(c, CHAT, &chat_body(EXPLAIN, 16))?;
            let u = cap
                .usage()
                .ok_or_else(|| Stop::fail("a usage chunk", cap.describe()))?;
            // The counts, not the whole object: OpenAI's `prompt_tokens_details.cached_tokens`
            // rightly differs between two calls when the second finds the prompt cached.
            let counts = |v: &Value| {
                json!({
                    "prompt_tokens": v["prompt_tokens"],
                    "completion_tokens": v["completion_tokens"],
                    "total_tokens": v["total_tokens"],
                })
            };
            ensure_eq!("usage", counts(&u), counts(&whole["usage"]));
            Ok(format!("usage {u}"))
        },
    );
    r.add(
        G,
        "stream.usage.false_means_none",
        "include_usage false adds no usage chunk",
        "no usage key on any chunk",
        |c, ev| {
            let body = with(
                streaming(chat_body("Hi", 4)),
                "stream_options",
                json!({"include_usage": false}),
            );
            let cap = c.target.stream_ok(CHAT, &body)?;
            ev.text("stream", &cap.describe());
            let n = chunks(&cap)?
                .iter()
                .filter(|c| c.get("usage").is_some())
                .count();
            ensure_eq!("chunks with usage", n, 0);
            Ok("no usage".into())
        },
    );
}
