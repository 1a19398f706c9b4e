//! Boot gates, run before anything large is allocated: the weights against the manifest
//! (exit 3), then the memory ledger against the limits (exit 1).

use std::path::Path;
use std::sync::OnceLock;

use inferloop_manifest::{verify_weights, IntegrityError, Manifest, VerifyCache};

use crate::config::ServeConfig;
use crate::exit::ExitCode;
use crate::ledger::{read_limits, read_shape, Decision, GgufError, Plan};

/// llama.cpp's widest micro-batch: `engine::worker` caps the context's `n_ubatch` at this and
/// the ledger sizes the compute term with it (the prefill chunk plus the decode rows of the
/// slots always reach it).
pub const N_UBATCH: u64 = 512;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    #[error("memory admission rejected: {}", .0.accounting())]
    Memory(Box<Decision>),
    #[error("cannot size the model: {0}")]
    Model(#[from] GgufError),
}

impl BootError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Integrity(_) => ExitCode::Integrity,
            Self::Memory(_) => ExitCode::MemoryRefused,
            Self::Model(_) => ExitCode::ModelLoad,
        }
    }
}

/// What the gates established.
#[derive(Debug, Clone)]
pub struct Passed {
    pub decision: Decision,
    /// The weights' SHA-256 when a manifest pinned it.
    pub pinned_sha256: Option<String>,
    pub manifest_sha256: Option<String>,
    /// The SHA-256 of the weights being served: the pin once verified, otherwise set by the
    /// background hash after start (empty until it finishes), so `/v1/status` can report it.
    pub observed_sha256: OnceLock<String>,
}

/// Verifies the weights when a manifest is configured.
pub fn check_integrity(config: &ServeConfig) -> Result<Option<(String, String)>, IntegrityError> {
    let Some(manifest_path) = config.manifest.as_deref() else {
        return Ok(None);
    };
    let loaded = Manifest::load(manifest_path)?;
    loaded.manifest.check_for_serve(manifest_path)?;
    let cache = config.state_dir.as_deref().map(VerifyCache::in_dir);
    verify_weights(&config.model, &loaded.manifest.model, cache.as_ref())?;
    Ok(Some((loaded.manifest.model.sha256, loaded.raw_sha256)))
}

/// Computes the ledger from the GGUF header and decides against the limits under `root`.
pub fn check_memory(config: &ServeConfig, root: &Path) -> Result<Decision, GgufError> {
    let shape = read_shape(&config.model)?;
    let plan = Plan {
        slots: config.slots as u64,
        ctx: u64::from(config.ctx),
        kv_cells: u64::from(config.kv_cells),
        n_ubatch: N_UBATCH,
        margin_bytes: config.memory_margin,
    };
    Ok(Decision::new(
        shape,
        plan,
        read_limits(root, config.memory_budget),
    ))
}

/// Both gates, in order. Logs the accounting at INFO when it fits.
pub fn run_gates(config: &ServeConfig) -> Result<Passed, BootError> {
    let pinned = check_integrity(config)?;
    let decision = check_memory(config, Path::new("/"))?;
    if !decision.fits {
        return Err(BootError::Memory(Box::new(decision)));
    }
    tracing::info!("memory admission accepted: {}", decision.accounting());
    let (pinned_sha256, manifest_sha256) = pinned.unzip();
    // Verified against the file just above: the pin is what is served.
    let observed_sha256 = pinned_sha256
        .clone()
        .map(OnceLock::from)
        .unwrap_or_default();
    Ok(Passed {
        decision,
        pinned_sha256,
        manifest_sha256,
        observed_sha256,
    })
}
