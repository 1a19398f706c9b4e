//! The sampling fields both request kinds share: temperature, top-p/k, min-p, penalties
//! (OpenAI's and llama-server's `repeat_penalty` / `repeat_last_n`), seed and
//! `logit_bias`.

use serde_json::{Map, Value};

use super::request::InvalidRequest;
use crate::engine::backend::sampling_chain::MAX_PENALTY_LAST_N;
use crate::engine::SamplingParams;
use crate::http::wire::WireSampling;

/// `logit_bias` values are clamped to this range by OpenAI's definition.
const MAX_BIAS: f64 = 100.0;

pub(super) fn sampling(w: &WireSampling) -> Result<SamplingParams, InvalidRequest> {
    let d = SamplingParams::default();
    let temperature = in_range("temperature", w.temperature, d.temperature, 0.0, 2.0)?;
    let top_p = w.top_p.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(InvalidRequest::field("top_p", "must be in (0, 1]"));
    }
    let top_k = w.top_k.unwrap_or(d.top_k);
    if top_k < 0 {
        return Err(InvalidRequest::field(
            "top_k",
            "must be 0 (disabled) or positive",
        ));
    }
    let min_p = in_range("min_p", w.min_p, d.min_p, 0.0, 1.0)?;
    let presence_penalty = in_range(
        "presence_penalty",
        w.presence_penalty,
        d.presence_penalty,
        -2.0,
        2.0,
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        w.frequency_penalty,
        d.frequency_penalty,
        -2.0,
        2.0,
    )?;
    // llama.cpp divides a positive logit by it: it must be positive.
    let repeat_penalty = w.repeat_penalty.unwrap_or(d.repeat_penalty);
    if !(repeat_penalty.is_finite() && repeat_penalty > 0.0 && repeat_penalty <= 2.0) {
        return Err(InvalidRequest::field(
            "repeat_penalty",
            "must be greater than 0 and at most 2 (1 is off)",
        ));
    }
    // llama-server reads -1 as the whole context; the window is bounded here instead, so
    // that each sequence's ring buffer stays small.
    let penalty_last_n = match w.repeat_last_n {
        None => d.penalty_last_n,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_PENALTY_LAST_N)
            .ok_or_else(|| {
                InvalidRequest::field(
                    "repeat_last_n",
                    format!(
                        "must be between 0 (penalties off) and {MAX_PENALTY_LAST_N} tokens; \
                         -1 (the whole context) is not supported"
                    ),
                )
            })?,
    };
    // Only the low 32 bits reach llama.cpp's sampler; without a seed every request differs.
    let seed = match w.seed {
        Some(s) => s as u64 as u32,
        None => rand::random(),
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        presence_penalty,
        frequency_penalty,
        repeat_penalty,
        penalty_last_n,
        seed,
        ..SamplingParams::default()
    })
}

fn in_range(
    param: &str,
    v: Option<f32>,
    default: f32,
    lo: f32,
    hi: f32,
) -> Result<f32, InvalidRequest> {
    let v = v.unwrap_or(default);
    if !(v.is_finite() && (lo..=hi).contains(&v)) {
        return Err(InvalidRequest::field(
            param,
            format!("must be between {lo} and {hi}"),
        ));
    }
    Ok(v)
}

/// `{"token id": bias}` → `(id, bias)` sorted by id. Ids are checked against the
/// vocabulary later ([`check_vocab`]), once the model is known.
pub(super) fn logit_bias(
    map: Option<&Map<String, Value>>,
) -> Result<Vec<(i32, f32)>, InvalidRequest> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id = key
            .parse::<i64>()
            .ok()
            .filter(|id| *id >= 0)
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| {
                InvalidRequest::field(
                    "logit_bias",
                    format!("key `{key}` is not a token id (a non-negative integer)"),
                )
            })?;
        let bias = value
            .as_f64()
            .filter(|b| (-MAX_BIAS..=MAX_BIAS).contains(b))
            .ok_or_else(|| {
                InvalidRequest::field(
                    "logit_bias",
                    format!(
                        "value for key `{key}` must be a number between -{MAX_BIAS} and \
                         {MAX_BIAS} (got {value})"
                    ),
                )
            })?;
        out.push((id, bias as f32));
    }
    out.sort_by_key(|b| b.0);
    // "01" and "1" name the same token: one bias per token, or the sum would exceed 100.
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(InvalidRequest::field(
            "logit_bias",
            format!("token id {} appears more than once", w[0].0),
        ));
    }
    Ok(out)
}

/// Every `logit_bias` id must be a token of the model's vocabulary.
pub fn check_vocab(sampling: &SamplingParams, n_vocab: i32) -> Result<(), InvalidRequest> {
    match sampling.logit_bias.iter().find(|b| b.0 >= n_vocab) {
        Some((id, _)) => Err(InvalidRequest::field(
            "logit_bias",
            format!(
                "key `{id}` is not a token id of this model (its vocabulary has {n_vocab} tokens)"
            ),
        )),
        None => Ok(()),
    }
}
