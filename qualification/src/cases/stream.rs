//! `stream`: server-sent events in the OpenAI shape: framing, role first, one id,
//! `finish_reason` on the last choice chunk, the usage chunk, `[DONE]` last, the same text as
//! the non-streamed answer, and errors that arrive before any chunk.

use std::time::Duration;

use serde_json::{json, Value};

use super::{pick_stop, reference, EXPLAIN};
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::sse::{Capture, Frame};
use crate::target::{
    chat_body, counting, expect_error, finish_of, streaming, text_of, u64_at, with,
};
use crate::{ensure, ensure_eq};

const G: Group = Group::Stream;
const CHAT: &str = "/v1/chat/completions";
/// The daemon's keep-alive period, plus slack for a busy machine.
const SILENCE_LIMIT: Duration = Duration::from_secs(15);

/// One streamed greedy answer to [`EXPLAIN`], shared by the framing cases.
fn explain_stream(c: &Ctx, ev: &mut Evidence) -> Result<Capture, Stop> {
    let t = c.target.clone();
    let cap = (*c.memo("stream explain", move || {
        t.stream_ok(CHAT, &streaming(chat_body(EXPLAIN, 16)))
    }))
    .clone()?;
    ev.text("stream", &cap.describe());
    Ok(cap)
}

/// The same with `include_usage`.
fn usage_stream(c: &Ctx, ev: &mut Evidence) -> Result<Capture, Stop> {
    let t = c.target.clone();
    let cap = (*c.memo("stream explain usage", move || {
        let body = with(
            streaming(chat_body(EXPLAIN, 16)),
            "stream_options",
            json!({"include_usage": true}),
        );
        t.stream_ok(CHAT, &body)
    }))
    .clone()?;
    ev.text("stream", &cap.describe());
    Ok(cap)
}

