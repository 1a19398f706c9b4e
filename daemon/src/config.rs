//! Serve settings from three layers, checked as a whole once merged. A command-line flag
//! beats an `INFERLOOP_*` environment variable, which beats the TOML file, which beats the
//! default: a flag typed by hand to override a unit file's `Environment=` must win.
//!
//! The layers are read in `config/env.rs`; the tests are in `config/tests.rs`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inferloop_board::Roots;
use inferloop_manifest::{IntegrityError, Loaded, Manifest};
use inferloop_thermal::AdmissionConfig;
use serde::{Deserialize, Serialize};

mod env;
#[cfg(test)]
mod tests;

/// Where an InferLoop image bakes its manifest; used when `--manifest` is not given.
pub const DEFAULT_MANIFEST: &str = "/etc/inferloop/manifest.json";

/// Default model location used by `make run`.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The OS error is the `source()`, printed by the `{:#}` chain, not repeated here.
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}={value:?}: {message}")]
    Env {
        var: &'static str,
        value: String,
        message: String,
    },
    #[error("`{field}` {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(
        "refusing to bind {host} without an API key: set --api-key (or INFERLOOP_API_KEY), \
         or pass --insecure-no-auth to serve the LAN unauthenticated"
    )]
    UnauthenticatedBind { host: IpAddr },
}

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

