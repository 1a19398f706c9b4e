//! `api`: every route with its documented shape, methods, headers, content types, ids,
//! `created`, `object` fields and the models list.

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{now_s, EXPLAIN};
use crate::case::{Group, Registry, Stop};
use crate::http::{self, Request};
use crate::target::{chat_body, counting, expect_error, json_200, metric, str_at, u64_at};
use crate::{ensure, ensure_eq};

const G: Group = Group::Api;

mod cors;
mod embeddings;
mod objects;
mod request;
mod responses;
mod routes;

/// The group's cases, section by section, in report order.
pub fn register(r: &mut Registry) {
    routes::register(r);
    objects::register(r);
    request::register(r);
    responses::register(r);
    embeddings::register(r);
    cors::register(r);
}
