//! Serve settings from three layers, checked as a whole once merged. A command-line flag
//! beats an `INFERLOOP_*` environment variable, which beats the TOML file, which beats the
//! default: a flag typed by hand to override a unit file's `Environment=` must win.
//!
//! The layers are read in `config/env.rs`; the tests are in `config/tests.rs`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inferloop_manifest::{IntegrityError, Loaded, Manifest};

mod choices;
mod env;
mod error;
mod layer;
#[cfg(test)]
mod tests;
mod thermal;

pub use choices::{BackendChoice, DeviceChoice, KvType, KvTypes, PrefixCache, Spec, SpecGate};
pub use error::ConfigError;
pub use layer::ServeLayer;
pub use thermal::{ThermalSettings, DEFAULT_THERMAL_INTERVAL_MS};

/// Where an InferLoop image bakes its manifest; used when `--manifest` is not given.
pub const DEFAULT_MANIFEST: &str = "/etc/inferloop/manifest.json";

/// Default model location used by `make run`.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The most choices (`n`) a request may ask for unless `--max-n` says otherwise.
pub const DEFAULT_MAX_N: usize = 8;

/// Final, checked settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The weights to serve. Without `--model`, the manifest's path, else [`DEFAULT_MODEL`].
    pub model: PathBuf,
    pub model_id: String,
    /// `--chat-template`: replaces the model's own chat template.
    pub chat_template: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    /// The manifest at `manifest`, read once here: it names the weights without `--model`,
    /// and the boot gate checks them against it. A load error is kept, not raised, so that it
    /// surfaces at the gate with exit 3 (`Arc`: the error holds an `io::Error`, not `Clone`).
    pub loaded_manifest: Option<Result<Loaded, Arc<IntegrityError>>>,
    pub state_dir: Option<PathBuf>,
    pub memory_budget: Option<u64>,
    pub memory_margin: Option<u64>,
    /// KV cells for all slots together (`--kv-cells`; `None`: slots x ctx). The engine plan
    /// derives and bounds it.
    pub kv_cells: Option<u32>,
    /// KV cache element types (`--kv-type`), K and V.
    pub kv_type: KvTypes,
    /// Prompt reuse across requests (`--prefix-cache`).
    pub prefix_cache: PrefixCache,
    /// Sequences that only retain prompt prefixes (`--prefix-slots`; `None`: the plan's
    /// default).
    pub prefix_slots: Option<usize>,
    /// The prompt cache's RAM tier in bytes (`None`: sized at boot from the headroom).
    pub prompt_cache_ram: Option<u64>,
    /// The disk tier's budget in bytes (on with a state directory).
    pub prompt_cache_disk: u64,
    /// Speculative decoding (`--spec`).
    pub spec: Spec,
    /// Which drafts a step verifies (`--spec-gate`).
    pub spec_gate: SpecGate,
    /// The model that drafts for `--spec draft` (set exactly when `spec` is `draft`).
    pub draft_model: Option<PathBuf>,
    pub host: IpAddr,
    pub port: u16,
    pub slots: usize,
    /// The most choices (`n`) one request may ask for, at most `slots`.
    pub max_n: usize,
    pub queue: usize,
    pub ctx: u32,
    pub threads: i32,
    /// `--backend` and `--device` as asked; resolved against the hardware and the weights
    /// at boot ([`crate::engine::select`]).
    pub backend: BackendChoice,
    pub device: DeviceChoice,
    /// `--cpu-fallback`: whether a wanted GPU that cannot be opened means the CPU (true) or a
    /// refusal to start, exit 4 (false). `None`: `auto` uses the CPU as on any machine
    /// without a GPU, `cuda` refuses ([`crate::engine::select::select`]).
    pub cpu_fallback: Option<bool>,
    pub api_key: Option<String>,
    /// Browser origins answered with CORS headers (`--cors-origin`); `*` allows any.
    pub cors_origins: Vec<String>,
    pub queue_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub max_body_bytes: usize,
    pub read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Most connections open at once (see [`crate::http::limits`]).
    pub max_connections: usize,
    /// HTTPS: the PEM certificate chain and its key (see [`crate::http::tls`]).
    pub tls: Option<TlsFiles>,
    /// `--kv-events`: where to publish KV block events, and the tokens per block.
    pub kv_events: Option<KvEventsAt>,
    pub thermal: ThermalSettings,
    /// `INFERLOOP_DEBUG_STALL_FILE` (see [`ServeLayer::debug_stall_file`]).
    pub debug_stall_file: Option<PathBuf>,
}

