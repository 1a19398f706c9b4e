//! Whether two models share one vocabulary: a draft model's tokens must mean the same
//! to the model that verifies them, id for id.

use crate::value::Value;
use crate::Gguf;

/// Metadata that must agree for two models' token ids to mean the same thing.
const SAME_KEYS: [&str; 3] = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
];
const TOKENS: &str = "tokenizer.ggml.tokens";

/// How two vocabularies differ, the first difference found, worded for an error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabMismatch {
    #[error("has no `{TOKENS}` array")]
    NoTokens,
    #[error("has {theirs} tokens where the model has {ours}")]
    Size { ours: usize, theirs: usize },
    #[error("token {id} is {theirs:?} where the model has {ours:?}")]
    Token {
        id: usize,
        ours: String,
        theirs: String,
    },
    #[error("`{key}` is {theirs} where the model has {ours}")]
    Key {
        key: &'static str,
        ours: String,
        theirs: String,
    },
}

/// Checks that `draft` tokenizes exactly like `model`: the same tokenizer kind, the same
/// begin and end tokens, and the same token text at every id.
pub fn same_vocab<A: AsRef<[u8]>, B: AsRef<[u8]>>(
    model: &Gguf<A>,
    draft: &Gguf<B>,
) -> Result<(), VocabMismatch> {
    for key in SAME_KEYS {
        let (ours, theirs) = (shown(model.metadata(key)), shown(draft.metadata(key)));
        if ours != theirs {
            return Err(VocabMismatch::Key { key, ours, theirs });
        }
    }
    let (Some(ours), Some(theirs)) = (model.get_array(TOKENS), draft.get_array(TOKENS)) else {
        return Err(VocabMismatch::NoTokens);
    };
    if ours.len() != theirs.len() {
        return Err(VocabMismatch::Size {
            ours: ours.len(),
            theirs: theirs.len(),
        });
    }
    for (id, (a, b)) in ours.iter().zip(theirs.iter()).enumerate() {
        if a != b {
            return Err(VocabMismatch::Token {
                id,
                ours: shown(Some(a)),
                theirs: shown(Some(b)),
            });
        }
    }
    Ok(())
}

fn shown(v: Option<Value<'_>>) -> String {
    match v {
        None => "absent".into(),
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => s.to_string(),
            (None, Some(i)) => i.to_string(),
            _ => format!("{v:?}"),
        },
    }
}
