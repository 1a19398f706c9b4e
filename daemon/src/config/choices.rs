//! The settings that are a choice among names: prompt reuse, speculation, backend, device,
//! KV types.

use serde::{Deserialize, Serialize};

/// Prompt reuse (`--prefix-cache`), spelled the same as a flag, in the file and in the
/// environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrefixCache {
    /// Reuse every resident row, decoded ones included, wherever a prompt diverges, as
    /// llama-server does: a shared system prompt or a resent chat history costs only what
    /// is new. Temperature-0 output may differ from reuse off (llama.cpp rounds a row
    /// differently by the batch it was computed in). `relaxed`, its name before it became
    /// the default, is still accepted (deprecated).
    #[serde(alias = "relaxed")]
    #[value(alias = "relaxed")]
    On,
    /// Reuse only KV rows computed exactly as without reuse: temperature-0 output is the
    /// same token for token as with reuse off, at the cost of recomputing more.
    Exact,
    Off,
}

impl PrefixCache {
    pub fn enabled(self) -> bool {
        self != PrefixCache::Off
    }

    /// Only rows computed as without reuse are reused.
    pub fn exact(self) -> bool {
        self == PrefixCache::Exact
    }
}

impl std::str::FromStr for PrefixCache {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            // `relaxed`: the deprecated name of `on`, kept for existing config files.
            "on" | "relaxed" => Ok(PrefixCache::On),
            "exact" => Ok(PrefixCache::Exact),
            "off" => Ok(PrefixCache::Off),
            other => Err(format!("expected `on`, `exact` or `off`, got `{other}`")),
        }
    }
}

/// Speculative decoding (`--spec`), spelled the same as a flag, in the file and in the
/// environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Spec {
    /// Prompt lookup: drafts from the request's own prompt and output, no second model.
    Ngram,
    /// A second, smaller model with the same vocabulary drafts (`--draft-model`).
    Draft,
    Off,
}

/// Which drafts a step verifies (`--spec-gate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SpecGate {
    /// Only the drafts whose rows the measured step cost says raise throughput.
    #[default]
    Cost,
    /// Every draft, at the length its acceptance rate allows: for a GPU whose extra rows
    /// are nearly free, for benchmarks, and for tests that must see drafts verified on a
    /// machine too loaded to measure step costs.
    Always,
}

impl std::str::FromStr for SpecGate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cost" => Ok(SpecGate::Cost),
            "always" => Ok(SpecGate::Always),
            other => Err(format!("expected `cost` or `always`, got `{other}`")),
        }
    }
}

impl Spec {
    pub fn enabled(self) -> bool {
        self != Spec::Off
    }
}

impl std::str::FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ngram" => Ok(Spec::Ngram),
            "draft" => Ok(Spec::Draft),
            "off" => Ok(Spec::Off),
            other => Err(format!("expected `ngram`, `draft` or `off`, got `{other}`")),
        }
    }
}

/// Which engine computes tokens (`--backend`). `auto` picks the native engine on a CUDA GPU
/// with Q8_0 weights, llama.cpp otherwise (see [`crate::engine::select`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    #[default]
    Auto,
    Llama,
    Native,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "llama" => Ok(Self::Llama),
            "native" => Ok(Self::Native),
            other => Err(format!(
                "expected `auto`, `llama` or `native`, got `{other}`"
            )),
        }
    }
}

/// Where the engine computes (`--device`). `auto` is CUDA when a CUDA GPU is found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("expected `auto`, `cpu` or `cuda`, got `{other}`")),
        }
    }
}

/// One KV cache element type, as llama.cpp names it (`ggml_type`). Quantized types store
/// blocks of 32 elements with one f16 scale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub enum KvType {
    #[default]
    #[serde(rename = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }

    /// Elements per block and bytes per block (ggml's `blck_size` and `type_size`).
    pub fn block(self) -> (u64, u64) {
        match self {
            Self::F16 => (1, 2),
            // An f16 scale and 32 signed bytes.
            Self::Q8_0 => (32, 34),
            // An f16 scale and 32 nibbles.
            Self::Q4_0 => (32, 18),
        }
    }

    /// Bytes of a row of `elements` (ggml's `ggml_row_size`). A row that is not a whole
    /// number of blocks is counted as if padded: llama.cpp refuses such a cache when it
    /// creates the context (a head size that is not a multiple of 32).
    pub fn row_bytes(self, elements: u64) -> u64 {
        let (per_block, bytes) = self.block();
        elements.div_ceil(per_block) * bytes
    }

    pub fn is_quantized(self) -> bool {
        self != Self::F16
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("expected `f16`, `q8_0` or `q4_0`, got `{s}`"))
    }
}

/// The KV cache's element types (`--kv-type K[,V]`): one name sets K and V, two separated
/// by a comma set K, then V. Spelled the same as a flag, in the file and in the
/// environment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// llama.cpp's default, and the only one the native backend keeps.
    pub const F16: KvTypes = KvTypes {
        k: KvType::F16,
        v: KvType::F16,
    };

    pub fn both(t: KvType) -> Self {
        Self { k: t, v: t }
    }

    pub fn is_f16(self) -> bool {
        self == Self::F16
    }
}

impl std::fmt::Display for KvTypes {
    /// `q8_0` when K and V agree, else `K,V`: what the flag takes back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "{},{}", self.k, self.v)
        }
    }
}

impl std::str::FromStr for KvTypes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(',') {
            None => Ok(Self::both(s.parse()?)),
            Some((k, v)) => Ok(Self {
                k: k.parse().map_err(|e| format!("K type: {e}"))?,
                v: v.parse().map_err(|e| format!("V type: {e}"))?,
            }),
        }
    }
}

impl TryFrom<String> for KvTypes {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}