/// The PEM files HTTPS is served with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServeConfig {
    /// Merges the layers (a flag beats the environment, which beats the file) and validates
    /// the result.
    pub fn resolve(
        file: Option<ServeLayer>,
        flags: ServeLayer,
        env: ServeLayer,
    ) -> Result<Self, ConfigError> {
        let merged = file.unwrap_or_default().overlay(env).overlay(flags);
        Self::validate(merged)
    }

    fn validate(l: ServeLayer) -> Result<Self, ConfigError> {
        let invalid = |field, message: &str| ConfigError::Invalid {
            field,
            message: message.to_string(),
        };
        let thermal = ThermalSettings::from_layer(&l)?;
        // On a device the image bakes its manifest here; the daemon honours it unasked.
        let manifest = l.manifest.or_else(|| {
            let baked = Path::new(DEFAULT_MANIFEST);
            baked.is_file().then(|| baked.to_path_buf())
        });
        let loaded_manifest = manifest
            .as_deref()
            .map(|path| Manifest::load(path).map_err(Arc::new));
        let model = match (l.model, &manifest, &loaded_manifest) {
            (Some(m), _, _) => m,
            // Only the path is used here; the integrity checks (exit 3) run at boot.
            (None, Some(path), Some(Ok(loaded))) => loaded.manifest.model_path(path),
            // The boot gate reports a broken manifest with its own exit code.
            _ => PathBuf::from(DEFAULT_MODEL),
        };
        let model_id = match l.model_id {
            Some(id) if id.trim().is_empty() => {
                return Err(invalid("model_id", "must not be empty"))
            }
            Some(id) => id,
            None => model
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid("model", "has no file name to derive a model id from"))?,
        };
        let slots = l.slots.unwrap_or(4);
        if !(1..=64).contains(&slots) {
            return Err(invalid("slots", "must be between 1 and 64"));
        }
        // Each choice decodes in a slot of its own, and they start together.
        let max_n = match l.max_n {
            None => DEFAULT_MAX_N.min(slots),
            Some(n) if (1..=slots).contains(&n) => n,
            Some(_) => {
                return Err(invalid(
                    "max_n",
                    &format!("must be between 1 and the slots ({slots}): each choice takes a slot"),
                ))
            }
        };
        let ctx = l.ctx.unwrap_or(2048);
        if !(64..=1 << 20).contains(&ctx) {
            return Err(invalid("ctx", "must be between 64 and 1048576 tokens"));
        }
        let default_threads = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
        let threads = l.threads.unwrap_or(default_threads);
        if !(1..=256).contains(&threads) {
            return Err(invalid("threads", "must be between 1 and 256"));
        }
        let max_body_bytes = l.max_body_bytes.unwrap_or(1 << 20);
        if max_body_bytes < 1024 {
            return Err(invalid("max_body_bytes", "must be at least 1024"));
        }
        let api_key = check_api_key(l.api_key)?;
        let cors_origins = l
            .cors_origin
            .unwrap_or_default()
            .into_iter()
            .map(check_origin)
            .collect::<Result<Vec<_>, _>>()?;
        let host = l.host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        if !host.is_loopback() && api_key.is_none() && !l.insecure_no_auth.unwrap_or(false) {
            return Err(ConfigError::UnauthenticatedBind { host });
        }
        // The pool and the prefix slots are geometry: `EnginePlan::new` derives and bounds
        // them against the slots and the context, once.
        let prefix_cache = l.prefix_cache.unwrap_or(PrefixCache::On);
        if l.memory_budget_mb == Some(0) {
            return Err(invalid("memory_budget_mb", "must be positive"));
        }
        let memory_budget = l
            .memory_budget_mb
            .map(|mb| mib_to_bytes("memory_budget_mb", mb))
            .transpose()?;
        let memory_margin = l
            .memory_margin_mb
            .map(|mb| mib_to_bytes("memory_margin_mb", mb))
            .transpose()?;
        let prompt_cache_ram = l
            .prompt_cache_ram_mb
            .map(|mb| mib_to_bytes("prompt_cache_ram_mb", mb))
            .transpose()?;
        let prompt_cache_disk = mib_to_bytes(
            "prompt_cache_disk_mb",
            l.prompt_cache_disk_mb.unwrap_or(1024),
        )?;
        // Like the model, the draft model defaults to the one the manifest pins.
        let draft_model = l
            .draft_model
            .or_else(|| match (&manifest, &loaded_manifest) {
                (Some(path), Some(Ok(loaded))) => loaded.manifest.draft_model_path(path),
                _ => None,
            });
        let spec = l.spec.unwrap_or(if draft_model.is_some() {
            Spec::Draft
        } else {
            Spec::Ngram
        });
        let draft_model = match (spec, draft_model) {
            (Spec::Draft, None) => {
                return Err(invalid(
                    "spec",
                    "`draft` needs a draft model: --draft-model PATH (a smaller model with the same vocabulary)",
                ))
            }
            (Spec::Draft, Some(path)) => Some(path),
            (_, Some(path)) => {
                tracing::warn!(draft_model = %path.display(), spec = ?spec,
                    "a draft model is configured but speculation is not `draft`: it is not loaded");
                None
            }
            (_, None) => None,
        };
        let queue_timeout_ms = l.queue_timeout_ms.unwrap_or(30_000);
        if queue_timeout_ms == 0 {
            return Err(invalid("queue_timeout_ms", "must be positive"));
        }
        let queue_timeout = wait("queue_timeout_ms", Duration::from_millis(queue_timeout_ms))?;
        let shutdown_timeout = wait(
            "shutdown_timeout",
            Duration::from_secs(l.shutdown_timeout_secs.unwrap_or(30)),
        )?;
        let read_timeout = wait(
            "read_timeout_secs",
            Duration::from_secs(l.read_timeout_secs.unwrap_or(30).max(1)),
        )?;
        let idle_timeout = wait(
            "idle_timeout_secs",
            Duration::from_secs(l.idle_timeout_secs.unwrap_or(60).max(1)),
        )?;
        let max_connections = crate::http::limits::max_connections(l.max_connections)
            .map_err(|message| invalid("max_connections", &message))?;
        let tls = match (l.tls_cert, l.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (Some(_), None) => return Err(invalid("tls_key", "is needed with tls_cert")),
            (None, Some(_)) => return Err(invalid("tls_cert", "is needed with tls_key")),
        };
        let kv_events = match (l.kv_events, l.kv_events_block_size) {
            (None, Some(_)) => {
                return Err(invalid(
                    "kv_events_block_size",
                    "is used only with kv_events",
                ))
            }
            (None, None) => None,
            (Some(_), _) if !prefix_cache.enabled() => {
                return Err(invalid(
                    "kv_events",
                    "needs prompt reuse (prefix_cache on or exact): with it off no KV block \
                     outlives its request",
                ))
            }
            (Some(addr), size) => {
                let block_size = size.unwrap_or(crate::kv_events::DEFAULT_BLOCK_SIZE);
                if !(1..=1024).contains(&block_size) {
                    return Err(invalid("kv_events_block_size", "must be 1 to 1024 tokens"));
                }
                Some(KvEventsAt { addr, block_size })
            }
        };
        Ok(Self {
            model,
            model_id,
            chat_template: l.chat_template,
            manifest,
            loaded_manifest,
            state_dir: l.state_dir,
            memory_budget,
            memory_margin,
            kv_cells: l.kv_cells,
            kv_type: l.kv_type.unwrap_or_default(),
            prefix_cache,
            prefix_slots: l.prefix_slots,
            prompt_cache_ram,
            prompt_cache_disk,
            spec,
            spec_gate: l.spec_gate.unwrap_or_default(),
            draft_model,
            host,
            port: l.port.unwrap_or(8080),
            slots,
            max_n,
            queue: l.queue.unwrap_or(16),
            ctx,
            threads,
            backend: l.backend.unwrap_or_default(),
            device: l.device.unwrap_or_default(),
            cpu_fallback: l.cpu_fallback,
            api_key,
            cors_origins,
            queue_timeout,
            shutdown_timeout,
            max_body_bytes,
            read_timeout,
            idle_timeout,
            max_connections,
            tls,
            kv_events,
            thermal,
            debug_stall_file: l.debug_stall_file,
        })
    }
}

