//! `/detokenize`: the token ids it is given.

use super::request::InvalidRequest;

/// `/detokenize` ids: each must be a token of the vocabulary.
pub fn token_ids(tokens: &[i64], n_vocab: i32) -> Result<Vec<i32>, InvalidRequest> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            i32::try_from(t)
                .ok()
                .filter(|t| (0..n_vocab).contains(t))
                .ok_or_else(|| {
                    InvalidRequest::field(
                        &format!("tokens[{i}]"),
                        format!(
                            "is not a token id of this model (0 to {}, got {t})",
                            n_vocab - 1
                        ),
                    )
                })
        })
        .collect()
}
