//! Boot gates, run before anything large is allocated: the weights against the manifest
//! (exit 3), the backend and device choice (exit 2; 4 for a GPU that cannot be opened
//! without `cpu_fallback`), then the memory ledger against the limits (exit 1).

use std::sync::{Arc, OnceLock};

use inferloop_manifest::{verify_weights, IntegrityError, VerifyCache};

use crate::config::{ConfigError, ServeConfig};
use crate::engine::select::{self, SelectError, Selection};
use crate::engine::EnginePlan;
use crate::exit::ExitCode;
use crate::ledger::{read_limits, read_shape, Decision, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// `Arc`: shared with the config, which keeps a manifest load error for this gate.
    #[error(transparent)]
    Integrity(Arc<IntegrityError>),
    #[error("memory admission rejected: {}", .0.accounting())]
    Memory(Box<Decision>),
    #[error("cannot size the model: {0}")]
    Model(#[from] GgufError),
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The slots, context and KV settings do not make a plan (exit 2).
    #[error(transparent)]
    Plan(#[from] ConfigError),
    /// The draft model cannot draft for this model (exit 2).
    #[error("draft model {path} cannot draft for {model}: it {why}")]
    Draft {
        path: String,
        model: String,
        why: inferloop_gguf::VocabMismatch,
    },
}

impl From<IntegrityError> for BootError {
    fn from(e: IntegrityError) -> Self {
        Self::Integrity(Arc::new(e))
    }
}

impl BootError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Integrity(_) => ExitCode::Integrity,
            Self::Memory(_) => ExitCode::MemoryRefused,
            Self::Model(_) => ExitCode::ModelLoad,
            Self::Select(e) => e.exit_code(),
            Self::Plan(_) | Self::Draft { .. } => ExitCode::Usage,
        }
    }
}

/// What the gates established.
#[derive(Debug, Clone)]
pub struct Passed {
    /// The engine's shape, derived once: the ledger sized it, the backend allocates it,
    /// `/v1/status` and `/metrics` report it.
    pub plan: EnginePlan,
    /// The backend and device that serve, resolved once.
    pub selection: Selection,
    pub decision: Decision,
    /// The weights' SHA-256 when a manifest pinned it.
    pub pinned_sha256: Option<String>,
    pub manifest_sha256: Option<String>,
    /// The SHA-256 of the weights being served: the pin once verified, otherwise set by the
    /// background hash after start (empty until it finishes), so `/v1/status` can report it.
    pub observed_sha256: Arc<OnceLock<String>>,
}

/// Verifies the weights when a manifest is configured, against the manifest that
/// [`ServeConfig::resolve`] loaded (a load error then surfaces here, exit 3).
pub fn check_integrity(config: &ServeConfig) -> Result<Option<(String, String)>, BootError> {
    let loaded = match &config.loaded_manifest {
        None => return Ok(None),
        Some(Ok(loaded)) => loaded,
        Some(Err(e)) => return Err(BootError::Integrity(Arc::clone(e))),
    };
    loaded.manifest.check_for_serve(&loaded.path)?;
    let cache = config.state_dir.as_deref().map(VerifyCache::in_dir);
    verify_weights(&config.model, &loaded.manifest.model, cache.as_ref())?;
    // A manifest vouches for everything the daemon maps: a draft model too.
    if let Some(draft) = &config.draft_model {
        let pin = loaded.manifest.draft_model.as_ref().ok_or_else(|| {
            IntegrityError::BadField {
                path: loaded.path.display().to_string(),
                field: "draft_model",
                message: format!(
                    "pins no draft model, but {} is configured to draft; pin it (path, sha256, size) or drop --draft-model",
                    draft.display()
                ),
            }
        })?;
        verify_weights(draft, pin, cache.as_ref())?;
    }
    Ok(Some((
        loaded.manifest.model.sha256.clone(),
        loaded.raw_sha256.clone(),
    )))
}

/// Resolves `--backend` and `--device` against this machine, the weights and the plan;
/// logs why.
pub fn select_backend(config: &ServeConfig, plan: &EnginePlan) -> Result<Selection, SelectError> {
    let selection = select::select(
        config.backend,
        config.device,
        config.cpu_fallback,
        select::probe_gpu,
        || select::first_non_q8_0(&config.model),
    )?;
    selection.check_plan(plan)?;
    let gpu = selection.gpu.as_deref().unwrap_or("none");
    if selection.gpu_error.is_some() {
        // Serving, but not where it was asked to: loud enough to be seen in the journal.
        tracing::warn!(
            backend = selection.name(),
            device = selection.device.name(),
            gpu,
            why = %selection.why,
            "backend selected: CPU fallback"
        );
    } else {
        tracing::info!(
            backend = selection.name(),
            device = selection.device.name(),
            gpu,
            why = %selection.why,
            "backend selected"
        );
    }
    Ok(selection)
}

