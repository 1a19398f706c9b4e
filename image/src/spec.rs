//! The build spec (`image.toml`): strict TOML in, a checked [`Spec`] out. Every path is
//! relative to the spec's own directory, and every input is checked before anything is built.

use std::path::{Path, PathBuf};

use inferloop_board::{BoardError, BoardProfile};
use inferloop_manifest::hash::is_sha256_hex;
use inferloop_manifest::schema::is_normal_image_path;
use inferloop_manifest::ImageFormat;
use serde::Deserialize;

use crate::elf;
use crate::error::ImageError;

/// Where the daemon binary goes inside the image.
pub const DAEMON_PATH: &str = "/usr/bin/inferloopd";
/// Where the generated daemon config goes inside the image.
pub const CONFIG_PATH: &str = "/etc/inferloop/inferloopd.toml";
/// Where a baked model goes inside the image (plus its file name).
pub const BAKED_MODEL_DIR: &str = "/usr/share/inferloop/models";
/// The daemon's writable state directory on the box (a mount of the data partition).
pub const STATE_DIR: &str = "/var/lib/inferloop";

/// The daemon's config keys (`ServeLayer` in `daemon/src/config.rs`; a test keeps the two in
/// step). Checking them here turns a typo into a build error instead of a box that fails
/// its first boot.
pub const DAEMON_CONFIG_KEYS: &[&str] = &[
    "model",
    "model_id",
    "host",
    "port",
    "slots",
    "queue",
    "ctx",
    "threads",
    "backend",
    "device",
    "api_key",
    "insecure_no_auth",
    "queue_timeout_ms",
    "shutdown_timeout_secs",
    "max_body_bytes",
    "read_timeout_secs",
    "manifest",
    "state_dir",
    "memory_budget_mb",
    "memory_margin_mb",
    "kv_cells",
    "prefix_cache",
    "prefix_slots",
    "chat_template",
    "board",
    "sysfs_root",
    "proc_root",
    "thermal_interval_ms",
    "hot_celsius",
    "critical_celsius",
    "hysteresis_celsius",
    "hot_fraction",
];

/// Keys the builder writes itself: they must agree with the manifest and the fstab.
pub const RESERVED_CONFIG_KEYS: &[&str] = &["model", "manifest", "state_dir"];

/// The spec file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    board: String,
    version: String,
    format: ImageFormat,
    base: PathBuf,
    #[serde(default)]
    overlay: Option<PathBuf>,
    memory_max: String,
    daemon: DaemonFile,
    model: ModelFile,
    #[serde(default)]
    config: toml::Table,
    #[serde(default)]
    ota: Option<OtaFile>,
}

/// `[ota]`: what a box needs to accept RAUC updates.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OtaFile {
    /// CA certificate(s) bundles must chain to.
    keyring: PathBuf,
    /// An `inferloop-qual` built for the image's target, run before and after updates.
    #[serde(default)]
    qual: Option<PathBuf>,
    /// An `inferloop-ota` built for the image's target (the fleet agent).
    #[serde(default)]
    agent: Option<PathBuf>,
    /// The rollout server (hawkBit DDI) the fleet agent polls; renders
    /// [`crate::ota::AGENT_CONF_PATH`]. Without it the agent stays off.
    #[serde(default)]
    server: Option<String>,
    /// hawkBit tenant (default `DEFAULT`).
    #[serde(default)]
    tenant: Option<String>,
    /// The box's target token, on the data partition (never in the shared image).
    #[serde(default)]
    token_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonFile {
    path: PathBuf,
    version: String,
    #[serde(default)]
    target: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    /// A local file baked into the image.
    #[serde(default)]
    file: Option<PathBuf>,
    /// Absolute path on the box where the data partition provides the weights.
    #[serde(default)]
    mount: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

/// A checked spec, paths resolved.
#[derive(Debug, Clone)]
pub struct Spec {
    pub origin: PathBuf,
    pub board: &'static BoardProfile,
    pub version: String,
    pub format: ImageFormat,
    pub base: Base,
    pub overlay: Option<PathBuf>,
    /// systemd `MemoryMax=` value for the unit.
    pub memory_max: String,
    pub daemon: DaemonInput,
    pub model: ModelInput,
    /// Daemon settings from `[config]`, reserved keys excluded.
    pub config: toml::Table,
    /// RAUC updates: present only when the spec has an `[ota]` table.
    pub ota: Option<OtaInput>,
}

/// The update files the image carries (RAUC's `system.conf` is rendered from the board).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtaInput {
    /// Installed as [`crate::ota::KEYRING_PATH`].
    pub keyring: PathBuf,
    /// Installed as [`crate::ota::QUAL_PATH`].
    pub qual: Option<PathBuf>,
    /// Installed as [`crate::ota::AGENT_PATH`].
    pub agent: Option<PathBuf>,
    /// The fleet agent's settings, when the spec names a server.
    pub fleet: Option<crate::ota::AgentConf>,
}