/// One layer of settings; every field optional so layers can be merged.
/// The same keys are accepted in the TOML file (snake_case) and as flags (kebab-case).
#[derive(Debug, Default, Clone, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ServeLayer {
    /// GGUF model file.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Model id reported by the API (default: the file stem).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Jinja chat template file used instead of the model's own (GGUF
    /// `tokenizer.chat_template`).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Address to bind.
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// Port to bind (0 picks a free one; the log line `listening on` names it).
    #[arg(long)]
    pub port: Option<u16>,
    /// Sequences decoded concurrently.
    #[arg(long)]
    pub slots: Option<usize>,
    /// Requests that may wait for a slot; more get 429.
    #[arg(long)]
    pub queue: Option<usize>,
    /// Context length of each slot, in tokens (the KV cache holds slots × ctx).
    #[arg(long)]
    pub ctx: Option<u32>,
    /// CPU threads for llama.cpp.
    #[arg(long)]
    pub threads: Option<i32>,
    /// Engine: `llama` (llama.cpp), `native` (Q8_0 weights only) or `auto` (default: native
    /// on a CUDA GPU with Q8_0 weights, llama.cpp otherwise).
    #[arg(long, value_name = "auto|llama|native")]
    pub backend: Option<BackendChoice>,
    /// Where the engine computes: `cpu`, `cuda` or `auto` (default: CUDA when a CUDA GPU is
    /// found).
    #[arg(long, value_name = "auto|cpu|cuda")]
    pub device: Option<DeviceChoice>,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Allow binding a non-loopback address without an API key.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub insecure_no_auth: Option<bool>,
    /// Longest wait in the queue before a 503, in milliseconds.
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// Grace period for in-flight requests on SIGTERM, SIGINT or SIGQUIT, in seconds.
    #[arg(long = "shutdown-timeout")]
    #[serde(alias = "shutdown_timeout")]
    pub shutdown_timeout_secs: Option<u64>,
    /// Largest accepted request body, in bytes.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Time allowed to receive request headers and body, in seconds.
    #[arg(long)]
    pub read_timeout_secs: Option<u64>,
    /// Manifest pinning the weights' SHA-256 and size; mismatches refuse to start (exit 3).
    /// Default: /etc/inferloop/manifest.json when that file exists (what images bake in).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Writable directory for state such as the verified-weights cache.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Memory the daemon may use, in MiB (the tightest of this, the cgroup limit and
    /// MemAvailable applies).
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Safety margin added to the ledger, in MiB (default: 5%, at least 16 MiB).
    #[arg(long)]
    pub memory_margin_mb: Option<u64>,
    /// KV cells shared by all slots (default slots × ctx). Fewer oversubscribes the slots:
    /// requests then also wait for free cells.
    #[arg(long)]
    pub kv_cells: Option<u32>,
    /// Reuse the KV cells of a prompt prefix already computed for another request
    /// (`on`, `off` or `relaxed`; default on). `on` keeps temperature-0 output identical to
    /// `off`; `relaxed` also reuses decoded tokens, as llama-server does, so a resent chat
    /// history recomputes only its new turn, but output may differ from `off`.
    #[arg(long, value_name = "on|off|relaxed")]
    pub prefix_cache: Option<PrefixCache>,
    /// Backend sequences beyond the slots: idle ones keep earlier prompts' prefixes, so
    /// that more distinct prompts stay reusable than there are slots. A request starts in
    /// the idle sequence holding its longest prefix; no more than `slots` run at once.
    /// Default: twice the slots with a shared pool (`--kv-cells`), where they cost no
    /// memory; 0 with a KV stream per sequence, where each costs `ctx` cells (the ledger
    /// counts them).
    #[arg(long)]
    pub prefix_slots: Option<usize>,
    /// Board profile to use instead of detecting one (`inferloopd board` shows what
    /// detection picks and why).
    #[arg(long)]
    pub board: Option<String>,
    /// Root of sysfs for board detection, the thermal watch and the cgroup memory limits
    /// (tests point it at fixtures).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// Root of procfs for board detection and the memory ledger (the device tree, meminfo,
    /// the own cgroup and mountinfo).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// How often the thermal watch samples the sensors, in milliseconds.
    #[arg(long)]
    pub thermal_interval_ms: Option<u64>,
    /// At or above this temperature (°C) the board is `hot` and fewer sequences decode at
    /// once (default: the lowest passive trip point, else the board profile).
    #[arg(long)]
    pub hot_celsius: Option<f64>,
    /// At or above this temperature (°C) the board is `critical` and new requests get 503
    /// (default: the lowest critical trip point, else the board profile).
    #[arg(long)]
    pub critical_celsius: Option<f64>,
    /// A thermal state is left only below its threshold minus this many °C (default 5).
    #[arg(long)]
    pub hysteresis_celsius: Option<f64>,
    /// Fraction of the slots that may decode at once while hot (rounded down, at least 1).
    #[arg(long)]
    pub hot_fraction: Option<f64>,
    /// Test-only fault hook, set by `INFERLOOP_DEBUG_STALL_FILE` alone (no flag, no file
    /// key): while this file exists the decode loop blocks (the VM's systemd watchdog test).
    #[arg(skip)]
    #[serde(skip)]
    pub debug_stall_file: Option<PathBuf>,
}

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
    /// KV cells for all slots together.
    pub kv_cells: u32,
    /// Prompt reuse across requests (`--prefix-cache`).
    pub prefix_cache: PrefixCache,
    /// Sequences that only retain prompt prefixes (`--prefix-slots`; 0 with reuse off).
    pub prefix_slots: usize,
    pub host: IpAddr,
    pub port: u16,
    pub slots: usize,
    pub queue: usize,
    pub ctx: u32,
    pub threads: i32,
    /// `--backend` and `--device` as asked; resolved against the hardware and the weights
    /// at boot ([`crate::engine::select`]).
    pub backend: BackendChoice,
    pub device: DeviceChoice,
    pub api_key: Option<String>,
    pub queue_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub max_body_bytes: usize,
    pub read_timeout: Duration,
    pub thermal: ThermalSettings,
    /// `INFERLOOP_DEBUG_STALL_FILE` (see [`ServeLayer::debug_stall_file`]).
    pub debug_stall_file: Option<PathBuf>,
}

/// Board and thermal-watch settings. Thresholds left `None` come from the sysfs trip points
/// or the board profile at start (see [`crate::thermal`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ThermalSettings {
    /// `--board`: skips detection.
    pub board: Option<String>,
    /// Where `/proc` and `/sys` are: for detection, the thermal watch and the memory ledger.
    pub roots: Roots,
    pub interval: Duration,
    pub hot_c: Option<f64>,
    pub critical_c: Option<f64>,
    pub hysteresis_c: Option<f64>,
    pub hot_fraction: f64,
}

impl Default for ThermalSettings {
    fn default() -> Self {
        ThermalSettings {
            board: None,
            roots: Roots::default(),
            interval: Duration::from_millis(DEFAULT_THERMAL_INTERVAL_MS),
            hot_c: None,
            critical_c: None,
            hysteresis_c: None,
            hot_fraction: AdmissionConfig::DEFAULT_HOT_FRACTION,
        }
    }
}

/// The thermal watch samples once a second unless told otherwise.
pub const DEFAULT_THERMAL_INTERVAL_MS: u64 = 1000;
/// Thresholds outside this range (°C) are a typo, not a board.
const CELSIUS_RANGE: std::ops::RangeInclusive<f64> = 1.0..=150.0;

