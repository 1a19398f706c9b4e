//! Serve settings from three layers: the TOML file, command-line flags, then `INFERLOOP_*`
//! environment variables, each overriding the one before; then checked as a whole.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use inferloop_board::Roots;
use inferloop_thermal::AdmissionConfig;
use serde::Deserialize;

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
    /// Board profile to use instead of detecting one (`inferloopd board` shows what
    /// detection picks and why).
    #[arg(long)]
    pub board: Option<String>,
    /// Root of sysfs for board detection and the thermal watch (tests point it at fixtures).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// Root of procfs for board detection (the device tree, meminfo).
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
}

impl ServeLayer {
    /// Overlays `other` on `self`: fields set in `other` win.
    fn overlay(self, other: ServeLayer) -> ServeLayer {
        ServeLayer {
            model: other.model.or(self.model),
            model_id: other.model_id.or(self.model_id),
            host: other.host.or(self.host),
            port: other.port.or(self.port),
            slots: other.slots.or(self.slots),
            queue: other.queue.or(self.queue),
            ctx: other.ctx.or(self.ctx),
            threads: other.threads.or(self.threads),
            api_key: other.api_key.or(self.api_key),
            insecure_no_auth: other.insecure_no_auth.or(self.insecure_no_auth),
            queue_timeout_ms: other.queue_timeout_ms.or(self.queue_timeout_ms),
            shutdown_timeout_secs: other.shutdown_timeout_secs.or(self.shutdown_timeout_secs),
            max_body_bytes: other.max_body_bytes.or(self.max_body_bytes),
            read_timeout_secs: other.read_timeout_secs.or(self.read_timeout_secs),
            manifest: other.manifest.or(self.manifest),
            state_dir: other.state_dir.or(self.state_dir),
            memory_budget_mb: other.memory_budget_mb.or(self.memory_budget_mb),
            memory_margin_mb: other.memory_margin_mb.or(self.memory_margin_mb),
            kv_cells: other.kv_cells.or(self.kv_cells),
            board: other.board.or(self.board),
            sysfs_root: other.sysfs_root.or(self.sysfs_root),
            proc_root: other.proc_root.or(self.proc_root),
            thermal_interval_ms: other.thermal_interval_ms.or(self.thermal_interval_ms),
            hot_celsius: other.hot_celsius.or(self.hot_celsius),
            critical_celsius: other.critical_celsius.or(self.critical_celsius),
            hysteresis_celsius: other.hysteresis_celsius.or(self.hysteresis_celsius),
            hot_fraction: other.hot_fraction.or(self.hot_fraction),
        }
    }

