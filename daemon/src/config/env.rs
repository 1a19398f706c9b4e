//! The layers that feed [`ServeConfig::resolve`](super::ServeConfig::resolve): `INFERLOOP_*`
//! variables, the TOML file, and how one layer is laid over another.

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::layer::ServeLayer;

/// Test-only fault hook for the systemd watchdog test (`make vm-test`): while the file this
/// variable names exists, the decode loop blocks, its heartbeat goes stale and the daemon
/// withholds `WATCHDOG=1`. Inert when unset; the image never sets it (the VM test adds a
/// runtime drop-in under /run).
pub const DEBUG_STALL_ENV: &str = "INFERLOOP_DEBUG_STALL_FILE";

impl ServeLayer {
    /// Overlays `other` on `self`: fields set in `other` win.
    pub(super) fn overlay(self, other: ServeLayer) -> ServeLayer {
        ServeLayer {
            model: other.model.or(self.model),
            model_id: other.model_id.or(self.model_id),
            chat_template: other.chat_template.or(self.chat_template),
            host: other.host.or(self.host),
            port: other.port.or(self.port),
            slots: other.slots.or(self.slots),
            queue: other.queue.or(self.queue),
            ctx: other.ctx.or(self.ctx),
            threads: other.threads.or(self.threads),
            backend: other.backend.or(self.backend),
            device: other.device.or(self.device),
            cpu_fallback: other.cpu_fallback.or(self.cpu_fallback),
            api_key: other.api_key.or(self.api_key),
            cors_origin: other.cors_origin.or(self.cors_origin),
            insecure_no_auth: other.insecure_no_auth.or(self.insecure_no_auth),
            queue_timeout_ms: other.queue_timeout_ms.or(self.queue_timeout_ms),
            shutdown_timeout_secs: other.shutdown_timeout_secs.or(self.shutdown_timeout_secs),
            max_body_bytes: other.max_body_bytes.or(self.max_body_bytes),
            read_timeout_secs: other.read_timeout_secs.or(self.read_timeout_secs),
            idle_timeout_secs: other.idle_timeout_secs.or(self.idle_timeout_secs),
            tls_cert: other.tls_cert.or(self.tls_cert),
            tls_key: other.tls_key.or(self.tls_key),
            max_connections: other.max_connections.or(self.max_connections),
            kv_events: other.kv_events.or(self.kv_events),
            kv_events_block_size: other.kv_events_block_size.or(self.kv_events_block_size),
            manifest: other.manifest.or(self.manifest),
            state_dir: other.state_dir.or(self.state_dir),
            memory_budget_mb: other.memory_budget_mb.or(self.memory_budget_mb),
            memory_margin_mb: other.memory_margin_mb.or(self.memory_margin_mb),
            kv_cells: other.kv_cells.or(self.kv_cells),
            kv_type: other.kv_type.or(self.kv_type),
            prefix_cache: other.prefix_cache.or(self.prefix_cache),
            prefix_slots: other.prefix_slots.or(self.prefix_slots),
            prompt_cache_ram_mb: other.prompt_cache_ram_mb.or(self.prompt_cache_ram_mb),
            prompt_cache_disk_mb: other.prompt_cache_disk_mb.or(self.prompt_cache_disk_mb),
            spec: other.spec.or(self.spec),
            max_n: other.max_n.or(self.max_n),
            spec_gate: other.spec_gate.or(self.spec_gate),
            draft_model: other.draft_model.or(self.draft_model),
            board: other.board.or(self.board),
            sysfs_root: other.sysfs_root.or(self.sysfs_root),
            proc_root: other.proc_root.or(self.proc_root),
            thermal_interval_ms: other.thermal_interval_ms.or(self.thermal_interval_ms),
            hot_celsius: other.hot_celsius.or(self.hot_celsius),
            critical_celsius: other.critical_celsius.or(self.critical_celsius),
            hysteresis_celsius: other.hysteresis_celsius.or(self.hysteresis_celsius),
            hot_fraction: other.hot_fraction.or(self.hot_fraction),
            debug_stall_file: other.debug_stall_file.or(self.debug_stall_file),
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
            chat_template: get("INFERLOOP_CHAT_TEMPLATE").map(PathBuf::from),
            host: parse(&get, "INFERLOOP_HOST")?,
            port: parse(&get, "INFERLOOP_PORT")?,
            slots: parse(&get, "INFERLOOP_SLOTS")?,
            queue: parse(&get, "INFERLOOP_QUEUE")?,
            ctx: parse(&get, "INFERLOOP_CTX")?,
            threads: parse(&get, "INFERLOOP_THREADS")?,
            backend: parse(&get, "INFERLOOP_BACKEND")?,
            device: parse(&get, "INFERLOOP_DEVICE")?,
            cpu_fallback: parse(&get, "INFERLOOP_CPU_FALLBACK")?,
            api_key: get("INFERLOOP_API_KEY"),
            cors_origin: get("INFERLOOP_CORS_ORIGIN").map(|v| {
                v.split(',')
                    .map(|o| o.trim().to_string())
                    .filter(|o| !o.is_empty())
                    .collect()
            }),
            insecure_no_auth: parse(&get, "INFERLOOP_INSECURE_NO_AUTH")?,
            queue_timeout_ms: parse(&get, "INFERLOOP_QUEUE_TIMEOUT_MS")?,
            shutdown_timeout_secs: parse(&get, "INFERLOOP_SHUTDOWN_TIMEOUT")?,
            max_body_bytes: parse(&get, "INFERLOOP_MAX_BODY_BYTES")?,
            read_timeout_secs: parse(&get, "INFERLOOP_READ_TIMEOUT_SECS")?,
            idle_timeout_secs: parse(&get, "INFERLOOP_IDLE_TIMEOUT_SECS")?,
            tls_cert: get("INFERLOOP_TLS_CERT").map(PathBuf::from),
            tls_key: get("INFERLOOP_TLS_KEY").map(PathBuf::from),
            max_connections: parse(&get, "INFERLOOP_MAX_CONNECTIONS")?,
            kv_events: parse(&get, "INFERLOOP_KV_EVENTS")?,
            kv_events_block_size: parse(&get, "INFERLOOP_KV_EVENTS_BLOCK_SIZE")?,
            manifest: get("INFERLOOP_MANIFEST").map(PathBuf::from),
            state_dir: get("INFERLOOP_STATE_DIR").map(PathBuf::from),
            memory_budget_mb: parse(&get, "INFERLOOP_MEMORY_BUDGET_MB")?,
            memory_margin_mb: parse(&get, "INFERLOOP_MEMORY_MARGIN_MB")?,
            kv_cells: parse(&get, "INFERLOOP_KV_CELLS")?,
            kv_type: parse(&get, "INFERLOOP_KV_TYPE")?,
            prefix_cache: parse(&get, "INFERLOOP_PREFIX_CACHE")?,
            prefix_slots: parse(&get, "INFERLOOP_PREFIX_SLOTS")?,
            prompt_cache_ram_mb: parse(&get, "INFERLOOP_PROMPT_CACHE_RAM_MB")?,
            prompt_cache_disk_mb: parse(&get, "INFERLOOP_PROMPT_CACHE_DISK_MB")?,
            spec: parse(&get, "INFERLOOP_SPEC")?,
            max_n: parse(&get, "INFERLOOP_MAX_N")?,
            spec_gate: parse(&get, "INFERLOOP_SPEC_GATE")?,
            draft_model: get("INFERLOOP_DRAFT_MODEL").map(PathBuf::from),
            board: get("INFERLOOP_BOARD"),
            sysfs_root: get("INFERLOOP_SYSFS_ROOT").map(PathBuf::from),
            proc_root: get("INFERLOOP_PROC_ROOT").map(PathBuf::from),
            thermal_interval_ms: parse(&get, "INFERLOOP_THERMAL_INTERVAL_MS")?,
            hot_celsius: parse(&get, "INFERLOOP_HOT_CELSIUS")?,
            critical_celsius: parse(&get, "INFERLOOP_CRITICAL_CELSIUS")?,
            hysteresis_celsius: parse(&get, "INFERLOOP_HYSTERESIS_CELSIUS")?,
            hot_fraction: parse(&get, "INFERLOOP_HOT_FRACTION")?,
            debug_stall_file: get(DEBUG_STALL_ENV).map(PathBuf::from),
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