/// Where `--kv-events` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventsAt {
    pub addr: std::net::SocketAddr,
    pub block_size: u32,
}

/// The most MiB a memory setting may name: its bytes must fit an `i64`, so neither the shift
/// to bytes nor the ledger's sums and signed headroom can wrap (8 EiB, beyond any board).
pub const MAX_MIB: u64 = (i64::MAX as u64) >> 20;

/// The longest timeout accepted. Deadlines are `now + timeout`, which panics (hyper's header
/// timer) or saturates somewhere past `u64` seconds; a year is already a typo, not a setting.
pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// MiB from the command line, the environment or the file, to bytes; refuses what would wrap.
fn mib_to_bytes(field: &'static str, mb: u64) -> Result<u64, ConfigError> {
    if mb > MAX_MIB {
        return Err(ConfigError::Invalid {
            field,
            message: format!("is {mb} MiB, more than the {MAX_MIB} MiB that fit in 64-bit bytes"),
        });
    }
    Ok(mb << 20)
}

fn wait(field: &'static str, d: Duration) -> Result<Duration, ConfigError> {
    if d > MAX_WAIT {
        return Err(ConfigError::Invalid {
            field,
            message: format!(
                "must be at most {} s (365 days), got {} s",
                MAX_WAIT.as_secs(),
                d.as_secs()
            ),
        });
    }
    Ok(d)
}