impl ThermalSettings {
    /// Checks the thermal keys of a merged layer; every message names its key.
    fn from_layer(l: &ServeLayer) -> Result<Self, ConfigError> {
        let invalid = |field, message: String| ConfigError::Invalid { field, message };
        let board = match &l.board {
            Some(b) if b.trim().is_empty() => {
                return Err(invalid("board", "must not be empty".into()))
            }
            other => other.clone(),
        };
        let interval_ms = l.thermal_interval_ms.unwrap_or(DEFAULT_THERMAL_INTERVAL_MS);
        if !(10..=60_000).contains(&interval_ms) {
            return Err(invalid(
                "thermal_interval_ms",
                format!("must be between 10 and 60000, got {interval_ms}"),
            ));
        }
        let celsius = |field, v: Option<f64>| match v {
            Some(c) if !CELSIUS_RANGE.contains(&c) => Err(invalid(
                field,
                format!(
                    "must be between {} and {} °C, got {c}",
                    CELSIUS_RANGE.start(),
                    CELSIUS_RANGE.end()
                ),
            )),
            other => Ok(other),
        };
        let hot_c = celsius("hot_celsius", l.hot_celsius)?;
        let critical_c = celsius("critical_celsius", l.critical_celsius)?;
        if let (Some(hot), Some(critical)) = (hot_c, critical_c) {
            if critical <= hot {
                return Err(invalid(
                    "critical_celsius",
                    format!("({critical}) must be above `hot_celsius` ({hot})"),
                ));
            }
        }
        let hysteresis_c = match l.hysteresis_celsius {
            Some(h) if !(0.0..=50.0).contains(&h) => {
                return Err(invalid(
                    "hysteresis_celsius",
                    format!("must be between 0 and 50 °C, got {h}"),
                ))
            }
            other => other,
        };
        let hot_fraction = l
            .hot_fraction
            .unwrap_or(AdmissionConfig::DEFAULT_HOT_FRACTION);
        if !(hot_fraction > 0.0 && hot_fraction <= 1.0) {
            return Err(invalid(
                "hot_fraction",
                format!("must be in (0, 1], got {hot_fraction}"),
            ));
        }
        let defaults = Roots::default();
        Ok(ThermalSettings {
            board,
            roots: Roots {
                proc_root: l.proc_root.clone().unwrap_or(defaults.proc_root),
                sys_root: l.sysfs_root.clone().unwrap_or(defaults.sys_root),
            },
            interval: Duration::from_millis(interval_ms),
            hot_c,
            critical_c,
            hysteresis_c,
            hot_fraction,
        })
    }
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
        let host = l.host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        if !host.is_loopback() && api_key.is_none() && !l.insecure_no_auth.unwrap_or(false) {
            return Err(ConfigError::UnauthenticatedBind { host });
        }
        let full = (slots as u64 * ctx as u64).min(u32::MAX as u64) as u32;
        let kv_cells = l.kv_cells.unwrap_or(full);
        if kv_cells < ctx || kv_cells > full {
            return Err(invalid(
                "kv_cells",
                &format!("must be between ctx ({ctx}) and slots x ctx ({full})"),
            ));
        }
        let prefix_cache = l.prefix_cache.unwrap_or(PrefixCache::On);
        let prefix_slots = match (prefix_cache.enabled(), l.prefix_slots) {
            (false, _) => 0,
            (true, Some(n)) => n,
            // They cost no memory in a shared pool: keep twice as many prompts as run.
            (true, None) if kv_cells < full => 2 * slots,
            (true, None) => 0,
        };
        // llama.cpp's LLAMA_MAX_SEQ.
        if slots + prefix_slots > 256 {
            return Err(invalid(
                "prefix_slots",
                &format!(
                    "must be at most {} (256 sequences with the slots)",
                    256 - slots
                ),
            ));
        }
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
        Ok(Self {
            model,
            model_id,
            chat_template: l.chat_template,
            manifest,
            loaded_manifest,
            state_dir: l.state_dir,
            memory_budget,
            memory_margin,
            kv_cells,
            prefix_cache,
            prefix_slots,
            host,
            port: l.port.unwrap_or(8080),
            slots,
            queue: l.queue.unwrap_or(16),
            ctx,
            threads,
            backend: l.backend.unwrap_or_default(),
            device: l.device.unwrap_or_default(),
            api_key,
            queue_timeout,
            shutdown_timeout,
            max_body_bytes,
            read_timeout,
            thermal,
            debug_stall_file: l.debug_stall_file,
        })
    }
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
