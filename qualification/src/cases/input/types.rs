//! `input` cases: wrong types: 400 naming the field.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- wrong types: 400 naming the field ----
    let types: [(&str, &str, Value, &str); 17] = [
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
        ("input.type.seed_string", "seed", json!("42"), "seed"),
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
        let case = r.add(
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
        if let Some(what) = beyond_openai(id, field) {
            case.inferloopd_only(what);
        }
    }
}
