//! `completions`: the legacy `/v1/completions` endpoint: its fields, the 16-token default,
//! echo of the prompt, stops and streaming.

use serde_json::{json, Value};

use super::reference;
use crate::case::{Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::target::{counting, finish_of, streaming, text_of, u64_at, with, COUNTING};
use crate::{ensure, ensure_eq};

const G: Group = Group::Completions;
const PATH: &str = "/v1/completions";

/// The greedy continuation of [`COUNTING`] with 12 tokens.
fn base(c: &Ctx) -> Result<(Value, String), Stop> {
    let v = reference(c, PATH, &counting(12, false))?;
    let t = text_of(&v)?;
    Ok((v, t))
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "completions.shape.choice_fields",
        "A completion choice has the legacy fields",
        "index 0, text string, logprobs null, finish_reason string",
        |c, ev| {
            let (v, _) = base(c)?;
            let ch = &v["choices"][0];
            ev.put("choice", ch.clone());
            ensure_eq!("index", ch["index"], json!(0));
            ensure!(ch["text"].is_string(), "text: string", ch.to_string());
            ensure!(
                ch.as_object()
                    .is_some_and(|o| o.get("logprobs") == Some(&Value::Null)),
                "logprobs: null",
                ch.to_string()
            );
            ensure!(
                ch["finish_reason"].is_string(),
                "finish_reason: string",
                ch.to_string()
            );
            Ok("legacy fields".into())
        },
    );
    r.add(
        G,
        "completions.shape.one_choice",
        "A completion holds exactly one choice",
        "choices length 1",
        |c, ev| {
            let (v, _) = base(c)?;
            ev.put("choices", v["choices"].clone());
            ensure_eq!(
                "choices length",
                v["choices"].as_array().map(Vec::len),
                Some(1)
            );
            Ok("one choice".into())
        },
    );
    r.add(
        G,
        "completions.shape.system_fingerprint",
        "A completion carries a system fingerprint",
        "non-empty string",
        |c, ev| {
            let (v, _) = base(c)?;
            ev.put("system_fingerprint", v["system_fingerprint"].clone());
            ensure!(
                v["system_fingerprint"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "a non-empty string",
                v["system_fingerprint"].to_string()
            );
            Ok(v["system_fingerprint"].to_string())
        },
    );
    r.add(
        G,
        "completions.usage.adds_up",
        "Completion usage adds up",
        "total = prompt + completion, completion = 12",
        |c, ev| {
            let (v, _) = base(c)?;
            ev.put("usage", v["usage"].clone());
            let (p, q, t) = (
                u64_at(&v, "/usage/prompt_tokens")?,
                u64_at(&v, "/usage/completion_tokens")?,
                u64_at(&v, "/usage/total_tokens")?,
            );
            ensure_eq!("total_tokens", t, p + q);
            ensure_eq!("completion_tokens", q, 12);
            Ok(format!("{p} + {q} = {t}"))
        },
    );
    r.add(
        G,
        "completions.usage.prompt_counts_the_prompt",
        "prompt_tokens counts the raw prompt",
        "prompt_tokens ≥ 12 for a 12-number prompt (no template added)",
        |c, ev| {
            let (v, _) = base(c)?;
            let p = u64_at(&v, "/usage/prompt_tokens")?;
            ev.put("prompt_tokens", p);
            ensure!(p >= 12, "≥ 12", p.to_string());
            Ok(format!("{p} prompt tokens"))
        },
    );
    r.add(G, "completions.timings.present", "A completion carries timings", "timings with prompt_n, prompt_ms, predicted_n, predicted_ms, predicted_per_second, queue_ms", |c, ev| {
        let (v, _) = base(c)?;
        ev.put("timings", v["timings"].clone());
        for k in ["prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "queue_ms"] {
            ensure!(v["timings"][k].is_number(), format!("timings.{k}: number"), v["timings"].to_string());
        }
        Ok("present".into())
    })
    .inferloopd_only("timings.queue_ms (llama-server's timings have none)");
    r.add(
        G,
        "completions.timings.match_usage",
        "Timings agree with usage",
        "prompt_n + cache_n = prompt_tokens, cache_n = usage's cached_tokens, predicted_n = completion_tokens",
        |c, ev| {
            let (v, _) = base(c)?;
            ev.put("timings", v["timings"].clone());
            ev.put("usage", v["usage"].clone());
            // A prompt seen before is partly reused: prompt_n counts only what was evaluated.
            let n = |p: &str| v.pointer(p).and_then(Value::as_u64);
            ensure_eq!(
                "prompt_n + cache_n",
                n("/timings/prompt_n").zip(n("/timings/cache_n")).map(|(a, b)| a + b),
                n("/usage/prompt_tokens")
            );
            ensure_eq!(
                "cache_n",
                n("/timings/cache_n"),
                n("/usage/prompt_tokens_details/cached_tokens")
            );
            ensure_eq!(
                "predicted_n",
                v["timings"]["predicted_n"],
                v["usage"]["completion_tokens"]
            );
            Ok("agree".into())
        },
    )
    .inferloopd_only("timings.cache_n matching usage.prompt_tokens_details.cached_tokens (llama-server's usage need not carry it)");
    r.add(
        G,
        "completions.default_max_tokens_16",
        "Without max_tokens a completion stops at 16 tokens",
        "16 completion tokens, finish_reason length (OpenAI's legacy default)",
        |c, ev| {
            let v = c
                .target
                .complete(&json!({"prompt": COUNTING, "temperature": 0}))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                16
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("16 tokens".into())
        },
    );
    r.add(
        G,
        "completions.max_tokens.length",
        "max_tokens ends a completion with length",
        "12 tokens, finish_reason length",
        |c, ev| {
            let (v, _) = base(c)?;
            ev.put("finish_reason", finish_of(&v));
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("length".into())
        },
    );
    r.add(
        G,
        "completions.max_tokens.one",
        "max_tokens 1 gives one token",
        "1 token, length",
        |c, ev| {
            let v = c.target.complete(&counting(1, false))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                1
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("1 token".into())
        },
    );
    r.add(
        G,
        "completions.determinism.temp0",
        "Greedy completions repeat",
        "two requests, same text",
        |c, ev| {
            let (_, a) = base(c)?;
            let b = text_of(&c.target.complete(&counting(12, false))?)?;
            ev.put("texts", json!([a, b]));
            ensure!(a == b, format!("{a:?}"), b);
            Ok("identical".into())
        },
    );
    r.add(
        G,
        "completions.determinism.prefix_consistent",
        "A shorter completion is a prefix of a longer one",
        "text(4) ⊑ text(12)",
        |c, ev| {
            let (_, long) = base(c)?;
            let short = text_of(&c.target.complete(&counting(4, false))?)?;
            ev.put("short", short.clone());
            ev.put("long", long.clone());
            ensure!(
                long.starts_with(&short),
                format!("a prefix of {long:?}"),
                short
            );
            Ok("prefix".into())
        },
    );
    r.add(
        G,
        "completions.continues_prompt",
        "A completion continues the prompt",
        "the greedy continuation of \"1, 2, …, 12,\" starts with \" 13\"",
        |c, ev| {
            let (_, t) = base(c)?;
            ev.put("text", t.clone());
            ensure!(t.starts_with(" 13"), "starts with \" 13\"", t);
            Ok(format!("{t:?}"))
        },
    );
    r.add(
        G,
        "completions.echo.prefix",
        "echo returns the prompt before the completion",
        "text starts with the prompt",
        |c, ev| {
            let v = c
                .target
                .complete(&with(counting(4, false), "echo", json!(true)))?;
            let t = text_of(&v)?;
            ev.put("text", t.clone());
            ensure!(
                t.starts_with(COUNTING),
                format!("starts with {COUNTING:?}"),
                t
            );
            Ok("echoed".into())
        },
    );
    r.add(
        G,
        "completions.echo.prompt_plus_text",
        "echo is exactly prompt + completion",
        "echo text == prompt + the non-echo text",
        |c, ev| {
            let plain = text_of(&c.target.complete(&counting(4, false))?)?;
            let echoed = text_of(&c.target.complete(&with(
                counting(4, false),
                "echo",
                json!(true),
            ))?)?;
            ev.put("plain", plain.clone());
            ev.put("echoed", echoed.clone());
            ensure_eq!("echoed text", echoed, format!("{COUNTING}{plain}"));
            Ok("prompt + text".into())
        },
    );
    r.add(
        G,
        "completions.echo.false_no_prompt",
        "Without echo the prompt is not repeated",
        "text does not start with the prompt",
        |c, ev| {
            let v = c
                .target
                .complete(&with(counting(4, false), "echo", json!(false)))?;
            let t = text_of(&v)?;
            ev.put("text", t.clone());
            ensure!(!t.starts_with(COUNTING), "no prompt in the text", t);
            Ok("not echoed".into())
        },
    );
    r.add(
        G,
        "completions.echo.usage_unchanged",
        "echo does not change the token counts",
        "usage equal with and without echo",
        |c, ev| {
            let a = c.target.complete(&counting(4, false))?;
            let b = c
                .target
                .complete(&with(counting(4, false), "echo", json!(true)))?;
            ev.put("usage", json!([a["usage"], b["usage"]]));
            ensure_eq!("usage", b["usage"], a["usage"]);
            Ok("same usage".into())
        },
    );
    r.add(
        G,
        "completions.stop.single",
        "A stop string ends a completion before it",
        "text up to \" 15\", finish_reason stop",
        |c, ev| {
            let (_, free) = base(c)?;
            let at = free
                .find(" 15")
                .ok_or_else(|| Stop::fail("\" 15\" in the reference", free.clone()))?;
            let v = c
                .target
                .complete(&with(counting(12, false), "stop", json!(" 15")))?;
            let t = text_of(&v)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, free[..at].to_string());
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("{t:?}"))
        },
    );
    r.add(
        G,
        "completions.stop.list",
        "A stop list cuts at the earliest match",
        "stops [\" 16\", \" 14\"] cut before \" 14\"",
        |c, ev| {
            let (_, free) = base(c)?;
            let at = free
                .find(" 14")
                .ok_or_else(|| Stop::fail("\" 14\" in the reference", free.clone()))?;
            let t = text_of(&c.target.complete(&with(
                counting(12, false),
                "stop",
                json!([" 16", " 14"]),
            ))?)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, free[..at].to_string());
            Ok(format!("{t:?}"))
        },
    );
    r.add(
        G,
        "completions.stop.across_tokens",
        "A stop spanning tokens is caught",
        "stop \"4, 1\" (across \" 14, 15\") cuts there and never leaks",
        |c, ev| {
            let (_, free) = base(c)?;
            let at = free
                .find("4, 1")
                .ok_or_else(|| Stop::fail("\"4, 1\" in the reference", free.clone()))?;
            let t = text_of(&c.target.complete(&with(
                counting(12, false),
                "stop",
                json!("4, 1"),
            ))?)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, free[..at].to_string());
            Ok(format!("{t:?}"))
        },
    );
    r.add(
        G,
        "completions.prompt.list_of_one",
        "A one-element prompt list is the prompt",
        "[\"…\"] gives the same text as \"…\"",
        |c, ev| {
            let (_, free) = base(c)?;
            let t = text_of(&c.target.complete(&with(
                counting(12, false),
                "prompt",
                json!([COUNTING]),
            ))?)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, free);
            Ok("same".into())
        },
    );
    r.add(
        G,
        "completions.stream.framing",
        "A completion stream is framed like the chat stream",
        "text_completion chunks with one cmpl- id, finish_reason last, data: [DONE] at the end",
        |c, ev| {
            let cap = c.target.stream_ok(PATH, &counting(8, true))?;
            ev.text("stream", &cap.describe());
            let chunks = cap.chunks().map_err(|e| Stop::fail("JSON chunks", e))?;
            ensure!(!chunks.is_empty(), "chunks", cap.describe());
            let id = chunks[0]["id"].as_str().unwrap_or_default().to_string();
            ensure!(id.starts_with("cmpl-"), "cmpl- id", id.clone());
            for ch in &chunks {
                ensure_eq!("id", ch["id"], json!(id));
                ensure_eq!("object", ch["object"], json!("text_completion"));
            }
            cap.final_finish_reason()
                .map_err(|e| Stop::fail("finish_reason on the last chunk", e))?;
            ensure!(
                cap.ends_with_done(),
                "data: [DONE] last",
                format!("last frame {:?}", cap.frames.last().map(|f| &f.frame))
            );
            Ok(format!("{} chunks, [DONE] last", chunks.len()))
        },
    );
    r.add(
        G,
        "completions.stream.equals_non_stream",
        "A streamed completion equals the plain one",
        "same text, finish_reason length",
        |c, ev| {
            let (_, free) = base(c)?;
            let cap = c.target.stream_ok(PATH, &counting(12, true))?;
            ev.text("stream", &cap.describe());
            ensure_eq!("text", cap.text(), free);
            ensure_eq!(
                "finish_reason",
                cap.final_finish_reason().ok(),
                Some("length".to_string())
            );
            Ok("identical".into())
        },
    );
    r.add(
        G,
        "completions.stream.echo_first",
        "A streamed echo sends the prompt first",
        "first chunk's text is the prompt",
        |c, ev| {
            let cap = c
                .target
                .stream_ok(PATH, &with(counting(4, true), "echo", json!(true)))?;
            ev.text("stream", &cap.describe());
            let chunks = cap.chunks().map_err(|e| Stop::fail("JSON chunks", e))?;
            let first = chunks
                .first()
                .map(|c| c["choices"][0]["text"].clone())
                .unwrap_or_default();
            ensure_eq!("first chunk text", first, json!(COUNTING));
            Ok("prompt first".into())
        },
    );
    r.add(
        G,
        "completions.stream.usage_chunk",
        "include_usage adds a usage chunk to a completion stream",
        "last chunk has choices [] and usage with completion_tokens 8",
        |c, ev| {
            let body = with(
                streaming(counting(8, false)),
                "stream_options",
                json!({"include_usage": true}),
            );
            let cap = c.target.stream_ok(PATH, &body)?;
            ev.text("stream", &cap.describe());
            let u = cap
                .usage()
                .ok_or_else(|| Stop::fail("a usage chunk", cap.describe()))?;
            ensure_eq!("completion_tokens", u["completion_tokens"], json!(8));
            ensure_eq!(
                "total_tokens",
                u["total_tokens"].as_u64(),
                Some(u64_at(&u, "/prompt_tokens")? + 8)
            );
            Ok(format!("usage {u}"))
        },
    );
}
