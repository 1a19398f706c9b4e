//! Just enough of the GGUF format to size a model without loading it: the header's metadata
//! and tensor table, read with small buffered reads (the tensor data is never touched).

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

/// Shape facts the ledger needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (magic {magic:?})")]
    NotGguf { path: String, magic: [u8; 4] },
    #[error("{path}: GGUF version {version} is not supported")]
    Version { path: String, version: u32 },
    #[error("{path}: malformed header: {message}")]
    Malformed { path: String, message: String },
    #[error("{path}: metadata key `{key}` is missing")]
    MissingKey { path: String, key: String },
}

#[derive(Debug, Clone)]
enum Value {
    Uint(u64),
    Int(i64),
    Other,
    Str(String),
    /// Arrays keep their length and, for integer arrays, their values (per-layer head counts).
    Array(u64, Vec<u64>),
}

/// Longest string or array we accept in a header; real headers stay far below.
const MAX_LEN: u64 = 1 << 28;

struct Reader<R> {
    inner: R,
    path: String,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|source| GgufError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn malformed(&self, message: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.clone(),
            message,
        }
    }
    fn skip(&mut self, n: u64) -> Result<(), GgufError> {
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink()).map_err(
            |source| GgufError::Io {
                path: self.path.clone(),
                source,
            },
        )?;
        if copied != n {
            return Err(self.malformed("truncated".into()));
        }
        Ok(())
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        if len > MAX_LEN {
            return Err(self.malformed(format!("string of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
    fn scalar(&mut self, ty: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::Uint(u64::from(self.bytes::<1>()?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Value::Uint(u64::from(self.u32()?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => {
                self.bytes::<4>()?;
                Value::Other
            }
            7 => {
                self.bytes::<1>()?;
                Value::Other
            }
            8 => Value::Str(self.string()?),
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => {
                self.bytes::<8>()?;
                Value::Other
            }
            other => return Err(self.malformed(format!("unknown value type {other}"))),
        })
    }
    fn value(&mut self, ty: u32) -> Result<Value, GgufError> {
        if ty != 9 {
            return self.scalar(ty);
        }
        let elem = self.u32()?;
        let len = self.u64()?;
        if len > MAX_LEN {
            return Err(self.malformed(format!("array of {len} items")));
        }
        let fixed = match elem {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        // Integer arrays are kept (per-layer values); big arrays of other types are skipped.
        if matches!(elem, 0 | 2 | 4 | 5 | 10 | 11) && len <= 4096 {
            let mut vals = Vec::with_capacity(len as usize);
            for _ in 0..len {
                match self.scalar(elem)? {
                    Value::Uint(v) => vals.push(v),
                    Value::Int(v) => vals.push(v.max(0) as u64),
                    _ => {}
                }
            }
            return Ok(Value::Array(len, vals));
        }
        match fixed {
            Some(size) => self.skip(len * size)?,
            None => {
                for _ in 0..len {
                    self.value(elem)?;
                }
            }
        }
        Ok(Value::Array(len, Vec::new()))
    }
}

/// Bytes per block and elements per block of a ggml tensor type.
fn type_size(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        0 => (4, 1),     // F32
        1 => (2, 1),     // F16
        2 => (18, 32),   // Q4_0
        3 => (20, 32),   // Q4_1
        6 => (22, 32),   // Q5_0
        7 => (24, 32),   // Q5_1
        8 => (34, 32),   // Q8_0
        9 => (36, 32),   // Q8_1
        10 => (84, 256), // Q2_K
        11 => (110, 256),
        12 => (144, 256),
        13 => (176, 256),
        14 => (210, 256),
        15 => (292, 256),
        16 => (66, 256), // IQ2_XXS
        17 => (74, 256),
        18 => (98, 256),
        19 => (50, 256),
        20 => (18, 32), // IQ4_NL
        21 => (110, 256),
        22 => (82, 256),
        23 => (136, 256),
        24 => (1, 1), // I8
        25 => (2, 1),
        26 => (4, 1),
        27 => (8, 1),
        28 => (8, 1),    // F64
        29 => (56, 256), // IQ1_M
        30 => (2, 1),    // BF16
        34 => (54, 256), // TQ1_0
        35 => (66, 256), // TQ2_0
        39 => (17, 32),  // MXFP4
        _ => return None,
    })
}

/// Reads the header of a GGUF file.
pub fn read_shape(path: &Path) -> Result<ModelShape, GgufError> {
    let shown = path.display().to_string();
    let io = |source| GgufError::Io {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let file_bytes = file.metadata().map_err(io)?.len();
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
        path: shown.clone(),
    };
    let magic = r.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err(GgufError::NotGguf { path: shown, magic });
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version {
            path: shown,
            version,
        });
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    if n_tensors > MAX_LEN || n_kv > MAX_LEN {
        return Err(r.malformed(format!("{n_tensors} tensors, {n_kv} keys")));
    }
    let mut kv = HashMap::new();
    for _ in 0..n_kv {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty)?;
        kv.insert(key, value);
    }
    let mut tensor_bytes = 0u64;
    for _ in 0..n_tensors {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 8 {
            return Err(r.malformed(format!("tensor {name} has {n_dims} dimensions")));
        }
        let mut elements = 1u64;
        for _ in 0..n_dims {
            elements = elements.saturating_mul(r.u64()?);
        }
        let ty = r.u32()?;
        let _offset = r.u64()?;
        let (block_bytes, block_elems) = type_size(ty)
            .ok_or_else(|| r.malformed(format!("tensor {name} has unknown type {ty}")))?;
        tensor_bytes += elements.div_ceil(block_elems) * block_bytes;
    }
    shape_from(kv, tensor_bytes, file_bytes, &shown)
}

fn shape_from(
    kv: HashMap<String, Value>,
    tensor_bytes: u64,
    file_bytes: u64,
    path: &str,
) -> Result<ModelShape, GgufError> {
    let architecture = match kv.get("general.architecture") {
        Some(Value::Str(s)) => s.clone(),
        _ => {
            return Err(GgufError::MissingKey {
                path: path.into(),
                key: "general.architecture".into(),
            })
        }
    };
    let get = |suffix: &str| -> Option<u64> {
        match kv.get(&format!("{architecture}.{suffix}"))? {
            Value::Uint(v) => Some(*v),
            Value::Int(v) => Some((*v).max(0) as u64),
            // Per-layer values: the largest layer sizes the cache.
            Value::Array(_, vals) => vals.iter().copied().max(),
            _ => None,
        }
    };
    let need = |suffix: &str| {
        get(suffix).ok_or_else(|| GgufError::MissingKey {
            path: path.into(),
            key: format!("{architecture}.{suffix}"),
        })
    };
    let n_layer = need("block_count")?;
    let n_embd = need("embedding_length")?;
    let n_head = need("attention.head_count")?.max(1);
    let n_head_kv = get("attention.head_count_kv").unwrap_or(n_head);
    let head_dim_k = get("attention.key_length").unwrap_or(n_embd / n_head);
    let head_dim_v = get("attention.value_length").unwrap_or(n_embd / n_head);
    let n_vocab = match kv.get("tokenizer.ggml.tokens") {
        Some(Value::Array(len, _)) => *len,
        _ => get("vocab_size").unwrap_or(0),
    };
    Ok(ModelShape {
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
        n_ff: get("feed_forward_length").unwrap_or(4 * n_embd),
        n_vocab,
        n_ctx_train: get("context_length").unwrap_or(0),
        tensor_bytes,
        file_bytes,
        architecture,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_a_gguf_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.gguf");
        std::fs::write(&p, b"PK\x03\x04rest").expect("write");
        assert!(matches!(read_shape(&p), Err(GgufError::NotGguf { .. })));
    }

    #[test]
    fn truncated_header_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"gen");
        std::fs::write(&p, &bytes).expect("write");
        assert!(read_shape(&p).is_err());
    }

    #[test]
    fn absurd_lengths_are_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        std::fs::write(&p, &bytes).expect("write");
        assert!(matches!(read_shape(&p), Err(GgufError::Malformed { .. })));
    }
}