/// An empty key means none. A key no client can send in `Authorization: Bearer KEY` is
/// refused: HTTP strips a header value's surrounding whitespace and carries visible ASCII
/// only, so such a key would pass the non-loopback guard and then lock every client out.
/// The messages never quote the key.
fn check_api_key(key: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return Ok(None);
    };
    let problem = if key.trim().is_empty() {
        "is only whitespace"
    } else if key.trim() != key {
        "starts or ends with whitespace, which HTTP strips from the header"
    } else if !key.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        "holds a control or non-ASCII character, which an HTTP header cannot carry"
    } else {
        return Ok(Some(key));
    };
    Err(ConfigError::Invalid {
        field: "api_key",
        message: format!(
            "(--api-key, INFERLOOP_API_KEY or the config file) {problem}: no client could \
             authenticate with it"
        ),
    })
}

/// A CORS origin as browsers send it: `*`, or `scheme://host[:port]` with an http(s)
/// scheme and nothing after the authority. Lowercased, as browsers serialize it.
fn check_origin(origin: String) -> Result<String, ConfigError> {
    let o = origin.trim().to_ascii_lowercase();
    if o == "*" {
        return Ok(o);
    }
    let authority = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"));
    let ok = authority.is_some_and(|a| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
    });
    if !ok {
        return Err(ConfigError::Invalid {
            field: "cors_origin",
            message: format!(
                "`{origin}` is not an origin: write `*` or `http(s)://host[:port]`, with no \
                 path or trailing slash"
            ),
        });
    }
    Ok(o)
}
