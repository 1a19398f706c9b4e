//! `stream` cases: `finish_reason` on the last choice chunk.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
}
