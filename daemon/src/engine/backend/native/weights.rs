//! The model's tensors, borrowed from a [`TensorSource`] (a mapped GGUF file, a test buffer):
//! the Q8_0 matrices zero-copy, the small F32 vectors (norms, biases) copied out.

use std::fmt;

use half::f16;
use inferloop_kernels::q8::{row_bytes, Q8Matrix};

use super::error::NativeError;
use super::hparams::HParams;

/// A tensor's element type as the forward pass sees it; every other GGUF type is
/// [`TensorKind::Other`] with its name (`Q4_1`, `BF16`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorKind {
    F32,
    F16,
    Q8_0,
    Other(String),
}

impl fmt::Display for TensorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorKind::F32 => f.write_str("F32"),
            TensorKind::F16 => f.write_str("F16"),
            TensorKind::Q8_0 => f.write_str("Q8_0"),
            TensorKind::Other(name) => f.write_str(name),
        }
    }
}

/// One tensor as it lies in its source. `dims` are GGUF's, innermost first: a matrix of
/// `rows` rows of `k` values is `[k, rows]`. `bytes` are only as aligned as the source
/// makes them (GGUF: `general.alignment`), so nothing here casts them to wider types.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub kind: TensorKind,
    pub dims: Vec<u64>,
    pub bytes: &'a [u8],
}

/// Tensors by GGUF name (`blk.0.attn_q.weight`).
pub trait TensorSource {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>>;
}

/// One transformer block.
pub struct Layer<'a> {
    pub attn_norm: Vec<f32>,
    pub wq: Q8Matrix<'a>,
    pub wk: Q8Matrix<'a>,
    pub wv: Q8Matrix<'a>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: Q8Matrix<'a>,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: Q8Matrix<'a>,
    pub ffn_up: Q8Matrix<'a>,
    pub ffn_down: Q8Matrix<'a>,
}

/// Every tensor the forward pass reads, shapes checked against the [`HParams`]. (No
/// `Debug`: it would print the weights.)
pub struct Weights<'a> {
    /// `[n_vocab][n_embd]`.
    pub token_embd: Q8Matrix<'a>,
    pub layers: Vec<Layer<'a>>,
    pub output_norm: Vec<f32>,
    /// `[n_vocab][n_embd]`; the embedding itself when the model ties them.
    pub output: Q8Matrix<'a>,
    /// Whether `output.weight` was absent and `token_embd.weight` stands in for it.
    pub tied_output: bool,
}

impl<'a> Weights<'a> {
    /// Collects and checks the tensors. A linear weight in any type but Q8_0 is an error
    /// naming the tensor and its type; so is a wrong shape or byte count.
    pub fn load(hp: &HParams, src: &'a dyn TensorSource) -> Result<Self, NativeError> {
        let ld = Loader { src };
        let (e, q, kv, ff) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff);
        if src.tensor("rope_freqs.weight").is_some() {
            return Err(NativeError::Unsupported(
                "per-dimension RoPE frequency factors (`rope_freqs.weight`, llama 3.1 scaling)"
                    .into(),
            ));
        }
        let token_embd = ld.matrix("token_embd.weight", hp.n_vocab, e)?;
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |t: &str| format!("blk.{i}.{t}");
                // Q, K, V biases are optional for both (llama.cpp loads them for llama too);
                // others would be silently dropped, so they are refused.
                let bias = |t: &str, len| ld.opt_vector(&n(t), len);
                for t in [
                    "attn_output.bias",
                    "ffn_gate.bias",
                    "ffn_up.bias",
                    "ffn_down.bias",
                ] {
                    if src.tensor(&n(t)).is_some() {
                        return Err(NativeError::Unsupported(format!(
                            "tensor `{}`: biases other than Q, K and V are not implemented",
                            n(t)
                        )));
                    }
                }
                Ok(Layer {
                    attn_norm: ld.vector(&n("attn_norm.weight"), e)?,
                    wq: ld.matrix(&n("attn_q.weight"), q, e)?,
                    wk: ld.matrix(&n("attn_k.weight"), kv, e)?,
                    wv: ld.matrix(&n("attn_v.weight"), kv, e)?,
                    bq: bias("attn_q.bias", q)?,
                    bk: bias("attn_k.bias", kv)?,
                    bv: bias("attn_v.bias", kv)?,
                    wo: ld.matrix(&n("attn_output.weight"), e, q)?,
                    ffn_norm: ld.vector(&n("ffn_norm.weight"), e)?,
                    ffn_gate: ld.matrix(&n("ffn_gate.weight"), ff, e)?,
                    ffn_up: ld.matrix(&n("ffn_up.weight"), ff, e)?,
                    ffn_down: ld.matrix(&n("ffn_down.weight"), e, ff)?,
                })
            })
            .collect::<Result<Vec<_>, NativeError>>()?;
        let output_norm = ld.vector("output_norm.weight", e)?;
        let (output, tied_output) = match src.tensor("output.weight") {
            Some(_) => (ld.matrix("output.weight", hp.n_vocab, e)?, false),
            None => (token_embd, true),
        };
        Ok(Self {
            token_embd,
            layers,
            output_norm,
            output,
            tied_output,
        })
    }
}

struct Loader<'a> {
    src: &'a dyn TensorSource,
}

impl<'a> Loader<'a> {
    fn get(&self, name: &str) -> Result<TensorRef<'a>, NativeError> {
        self.src
            .tensor(name)
            .ok_or_else(|| NativeError::MissingTensor(name.into()))
    }

    /// A Q8_0 matrix of `rows` rows of `k` weights.
    fn matrix(&self, name: &str, rows: usize, k: usize) -> Result<Q8Matrix<'a>, NativeError> {
        let t = self.get(name)?;
        if t.kind != TensorKind::Q8_0 {
            return Err(NativeError::TensorType {
                name: name.into(),
                kind: t.kind.to_string(),
                expected: "Q8_0",
            });
        }
        check_dims(name, &t.dims, &[k as u64, rows as u64])?;
        Q8Matrix::new(t.bytes, rows, k).map_err(|_| NativeError::TensorSize {
            name: name.into(),
            got: t.bytes.len(),
            need: rows * row_bytes(k),
        })
    }

    /// An F32 (or F16) vector of `n` values, copied out.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, NativeError> {
        let t = self.get(name)?;
        check_dims(name, &t.dims, &[n as u64])?;
        let width = match t.kind {
            TensorKind::F32 => 4,
            TensorKind::F16 => 2,
            _ => {
                return Err(NativeError::TensorType {
                    name: name.into(),
                    kind: t.kind.to_string(),
                    expected: "F32 or F16",
                })
            }
        };
        if t.bytes.len() != n * width {
            return Err(NativeError::TensorSize {
                name: name.into(),
                got: t.bytes.len(),
                need: n * width,
            });
        }
        // from_le_bytes, not a cast: the data is only as aligned as the file makes it.
        Ok(if width == 4 {
            t.bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        } else {
            t.bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect()
        })
    }

    fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, NativeError> {
        match self.src.tensor(name) {
            Some(_) => self.vector(name, n).map(Some),
            None => Ok(None),
        }
    }
}

fn check_dims(name: &str, dims: &[u64], expected: &[u64]) -> Result<(), NativeError> {
    if dims == expected {
        Ok(())
    } else {
        Err(NativeError::TensorShape {
            name: name.into(),
            dims: dims.to_vec(),
            expected: expected.to_vec(),
        })
    }
}