fn chunks(cap: &Capture) -> Result<Vec<Value>, Stop> {
    let chunks = cap
        .chunks()
        .map_err(|e| Stop::fail("every data frame is a JSON object", e))?;
    if chunks.is_empty() {
        return Err(Stop::fail("at least one chunk", cap.describe()));
    }
    Ok(chunks)
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.content_type",
        "A stream is served as text/event-stream",
        "200, Content-Type text/event-stream",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ct = cap
                .head
                .header("content-type")
                .unwrap_or_default()
                .to_string();
            ensure!(ct.starts_with("text/event-stream"), "text/event-stream", ct);
            Ok(ct)
        },
    );
    r.add(
        G,
        "stream.cache_control",
        "A stream is not cached",
        "Cache-Control: no-cache",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let cc = cap
                .head
                .header("cache-control")
                .unwrap_or_default()
                .to_string();
            ensure!(cc.contains("no-cache"), "no-cache", cc);
            Ok(cc)
        },
    );
    r.add(
        G,
        "stream.framing.data_frames",
        "Every event is one `data:` line followed by a blank line",
        "only `data: <one line>` frames (or `:` comments), body ends on a frame boundary",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let bad: Vec<&Frame> = cap
                .frames
                .iter()
                .map(|t| &t.frame)
                .filter(|f| matches!(f, Frame::Other(_)))
                .collect();
            ensure!(
                bad.is_empty(),
                "no multi-line or non-data frames",
                format!("{bad:?}")
            );
            ensure!(
                cap.trailing.is_empty(),
                "no bytes after the last blank line",
                format!("{:?}", cap.trailing)
            );
            Ok(format!("{} well-formed frames", cap.frames.len()))
        },
    );
    r.add(
        G,
        "stream.done_last",
        "The stream ends with data: [DONE]",
        "the last frame is `data: [DONE]` and nothing follows",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let last = cap
                .frames
                .last()
                .map(|t| format!("{:?}", t.frame))
                .unwrap_or_default();
            ensure!(
                cap.ends_with_done(),
                "last frame `data: [DONE]`",
                format!("last frame {last}, trailing {:?}", cap.trailing)
            );
            Ok("ends with [DONE]".into())
        },
    );
    r.add(
        G,
        "stream.done_once",
        "[DONE] is sent exactly once",
        "one `data: [DONE]` frame",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            ensure_eq!("[DONE] frames", cap.done_count(), 1);
            Ok("one [DONE]".into())
        },
    );
    r.add(
        G,
        "stream.chunks_json",
        "Every chunk is a JSON object",
        "each data frame before [DONE] parses as a JSON object",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let n = chunks(&cap)?.len();
            Ok(format!("{n} JSON chunks"))
        },
    );
    r.add(
        G,
        "stream.role_first",
        "The first chunk carries the assistant role",
        "chunks[0].choices[0].delta.role == \"assistant\"",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            ensure_eq!(
                "first delta.role",
                ch[0]["choices"][0]["delta"]["role"],
                json!("assistant")
            );
            Ok("role first".into())
        },
    );
    r.add(
        G,
        "stream.role_only_first",
        "Only the first chunk carries the role",
        "no later delta has a role",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let late: Vec<usize> = ch
                .iter()
                .enumerate()
                .skip(1)
                .filter(|(_, c)| c["choices"][0]["delta"].get("role").is_some())
                .map(|(i, _)| i)
                .collect();
            ensure!(
                late.is_empty(),
                "role on chunk 0 only",
                format!("role also on chunks {late:?}")
            );
            Ok("role once".into())
        },
    );
    r.add(
        G,
        "stream.id_constant",
        "Every chunk has the same id",
        "one id across the stream",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let ids: std::collections::BTreeSet<String> =
                ch.iter().map(|c| c["id"].to_string()).collect();
            ensure_eq!("distinct ids", ids.len(), 1);
            Ok(format!("id {}", ch[0]["id"]))
        },
    );
    r.add(
        G,
        "stream.id_prefix",
        "A chat stream's id is chatcmpl-…",
        "id starts with chatcmpl-",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let id = chunks(&cap)?[0]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ensure!(id.starts_with("chatcmpl-"), "chatcmpl-…", id);
            Ok(id)
        },
    );
    r.add(
        G,
        "stream.object_chunk",
        "Every chunk is a chat.completion.chunk",
        "object \"chat.completion.chunk\" on every chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!("object", ch["object"], json!("chat.completion.chunk"));
            }
            Ok("all chat.completion.chunk".into())
        },
    );
    r.add(
        G,
        "stream.model_field",
        "Every chunk names the served model",
        "model equals the /v1/models id on every chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!("model", ch["model"], json!(c.facts.model_id));
            }
            Ok(format!("model {}", c.facts.model_id))
        },
    );
    r.add(
        G,
        "stream.created_constant",
        "Every chunk has the same created time",
        "one created value, a plausible Unix time",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let set: std::collections::BTreeSet<String> =
                ch.iter().map(|c| c["created"].to_string()).collect();
            ensure_eq!("distinct created values", set.len(), 1);
            ensure!(
                ch[0]["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
                "a Unix time",
                ch[0]["created"].to_string()
            );
            Ok(format!("created {}", ch[0]["created"]))
        },
    );
    r.add(
        G,
        "stream.choice_index_zero",
        "Each chunk has one choice, index 0",
        "choices length 1 and index 0 on every choice chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!(
                    "choices length",
                    ch["choices"].as_array().map(Vec::len),
                    Some(1)
                );
                ensure_eq!("index", ch["choices"][0]["index"], json!(0));
            }
            Ok("one choice each".into())
        },
    );
    r.add(
        G,
        "stream.finish_reason.last_choice_chunk",
        "finish_reason is set on the last choice chunk only",
        "null on every chunk but the last choice chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let f = cap
                .final_finish_reason()
                .map_err(|e| Stop::fail("finish_reason only on the last choice chunk", e))?;
            Ok(format!("finish_reason {f} on the last chunk"))
        },
    );
    r.add(
        G,
        "stream.finish_reason.length",
        "A stream cut by max_tokens finishes with length",
        "finish_reason length after exactly max_tokens tokens",
        |c, ev| {
            let body = with(
                streaming(chat_body("Write a long story about a dragon.", 6)),
                "stream_options",
                json!({"include_usage": true}),
            );
            let cap = c.target.stream_ok(CHAT, &body)?;
            ev.text("stream", &cap.describe());
            let f = cap
                .final_finish_reason()
                .map_err(|e| Stop::fail("one finish_reason", e))?;
            ensure_eq!("finish_reason", f, "length");
            let n = cap.usage().and_then(|u| u["completion_tokens"].as_u64());
            ensure_eq!("completion_tokens", n, Some(6));
            Ok("length after 6".into())
        },
    );
    r.add(
        G,
        "stream.finish_reason.stop_on_stop_string",
        "A stream ended by a stop string finishes with stop",
        "finish_reason stop",
        |c, ev| {
            let free = text_of(&reference(c, CHAT, &chat_body(EXPLAIN, 16))?)?;
            let (stop, _) = pick_stop(&free)?;
            let cap = c.target.stream_ok(
                CHAT,
                &with(streaming(chat_body(EXPLAIN, 16)), "stop", json!(stop)),
            )?;
            ev.text("stream", &cap.describe());
            let f = cap
                .final_finish_reason()
                .map_err(|e| Stop::fail("one finish_reason", e))?;
            ensure_eq!("finish_reason", f, "stop");
            Ok("stop".into())
        },
    );
    r.add(
        G,
        "stream.finish_reason.stop_on_eos",
        "A stream the model ends itself finishes with stop",
        "finish_reason stop for a short-answer prompt",
        |c, ev| {
            let cap = c
                .target
                .stream_ok(CHAT, &streaming(chat_body("Say OK.", 64)))?;
            ev.text("stream", &cap.describe());
            let f = cap
                .final_finish_reason()
                .map_err(|e| Stop::fail("one finish_reason", e))?;
            ensure_eq!("finish_reason", f, "stop");
            Ok("stop".into())
        },
    );
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
            ensure_eq!("usage", u, whole["usage"]);
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
    );
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
