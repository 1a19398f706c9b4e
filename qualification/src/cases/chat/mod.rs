//! `chat`: the non-streamed chat route: shape, roles and the chat template, temperature-0
//! determinism, seeds, sampling filters, penalties, stop sequences, length limits, usage and
//! timings.

use std::time::Instant;

use serde_json::{json, Value};

use super::{pick_stop, reference, EXPLAIN};
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::target::{chat_body, f64_at, finish_of, text_of, u64_at, with};
use crate::{ensure, ensure_eq};

const G: Group = Group::Chat;
const CHAT: &str = "/v1/chat/completions";
/// A prompt whose greedy answer repeats itself, so penalties show. (With the model's own
/// template, whose default system prompt is part of every chat, a counting prompt's greedy
/// answer no longer changed under presence_penalty 2 within 12 tokens.)
const REPETITIVE: &str = "Say the word hello ten times.";

/// Tokens of the shared greedy answer: enough words to stop on, few enough for a slow box.
const N: u32 = 16;

/// The greedy answer to [`EXPLAIN`] with [`N`] tokens, shared by many cases.
fn explain(c: &Ctx) -> Result<(Value, String), Stop> {
    let v = reference(c, CHAT, &chat_body(EXPLAIN, N))?;
    let t = text_of(&v)?;
    Ok((v, t))
}

fn messages(msgs: Value, max_tokens: u32) -> Value {
    json!({"messages": msgs, "max_tokens": max_tokens, "temperature": 0})
}

fn sampled(seed: Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a short story about a cat."}],
        "max_tokens": 8,
        "temperature": 0.9,
        "seed": seed,
    })
}

/// The same text as the greedy reference, for settings that must not change it.
fn same_as_greedy(
    c: &Ctx,
    ev: &mut crate::case::Evidence,
    body: Value,
    what: &str,
) -> Result<String, Stop> {
    let (_, greedy) = explain(c)?;
    let v = c.target.chat(&body)?;
    let got = text_of(&v)?;
    ev.put("greedy", greedy.clone());
    ev.put("observed", got.clone());
    ensure!(
        got == greedy,
        format!("{what}: the greedy (temperature 0) text {greedy:?}"),
        got
    );
    Ok(format!("{what}: same text as greedy"))
}

/// `field` at 2 must change the greedy answer to [`REPETITIVE`].
fn penalty_changes_answer(c: &Ctx, ev: &mut Evidence, field: &str) -> Result<String, Stop> {
    let plain = text_of(&reference(c, CHAT, &chat_body(REPETITIVE, 12))?)?;
    let pen = text_of(
        &c.target
            .chat(&with(chat_body(REPETITIVE, 12), field, json!(2)))?,
    )?;
    ev.put("plain", plain.clone());
    ev.put("penalised", pen.clone());
    ensure!(
        plain != pen,
        "a different answer",
        format!("both {plain:?}")
    );
    Ok(format!("{plain:?} → {pen:?}"))
}

mod length;
mod sampling;
mod shape;
mod stop;
mod template;
mod usage;

/// The group's cases, section by section, in report order.
pub fn register(r: &mut Registry) {
    shape::register(r);
    template::register(r);
    sampling::register(r);
    stop::register(r);
    length::register(r);
    usage::register(r);
}
