//! `input` cases: malformed JSON, bad messages, the legacy prompt, bad UTF-8 and escapes.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
        let case = r.add(
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
        if let Some(what) = beyond_openai(id, param) {
            case.inferloopd_only(what);
        }
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
}