    /// Reads `INFERLOOP_*` variables through `get` (injectable for tests).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<ServeLayer, ConfigError> {
        fn parse<T: std::str::FromStr>(
            get: &impl Fn(&str) -> Option<String>,
            var: &'static str,
        ) -> Result<Option<T>, ConfigError>
        where
            T::Err: std::fmt::Display,
        {
            match get(var) {
                None => Ok(None),
                Some(value) => {
                    value
                        .trim()
                        .parse()
                        .map(Some)
                        .map_err(|e: T::Err| ConfigError::Env {
                            var,
                            message: e.to_string(),
                            value,
                        })
                }
            }
        }
        Ok(ServeLayer {
            model: get("INFERLOOP_MODEL").map(PathBuf::from),
            model_id: get("INFERLOOP_MODEL_ID"),
            host: parse(&get, "INFERLOOP_HOST")?,
            port: parse(&get, "INFERLOOP_PORT")?,
            slots: parse(&get, "INFERLOOP_SLOTS")?,
            queue: parse(&get, "INFERLOOP_QUEUE")?,
            ctx: parse(&get, "INFERLOOP_CTX")?,
            threads: parse(&get, "INFERLOOP_THREADS")?,
            api_key: get("INFERLOOP_API_KEY"),
            insecure_no_auth: parse(&get, "INFERLOOP_INSECURE_NO_AUTH")?,
            queue_timeout_ms: parse(&get, "INFERLOOP_QUEUE_TIMEOUT_MS")?,
            shutdown_timeout_secs: parse(&get, "INFERLOOP_SHUTDOWN_TIMEOUT")?,
            max_body_bytes: parse(&get, "INFERLOOP_MAX_BODY_BYTES")?,
            read_timeout_secs: parse(&get, "INFERLOOP_READ_TIMEOUT_SECS")?,
            manifest: get("INFERLOOP_MANIFEST").map(PathBuf::from),
            state_dir: get("INFERLOOP_STATE_DIR").map(PathBuf::from),
            memory_budget_mb: parse(&get, "INFERLOOP_MEMORY_BUDGET_MB")?,
            memory_margin_mb: parse(&get, "INFERLOOP_MEMORY_MARGIN_MB")?,
            kv_cells: parse(&get, "INFERLOOP_KV_CELLS")?,
            board: get("INFERLOOP_BOARD"),
            sysfs_root: get("INFERLOOP_SYSFS_ROOT").map(PathBuf::from),
            proc_root: get("INFERLOOP_PROC_ROOT").map(PathBuf::from),
            thermal_interval_ms: parse(&get, "INFERLOOP_THERMAL_INTERVAL_MS")?,
            hot_celsius: parse(&get, "INFERLOOP_HOT_CELSIUS")?,
            critical_celsius: parse(&get, "INFERLOOP_CRITICAL_CELSIUS")?,
            hysteresis_celsius: parse(&get, "INFERLOOP_HYSTERESIS_CELSIUS")?,
            hot_fraction: parse(&get, "INFERLOOP_HOT_FRACTION")?,
        })
    }

    pub fn from_file(path: &Path) -> Result<ServeLayer, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
    }
}

/// Final, checked settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The weights to serve. Without `--model`, the manifest's path, else [`DEFAULT_MODEL`].
    pub model: PathBuf,
    pub model_id: String,
    pub manifest: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub memory_budget: Option<u64>,
    pub memory_margin: Option<u64>,
    /// KV cells for all slots together.
    pub kv_cells: u32,
    pub host: IpAddr,
    pub port: u16,
    pub slots: usize,
    pub queue: usize,
    pub ctx: u32,
    pub threads: i32,
    pub api_key: Option<String>,
    pub queue_timeout: Duration,
    pub shutdown_timeout: Duration,
    pub max_body_bytes: usize,
    pub read_timeout: Duration,
    pub thermal: ThermalSettings,
}

