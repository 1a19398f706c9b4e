//! The settings that are a choice among names: prompt reuse, speculation, backend, device.

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
    /// A second, smaller model drafts. Not implemented yet: refused at startup.
    Draft,
    Off,
}

impl Spec {
    pub fn enabled(self) -> bool {
        self == Spec::Ngram
    }
}

impl std::str::FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ngram" => Ok(Spec::Ngram),
            "draft" => Ok(Spec::Draft),
            "off" => Ok(Spec::Off),
            other => Err(format!("expected `ngram` or `off`, got `{other}`")),
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
