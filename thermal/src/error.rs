//! The thermal crate's one error type.

use std::path::PathBuf;

/// What went wrong opening or reading a thermal source, or configuring the watch.
#[derive(Debug, thiserror::Error)]
pub enum ThermalError {
    /// The sysfs root given (`--sysfs-root`) is not a readable directory.
    #[error("sysfs root {path} is not a readable directory: {source}")]
    SysRoot {
        path: PathBuf,
        source: std::io::Error,
    },

    /// libnvidia-ml could not be loaded or initialised; callers fall back to sysfs.
    #[error("NVML is not available: {reason}")]
    NvmlUnavailable { reason: String },

    /// An NVML query that every GPU answers failed (device lost, driver gone).
    #[error("NVML {call} failed: {message}")]
    Nvml { call: &'static str, message: String },

    /// A setting is out of range; names the field and the limit.
    #[error("`{field}` {message}")]
    InvalidConfig {
        field: &'static str,
        message: String,
    },

    /// A source could not produce a reading (a scripted failure of [`crate::FakeSource`],
    /// or every part of a merged source failing).
    #[error("thermal source {source_name} failed: {message}")]
    SourceFailed {
        source_name: String,
        message: String,
    },
}

impl ThermalError {
    /// Stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SysRoot { .. } => "sysfs_root",
            Self::NvmlUnavailable { .. } => "nvml_unavailable",
            Self::Nvml { .. } => "nvml_failed",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::SourceFailed { .. } => "source_failed",
        }
    }
}
