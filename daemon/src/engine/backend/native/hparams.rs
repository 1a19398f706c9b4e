//! The model's shape and constants, read from its metadata (GGUF keys) through [`Metadata`].

use inferloop_kernels::cpu::attention::MAX_HEAD_DIM;
use inferloop_kernels::cpu::rope::{Rope, RopeMode};
use inferloop_kernels::q8::QK;

use super::error::NativeError;

/// Metadata lookup by GGUF key. Integers of any width come back as `u64`, floats as `f32`;
/// a key that is absent or of another type is `None`.
pub trait Metadata {
    fn get_u64(&self, key: &str) -> Option<u64>;
    fn get_f32(&self, key: &str) -> Option<f32>;
    fn get_str(&self, key: &str) -> Option<&str>;
    /// Elements of an array value (`tokenizer.ggml.tokens`), if the source can tell.
    fn get_array_len(&self, key: &str) -> Option<u64> {
        let _ = key;
        None
    }
}

/// The architectures the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3 (without llama 3.1's rope frequency factors), SmolLM2, Mistral 7B.
    Llama,
    /// Qwen2 and Qwen2.5: NeoX rotation (and biases on Q, K, V, which llama may have too).
    Qwen2,
}

impl Arch {
    /// The `general.architecture` value, also the prefix of the other keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }

    /// Which dims RoPE pairs (llama.cpp's `LLAMA_ROPE_TYPE_NORM` / `_NEOX`).
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Arch::Llama => RopeMode::Normal,
            Arch::Qwen2 => RopeMode::Neox,
        }
    }
}

/// A Llama-family model's hyperparameters, checked against what the kernels can run.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Leading dims of each head that RoPE rotates (even, at most `head_dim`).
    pub rope_dims: usize,
    pub n_ctx_train: usize,
}

