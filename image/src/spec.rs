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
    "max_n",
    "queue",
    "ctx",
    "threads",
    "backend",
    "device",
    "cpu_fallback",
    "api_key",
    "cors_origin",
    "insecure_no_auth",
    "queue_timeout_ms",
    "shutdown_timeout_secs",
    "max_body_bytes",
    "idle_timeout_secs",
    "max_connections",
    "kv_events",
    "kv_events_block_size",
    "tls_cert",
    "tls_key",
    "read_timeout_secs",
    "manifest",
    "state_dir",
    "memory_budget_mb",
    "memory_margin_mb",
    "kv_cells",
    "kv_type",
    "prefix_cache",
    "prefix_slots",
    "prompt_cache_ram_mb",
    "prompt_cache_disk_mb",
    "spec",
    "spec_gate",
    "draft_model",
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
pub const RESERVED_CONFIG_KEYS: &[&str] = &["model", "draft_model", "manifest", "state_dir"];

/// The spec file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    board: String,
    version: String,
    format: ImageFormat,
    /// A path (directory, .tar, .tar.zst) or a table `{ debian = "bookworm", ... }`.
    base: toml::Value,
    /// A directory, or a list of them applied in order (a later file replaces an earlier).
    #[serde(default)]
    overlay: Option<Overlays>,
    /// `zstd` (level 15, the default), `zstd:N` or `lz4`: squashfs images only.
    #[serde(default)]
    squashfs_compression: Option<String>,
    memory_max: String,
    daemon: DaemonFile,
    model: ModelFile,
    /// The smaller model that drafts for `spec = "draft"`: baked or mounted like `[model]`,
    /// pinned by the manifest's `draft_model`, named by the config's `draft_model`.
    #[serde(default)]
    draft_model: Option<ModelFile>,
    #[serde(default)]
    config: toml::Table,
    #[serde(default)]
    ota: Option<OtaFile>,
    /// `worker` (the default: the daemon) or `gateway` (vllm-router, from `[gateway]`).
    #[serde(default)]
    role: Role,
    #[serde(default)]
    gateway: Option<crate::gateway::GatewayFile>,
}

/// What a box built from the spec does on the LAN.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serves with inferloopd (every image before roles existed).
    #[default]
    Worker,
    /// Runs vllm-router in front of other boxes, and inferloopd too when `serve = true`.
    Gateway,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Overlays {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

/// `base = { debian = "bookworm", ... }`: a root built by mmdebstrap.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DebianFile {
    /// Suite or codename.
    debian: String,
    /// Default `http://deb.debian.org/debian`; a snapshot.debian.org URL pins versions.
    #[serde(default)]
    mirror: Option<String>,
    /// Installed after the essential packages and [`crate::debian::REQUIRED_PACKAGES`].
    #[serde(default)]
    packages: Vec<String>,
    /// Kernel modules to keep (their dependencies too); every other one is deleted.
    #[serde(default)]
    keep_modules: Option<Vec<String>>,
    /// SOURCE_DATE_EPOCH of the base (default: the build's).
    #[serde(default)]
    epoch: Option<u64>,
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
    /// `make kernels-check`'s output directory, installed as the daemon's kernels.
    #[serde(default)]
    kernels: Option<PathBuf>,
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
    /// Overlay directories, applied in order.
    pub overlays: Vec<PathBuf>,
    /// mksquashfs compressor; `None` is the pinned default.
    pub squashfs_compression: Option<crate::pack::SquashComp>,
    /// systemd `MemoryMax=` value for the unit.
    pub memory_max: String,
    pub daemon: DaemonInput,
    pub model: ModelInput,
    /// `[draft_model]`, when the spec has one.
    pub draft_model: Option<ModelInput>,
    /// Daemon settings from `[config]`, reserved keys excluded.
    pub config: toml::Table,
    /// RAUC updates: present only when the spec has an `[ota]` table.
    pub ota: Option<OtaInput>,
    /// The router, for `role = "gateway"` (`None` for a worker).
    pub gateway: Option<crate::gateway::GatewayInput>,
}

impl Spec {
    pub fn role(&self) -> Role {
        if self.gateway.is_some() {
            Role::Gateway
        } else {
            Role::Worker
        }
    }
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
    Tar {
        path: PathBuf,
        zstd: bool,
    },
    /// Built by mmdebstrap (and cached) at build time.
    Debian(crate::debian::DebianBase),
}

#[derive(Debug, Clone)]
pub struct DaemonInput {
    pub path: PathBuf,
    pub version: String,
    pub target: String,
    /// The CUDA kernels to install at [`crate::kernels::KERNELS_PATH`] (cubins and PTX).
    pub kernels: Option<PathBuf>,
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

        let listed = match file.overlay {
            None => Vec::new(),
            Some(Overlays::One(p)) => vec![p],
            Some(Overlays::Many(v)) => v,
        };
        let mut overlays = Vec::with_capacity(listed.len());
        for p in listed {
            let p = resolve(&p);
            if !metadata("overlay", &p)?.is_dir() {
                return Err(invalid(
                    "overlay",
                    format!("{} must be a directory", p.display()),
                ));
            }
            overlays.push(p);
        }

