//! `input`: bad input never reaches the model. Each row of each table is its own case: wrong
//! types per field, out-of-range values per field, malformed JSON, bad messages, bad UTF-8,
//! oversized bodies, context overflow, unknown model, auth, and clients that stall.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::case::{Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::fixtures::KEY;
use crate::http::Request;
use crate::target::{chat_body, expect_error, json_200, text_of, Target};
use crate::{ensure, ensure_eq};

const G: Group = Group::Input;
const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

/// A chat body with `field` set to `value` (the whole messages list when `field` is
/// "messages").
fn chat_with(field: &str, value: Value) -> Value {
    let mut body = chat_body("Hello", 8);
    body[field] = value;
    body
}

/// The daemon with an API key: the `strict` fixture, or the target itself when attached
/// with `--api-key`.
fn keyed(c: &Ctx) -> Result<(Target, String, Option<std::sync::Arc<crate::ctx::Fixture>>), Stop> {
    if let Some(k) = &c.target.key {
        return Ok((c.target.clone(), k.clone(), None));
    }
    match c.fixture("strict") {
        Ok(fx) => Ok((fx.target(), KEY.to_string(), Some(fx))),
        Err(Stop::Skip(reason)) => Err(Stop::skip(format!(
            "the target has no API key (pass --api-key) and {reason}"
        ))),
        Err(e) => Err(e),
    }
}

