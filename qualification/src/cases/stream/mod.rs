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

mod chunks;
mod errors;
mod finish;
mod framing;
mod responses;
mod text;
mod usage;

/// The group's cases, section by section, in report order.
pub fn register(r: &mut Registry) {
    framing::register(r);
    chunks::register(r);
    finish::register(r);
    usage::register(r);
    text::register(r);
    errors::register(r);
    responses::register(r);
}