/// Board and thermal-watch settings. Thresholds left `None` come from the sysfs trip points
/// or the board profile at start (see [`crate::thermal`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ThermalSettings {
    /// `--board`: skips detection.
    pub board: Option<String>,
    /// Where `/proc` and `/sys` are.
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
    /// Merges file < flags < env and validates the result.
    pub fn resolve(
        file: Option<ServeLayer>,
        flags: ServeLayer,
        env: ServeLayer,
    ) -> Result<Self, ConfigError> {
        let merged = file.unwrap_or_default().overlay(flags).overlay(env);
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
        let model = match (l.model, &manifest) {
            (Some(m), _) => m,
            (None, Some(manifest)) => pinned_model_path(manifest),
            (None, None) => PathBuf::from(DEFAULT_MODEL),
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
            manifest,
            state_dir: l.state_dir,
            memory_budget,
            memory_margin,
            kv_cells,
            host,
            port: l.port.unwrap_or(8080),
            slots,
            queue: l.queue.unwrap_or(16),
            ctx,
            threads,
            api_key,
            queue_timeout,
            shutdown_timeout,
            max_body_bytes,
            read_timeout,
            thermal,
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

/// The weights path a manifest pins, for when no `--model` is given. Only the path is read
/// here; the integrity checks (exit 3) run at boot.
fn pinned_model_path(manifest: &Path) -> PathBuf {
    match inferloop_manifest::Manifest::load(manifest) {
        Ok(loaded) => loaded.manifest.model_path(manifest),
        // The boot gate reports a broken manifest with its own exit code.
        Err(_) => PathBuf::from(DEFAULT_MODEL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> ServeLayer {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ServeLayer::from_env(|k| map.get(k).cloned()).expect("valid env")
    }

    #[test]
    fn flags_override_file_and_env_overrides_both() {
        let file: ServeLayer = toml::from_str("port = 1000\nslots = 2\nctx = 512\n").expect("toml");
        let flags = ServeLayer {
            port: Some(2000),
            slots: Some(3),
            ..ServeLayer::default()
        };
        let cfg = ServeConfig::resolve(Some(file), flags, env(&[("INFERLOOP_PORT", "3000")]))
            .expect("valid");
        assert_eq!(cfg.port, 3000);
        assert_eq!(cfg.slots, 3);
        assert_eq!(cfg.ctx, 512);
    }

    #[test]
    fn unreadable_file_prints_the_os_error_once() {
        let err = ServeLayer::from_file(Path::new("/nonexistent/inferloop.toml"))
            .expect_err("no such file");
        let printed = format!("{:#}", anyhow::Error::from(err));
        let os = std::io::Error::from_raw_os_error(2).to_string();
        assert_eq!(printed.matches(&os).count(), 1, "{printed}");
        assert!(printed.contains("/nonexistent/inferloop.toml"), "{printed}");
    }

    #[test]
    fn unknown_key_in_file_is_rejected() {
        let err = toml::from_str::<ServeLayer>("prot = 1").expect_err("unknown key");
        assert!(err.to_string().contains("prot"), "{err}");
    }

    #[test]
    fn model_id_defaults_to_file_stem() {
        let cfg = ServeConfig::resolve(None, ServeLayer::default(), ServeLayer::default())
            .expect("defaults are valid");
        assert_eq!(cfg.model_id, "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(cfg.host, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(cfg.max_body_bytes, 1 << 20);
    }

    #[test]
    fn public_bind_without_key_is_refused() {
        let flags = ServeLayer {
            host: Some("0.0.0.0".parse().expect("ip")),
            ..ServeLayer::default()
        };
        let err = ServeConfig::resolve(None, flags.clone(), ServeLayer::default())
            .expect_err("must refuse");
        assert!(matches!(err, ConfigError::UnauthenticatedBind { .. }));
        let insecure = ServeLayer {
            insecure_no_auth: Some(true),
            ..flags.clone()
        };
        assert!(ServeConfig::resolve(None, insecure, ServeLayer::default()).is_ok());
        let keyed = ServeLayer {
            api_key: Some("k".into()),
            ..flags
        };
        assert!(ServeConfig::resolve(None, keyed, ServeLayer::default()).is_ok());
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err = ServeLayer::from_env(|k| (k == "INFERLOOP_SLOTS").then(|| "many".to_string()))
            .expect_err("not a number");
        assert!(err.to_string().contains("INFERLOOP_SLOTS"), "{err}");
    }

    #[test]
    fn thermal_keys_layer_like_the_others() {
        let file: ServeLayer = toml::from_str(
            "board = \"jetson-orin-nx-16gb\"\nsysfs_root = \"/fixture/sys\"\n\
             hot_celsius = 70.0\ncritical_celsius = 90.0\nthermal_interval_ms = 500\n",
        )
        .expect("toml");
        let flags = ServeLayer {
            hot_celsius: Some(75.0),
            hot_fraction: Some(0.25),
            ..ServeLayer::default()
        };
        let cfg = ServeConfig::resolve(
            Some(file),
            flags,
            env(&[
                ("INFERLOOP_CRITICAL_CELSIUS", "95"),
                ("INFERLOOP_PROC_ROOT", "/fixture/proc"),
                ("INFERLOOP_HYSTERESIS_CELSIUS", "2.5"),
            ]),
        )
        .expect("valid");
        let t = &cfg.thermal;
        assert_eq!(t.board.as_deref(), Some("jetson-orin-nx-16gb"));
        assert_eq!(t.roots.sys_root, PathBuf::from("/fixture/sys"));
        assert_eq!(t.roots.proc_root, PathBuf::from("/fixture/proc"));
        assert_eq!((t.hot_c, t.critical_c), (Some(75.0), Some(95.0)));
        assert_eq!(t.hysteresis_c, Some(2.5));
        assert_eq!(t.hot_fraction, 0.25);
        assert_eq!(t.interval, Duration::from_millis(500));
    }

    #[test]
    fn thermal_defaults_read_the_real_roots_every_second() {
        let cfg = ServeConfig::resolve(None, ServeLayer::default(), ServeLayer::default())
            .expect("defaults are valid");
        assert_eq!(cfg.thermal, ThermalSettings::default());
        assert_eq!(cfg.thermal.roots, Roots::default());
        assert_eq!(cfg.thermal.interval, Duration::from_secs(1));
        assert_eq!(cfg.thermal.hot_fraction, 0.5);
        assert_eq!((cfg.thermal.hot_c, cfg.thermal.critical_c), (None, None));
    }

    #[test]
    fn out_of_range_thermal_values_name_the_field() {
        let cases: [(ServeLayer, &str); 8] = [
            (
                ServeLayer {
                    hot_celsius: Some(200.0),
                    ..ServeLayer::default()
                },
                "`hot_celsius`",
            ),
            (
                ServeLayer {
                    critical_celsius: Some(f64::NAN),
                    ..ServeLayer::default()
                },
                "`critical_celsius`",
            ),
            (
                ServeLayer {
                    hot_celsius: Some(90.0),
                    critical_celsius: Some(80.0),
                    ..ServeLayer::default()
                },
                "`critical_celsius`",
            ),
            (
                ServeLayer {
                    hysteresis_celsius: Some(-1.0),
                    ..ServeLayer::default()
                },
                "`hysteresis_celsius`",
            ),
            (
                ServeLayer {
                    hot_fraction: Some(0.0),
                    ..ServeLayer::default()
                },
                "`hot_fraction`",
            ),
            (
                ServeLayer {
                    hot_fraction: Some(1.5),
                    ..ServeLayer::default()
                },
                "`hot_fraction`",
            ),
            (
                ServeLayer {
                    thermal_interval_ms: Some(0),
                    ..ServeLayer::default()
                },
                "`thermal_interval_ms`",
            ),
            (
                ServeLayer {
                    board: Some(" ".into()),
                    ..ServeLayer::default()
                },
                "`board`",
            ),
        ];
        for (flags, field) in cases {
            let err =
                ServeConfig::resolve(None, flags, ServeLayer::default()).expect_err("out of range");
            assert!(
                matches!(err, ConfigError::Invalid { .. }) && err.to_string().contains(field),
                "{field}: {err}"
            );
        }
    }

    #[test]
    fn bad_thermal_env_value_names_the_variable() {
        let err =
            ServeLayer::from_env(|k| (k == "INFERLOOP_HOT_CELSIUS").then(|| "warm".to_string()))
                .expect_err("not a number");
        assert!(err.to_string().contains("INFERLOOP_HOT_CELSIUS"), "{err}");
    }

    fn refusal(flags: ServeLayer, env_pairs: &[(&str, &str)]) -> String {
        match ServeConfig::resolve(None, flags, env(env_pairs)) {
            Err(e @ ConfigError::Invalid { .. }) => e.to_string(),
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn memory_sizes_that_overflow_bytes_are_refused_not_wrapped() {
        let margin = refusal(
            ServeLayer {
                memory_margin_mb: Some(u64::MAX),
                ..ServeLayer::default()
            },
            &[],
        );
        assert!(
            margin.contains("`memory_margin_mb`") && margin.contains("18446744073709551615"),
            "{margin}"
        );
        // 2^44 MiB shifted to bytes is 2^64, which wrapped to a 0-byte limit.
        let budget = refusal(
            ServeLayer::default(),
            &[("INFERLOOP_MEMORY_BUDGET_MB", "17592186044416")],
        );
        assert!(budget.contains("`memory_budget_mb`"), "{budget}");
        let largest = ServeConfig::resolve(
            None,
            ServeLayer {
                memory_budget_mb: Some(MAX_MIB),
                memory_margin_mb: Some(MAX_MIB),
                ..ServeLayer::default()
            },
            ServeLayer::default(),
        )
        .expect("the largest size is valid");
        assert_eq!(largest.memory_budget, Some(MAX_MIB << 20));
        assert!(largest.memory_margin.is_some_and(|b| b <= i64::MAX as u64));
    }

    #[test]
    fn timeouts_past_a_year_are_refused_before_a_deadline_overflows() {
        for (flags, field) in [
            (
                ServeLayer {
                    queue_timeout_ms: Some(u64::MAX),
                    ..ServeLayer::default()
                },
                "`queue_timeout_ms`",
            ),
            (
                ServeLayer {
                    read_timeout_secs: Some(u64::MAX),
                    ..ServeLayer::default()
                },
                "`read_timeout_secs`",
            ),
            (
                ServeLayer {
                    shutdown_timeout_secs: Some(MAX_WAIT.as_secs() + 1),
                    ..ServeLayer::default()
                },
                "`shutdown_timeout`",
            ),
        ] {
            let err = refusal(flags, &[]);
            assert!(err.contains(field), "{field}: {err}");
        }
        let year = ServeConfig::resolve(
            None,
            ServeLayer {
                read_timeout_secs: Some(MAX_WAIT.as_secs()),
                ..ServeLayer::default()
            },
            ServeLayer::default(),
        )
        .expect("a year is the limit, not over it");
        assert_eq!(year.read_timeout, MAX_WAIT);
    }

    #[test]
    fn api_key_no_client_can_send_is_refused_from_every_layer() {
        let public = ServeLayer {
            host: Some("0.0.0.0".parse().expect("ip")),
            ..ServeLayer::default()
        };
        let flag = refusal(
            ServeLayer {
                api_key: Some("   ".into()),
                ..public.clone()
            },
            &[],
        );
        assert!(
            flag.contains("`api_key`") && flag.contains("whitespace"),
            "{flag}"
        );
        let from_env = refusal(public.clone(), &[("INFERLOOP_API_KEY", "\t \n")]);
        assert!(from_env.contains("INFERLOOP_API_KEY"), "{from_env}");
        let file: ServeLayer = toml::from_str("api_key = \" \"\n").expect("toml");
        let err = ServeConfig::resolve(Some(file), public.clone(), ServeLayer::default())
            .expect_err("blank key in the file");
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    field: "api_key",
                    ..
                }
            ),
            "{err}"
        );
        for unsendable in [" secret", "secret\n", "sécret", "sec\u{7}ret"] {
            let err = refusal(
                ServeLayer {
                    api_key: Some(unsendable.into()),
                    ..public.clone()
                },
                &[],
            );
            assert!(
                !err.contains("ecret"),
                "the message must not quote the key: {err}"
            );
        }
        let cfg = ServeConfig::resolve(
            None,
            ServeLayer {
                api_key: Some("sk-a b~c".into()),
                ..public
            },
            ServeLayer::default(),
        )
        .expect("a sendable key");
        assert_eq!(cfg.api_key.as_deref(), Some("sk-a b~c"));
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        let flags = ServeLayer {
            slots: Some(0),
            ..ServeLayer::default()
        };
        let err = ServeConfig::resolve(None, flags, ServeLayer::default()).expect_err("0 slots");
        assert!(err.to_string().contains("`slots`"), "{err}");
    }
}
