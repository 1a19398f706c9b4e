//! How much to generate and how it is delivered, for both request kinds: `n`, the token
//! limit, `stop` and `stream_options`.

use super::request::InvalidRequest;
use crate::http::wire::{StopField, StreamOptions};

/// Most stop sequences per request, and their longest length in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 512;

/// OpenAI's own bound on `n`; the box's (`--max-n`, at most the slots) is checked once
/// the request reaches it.
pub const MAX_N: u32 = 128;

pub(super) fn check_n(n: Option<u32>) -> Result<u32, InvalidRequest> {
    match n.unwrap_or(1) {
        0 => Err(InvalidRequest::field("n", "must be at least 1")),
        n if n > MAX_N => Err(InvalidRequest::field(
            "n",
            format!("must be at most {MAX_N}"),
        )),
        n => Ok(n),
    }
}

pub(super) fn check_max_tokens(param: &str, n: u32) -> Result<u32, InvalidRequest> {
    if n == 0 {
        return Err(InvalidRequest::field(param, "must be at least 1"));
    }
    Ok(n)
}

pub(super) fn stream_usage(
    stream: bool,
    opts: Option<StreamOptions>,
) -> Result<bool, InvalidRequest> {
    match opts {
        None => Ok(false),
        Some(_) if !stream => Err(InvalidRequest::field(
            "stream_options",
            "is only allowed when `stream` is true",
        )),
        Some(o) => Ok(o.include_usage.unwrap_or(false)),
    }
}

pub(super) fn stops(stop: Option<StopField>) -> Result<Vec<String>, InvalidRequest> {
    let list = match stop {
        None => return Ok(Vec::new()),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if list.len() > MAX_STOPS {
        return Err(InvalidRequest::field(
            "stop",
            format!("may hold at most {MAX_STOPS} sequences"),
        ));
    }
    for s in &list {
        if s.is_empty() {
            return Err(InvalidRequest::field(
                "stop",
                "must not contain empty strings",
            ));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(InvalidRequest::field(
                "stop",
                format!("sequences must be at most {MAX_STOP_BYTES} bytes"),
            ));
        }
    }
    Ok(list)
}
