//! The shape facts the daemon's memory ledger needs, read from the metadata.

use std::path::Path;

use crate::{FormatError, Gguf, GgufError, GgufFile, Value};

/// Arrays longer than this are not per-layer values (those have one item per layer).
const MAX_PER_LAYER: usize = 4096;

/// Shape facts the ledger needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ModelShape {
    pub architecture: String,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim_k: u64,
    pub head_dim_v: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    pub n_ctx_train: u64,
    /// Sum of all tensor data, i.e. what gets mapped and touched.
    pub tensor_bytes: u64,
    pub file_bytes: u64,
}

/// Maps the file and reads its shape; only the header's pages are touched.
pub fn read_shape(path: &Path) -> Result<ModelShape, GgufError> {
    let file = GgufFile::open(path)?;
    ModelShape::from_gguf(&file).map_err(|error| GgufError::Format {
        path: path.to_path_buf(),
        error,
    })
}

impl ModelShape {
    pub fn from_gguf<B: AsRef<[u8]>>(g: &Gguf<B>) -> Result<Self, FormatError> {
        let missing = |key: &str| FormatError::MissingKey { key: key.into() };
        let architecture = g
            .architecture()
            .ok_or_else(|| missing("general.architecture"))?
            .to_owned();
        let get = |suffix: &str| -> Option<u64> {
            match g.metadata(&format!("{architecture}.{suffix}"))? {
                // Per-layer values: the largest layer sizes the cache.
                Value::Array(a) if a.len() <= MAX_PER_LAYER => {
                    a.iter().filter_map(|v| clamped(&v)).max()
                }
                v => clamped(&v),
            }
        };
        let need =
            |suffix: &str| get(suffix).ok_or_else(|| missing(&format!("{architecture}.{suffix}")));
        let n_layer = need("block_count")?;
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?.max(1);
        let n_head_kv = get("attention.head_count_kv").unwrap_or(n_head);
        let head_dim_k = get("attention.key_length").unwrap_or(n_embd / n_head);
        let head_dim_v = get("attention.value_length").unwrap_or(n_embd / n_head);
        let n_vocab = match g.get_array_len("tokenizer.ggml.tokens") {
            Some(len) => len as u64,
            None => get("vocab_size").unwrap_or(0),
        };
        Ok(ModelShape {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff: get("feed_forward_length").unwrap_or(n_embd.saturating_mul(4)),
            n_vocab,
            n_ctx_train: get("context_length").unwrap_or(0),
            tensor_bytes: g.tensor_bytes(),
            file_bytes: g.file_len(),
            architecture,
        })
    }
}

/// An integer of any type, negatives as 0 (as the ledger always read them).
fn clamped(v: &Value<'_>) -> Option<u64> {
    v.as_u64().or_else(|| v.as_i64().map(|_| 0))
}