        let daemon_path = resolve(&file.daemon.path);
        metadata("daemon.path", &daemon_path)?;
        check_version("daemon.version", &file.daemon.version)?;
        let target = elf::check_target(&daemon_path, file.daemon.target.as_deref())?;
        let kernels = match file.daemon.kernels {
            Some(k) => {
                let k = resolve(&k);
                crate::kernels::check(&k)?;
                Some(k)
            }
            None => None,
        };
        let daemon = DaemonInput {
            path: daemon_path,
            version: file.daemon.version,
            target,
            kernels,
        };

        let mut base = check_base(file.base, &daemon.target, &resolve)?;
        let squashfs_compression = match &file.squashfs_compression {
            None => None,
            Some(_) if file.format != ImageFormat::Squashfs => {
                return Err(invalid(
                    "squashfs_compression",
                    "applies to squashfs images only",
                ))
            }
            Some(c) => Some(crate::pack::SquashComp::parse(c).ok_or_else(|| {
                invalid(
                    "squashfs_compression",
                    format!("{c:?} must be zstd, zstd:N (1 to 22) or lz4"),
                )
            })?),
        };
        let model = check_model(file.model, &MAIN_FIELDS, &resolve)?;
        let draft_model = (file.draft_model)
            .map(|d| check_model(d, &DRAFT_FIELDS, &resolve))
            .transpose()?;
        if let Some(draft) = draft_model.as_ref() {
            if draft.device_path() == model.device_path() {
                return Err(invalid(
                    "draft_model",
                    format!(
                        "is at {}, where [model] is: the draft is a second, smaller model",
                        draft.device_path()
                    ),
                ));
            }
        }
        let config = check_config(file.config, board)?;
        let ota = match file.ota {
            Some(ota) => Some(check_ota(ota, board, &daemon.target, &resolve)?),
            None => None,
        };

        let gateway =
            match (file.role, file.gateway) {
                (Role::Worker, None) => None,
                (Role::Worker, Some(_)) => {
                    return Err(invalid(
                        "gateway",
                        "applies to role = \"gateway\" only; add it, or remove [gateway]",
                    ))
                }
                (Role::Gateway, None) => return Err(invalid(
                    "role",
                    "\"gateway\" needs a [gateway] table naming at least `workers` and `wheels`",
                )),
                (Role::Gateway, Some(g)) => {
                    let daemon_port = match config.get("port") {
                        Some(toml::Value::Integer(p)) => u16::try_from(*p).unwrap_or(0),
                        _ => 8080,
                    };
                    // The router's venv runs on the image's own Python.
                    if let Base::Debian(d) = &mut base {
                        if !d
                            .packages
                            .iter()
                            .any(|p| p == "python3" || p.starts_with("python3="))
                        {
                            d.packages.push("python3".into());
                        }
                    }
                    Some(crate::gateway::check(
                        g,
                        &daemon.target,
                        daemon_port,
                        ota.is_some(),
                        &resolve,
                    )?)
                }
            };

        Ok(Spec {
            origin: origin.to_path_buf(),
            board,
            version: file.version,
            format: file.format,
            base,
            overlays,
            squashfs_compression,
            memory_max: file.memory_max,
            daemon,
            model,
            draft_model,
            config,
            ota,
            gateway,
        })
    }
}

fn check_base(
    value: toml::Value,
    target: &str,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Base, ImageError> {
    let table = match value {
        toml::Value::String(path) => return check_base_path(resolve(Path::new(&path))),
        toml::Value::Table(t) => t,
        other => {
            return Err(invalid(
                "base",
                format!(
                    "must be a path or a table like {{ debian = \"bookworm\" }}, not a {}",
                    other.type_str()
                ),
            ))
        }
    };
    let file: DebianFile = table
        .try_into()
        .map_err(|e: toml::de::Error| invalid("base", e.message().to_string()))?;
    let suite_ok = !file.debian.is_empty()
        && file
            .debian
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !suite_ok {
        return Err(invalid(
            "base.debian",
            format!(
                "{:?} must be a suite or codename, e.g. \"bookworm\"",
                file.debian
            ),
        ));
    }
    let mirror = file
        .mirror
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string());
    if !["http://", "https://", "file:/"]
        .iter()
        .any(|p| mirror.starts_with(p))
        || mirror.contains(char::is_whitespace)
    {
        return Err(invalid(
            "base.mirror",
            format!("{mirror:?} must be an http://, https:// or file:/ URL"),
        ));
    }
    let arch = crate::debian::debian_arch(target).ok_or_else(|| {
        invalid(
            "base.debian",
            format!("no Debian architecture for the daemon's target {target}"),
        )
    })?;
    let mut packages: Vec<String> = Vec::new();
    for p in crate::debian::REQUIRED_PACKAGES
        .iter()
        .map(|s| s.to_string())
        .chain(file.packages)
    {
        if !crate::debian::is_package(&p) {
            return Err(invalid(
                "base.packages",
                format!("{p:?} is not a Debian package name (optionally name=version)"),
            ));
        }
        if !packages.contains(&p) {
            packages.push(p);
        }
    }
    if !packages.iter().any(|p| p.starts_with("linux-image-")) {
        return Err(invalid(
            "base.packages",
            "must include a kernel (linux-image-arm64, say): the image boots it",
        ));
    }
    let keep_modules = match file.keep_modules {
        Some(m) => {
            if let Some(bad) = m.iter().find(|m| {
                m.is_empty()
                    || !m
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            }) {
                return Err(invalid(
                    "base.keep_modules",
                    format!("{bad:?} is not a kernel module name"),
                ));
            }
            Some(m)
        }
        None => None,
    };
    Ok(Base::Debian(crate::debian::DebianBase {
        suite: file.debian,
        arch: arch.to_string(),
        mirror,
        packages,
        keep_modules,
        epoch: file.epoch,
    }))
}

