//! `input` cases: fields that are accepted and ignored, and an unknown one refused.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- ignored fields ----
    r.add(
        G,
        "input.ignored.unknown_fields",
        "Harmless extras are ignored; an unknown field is refused by name",
        "logit_bias {} and parallel_tool_calls false → 200, same greedy text; foo → 400 naming `foo`",
        |c, ev| {
            let plain = text_of(&c.target.chat(&chat_body("Hi", 4))?)?;
            let mut body = chat_body("Hi", 4);
            body["logit_bias"] = json!({});
            body["parallel_tool_calls"] = json!(false);
            let got = text_of(&c.target.chat(&body)?)?;
            ev.put("texts", json!([plain, got]));
            ensure_eq!("text", got, plain);
            // A field the server would drop must not pass for one that acted.
            body["foo"] = json!(1);
            let resp = c.target.post(CHAT, &body)?;
            ev.text("unknown field", &resp.describe());
            // OpenAI refuses an unknown argument too, naming it in the message; inferloopd
            // names it in `param` as well.
            let param = c.server.inferloopd.then_some("foo");
            if param.is_some() {
                expect_error(&resp, 400, param, None)?;
            } else {
                ensure_eq!("status of an unknown field", resp.status(), 400);
            }
            Ok("ignored; foo refused".into())
        },
    );
    r.add(
        G,
        "input.ignored.user",
        "The `user` field is accepted and ignored",
        "200, the greedy text of the same request without it (run just before or just after)",
        |c, ev| {
            // On a server busy with other requests, greedy text may part at a near tie
            // between two runs of one request (batches of other sizes round differently):
            // the request with `user` must match one of its neighbours without it.
            let before = text_of(&c.target.chat(&chat_body("Hello", 8))?)?;
            let got = text_of(&c.target.chat(&chat_with("user", json!("user-1234")))?)?;
            let after = text_of(&c.target.chat(&chat_body("Hello", 8))?)?;
            ev.put(
                "texts",
                json!({"before": before, "with_user": got, "after": after}),
            );
            ensure!(
                got == before || got == after,
                format!("text with user = {before:?} or {after:?}"),
                format!("text with user = {got:?}")
            );
            Ok("ignored".into())
        },
    );
}
