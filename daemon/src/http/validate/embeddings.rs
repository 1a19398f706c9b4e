//! `/v1/embeddings`: the input in any of OpenAI's four forms, the encoding, and the
//! dimensions this model can give.

use serde_json::Value;

use super::request::InvalidRequest;
use crate::http::embeddings::wire::EmbeddingRequest;

/// OpenAI's limit on inputs per request.
pub const MAX_INPUTS: usize = 2048;

/// What to embed: strings to tokenize, or token ids as given (checked against the
/// vocabulary once the model is known, by [`check_token_ids`]).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInputs {
    Texts(Vec<String>),
    /// `flat`: one list of ids (`input[j]`), not a list of lists (`input[i][j]`).
    Tokens {
        lists: Vec<Vec<i64>>,
        flat: bool,
    },
}

impl EmbedInputs {
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(v) => v.len(),
            Self::Tokens { lists, .. } => lists.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An embeddings request that passed every check the wire allows.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidEmbeddings {
    pub model: Option<String>,
    pub inputs: EmbedInputs,
    /// `encoding_format: "base64"`: little-endian f32 bytes, base64, as OpenAI sends them.
    pub base64: bool,
    /// Checked against the model's size once it is known.
    pub dimensions: Option<u64>,
}

/// An `/v1/embeddings` body, checked field by field.
pub fn embeddings(req: EmbeddingRequest) -> Result<ValidEmbeddings, InvalidRequest> {
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(InvalidRequest::field(
                "encoding_format",
                format!("must be `float` or `base64`, not `{other}`"),
            ))
        }
    };
    let dimensions = match req.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(d as u64),
        Some(d) => {
            return Err(InvalidRequest::field(
                "dimensions",
                format!("must be at least 1, not {d}"),
            ))
        }
    };
    let Some(input) = req.input else {
        return Err(InvalidRequest::field("input", "is required"));
    };
    Ok(ValidEmbeddings {
        model: req.model,
        inputs: inputs(&input)?,
        base64,
        dimensions,
    })
}

/// A string, a list of strings, a list of token ids, or a list of lists of token ids.
fn inputs(input: &Value) -> Result<EmbedInputs, InvalidRequest> {
    const FORMS: &str = "must be a string, a list of strings, a list of token ids or a list \
                         of lists of token ids";
    let list = match input {
        Value::String(s) => return Ok(EmbedInputs::Texts(vec![text("input", s)?])),
        Value::Array(list) => list,
        _ => return Err(InvalidRequest::field("input", FORMS)),
    };
    if list.is_empty() {
        return Err(InvalidRequest::field("input", "must not be an empty list"));
    }
    if list.len() > MAX_INPUTS {
        return Err(InvalidRequest::field(
            "input",
            format!("holds {} inputs; at most {MAX_INPUTS}", list.len()),
        ));
    }
    match &list[0] {
        Value::String(_) => list
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => text(&format!("input[{i}]"), s),
                _ => Err(InvalidRequest::field(
                    &format!("input[{i}]"),
                    "must be a string like the other inputs",
                )),
            })
            .collect::<Result<_, _>>()
            .map(EmbedInputs::Texts),
        Value::Number(_) => Ok(EmbedInputs::Tokens {
            lists: vec![ids("input", list)?],
            flat: true,
        }),
        Value::Array(_) => list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let param = format!("input[{i}]");
                match v {
                    Value::Array(inner) if inner.is_empty() => {
                        Err(InvalidRequest::field(&param, "must not be an empty list"))
                    }
                    Value::Array(inner) => ids(&param, inner),
                    _ => Err(InvalidRequest::field(&param, "must be a list of token ids")),
                }
            })
            .collect::<Result<_, _>>()
            .map(|lists| EmbedInputs::Tokens { lists, flat: false }),
        _ => Err(InvalidRequest::field("input", FORMS)),
    }
}

fn text(param: &str, s: &str) -> Result<String, InvalidRequest> {
    if s.is_empty() {
        return Err(InvalidRequest::field(param, "must not be an empty string"));
    }
    if s.contains('\0') {
        return Err(InvalidRequest::field(
            param,
            "must not contain NUL characters",
        ));
    }
    Ok(s.to_string())
}

fn ids(param: &str, list: &[Value]) -> Result<Vec<i64>, InvalidRequest> {
    list.iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_i64().ok_or_else(|| {
                InvalidRequest::field(&format!("{param}[{j}]"), "must be an integer token id")
            })
        })
        .collect()
}

/// Token-id inputs against the vocabulary: each id must be one of its tokens.
pub fn check_token_ids(
    inputs: &[Vec<i64>],
    flat: bool,
    n_vocab: i32,
) -> Result<Vec<Vec<i32>>, InvalidRequest> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            ids.iter()
                .enumerate()
                .map(|(j, &t)| {
                    i32::try_from(t)
                        .ok()
                        .filter(|t| (0..n_vocab).contains(t))
                        .ok_or_else(|| {
                            let param = if flat {
                                format!("input[{j}]")
                            } else {
                                format!("input[{i}][{j}]")
                            };
                            InvalidRequest::field(
                                &param,
                                format!(
                                    "is not a token id of this model (0 to {}, got {t})",
                                    n_vocab - 1
                                ),
                            )
                        })
                })
                .collect()
        })
        .collect()
}

/// `dimensions`, when given, must be the model's own: vectors are not truncated.
pub fn check_dimensions(dimensions: Option<u64>, n_embd: i32) -> Result<(), InvalidRequest> {
    match dimensions {
        Some(d) if d != n_embd as u64 => Err(InvalidRequest::field(
            "dimensions",
            format!(
                "must be {n_embd}, this model's embedding size, when given (got {d}); \
                 vectors are not shortened"
            ),
        )),
        _ => Ok(()),
    }
}
