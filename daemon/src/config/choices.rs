//! The settings that are a choice among names: prompt reuse, backend, device.

use serde::{Deserialize, Serialize};

/// Prompt reuse (`--prefix-cache`), spelled the same as a flag, in the file and in the
/// environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrefixCache {
    /// Reuse only KV rows computed exactly as without reuse: temperature-0 output is the
    /// same token for token as with reuse off.
    On,
    Off,
    /// Also reuse rows computed while decoding, as llama-server does: a resent chat history
    /// recomputes only the new turn, and temperature-0 output may differ from reuse off
    /// (llama.cpp rounds decoded rows differently from prompt rows).
    Relaxed,
}

impl PrefixCache {
    pub fn enabled(self) -> bool {
        self != PrefixCache::Off
    }
}

impl std::str::FromStr for PrefixCache {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "on" => Ok(PrefixCache::On),
            "off" => Ok(PrefixCache::Off),
            "relaxed" => Ok(PrefixCache::Relaxed),
            other => Err(format!("expected `on`, `off` or `relaxed`, got `{other}`")),
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