/// The base root filesystem the image starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    Dir(PathBuf),
    Tar { path: PathBuf, zstd: bool },
}

#[derive(Debug, Clone)]
pub struct DaemonInput {
    pub path: PathBuf,
    pub version: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelInput {
    /// Copied into the image; `sha256`/`size`, when given, must match the file.
    Baked {
        file: PathBuf,
        sha256: Option<String>,
        size: Option<u64>,
    },
    /// Provided at run time from the data partition, pinned only.
    Mounted {
        path: String,
        sha256: String,
        size: u64,
    },
}

impl ModelInput {
    /// The model's absolute path on the box.
    pub fn device_path(&self) -> String {
        match self {
            Self::Baked { file, .. } => format!(
                "{BAKED_MODEL_DIR}/{}",
                file.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            Self::Mounted { path, .. } => path.clone(),
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> ImageError {
    ImageError::SpecInvalid {
        field,
        message: message.into(),
    }
}

impl Spec {
    /// Reads, parses and checks a spec file.
    pub fn load(path: &Path) -> Result<Spec, ImageError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImageError::SpecRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Parses and checks spec text; relative paths resolve against `origin`'s directory.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Spec, ImageError> {
        let file: SpecFile = toml::from_str(text).map_err(|e| ImageError::SpecParse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        })?;
        let dir = origin.parent().unwrap_or_else(|| Path::new("."));
        let resolve = |p: &Path| dir.join(p);

        let board = inferloop_board::profile::find(&file.board).map_err(|e| match e {
            BoardError::UnknownBoard { name, known } => ImageError::UnknownBoard { name, known },
            other => invalid("board", other.to_string()),
        })?;

        check_version("version", &file.version)?;
        check_memory_max(&file.memory_max, board)?;

        let base_path = resolve(&file.base);
        let base_meta = metadata("base", &base_path)?;
        let base = if base_meta.is_dir() {
            Base::Dir(base_path)
        } else {
            let name = base_path.to_string_lossy();
            if name.ends_with(".tar") {
                Base::Tar {
                    path: base_path,
                    zstd: false,
                }
            } else if name.ends_with(".tar.zst") || name.ends_with(".tzst") {
                Base::Tar {
                    path: base_path,
                    zstd: true,
                }
            } else {
                return Err(invalid(
                    "base",
                    format!("{name} must be a directory, a .tar or a .tar.zst"),
                ));
            }
        };

        let overlay = match &file.overlay {
            Some(p) => {
                let p = resolve(p);
                if !metadata("overlay", &p)?.is_dir() {
                    return Err(invalid(
                        "overlay",
                        format!("{} must be a directory", p.display()),
                    ));
                }
                Some(p)
            }
            None => None,
        };

        let daemon_path = resolve(&file.daemon.path);
        metadata("daemon.path", &daemon_path)?;
        check_version("daemon.version", &file.daemon.version)?;
        let target = elf::check_target(&daemon_path, file.daemon.target.as_deref())?;
        let daemon = DaemonInput {
            path: daemon_path,
            version: file.daemon.version,
            target,
        };

        let model = check_model(file.model, &resolve)?;
        let config = check_config(file.config)?;
        let ota = match file.ota {
            Some(ota) => Some(check_ota(ota, board, &daemon.target, &resolve)?),
            None => None,
        };

        Ok(Spec {
            origin: origin.to_path_buf(),
            board,
            version: file.version,
            format: file.format,
            base,
            overlay,
            memory_max: file.memory_max,
            daemon,
            model,
            config,
            ota,
        })
    }
}

fn metadata(field: &'static str, path: &Path) -> Result<std::fs::Metadata, ImageError> {
    std::fs::metadata(path).map_err(|source| ImageError::InputMissing {
        field,
        path: path.to_path_buf(),
        source,
    })
}

fn check_version(field: &'static str, v: &str) -> Result<(), ImageError> {
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+-_~".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v:?} must be non-empty letters, digits and . + - _ ~"),
        ))
    }
}

