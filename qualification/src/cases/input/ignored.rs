//! `input` cases: fields that are accepted and ignored.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
