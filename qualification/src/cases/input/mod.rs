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

mod auth;
mod embeddings;
mod ignored;
mod malformed;
mod range;
mod responses;
mod size;
mod slow;
mod types;

/// The group's cases, section by section, in report order.
/// What an input case checks beyond OpenAI's API: the validation of a field OpenAI does not
/// define, or the refusal of something OpenAI allows. Other servers skip it.
fn beyond_openai(id: &str, field: &str) -> Option<&'static str> {
    match (id, field) {
        (_, "top_k") => Some("`top_k` (not an OpenAI field)"),
        (_, "min_p") => Some("`min_p` (not an OpenAI field)"),
        ("input.completions.prompt_list_of_two", _) => {
            Some("refusing a list of prompts (OpenAI's API allows it)")
        }
        _ => None,
    }
}

pub fn register(r: &mut Registry) {
    types::register(r);
    responses::register(r);
    range::register(r);
    embeddings::register(r);
    malformed::register(r);
    size::register(r);
    auth::register(r);
    slow::register(r);
    ignored::register(r);
}