pub fn register(r: &mut Registry) {
    // ---- wrong types: 400 naming the field ----
    let types: [(&str, &str, Value, &str); 20] = [
        (
            "input.type.messages_string",
            "messages",
            json!("Hello"),
            "messages",
        ),
        (
            "input.type.message_item_string",
            "messages",
            json!(["Hello"]),
            "messages[0]",
        ),
        (
            "input.type.role_number",
            "messages",
            json!([{"role": 1, "content": "Hi"}]),
            "messages[0].role",
        ),
        (
            "input.type.content_number",
            "messages",
            json!([{"role": "user", "content": 42}]),
            "messages[0].content",
        ),
        (
            "input.type.content_object",
            "messages",
            json!([{"role": "user", "content": {}}]),
            "messages[0].content",
        ),
        (
            "input.type.max_tokens_string",
            "max_tokens",
            json!("8"),
            "max_tokens",
        ),
        (
            "input.type.max_tokens_float",
            "max_tokens",
            json!(8.5),
            "max_tokens",
        ),
        (
            "input.type.max_tokens_negative",
            "max_tokens",
            json!(-1),
            "max_tokens",
        ),
        (
            "input.type.temperature_string",
            "temperature",
            json!("hot"),
            "temperature",
        ),
        ("input.type.top_p_string", "top_p", json!("0.5"), "top_p"),
        ("input.type.top_k_float", "top_k", json!(1.5), "top_k"),
        ("input.type.min_p_string", "min_p", json!("0.1"), "min_p"),
        ("input.type.seed_string", "seed", json!("42"), "seed"),
        (
            "input.type.presence_penalty_string",
            "presence_penalty",
            json!("1"),
            "presence_penalty",
        ),
        (
            "input.type.frequency_penalty_string",
            "frequency_penalty",
            json!("1"),
            "frequency_penalty",
        ),
        ("input.type.stop_number", "stop", json!(5), "stop"),
        ("input.type.n_string", "n", json!("1"), "n"),
        ("input.type.stream_string", "stream", json!("yes"), "stream"),
        (
            "input.type.stream_options_string",
            "stream_options",
            json!("x"),
            "stream_options",
        ),
        ("input.type.model_number", "model", json!(5), "model"),
    ];
    for (id, field, value, param) in types {
        r.add(
            G,
            id,
            format!("`{field}` = {value} (wrong type) is refused"),
            format!("400 invalid_request_error naming `{param}`"),
            move |c, ev| {
                let body = chat_with(field, value.clone());
                ev.put("request", body.clone());
                let resp = c.target.post(CHAT, &body)?;
                ev.text("response", &resp.describe());
                let err = expect_error(&resp, 400, Some(param), None)?;
                ensure_eq!("type", err["type"], json!("invalid_request_error"));
                Ok(format!("400 param {param}"))
            },
        );
    }

    // ---- out of range: 400 naming the field ----
    let long_stop = "x".repeat(513);
    let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let ranges: [(&str, &str, Value, &str); 16] = [
        (
            "input.range.temperature_above_2",
            "temperature",
            json!(2.5),
            "temperature",
        ),
        (
            "input.range.temperature_negative",
            "temperature",
            json!(-0.1),
            "temperature",
        ),
        ("input.range.top_p_zero", "top_p", json!(0), "top_p"),
        ("input.range.top_p_above_1", "top_p", json!(1.5), "top_p"),
        ("input.range.top_k_negative", "top_k", json!(-1), "top_k"),
        ("input.range.min_p_above_1", "min_p", json!(1.5), "min_p"),
        (
            "input.range.presence_penalty_above_2",
            "presence_penalty",
            json!(2.5),
            "presence_penalty",
        ),
        (
            "input.range.presence_penalty_below_minus_2",
            "presence_penalty",
            json!(-2.5),
            "presence_penalty",
        ),
        (
            "input.range.frequency_penalty_above_2",
            "frequency_penalty",
            json!(3),
            "frequency_penalty",
        ),
        (
            "input.range.frequency_penalty_below_minus_2",
            "frequency_penalty",
            json!(-3),
            "frequency_penalty",
        ),
        (
            "input.range.max_tokens_zero",
            "max_tokens",
            json!(0),
            "max_tokens",
        ),
        (
            "input.range.max_completion_tokens_zero",
            "max_completion_tokens",
            json!(0),
            "max_completion_tokens",
        ),
        ("input.range.n_two", "n", json!(2), "n"),
        (
            "input.range.stop_too_many",
            "stop",
            json!(many_stops),
            "stop",
        ),
        ("input.range.stop_empty_string", "stop", json!([""]), "stop"),
        (
            "input.range.stop_too_long",
            "stop",
            json!(long_stop),
            "stop",
        ),
    ];
    for (id, field, value, param) in ranges {
        let shown = crate::case::snippet(&value.to_string(), 40);
        r.add(
            G,
            id,
            format!("`{field}` = {shown} (out of range) is refused"),
            format!("400 naming `{param}`, nothing generated"),
            move |c, ev| {
                let body = chat_with(field, value.clone());
                let resp = c.target.post(CHAT, &body)?;
                ev.text("response", &resp.describe());
                let err = expect_error(&resp, 400, Some(param), None)?;
                ensure!(
                    err["message"].as_str().is_some_and(|m| m.contains(param)),
                    format!("the message names `{param}`"),
                    err.to_string()
                );
                Ok(format!("400 param {param}"))
            },
        );
    }

    // ---- malformed JSON ----
    let bodies: [(&str, &str, &'static [u8]); 5] = [
        (
            "input.json.truncated",
            "a truncated JSON object",
            br#"{"messages": [{"role": "user", "content": "Hi"}"#,
        ),
        ("input.json.empty_body", "an empty body", b""),
        (
            "input.json.array_body",
            "a JSON array",
            br#"[{"role": "user", "content": "Hi"}]"#,
        ),
        ("input.json.string_body", "a JSON string", br#""hello""#),
        (
            "input.json.trailing_garbage",
            "a valid object followed by garbage",
            br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}xyz"#,
        ),
    ];
    for (id, what, bytes) in bodies {
        r.add(
            G,
            id,
            format!("{what} is malformed JSON"),
            "400 invalid_json, param null",
            move |c, ev| {
                ev.put("body", String::from_utf8_lossy(bytes).into_owned());
                let resp = c
                    .target
                    .send(Request::post(CHAT).body(bytes.to_vec(), Some("application/json")))?;
                ev.text("response", &resp.describe());
                expect_error(&resp, 400, None, Some("invalid_json"))?;
                Ok("400 invalid_json".into())
            },
        );
    }

    // ---- bad messages ----
    let msgs: [(&str, &str, Value, &str); 7] = [
        (
            "input.messages.missing",
            "no `messages` at all",
            json!({"max_tokens": 4}),
            "messages",
        ),
        (
            "input.messages.empty",
            "an empty `messages` list",
            json!({"messages": []}),
            "messages",
        ),
        (
            "input.messages.unknown_role",
            "a message with role `wizard`",
            json!({"messages": [{"role": "wizard", "content": "Hi"}]}),
            "messages[0].role",
        ),
        (
            "input.messages.user_content_null",
            "a user message without content",
            json!({"messages": [{"role": "user", "content": null}]}),
            "messages[0].content",
        ),
        (
            "input.messages.image_part",
            "an image content part",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            "input.messages.part_without_text",
            "a text part without text",
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "messages[0].content[0].text",
        ),
        (
            "input.messages.nul_char",
            "a NUL character in a message",
            json!({"messages": [{"role": "user", "content": "a\u{0}b"}]}),
            "messages[0].content",
        ),
    ];
    for (id, what, body, param) in msgs {
        r.add(
            G,
            id,
            format!("{what} is refused"),
            format!("400 naming `{param}`"),
            move |c, ev| {
                ev.put("request", body.clone());
                let resp = c.target.post(CHAT, &body)?;
                ev.text("response", &resp.describe());
                expect_error(&resp, 400, Some(param), None)?;
                Ok(format!("400 param {param}"))
            },
        );
    }

    // ---- the legacy endpoint's prompt ----
    let prompts: [(&str, &str, Value, &str); 5] = [
        (
            "input.completions.prompt_missing",
            "a completion without `prompt`",
            json!({"max_tokens": 4}),
            "prompt",
        ),
        (
            "input.completions.prompt_number",
            "a numeric `prompt`",
            json!({"prompt": 5}),
            "prompt",
        ),
        (
            "input.completions.prompt_list_of_two",
            "a `prompt` list of two",
            json!({"prompt": ["a", "b"]}),
            "prompt",
        ),
        (
            "input.completions.prompt_empty",
            "an empty `prompt`",
            json!({"prompt": ""}),
            "prompt",
        ),
        (
            "input.completions.echo_string",
            "`echo` as a string",
            json!({"prompt": "a", "echo": "yes"}),
            "echo",
        ),
    ];
    for (id, what, body, param) in prompts {
        r.add(
            G,
            id,
            format!("{what} is refused"),
            format!("400 naming `{param}`"),
            move |c, ev| {
                let resp = c.target.post(COMPLETIONS, &body)?;
                ev.text("response", &resp.describe());
                expect_error(&resp, 400, Some(param), None)?;
                Ok(format!("400 param {param}"))
            },
        );
    }

    // ---- bad UTF-8 and escapes ----
    let utf8: [(&str, &str, &'static [u8]); 3] = [
        (
            "input.utf8.invalid_bytes",
            "a raw 0xFF byte inside a string",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}",
        ),
        (
            "input.utf8.lone_surrogate",
            "a lone UTF-16 surrogate escape",
            br#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
        ),
        (
            "input.utf8.overlong",
            "an overlong encoding of NUL",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\x80\"}]}",
        ),
    ];
    for (id, what, bytes) in utf8 {
        r.add(
            G,
            id,
            format!("{what} is refused"),
            "400 invalid_json; the daemon keeps serving",
            move |c, ev| {
                let resp = c
                    .target
                    .send(Request::post(CHAT).body(bytes.to_vec(), Some("application/json")))?;
                ev.text("response", &resp.describe());
                expect_error(&resp, 400, None, Some("invalid_json"))?;
                json_200(&c.target.get("/healthz")?, "GET /healthz afterwards")?;
                Ok("400 invalid_json, still healthy".into())
            },
        );
    }

    // ---- sizes and the context ----
    r.add(G, "input.body.over_default_limit", "A body over the default 1 MiB limit is refused", "413 request_too_large (spawn mode: default --max-body-bytes)", |c, ev| {
        let body = chat_body(&"a".repeat(1_100_000), 8);
        let resp = c.target.post(CHAT, &body)?;
        ev.text("response", &resp.describe());
        if c.spawn.is_none() && resp.status() == 400 {
            return Err(Stop::skip("the attached daemon accepts bodies over 1 MiB (a larger --max-body-bytes); its limit is unknown here"));
        }
        expect_error(&resp, 413, None, Some("request_too_large"))?;
        Ok("413".into())
    });
    r.add(
        G,
        "input.body.over_limit",
        "A body over --max-body-bytes (4096) is refused",
        "413 request_too_large, by Content-Length",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let resp = fx
                .target()
                .post(CHAT, &chat_body(&"a".repeat(10 * 1024), 8))?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 413, None, Some("request_too_large"))?;
            Ok("413".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.body.over_limit_chunked",
        "A chunked body over the limit is refused while reading",
        "413 request_too_large without a Content-Length",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let bytes =
                serde_json::to_vec(&chat_body(&"a".repeat(10 * 1024), 8)).unwrap_or_default();
            let resp = fx.target().send(
                Request::post(CHAT)
                    .body(bytes, Some("application/json"))
                    .chunked(),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 413, None, Some("request_too_large"))?;
            Ok("413 while reading".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.context.max_tokens_over",
        "max_tokens beyond the context is refused",
        "400 context_length_exceeded naming messages; the message quotes the limit",
        |c, ev| {
            let ctx = c.facts.ctx;
            let resp = c.target.post(CHAT, &chat_body("Hello", ctx as u32))?;
            ev.text("response", &resp.describe());
            let err = expect_error(
                &resp,
                400,
                Some("messages"),
                Some("context_length_exceeded"),
            )?;
            ensure!(
                err["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&ctx.to_string())),
                format!("the message quotes {ctx}"),
                err.to_string()
            );
            Ok(format!("400 at max_tokens {ctx}"))
        },
    );
    r.add(
        G,
        "input.context.prompt_over",
        "A prompt longer than the context is refused",
        "400 context_length_exceeded",
        |c, ev| {
            let long = "tell me more about the weather ".repeat((c.facts.ctx as usize / 3) + 10);
            let resp = c.target.post(CHAT, &chat_body(&long, 8))?;
            ev.text("response", &resp.describe());
            expect_error(
                &resp,
                400,
                Some("messages"),
                Some("context_length_exceeded"),
            )?;
            Ok(format!("400 for {} bytes of prompt", long.len()))
        },
    );
    r.add(
        G,
        "input.model.unknown",
        "Generation for another model is refused",
        "404 model_not_found naming model",
        |c, ev| {
            let resp = c.target.post(CHAT, &chat_with("model", json!("gpt-4")))?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 404, Some("model"), Some("model_not_found"))?;
            Ok("404".into())
        },
    );

    // ---- auth ----
    r.add(
        G,
        "input.auth.missing_key",
        "A request without the API key is refused",
        "401 invalid_api_key with `WWW-Authenticate: Bearer`, on known and unknown /v1 paths",
        |c, ev| {
            let (t, _, _fx) = keyed(c)?;
            for path in ["/v1/models", "/v1/embeddings"] {
                let resp = t.send_raw(Request::get(path))?;
                ev.text(path, &resp.describe());
                expect_error(&resp, 401, None, Some("invalid_api_key"))?;
                let challenge = resp.header("www-authenticate").unwrap_or_default();
                ensure!(
                    challenge.starts_with("Bearer"),
                    format!("GET {path}: WWW-Authenticate names Bearer (RFC 6750)"),
                    format!("{challenge:?}")
                );
            }
            Ok("401 with a Bearer challenge".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.wrong_key",
        "A wrong API key is refused and not echoed",
        "401 invalid_api_key; the message does not contain either key",
        |c, ev| {
            let (t, key, _fx) = keyed(c)?;
            let wrong = format!("{key}x");
            let resp = t.send_raw(
                Request::get("/v1/models").header("Authorization", &format!("Bearer {wrong}")),
            )?;
            ev.text("response", &resp.describe());
            let err = expect_error(&resp, 401, None, Some("invalid_api_key"))?;
            let msg = err["message"].as_str().unwrap_or_default();
            ensure!(
                !msg.contains(&key),
                "no key in the message",
                msg.to_string()
            );
            Ok("401".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.right_key",
        "The right API key is served",
        "200 on /v1/models (also with a lowercase `bearer` scheme) and a chat answer",
        |c, ev| {
            let (t, key, _fx) = keyed(c)?;
            let auth = format!("Bearer {key}");
            let models = t.send_raw(Request::get("/v1/models").header("Authorization", &auth))?;
            json_200(&models, "GET /v1/models with the key")?;
            // The auth scheme is case-insensitive (RFC 9110 §11.1).
            let lower = t.send_raw(
                Request::get("/v1/models").header("Authorization", &format!("bearer {key}")),
            )?;
            json_200(&lower, "GET /v1/models with `bearer KEY`")?;
            let chat = t.send_raw(
                Request::post(CHAT)
                    .json(&chat_body("Hi", 2))
                    .header("Authorization", &auth),
            )?;
            ev.text("chat", &chat.describe());
            text_of(&json_200(&chat, "POST chat with the key")?)?;
            Ok("200".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.operational_routes_open",
        "Health, readiness and metrics need no key; generation does",
        "/healthz, /readyz, /metrics 200 without a key; POST chat 401",
        |c, ev| {
            let (t, _, _fx) = keyed(c)?;
            for path in ["/healthz", "/readyz", "/metrics"] {
                let r = t.send_raw(Request::get(path))?;
                ensure_eq!(format!("{path} status"), r.status(), 200);
            }
            let resp = t.send_raw(Request::post(CHAT).json(&chat_body("Hi", 2)))?;
            ev.text("chat_without_key", &resp.describe());
            expect_error(&resp, 401, None, Some("invalid_api_key"))?;
            Ok("open operational routes, closed /v1".into())
        },
    )
    .fixture("strict");

    // ---- slow clients ----
    r.add(
        G,
        "input.slow.partial_headers",
        "A client that never finishes its headers is cut off",
        "connection closed within 5 s (read timeout 1 s), never served",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let ep = fx.target().ep;
            let mut s = ep
                .connect(Duration::from_secs(5))
                .map_err(|e| Stop::fail("connect", e.to_string()))?;
            s.write_all(b"GET /healthz HTTP/1.1\r\n")
                .map_err(|e| Stop::fail("write", e.to_string()))?;
            s.set_read_timeout(Some(Duration::from_secs(6))).ok();
            let t0 = Instant::now();
            let mut buf = Vec::new();
            let closed = match s.read_to_end(&mut buf) {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
                Err(_) => false,
            };
            let took = t0.elapsed();
            ev.put("closed_after_ms", took.as_secs_f64() * 1000.0);
            ev.put("received", String::from_utf8_lossy(&buf).into_owned());
            ensure!(
                closed && took < Duration::from_secs(5),
                "closed within 5 s",
                format!("closed={closed} after {took:?}")
            );
            ensure!(
                !String::from_utf8_lossy(&buf).contains("200 OK"),
                "not served",
                String::from_utf8_lossy(&buf).into_owned()
            );
            Ok(format!("closed after {took:?}"))
        },
    )
    .fixture("strict");
    r.add(G, "input.slow.stalled_body", "A client that stalls mid-body gets 408", "408 request_timeout within 5 s (read timeout 1 s)", |c, ev| {
        let fx = c.fixture("strict")?;
        let ep = fx.target().ep;
        let mut s = ep.connect(Duration::from_secs(5)).map_err(|e| Stop::fail("connect", e.to_string()))?;
        let head = format!("POST {CHAT} HTTP/1.1\r\nHost: {ep}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"messages\":");
        s.write_all(head.as_bytes()).map_err(|e| Stop::fail("write", e.to_string()))?;
        s.set_read_timeout(Some(Duration::from_secs(6))).ok();
        let t0 = Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let took = t0.elapsed();
        let text = String::from_utf8_lossy(&buf).into_owned();
        ev.put("response", text.clone());
        ev.put("after_ms", took.as_secs_f64() * 1000.0);
        ensure!(text.starts_with("HTTP/1.1 408"), "HTTP/1.1 408", crate::case::snippet(&text, 300));
        ensure!(text.contains("request_timeout"), "code request_timeout", crate::case::snippet(&text, 300));
        ensure!(took < Duration::from_secs(5), "within 5 s", format!("{took:?}"));
        Ok(format!("408 after {took:?}"))
    }).fixture("strict");

    // ---- ignored fields ----
    r.add(
        G,
        "input.ignored.unknown_fields",
        "Unknown fields are ignored, as OpenAI does",
        "logit_bias, foo and tools-free extras → 200, same greedy text",
        |c, ev| {
            let plain = text_of(&c.target.chat(&chat_body("Hi", 4))?)?;
            let mut body = chat_body("Hi", 4);
            body["logit_bias"] = json!({});
            body["foo"] = json!(1);
            body["parallel_tool_calls"] = json!(false);
            let got = text_of(&c.target.chat(&body)?)?;
            ev.put("texts", json!([plain, got]));
            ensure_eq!("text", got, plain);
            Ok("ignored".into())
        },
    );
    r.add(
        G,
        "input.ignored.user",
        "The `user` field is accepted and ignored",
        "200, same greedy text",
        |c, ev| {
            let plain = text_of(&c.target.chat(&chat_body("Hi", 4))?)?;
            let got = text_of(&c.target.chat(&chat_with("user", json!("user-1234")))?)?;
            let base = text_of(&c.target.chat(&chat_body("Hello", 8))?)?;
            ev.put("texts", json!([plain, got, base]));
            ensure_eq!("text with user", got, base);
            Ok("ignored".into())
        },
    );
}
