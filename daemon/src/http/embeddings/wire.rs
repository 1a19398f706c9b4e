//! The embeddings wire types: the request as OpenAI defines it, the list answered, and
//! the base64 form of a vector.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/embeddings`. Strict: a field OpenAI does not define is an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// A string, a list of strings, a list of token ids or a list of lists of token ids:
    /// told apart by validation, which names the item at fault.
    pub input: Option<Value>,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    /// Accepted, as OpenAI's end-user id; not used.
    #[allow(dead_code)]
    pub user: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingData {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vector,
}

/// A vector as floats, or as base64 of its little-endian f32 bytes.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

impl Vector {
    pub fn encode(v: Vec<f32>, base64: bool) -> Self {
        if base64 {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Self::Base64(base64_encode(&bytes))
        } else {
            Self::Float(v)
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

/// Standard base64 (RFC 4648 §4) with padding, as Python's `base64.b64decode` reads it.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