/// Computes the ledger (for `selection`'s backend) from the GGUF header and decides against
/// the limits read under the configured `/proc` and `/sys` roots (`--proc-root`,
/// `--sysfs-root`). Sizes the prompt cache's RAM tier first when it was not configured
/// ([`default_ram_tier`]).
pub fn check_memory(
    config: &ServeConfig,
    plan: &mut EnginePlan,
    selection: &Selection,
) -> Result<Decision, GgufError> {
    let shape = read_shape(&config.model)?;
    let draft = config.draft_model.as_deref().map(read_shape).transpose()?;
    let limits = read_limits(&config.thermal.roots, config.memory_budget);
    let decide = |plan: &EnginePlan| {
        Decision::new(
            shape.clone(),
            draft.as_ref(),
            plan,
            selection,
            config.max_connections,
            config.memory_margin,
            limits.clone(),
        )
    };
    if config.prompt_cache_ram.is_none() && plan.prefix_cache.enabled() {
        plan.prompt_cache.ram_bytes = default_ram_tier(plan, &shape);
        let with = decide(plan);
        if !with.fits {
            // Shrunk to a quarter of what the rest leaves, so that a default never refuses
            // a box that fits without it.
            plan.prompt_cache.ram_bytes = 0;
            let without = decide(plan);
            let headroom = without
                .limit
                .as_ref()
                .map_or(0, |l| l.bytes.saturating_sub(without.required_bytes) / 4);
            let ram = headroom >> 20 << 20;
            plan.prompt_cache.ram_bytes = if ram < 16 << 20 { 0 } else { ram };
        }
    }
    Ok(decide(plan))
}

/// The largest RAM tier sized by default (llama-server's `--cache-ram` default).
pub const RAM_TIER_MAX: u64 = 8 << 30;

/// The RAM tier's default: room for twice the slots' prompts at full context (what the
/// slots' KV cells hold, twice over), at most [`RAM_TIER_MAX`]. It does not follow the
/// memory free at boot, so the same config asks for the same ledger on every start.
pub fn default_ram_tier(plan: &EnginePlan, shape: &inferloop_gguf::ModelShape) -> u64 {
    let entry = crate::ledger::prompt_cache_entry_bytes(shape, plan);
    (2 * plan.slots as u64 * entry).min(RAM_TIER_MAX) >> 20 << 20
}

/// A draft model must tokenize exactly like the model it drafts for: a drafted id is
/// verified as the model's own.
pub fn check_draft_vocab(config: &ServeConfig) -> Result<(), BootError> {
    let Some(draft) = &config.draft_model else {
        return Ok(());
    };
    let model = inferloop_gguf::GgufFile::open(&config.model)?;
    let theirs = inferloop_gguf::GgufFile::open(draft)?;
    inferloop_gguf::same_vocab(&model, &theirs).map_err(|why| BootError::Draft {
        path: draft.display().to_string(),
        model: config.model.display().to_string(),
        why,
    })
}

/// Both gates, in order. Logs the accounting at INFO when it fits.
pub fn run_gates(config: &ServeConfig) -> Result<Passed, BootError> {
    let pinned = check_integrity(config)?;
    check_draft_vocab(config)?;
    let mut plan = EnginePlan::from_config(config)?;
    let selection = select_backend(config, &plan)?;
    let decision = check_memory(config, &mut plan, &selection)?;
    if !decision.fits {
        return Err(BootError::Memory(Box::new(decision)));
    }
    tracing::info!("memory admission accepted: {}", decision.accounting());
    let (pinned_sha256, manifest_sha256) = pinned.unzip();
    // Verified against the file just above: the pin is what is served.
    let observed_sha256 = Arc::new(
        pinned_sha256
            .clone()
            .map(OnceLock::from)
            .unwrap_or_default(),
    );
    Ok(Passed {
        plan,
        selection,
        decision,
        pinned_sha256,
        manifest_sha256,
        observed_sha256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeLayer;

    fn config_with_manifest(text: &str) -> (tempfile::TempDir, ServeConfig) {
        let dir = tempfile::tempdir().expect("tmp");
        let manifest = dir.path().join("manifest.json");
        std::fs::write(&manifest, text).expect("write manifest");
        let flags = ServeLayer {
            manifest: Some(manifest),
            ..ServeLayer::default()
        };
        let config =
            ServeConfig::resolve(None, flags, ServeLayer::default()).expect("resolves anyway");
        (dir, config)
    }

    #[test]
    fn broken_manifest_read_at_resolve_fails_the_gate_with_exit_3() {
        let (dir, config) = config_with_manifest(
            r#"{"schema":1,"model":{"path":"m.gguf","sha256":"00","size":1},"extra":true}"#,
        );
        let err = check_integrity(&config).expect_err("broken manifest");
        assert_eq!(err.exit_code(), ExitCode::Integrity);
        let printed = format!("{:#}", anyhow::Error::from(err));
        let path = dir.path().join("manifest.json");
        assert!(
            printed.starts_with(&format!("manifest {} is invalid: ", path.display()))
                && printed.contains("unknown field `extra`"),
            "{printed}"
        );
    }

    #[test]
    fn missing_manifest_fails_the_gate_naming_the_os_error_once() {
        let dir = tempfile::tempdir().expect("tmp");
        let flags = ServeLayer {
            manifest: Some(dir.path().join("absent.json")),
            ..ServeLayer::default()
        };
        let config = ServeConfig::resolve(None, flags, ServeLayer::default()).expect("resolves");
        let err = check_integrity(&config).expect_err("no manifest file");
        assert_eq!(err.exit_code(), ExitCode::Integrity);
        let printed = format!("{:#}", anyhow::Error::from(err));
        let os = std::io::Error::from_raw_os_error(2).to_string();
        assert!(printed.starts_with("cannot read manifest "), "{printed}");
        assert_eq!(printed.matches(&os).count(), 1, "{printed}");
    }
}