fn check_base_path(base_path: PathBuf) -> Result<Base, ImageError> {
    let base_meta = metadata("base", &base_path)?;
    if base_meta.is_dir() {
        return Ok(Base::Dir(base_path));
    }
    let name = base_path.to_string_lossy();
    if name.ends_with(".tar") {
        Ok(Base::Tar {
            path: base_path,
            zstd: false,
        })
    } else if name.ends_with(".tar.zst") || name.ends_with(".tzst") {
        Ok(Base::Tar {
            path: base_path,
            zstd: true,
        })
    } else {
        Err(invalid(
            "base",
            format!("{name} must be a directory, a .tar or a .tar.zst"),
        ))
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

/// The field names a model table's errors use: `[model]`'s or `[draft_model]`'s.
struct ModelFields {
    table: &'static str,
    sha256: &'static str,
    size: &'static str,
    file: &'static str,
    mount: &'static str,
}

const MAIN_FIELDS: ModelFields = ModelFields {
    table: "model",
    sha256: "model.sha256",
    size: "model.size",
    file: "model.file",
    mount: "model.mount",
};

const DRAFT_FIELDS: ModelFields = ModelFields {
    table: "draft_model",
    sha256: "draft_model.sha256",
    size: "draft_model.size",
    file: "draft_model.file",
    mount: "draft_model.mount",
};

fn check_model(
    m: ModelFile,
    fields: &ModelFields,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<ModelInput, ImageError> {
    if let Some(sha) = &m.sha256 {
        if !is_sha256_hex(sha) {
            return Err(invalid(fields.sha256, "must be 64 lowercase hex digits"));
        }
    }
    if m.size == Some(0) {
        return Err(invalid(fields.size, "must be positive"));
    }
    match (m.file, m.mount) {
        (Some(file), None) => {
            let file = resolve(&file);
            let meta = metadata(fields.file, &file)?;
            if !meta.is_file() {
                return Err(invalid(
                    fields.file,
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
                    fields.mount,
                    format!("{path:?} must be a normalised absolute path on the box"),
                ));
            }
            let (Some(sha256), Some(size)) = (m.sha256, m.size) else {
                return Err(invalid(
                    fields.table,
                    "a mounted model is pinned by `sha256` and `size`; both are required",
                ));
            };
            Ok(ModelInput::Mounted { path, sha256, size })
        }
        (Some(_), Some(_)) => Err(invalid(
            fields.table,
            "set `file` (baked into the image) or `mount` (on the data partition), not both",
        )),
        (None, None) => Err(invalid(
            fields.table,
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

/// Checks `[config]` and settles, for a board with a CUDA GPU, what a box whose GPU cannot
/// be opened does: the spec's `cpu_fallback`, else `false` (the daemon refuses to start, exit
/// 4, and the unit's journal names why) rather than serving on the CPU unnoticed.
fn check_config(mut config: toml::Table, board: &BoardProfile) -> Result<toml::Table, ImageError> {
    for key in config.keys() {
        if key == "draft_model" {
            // The manifest must pin the draft too (the daemon refuses one it does not pin).
            return Err(invalid(
                "config",
                "`draft_model` is written by the builder from a [draft_model] table (file or \
                 mount, pinned in the manifest like [model]); move it there",
            ));
        }
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
    let device = match config.get("device") {
        None => "auto",
        Some(toml::Value::String(d)) if ["auto", "cpu", "cuda"].contains(&d.as_str()) => d.as_str(),
        Some(other) => {
            return Err(invalid(
                "config.device",
                format!("{other} must be \"auto\", \"cpu\" or \"cuda\""),
            ))
        }
    };
    match config.get("cpu_fallback") {
        None | Some(toml::Value::Boolean(_)) => {}
        Some(other) => {
            return Err(invalid(
                "config.cpu_fallback",
                format!("{other} must be true or false"),
            ))
        }
    }
    let wants_gpu = board.gpu.is_some() && device != "cpu";
    if wants_gpu && !config.contains_key("cpu_fallback") {
        config.insert("cpu_fallback".into(), toml::Value::Boolean(false));
    }
    Ok(config)
}