impl HParams {
    /// Reads and checks the hyperparameters. Keys are llama.cpp's; defaults are its own
    /// (`rope.freq_base` 10000, `rope.dimension_count` = head size, `head_count_kv` =
    /// `head_count`, head size `embedding_length / head_count` unless `attention.key_length`).
    pub fn from_metadata(md: &dyn Metadata) -> Result<Self, NativeError> {
        let arch_name = md
            .get_str("general.architecture")
            .ok_or_else(|| missing("general.architecture", "a string"))?;
        let arch =
            Arch::parse(arch_name).ok_or_else(|| NativeError::UnsupportedArch(arch_name.into()))?;
        let a = arch.name();
        let int = |key: String| -> Result<usize, NativeError> {
            let v = md
                .get_u64(&key)
                .ok_or_else(|| missing(&key, "an integer"))?;
            usize::try_from(v).map_err(|_| bad(format!("`{key}` = {v} does not fit in memory")))
        };
        let opt_int = |key: String| -> Result<Option<usize>, NativeError> {
            match md.get_u64(&key) {
                None => Ok(None),
                Some(_) => int(key).map(Some),
            }
        };
        let n_embd = int(format!("{a}.embedding_length"))?;
        let n_layer = int(format!("{a}.block_count"))?;
        let n_ff = int(format!("{a}.feed_forward_length"))?;
        let n_head = int(format!("{a}.attention.head_count"))?;
        let n_head_kv = opt_int(format!("{a}.attention.head_count_kv"))?.unwrap_or(n_head);
        let n_ctx_train = int(format!("{a}.context_length"))?;
        let rms_key = format!("{a}.attention.layer_norm_rms_epsilon");
        let rms_eps = md
            .get_f32(&rms_key)
            .ok_or_else(|| missing(&rms_key, "a float"))?;
        let rope_theta = md
            .get_f32(&format!("{a}.rope.freq_base"))
            .unwrap_or(10000.0);
        if n_head == 0 || n_embd == 0 || n_layer == 0 || n_ff == 0 {
            return Err(bad(format!(
                "zero in embedding_length {n_embd}, block_count {n_layer}, \
                 feed_forward_length {n_ff} or head_count {n_head}"
            )));
        }
        let head_dim = match opt_int(format!("{a}.attention.key_length"))? {
            Some(k) => k,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(bad(format!(
                    "embedding_length {n_embd} is not a multiple of head_count {n_head}"
                )))
            }
        };
        if let Some(vl) = opt_int(format!("{a}.attention.value_length"))? {
            if vl != head_dim {
                return Err(NativeError::Unsupported(format!(
                    "value head size {vl} differs from key head size {head_dim}"
                )));
            }
        }
        let rope_dims = opt_int(format!("{a}.rope.dimension_count"))?.unwrap_or(head_dim);
        let n_vocab = match opt_int(format!("{a}.vocab_size"))? {
            Some(n) => n,
            None => md
                .get_array_len("tokenizer.ggml.tokens")
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| missing(&format!("{a}.vocab_size"), "an integer"))?,
        };
        check_rope_scaling(md, a)?;
        let hp = Self {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            rms_eps,
            rope_theta,
            rope_dims,
            n_ctx_train,
        };
        hp.check()?;
        Ok(hp)
    }

    /// Width of the query projection (all heads).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key and value projections.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The rotation of `n_head` heads (the query's, or the keys' with `n_head_kv`).
    pub fn rope(&self, n_head: usize) -> Rope {
        Rope {
            n_head,
            head_dim: self.head_dim,
            rot_dims: self.rope_dims,
            theta_base: self.rope_theta,
            mode: self.arch.rope_mode(),
        }
    }

    /// What the kernels can run: heads the attention kernel holds, Q8_0 rows of whole
    /// blocks, a rotation inside the head.
    fn check(&self) -> Result<(), NativeError> {
        let unsupported = |why: String| Err(NativeError::Unsupported(why));
        if self.n_head_kv == 0 || self.n_head % self.n_head_kv != 0 {
            return Err(bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            )));
        }
        if self.head_dim == 0 || self.head_dim % 32 != 0 || self.head_dim > MAX_HEAD_DIM {
            return unsupported(format!(
                "head size {}: the attention kernel takes multiples of 32 up to {MAX_HEAD_DIM}",
                self.head_dim
            ));
        }
        for (what, n) in [
            ("embedding_length", self.n_embd),
            ("feed_forward_length", self.n_ff),
        ] {
            if n % QK != 0 {
                return unsupported(format!(
                    "{what} {n} is not a multiple of the Q8_0 block ({QK})"
                ));
            }
        }
        if self.rope_dims % 2 != 0 || self.rope_dims > self.head_dim {
            return Err(bad(format!(
                "rope.dimension_count {} must be even and at most the head size {}",
                self.rope_dims, self.head_dim
            )));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(bad(format!("rope.freq_base {}", self.rope_theta)));
        }
        if !(self.rms_eps >= 0.0 && self.rms_eps.is_finite()) {
            return Err(bad(format!("layer_norm_rms_epsilon {}", self.rms_eps)));
        }
        if self.n_vocab == 0 {
            return Err(bad("an empty vocabulary".into()));
        }
        Ok(())
    }
}

/// RoPE scaling (linear, YaRN, llama 3.1's factors) is not implemented: refuse it rather than
/// compute something else. A factor of 1 or type `none` is plain RoPE.
fn check_rope_scaling(md: &dyn Metadata, a: &str) -> Result<(), NativeError> {
    let kind = md.get_str(&format!("{a}.rope.scaling.type"));
    let factor = md
        .get_f32(&format!("{a}.rope.scaling.factor"))
        .or_else(|| md.get_f32(&format!("{a}.rope.scale_linear")));
    // llama.cpp reads a factor of 0 as "none".
    let scaled = factor.is_some_and(|f| f != 0.0 && f != 1.0);
    let other = kind.is_some_and(|k| k != "none" && k != "linear");
    if scaled || other {
        Err(NativeError::Unsupported(format!(
            "RoPE scaling `{}` with factor {}",
            kind.unwrap_or("linear"),
            factor.unwrap_or(1.0)
        )))
    } else {
        Ok(())
    }
}

fn missing(key: &str, expected: &'static str) -> NativeError {
    NativeError::MissingKey {
        key: key.into(),
        expected,
    }
}

fn bad(why: String) -> NativeError {
    NativeError::BadMetadata(why)
}