/// systemd's `MemoryMax=`: bytes with an optional K/M/G/T suffix (powers of 1024), a
/// percentage, or `infinity`. An absolute value above the board's DRAM is a spec mistake.
pub fn check_memory_max(value: &str, board: &BoardProfile) -> Result<(), ImageError> {
    const FIELD: &str = "memory_max";
    if value == "infinity" {
        return Ok(());
    }
    if let Some(pct) = value.strip_suffix('%') {
        return match pct.parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(()),
            _ => Err(invalid(
                FIELD,
                format!("{value:?} must be a percentage in (0, 100]"),
            )),
        };
    }
    let (digits, shift) = match value.as_bytes().last() {
        Some(b'K') => (&value[..value.len() - 1], 10),
        Some(b'M') => (&value[..value.len() - 1], 20),
        Some(b'G') => (&value[..value.len() - 1], 30),
        Some(b'T') => (&value[..value.len() - 1], 40),
        _ => (value, 0),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| {
            invalid(
                FIELD,
                format!("{value:?} must be bytes with an optional K, M, G or T suffix, a percentage, or infinity"),
            )
        })?;
    if let Some(dram) = board.dram_bytes {
        if bytes > dram {
            return Err(invalid(
                FIELD,
                format!(
                    "{value} ({bytes} bytes) is more than the {} bytes of DRAM on {}",
                    dram, board.name
                ),
            ));
        }
    }
    Ok(())
}

fn check_model(m: ModelFile, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<ModelInput, ImageError> {
    if let Some(sha) = &m.sha256 {
        if !is_sha256_hex(sha) {
            return Err(invalid("model.sha256", "must be 64 lowercase hex digits"));
        }
    }
    if m.size == Some(0) {
        return Err(invalid("model.size", "must be positive"));
    }
    match (m.file, m.mount) {
        (Some(file), None) => {
            let file = resolve(&file);
            let meta = metadata("model.file", &file)?;
            if !meta.is_file() {
                return Err(invalid(
                    "model.file",
                    format!("{} is not a regular file", file.display()),
                ));
            }
            Ok(ModelInput::Baked {
                file,
                sha256: m.sha256,
                size: m.size,
            })
        }
        (None, Some(path)) => {
            if !is_normal_image_path(&path) || path == "/" {
                return Err(invalid(
                    "model.mount",
                    format!("{path:?} must be a normalised absolute path on the box"),
                ));
            }
            let (Some(sha256), Some(size)) = (m.sha256, m.size) else {
                return Err(invalid(
                    "model",
                    "a mounted model is pinned by `sha256` and `size`; both are required",
                ));
            };
            Ok(ModelInput::Mounted { path, sha256, size })
        }
        (Some(_), Some(_)) => Err(invalid(
            "model",
            "set `file` (baked into the image) or `mount` (on the data partition), not both",
        )),
        (None, None) => Err(invalid(
            "model",
            "set `file` (baked into the image) or `mount` (on the data partition)",
        )),
    }
}

fn check_ota(
    ota: OtaFile,
    board: &BoardProfile,
    target: &str,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<OtaInput, ImageError> {
    // A box whose board has no slots could never install what it is told to trust.
    if board.ota.is_none() {
        return Err(ImageError::NoOta {
            board: board.name.clone(),
        });
    }
    let keyring = resolve(&ota.keyring);
    metadata("ota.keyring", &keyring)?;
    crate::ota::check_keyring(&keyring)?;
    let qual = match ota.qual {
        Some(qual) => {
            let qual = resolve(&qual);
            metadata("ota.qual", &qual)?;
            elf::check_arch(&qual, target).map_err(|message| ImageError::QualBinary {
                path: qual.clone(),
                message,
            })?;
            Some(qual)
        }
        None => None,
    };
    let agent = match ota.agent {
        Some(agent) => {
            let agent = resolve(&agent);
            metadata("ota.agent", &agent)?;
            elf::check_arch(&agent, target).map_err(|message| ImageError::QualBinary {
                path: agent.clone(),
                message,
            })?;
            Some(agent)
        }
        None => None,
    };
    let fleet = match (ota.server, ota.tenant, ota.token_file) {
        (None, None, None) => None,
        (None, _, _) => {
            return Err(invalid(
                "ota.server",
                "`tenant` and `token_file` configure the fleet agent, which needs `server`",
            ))
        }
        (Some(server), tenant, token_file) => Some(
            crate::ota::AgentConf::new(server, tenant, token_file)
                .map_err(|message| invalid("ota.server", message))?,
        ),
    };
    Ok(OtaInput {
        keyring,
        qual,
        agent,
        fleet,
    })
}

fn check_config(config: toml::Table) -> Result<toml::Table, ImageError> {
    for key in config.keys() {
        if RESERVED_CONFIG_KEYS.contains(&key.as_str()) {
            return Err(invalid(
                "config",
                format!("`{key}` is written by the builder (from [model] and the image layout); remove it"),
            ));
        }
        if key == "api_key" {
            return Err(invalid(
                "config",
                "`api_key` must not be baked into an image that every box shares; put \
                 INFERLOOP_API_KEY=... in /data/etc/inferloopd.env on each box",
            ));
        }
        if !DAEMON_CONFIG_KEYS.contains(&key.as_str()) {
            return Err(invalid(
                "config",
                format!(
                    "unknown daemon setting `{key}`; known: {}",
                    DAEMON_CONFIG_KEYS.join(", ")
                ),
            ));
        }
    }
    Ok(config)
}
