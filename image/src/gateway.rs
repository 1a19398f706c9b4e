//! `role = "gateway"`: vLLM's router installed into the image at build time (from wheels, or
//! from a venv built beforehand, as a venv in [`ROUTER_PREFIX`] for the image's own Python),
//! its unit enabled and its config rendered from the spec's `[gateway]` table. Nothing is
//! fetched on the box.

use std::path::{Path, PathBuf};

use inferloop_manifest::schema::is_normal_image_path;
use serde::Deserialize;

use crate::error::ImageError;
use crate::tools::Tool;
use crate::tree;

/// The router release the unit's flags were checked against (`make lan-demo`, the deploy
/// test); the Makefile's `VLLM_ROUTER_VERSION` is the same.
pub const ROUTER_VERSION: &str = "0.1.17";
/// The venv the router runs from: the path `deploy/vllm-router/install.sh` uses too.
pub const ROUTER_PREFIX: &str = "/opt/inferloop-router";
pub const ROUTER_BIN: &str = "/opt/inferloop-router/bin/vllm-router";
pub const UNIT_PATH: &str = "/etc/systemd/system/inferloop-router.service";
pub const UNIT_WANTS_PATH: &str =
    "/etc/systemd/system/multi-user.target.wants/inferloop-router.service";
pub const ENV_PATH: &str = "/etc/inferloop/router.env";
pub const API_KEY_DROPIN_PATH: &str =
    "/etc/systemd/system/inferloop-router.service.d/10-api-key.conf";
pub const API_KEY_LAUNCHER_PATH: &str = "/usr/lib/inferloop/router-with-api-key";
/// The systemd credential name the drop-in and the launcher agree on.
const API_KEY_CREDENTIAL: &str = "router-api-key";

/// The unit that `deploy/vllm-router/install.sh` installs: one file for both.
pub const UNIT: &str = include_str!("../../deploy/vllm-router/inferloop-router.service");
pub const API_KEY_LAUNCHER: &str = include_str!("../../deploy/vllm-router/router-with-api-key");

/// The links that start the daemon at boot. `inferloop-health.service` wants
/// `inferloopd.service`, so a gateway that does not serve drops both.
pub const DAEMON_WANTS: &[&str] = &[
    "/etc/systemd/system/multi-user.target.wants/inferloopd.service",
    "/etc/systemd/system/multi-user.target.wants/inferloop-health.service",
];

/// The host Python that runs pip (never the image's: it may be another architecture).
pub const PIP: Tool = Tool {
    name: "python3",
    package: "python3-pip",
};

/// `[gateway]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatewayFile {
    #[serde(default)]
    workers: Option<Vec<String>>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    api_key_file: Option<String>,
    #[serde(default)]
    wheels: Option<PathBuf>,
    #[serde(default)]
    venv: Option<PathBuf>,
    #[serde(default)]
    serve: bool,
}

/// The routing policies `make lan-demo` measured with InferLoop boxes behind the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    CacheAware,
    /// Routes on the boxes' KV events: the workers need `kv_events` in their `[config]`.
    KvAware,
    PowerOfTwo,
    RoundRobin,
}

impl Policy {
    const ALL: [Policy; 4] = [
        Policy::CacheAware,
        Policy::KvAware,
        Policy::PowerOfTwo,
        Policy::RoundRobin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CacheAware => "cache_aware",
            Self::KvAware => "kv_aware",
            Self::PowerOfTwo => "power_of_two",
            Self::RoundRobin => "round_robin",
        }
    }
}

/// What the builder installs the router from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterSource {
    /// A directory of wheels (vllm-router and every dependency) pip installs from.
    Wheels(PathBuf),
    /// A venv with vllm-router installed, made beforehand for the image's architecture and
    /// Python 3.`python`; its site-packages and scripts are copied.
    Venv { dir: PathBuf, python: u32 },
}

/// A checked `[gateway]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayInput {
    /// `http(s)://host[:port]`, each once.
    pub workers: Vec<String>,
    pub policy: Policy,
    /// The address the router binds.
    pub host: String,
    pub port: u16,
    /// A file on the data partition holding the key the boxes require.
    pub api_key_file: Option<String>,
    /// Where the router comes from.
    pub source: RouterSource,
    /// Whether this box also runs inferloopd (and is then usually one of `workers`).
    pub serve: bool,
}

fn invalid(field: &'static str, message: impl Into<String>) -> ImageError {
    ImageError::SpecInvalid {
        field,
        message: message.into(),
    }
}

/// Checks `[gateway]` against the rest of the spec: the daemon's target (which wheels fit),
/// its port (a gateway that serves must not take it) and `[ota]` (the post-update health
/// check needs a daemon).
pub(crate) fn check(
    file: GatewayFile,
    target: &str,
    daemon_port: u16,
    has_ota: bool,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<GatewayInput, ImageError> {
    let workers = file.workers.unwrap_or_default();
    if workers.is_empty() {
        return Err(invalid(
            "gateway.workers",
            "must list the boxes the router sends work to, e.g. [\"http://box-1.lan:8080\", \"http://box-2.lan:8080\"]",
        ));
    }
    for (i, url) in workers.iter().enumerate() {
        check_worker_url(url).map_err(|m| invalid("gateway.workers", format!("{url:?} {m}")))?;
        if workers[..i].contains(url) {
            return Err(invalid(
                "gateway.workers",
                format!("{url:?} is listed twice"),
            ));
        }
    }
    let policy = match file.policy.as_deref() {
        None => Policy::CacheAware,
        Some(p) => Policy::ALL
            .into_iter()
            .find(|x| x.as_str() == p)
            .ok_or_else(|| {
                invalid(
                    "gateway.policy",
                    format!(
                        "{p:?} is not one measured with InferLoop boxes; use cache_aware, \
                         kv_aware, power_of_two or round_robin"
                    ),
                )
            })?,
    };
    let host = file.host.unwrap_or_else(|| "0.0.0.0".into());
    if host.parse::<std::net::IpAddr>().is_err() {
        return Err(invalid(
            "gateway.host",
            format!("{host:?} must be an IP address to bind (0.0.0.0 for every interface)"),
        ));
    }
    let port = file.port.unwrap_or(8080);
    if port == 0 {
        return Err(invalid("gateway.port", "must be 1 to 65535"));
    }
    if file.serve && port == daemon_port {
        return Err(invalid(
            "gateway.port",
            format!(
                "{port} is the daemon's port too (serve = true runs both): give [config] port \
                 another one and list this box among the workers, e.g. http://127.0.0.1:8081"
            ),
        ));
    }
    if !file.serve && has_ota {
        return Err(invalid(
            "gateway.serve",
            "is false but the spec has [ota]: the post-update health check (inferloop-health) \
             runs the smoke set against this box's daemon, so an update could never be marked \
             good; set serve = true or leave out [ota]",
        ));
    }
    let api_key_file = match file.api_key_file {
        Some(p) => {
            if !p.starts_with("/data/")
                || !is_normal_image_path(&p)
                || p.contains(|c: char| c.is_whitespace() || c == ':')
            {
                return Err(invalid(
                    "gateway.api_key_file",
                    format!(
                        "{p:?} must be a normalised absolute path under /data/ without spaces or \
                         colons: the key lives on each box's data partition, never in the image"
                    ),
                ));
            }
            Some(p)
        }
        None => None,
    };
    let source = match (file.wheels, file.venv) {
        (Some(wheels), None) => {
            let wheels = resolve(&wheels);
            input_dir("gateway.wheels", &wheels, "a directory of .whl files")?;
            check_router_wheel(&wheels, target)?;
            RouterSource::Wheels(wheels)
        }
        (None, Some(venv)) => {
            let dir = resolve(&venv);
            input_dir("gateway.venv", &dir, "a venv directory")?;
            let python = check_venv(&dir, target)?;
            RouterSource::Venv { dir, python }
        }
        (Some(_), Some(_)) => {
            return Err(invalid(
                "gateway",
                "set `wheels` (a directory pip installs from) or `venv` (one built beforehand), not both",
            ))
        }
        (None, None) => {
            return Err(invalid(
                "gateway.wheels",
                format!(
                    "must name a directory of wheels (vllm-router {ROUTER_VERSION} and its \
                     dependencies), or `venv` one built beforehand: the image is built with the \
                     router in it, nothing is fetched on the box; `make router-wheels` fills \
                     out/router-wheels for this machine"
                ),
            ))
        }
    };
    Ok(GatewayInput {
        workers,
        policy,
        host,
        port,
        api_key_file,
        source,
        serve: file.serve,
    })
}

fn input_dir(field: &'static str, dir: &Path, what: &str) -> Result<(), ImageError> {
    let meta = std::fs::metadata(dir).map_err(|source| ImageError::InputMissing {
        field,
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(invalid(field, format!("{} must be {what}", dir.display())))
    }
}

/// A venv made beforehand: vllm-router [`ROUTER_VERSION`] installed in it for one Python 3.N
/// (returned), its native core built for the image's architecture, and nothing taken from
/// the Python it was made with.
fn check_venv(dir: &Path, target: &str) -> Result<u32, ImageError> {
    const FIELD: &str = "gateway.venv";
    let at = dir.display();
    let cfg = std::fs::read_to_string(dir.join("pyvenv.cfg"))
        .map_err(|_| invalid(FIELD, format!("{at} is not a venv (no pyvenv.cfg)")))?;
    let system = cfg.lines().any(|l| {
        l.split_once('=')
            .is_some_and(|(k, v)| k.trim() == "include-system-site-packages" && v.trim() == "true")
    });
    if system {
        return Err(invalid(
            FIELD,
            format!(
                "{at} includes its Python's system site-packages, which the image does not have; \
                 make it without --system-site-packages"
            ),
        ));
    }
    let lib = dir.join("lib");
    let mut minors: Vec<u32> = std::fs::read_dir(&lib)
        .map(|l| {
            l.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let minor = name.strip_prefix("python3.")?.parse().ok()?;
                lib.join(&name)
                    .join("site-packages")
                    .is_dir()
                    .then_some(minor)
            })
            .collect()
        })
        .unwrap_or_default();
    minors.sort_unstable();
    let [python] = minors[..] else {
        return Err(invalid(
            FIELD,
            format!(
                "{at} must hold one lib/python3.N/site-packages, not {}",
                minors.len()
            ),
        ));
    };
    let site = lib.join(format!("python3.{python}/site-packages"));
    if !site
        .join(format!("vllm_router-{ROUTER_VERSION}.dist-info"))
        .is_dir()
    {
        let other: Vec<String> = std::fs::read_dir(&site)
            .map(|l| {
                l.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("vllm_router-") && n.ends_with(".dist-info"))
                    .collect()
            })
            .unwrap_or_default();
        return Err(invalid(
            FIELD,
            if other.is_empty() {
                format!(
                    "{at} has no vllm-router installed (pip install vllm-router=={ROUTER_VERSION})"
                )
            } else {
                format!(
                    "{at} has {} installed; the unit's flags are checked against vllm-router {ROUTER_VERSION}",
                    other.join(", ")
                )
            },
        ));
    }
    let core = site.join("vllm_router_rs.abi3.so");
    crate::elf::check_arch(&core, target).map_err(|m| {
        invalid(
            FIELD,
            format!(
                "{}: {m}; make the venv on a machine of the image's architecture, or give `wheels`",
                core.display()
            ),
        )
    })?;
    if !dir.join("bin/vllm-router").is_file() {
        return Err(invalid(FIELD, format!("{at} has no bin/vllm-router")));
    }
    Ok(python)
}

/// A worker URL as vllm-router joins paths onto it: `http(s)://host[:port]`, no path (it
/// appends `/health`, so even a trailing `/` would double the slash), no user or query.
pub fn check_worker_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("must start with http:// or https://")?;
    if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
        return Err(
            "must be scheme://host[:port] with no path (not even a trailing /), user or query"
                .into(),
        );
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("has an unclosed [")?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("has {addr:?}, which is not an IPv6 address"));
        }
        match after {
            "" => (addr, None),
            _ => (
                addr,
                Some(after.strip_prefix(':').ok_or("has text after the ]")?),
            ),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !rest.starts_with('[') && !host.split('.').all(label_ok) {
        return Err(format!("has {host:?}, which is not a host name or address"));
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && !p.starts_with('0') => {}
            _ => return Err(format!("has port {p:?}, not 1 to 65535")),
        }
    }
    Ok(())
}

/// The wheels directory holds a vllm-router wheel for the image's architecture. PyPI has
/// manylinux_2_28 wheels for x86_64 and aarch64; a directory filled on another machine
/// may hold only that machine's.
fn check_router_wheel(dir: &Path, target: &str) -> Result<(), ImageError> {
    let arch = target.split('-').next().unwrap_or(target);
    let listing = std::fs::read_dir(dir).map_err(ImageError::io(dir))?;
    let prefix = format!("vllm_router-{ROUTER_VERSION}-");
    let mut found: Vec<String> = listing
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        .collect();
    found.sort();
    let fits = |name: &str| {
        let stem = name.trim_end_matches(".whl");
        let platform = stem.rsplit('-').next().unwrap_or_default();
        platform
            .split('.')
            .any(|tag| tag == "any" || tag.ends_with(&format!("_{arch}")))
    };
    if found.iter().any(|n| fits(n)) {
        return Ok(());
    }
    let fetch = format!(
        "pip download -d {} --only-binary=:all: --platform manylinux_2_28_{arch} \
         --platform manylinux2014_{arch} --python-version <the image's Python, e.g. 3.11> \
         vllm-router=={ROUTER_VERSION}",
        dir.display()
    );
    Err(invalid(
        "gateway.wheels",
        if found.is_empty() {
            format!(
                "{} holds no vllm-router {ROUTER_VERSION} wheel; fill it (with the dependencies) \
                 by: {fetch}",
                dir.display()
            )
        } else {
            format!(
                "{} holds no vllm-router {ROUTER_VERSION} wheel for {arch} (the image's \
                 architecture), only {}; add one (with the dependencies) by: {fetch}",
                dir.display(),
                found.join(", ")
            )
        },
    ))
}

/// The Python the image runs: `usr/bin/python3.N` with its standard library in
/// `usr/lib/python3.N` (the one `usr/bin/python3` names when there are several).
pub fn image_python(root: &Path) -> Result<u32, ImageError> {
    let lib = root.join("usr/lib");
    let mut minors: Vec<u32> = std::fs::read_dir(&lib)
        .map(|l| {
            l.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let minor: u32 = name.strip_prefix("python3.")?.parse().ok()?;
                let ok = lib.join(&name).join("os.py").is_file()
                    && std::fs::symlink_metadata(root.join("usr/bin").join(&name)).is_ok();
                ok.then_some(minor)
            })
            .collect()
        })
        .unwrap_or_default();
    minors.sort_unstable();
    let named = std::fs::read_link(root.join("usr/bin/python3"))
        .ok()
        .and_then(|t| {
            t.file_name()?
                .to_str()?
                .strip_prefix("python3.")?
                .parse::<u32>()
                .ok()
        });
    let minor = match (minors.as_slice(), named) {
        ([], _) => {
            return Err(ImageError::Gateway {
                message: "the image has no Python 3 (usr/bin/python3.N and its standard library \
                          in usr/lib/python3.N) for the router's venv: add python3 to the base"
                    .into(),
            })
        }
        ([one], _) => *one,
        (_, Some(n)) if minors.contains(&n) => n,
        (many, _) => {
            return Err(ImageError::Gateway {
                message: format!(
                    "the image has several Pythons (3.{}) and usr/bin/python3 names none of them",
                    many.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", 3.")
                ),
            })
        }
    };
    if minor < 8 {
        return Err(ImageError::Gateway {
            message: format!("vllm-router needs Python 3.8 or later; the image has 3.{minor}"),
        });
    }
    Ok(minor)
}

/// The image's glibc minor version (2.N), read from the banner in its `libc.so.6`: a wheel
/// built for a newer glibc would install here and fail to load on the box.
pub fn image_glibc(root: &Path, arch: &str) -> Result<u32, ImageError> {
    let triplet = format!("{arch}-linux-gnu");
    let candidates = [
        format!("usr/lib/{triplet}/libc.so.6"),
        format!("lib/{triplet}/libc.so.6"),
        "usr/lib64/libc.so.6".to_string(),
        "lib64/libc.so.6".to_string(),
    ];
    for rel in &candidates {
        let mut path = root.join(rel);
        // One level of symlink (libc.so.6 -> libc-2.31.so), kept inside the image.
        if let Ok(target) = std::fs::read_link(&path) {
            path = match target.strip_prefix("/") {
                Ok(abs) => root.join(abs),
                Err(_) => path.parent().unwrap_or(root).join(target),
            };
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if let Some(minor) = glibc_banner_minor(&bytes) {
            return Ok(minor);
        }
        return Err(ImageError::Gateway {
            message: format!(
                "{} has no glibc version banner (\"release version 2.N\")",
                path.display()
            ),
        });
    }
    Err(ImageError::Gateway {
        message: format!(
            "the image has no glibc (looked for {}): the router's wheels are manylinux builds",
            candidates.join(", ")
        ),
    })
}

/// `... stable release version 2.36.` → 36.
fn glibc_banner_minor(bytes: &[u8]) -> Option<u32> {
    const NEEDLE: &[u8] = b"release version 2.";
    let at = bytes.windows(NEEDLE.len()).position(|w| w == NEEDLE)? + NEEDLE.len();
    let digits: String = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .map(|b| *b as char)
        .collect();
    digits.parse().ok()
}

/// The manylinux platform tags a box with glibc 2.`glibc` runs, newest first, with the
/// legacy aliases (`manylinux2014` = 2.17, `manylinux2010` = 2.12, `manylinux1` = 2.5) that
/// older wheels carry alone.
pub fn platform_tags(arch: &str, glibc: u32) -> Vec<String> {
    let floor = if arch == "x86_64" { 5 } else { 17 };
    let mut tags = Vec::new();
    for minor in (floor..=glibc).rev() {
        tags.push(format!("manylinux_2_{minor}_{arch}"));
        let legacy = match minor {
            17 => Some("manylinux2014"),
            12 => Some("manylinux2010"),
            5 => Some("manylinux1"),
            _ => None,
        };
        if let Some(l) = legacy {
            tags.push(format!("{l}_{arch}"));
        }
    }
    tags
}

/// `/etc/inferloop/router.env`: the variables the unit's command line uses.
pub fn env_text(gw: &GatewayInput, version: &str, board: &str) -> String {
    format!(
        "# /etc/inferloop/router.env for gateway image {version} ({board}), written by\n\
         # inferloop-image from the spec's [gateway] table and read by inferloop-router.service.\n\
         # The root filesystem is read-only: change the spec to change this (docs/lan.md).\n\
         ROUTER_HOST={host}\n\
         ROUTER_PORT={port}\n\
         WORKER_URLS=\"{workers}\"\n\
         ROUTER_POLICY={policy}\n\
         # As deploy/vllm-router/router.env: a box that fails one check a second apart gets no\n\
         # new work until it answers /health again.\n\
         HEALTH_CHECK_INTERVAL_SECS=1\n\
         HEALTH_FAILURE_THRESHOLD=1\n\
         PROMETHEUS_HOST=127.0.0.1\n\
         PROMETHEUS_PORT=29000\n\
         ROUTER_ARGS=\"\"\n",
        host = gw.host,
        port = gw.port,
        workers = gw.workers.join(" "),
        policy = gw.policy.as_str(),
    )
}

/// The unit's `ExecStart=` value, continuation lines joined.
pub fn unit_exec_start() -> Option<String> {
    let mut joined = String::new();
    for line in UNIT.lines() {
        match line.strip_suffix('\\') {
            Some(part) => {
                joined.push_str(part.trim());
                joined.push(' ');
            }
            None => {
                joined.push_str(line.trim());
                joined.push('\n');
            }
        }
    }
    joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=").map(str::to_string))
}

/// The drop-in that loads the API key as a credential and starts the router through the
/// launcher that adds `--api-key`.
pub fn api_key_dropin(key_file: &str) -> Result<String, ImageError> {
    let exec = unit_exec_start().ok_or_else(|| ImageError::Gateway {
        message: "deploy/vllm-router/inferloop-router.service has no ExecStart=".into(),
    })?;
    let dir = Path::new(key_file)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/data".into());
    Ok(format!(
        "# Written by inferloop-image from the spec's [gateway] api_key_file: systemd reads the\n\
         # key as root and hands it to the router's dynamic user; the launcher passes it as\n\
         # --api-key for the router's own calls to the boxes (docs/lan.md).\n\
         [Unit]\n\
         RequiresMountsFor={dir}\n\
         \n\
         [Service]\n\
         LoadCredential={API_KEY_CREDENTIAL}:{key_file}\n\
         ExecStart=\n\
         ExecStart={API_KEY_LAUNCHER_PATH} {exec}\n"
    ))
}

/// Installs the router and its unit into the staged `root`. `work` is scratch space on the
/// same filesystem.
pub fn install(
    gw: &GatewayInput,
    target: &str,
    version: &str,
    board: &str,
    root: &Path,
    work: &Path,
) -> Result<(), ImageError> {
    let mut generated = vec![ROUTER_PREFIX, UNIT_PATH, UNIT_WANTS_PATH, ENV_PATH];
    if gw.api_key_file.is_some() {
        generated.extend([API_KEY_DROPIN_PATH, API_KEY_LAUNCHER_PATH]);
    }
    for path in generated {
        let dest = tree::join(root, path);
        if std::fs::symlink_metadata(&dest).is_ok() {
            return Err(ImageError::OverlayConflict {
                path: dest,
                message: format!(
                    "{path} is generated for role = \"gateway\"; remove it from the base and overlay"
                ),
            });
        }
    }
    let arch = target.split('-').next().unwrap_or(target);
    let python = image_python(root)?;
    let prefix = tree::join(root, ROUTER_PREFIX);
    let site = prefix.join(format!("lib/python3.{python}/site-packages"));
    tree::mkdir_p(&site)?;
    let bin = prefix.join("bin");
    tree::mkdir_p(&bin)?;
    // Scripts to install, and how their RECORD entries name them.
    let (scripts_from, record_prefix, only_python) = match &gw.source {
        RouterSource::Wheels(wheels) => {
            let glibc = image_glibc(root, arch)?;
            tracing::info!(
                wheels = %wheels.display(),
                python = format!("3.{python}"),
                glibc = format!("2.{glibc}"),
                arch,
                "installing vllm-router {ROUTER_VERSION} into {ROUTER_PREFIX}"
            );
            let staged = work.join("router-pip");
            pip_install(wheels, arch, python, glibc, &staged)?;
            for entry in std::fs::read_dir(&staged).map_err(ImageError::io(&staged))? {
                let entry = entry.map_err(ImageError::io(&staged))?;
                if entry.file_name() == "bin" {
                    continue;
                }
                let dest = site.join(entry.file_name());
                std::fs::rename(entry.path(), &dest).map_err(ImageError::io(&dest))?;
            }
            // pip --target puts scripts in <target>/bin beside <target>/lib/python.
            (staged.join("bin"), "../../bin/", false)
        }
        RouterSource::Venv {
            dir,
            python: made_for,
        } => {
            if *made_for != python {
                return Err(ImageError::Gateway {
                    message: format!(
                        "{} is a venv for Python 3.{made_for}; the image has 3.{python}",
                        dir.display()
                    ),
                });
            }
            tracing::info!(venv = %dir.display(), "copying vllm-router {ROUTER_VERSION} into {ROUTER_PREFIX}");
            let from = dir.join(format!("lib/python3.{python}/site-packages"));
            tree::copy_onto(&from, &site, tree::Modes::Git)?;
            // Byte code of the Python the venv was made with, stamped with its files' times.
            for node in tree::walk(&site, tree::Specials::Refuse)?.iter().rev() {
                let name = node.path.rsplit('/').next().unwrap_or_default();
                if node.kind == inferloop_manifest::FileKind::Dir && name == "__pycache__" {
                    std::fs::remove_dir_all(&node.abs).map_err(ImageError::io(&node.abs))?;
                } else if node.kind == inferloop_manifest::FileKind::File
                    && name.ends_with(".pyc")
                    && node.abs.exists()
                {
                    std::fs::remove_file(&node.abs).map_err(ImageError::io(&node.abs))?;
                }
            }
            // A venv's bin also holds activate scripts and its interpreter links: not copied.
            (dir.join("bin"), "../../../bin/", true)
        }
    };
    // The scripts' shebangs name the Python that installed them; on the box it is the venv's.
    let shebang = format!("#!{ROUTER_PREFIX}/bin/python");
    let mut scripts = Vec::new();
    if let Ok(listing) = std::fs::read_dir(&scripts_from) {
        let mut entries: Vec<_> = listing.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_file = std::fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_file());
            if !is_file {
                continue;
            }
            let text = std::fs::read(entry.path()).map_err(ImageError::io(entry.path()))?;
            let body = match rewrite_shebang(&text, &shebang) {
                Some(body) => body,
                None if only_python => continue,
                None => {
                    return Err(ImageError::Gateway {
                        message: format!("pip wrote bin/{name} without a Python shebang"),
                    })
                }
            };
            tree::write_file(&bin.join(&name), &body, 0o755)?;
            scripts.push((name, body));
        }
    }
    if !bin.join("vllm-router").is_file() {
        return Err(ImageError::Gateway {
            message: "no bin/vllm-router was installed".into(),
        });
    }
    fix_records(&site, &scripts, record_prefix)?;
    let python_bin = format!("/usr/bin/python3.{python}");
    for (link, to) in [
        ("python", python_bin.as_str()),
        ("python3", "python"),
        (&format!("python3.{python}"), "python"),
    ] {
        std::os::unix::fs::symlink(to, bin.join(link)).map_err(ImageError::io(bin.join(link)))?;
    }
    tree::write_file(
        &prefix.join("pyvenv.cfg"),
        format!("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.{python}\n")
            .as_bytes(),
        0o644,
    )?;
    // pip's files carry the builder's umask; the manifest records modes, so settle them.
    for node in tree::walk(&prefix, tree::Specials::Refuse)? {
        let mode = match node.kind {
            inferloop_manifest::FileKind::Dir => 0o755,
            inferloop_manifest::FileKind::File if node.mode & 0o111 != 0 => 0o755,
            inferloop_manifest::FileKind::File => 0o644,
            inferloop_manifest::FileKind::Symlink => continue,
        };
        tree::set_mode(&node.abs, mode)?;
    }

    tree::write_file(&tree::join(root, UNIT_PATH), UNIT.as_bytes(), 0o644)?;
    let wants = tree::join(root, UNIT_WANTS_PATH);
    tree::mkdir_p(wants.parent().unwrap_or(root))?;
    std::os::unix::fs::symlink("../inferloop-router.service", &wants)
        .map_err(ImageError::io(&wants))?;
    tree::write_file(
        &tree::join(root, ENV_PATH),
        env_text(gw, version, board).as_bytes(),
        0o644,
    )?;
    if let Some(key_file) = &gw.api_key_file {
        tree::write_file(
            &tree::join(root, API_KEY_LAUNCHER_PATH),
            API_KEY_LAUNCHER.as_bytes(),
            0o755,
        )?;
        tree::write_file(
            &tree::join(root, API_KEY_DROPIN_PATH),
            api_key_dropin(key_file)?.as_bytes(),
            0o644,
        )?;
    }
    if !gw.serve {
        for link in DAEMON_WANTS {
            let path = tree::join(root, link);
            if std::fs::symlink_metadata(&path).is_ok() {
                std::fs::remove_file(&path).map_err(ImageError::io(&path))?;
            }
        }
    }
    Ok(())
}

/// `pip install --target` for the image's platform: its architecture, CPython 3.`python`,
/// glibc 2.`glibc`, binary wheels only and from `wheels` only.
fn pip_install(
    wheels: &Path,
    arch: &str,
    python: u32,
    glibc: u32,
    target: &Path,
) -> Result<(), ImageError> {
    if PIP.run(["-m", "pip", "--version"]).is_err() {
        return Err(ImageError::ToolMissing {
            tool: "python3 -m pip",
            package: PIP.package,
        });
    }
    let mut args: Vec<String> = [
        "-m",
        "pip",
        "install",
        // No pip.conf, no PIP_* variables: the spec's wheels are the only input.
        "--isolated",
        "--disable-pip-version-check",
        "--no-input",
        "--no-cache-dir",
        "--no-index",
        "--only-binary=:all:",
        // Byte code would be the build host's Python's; the box runs without it.
        "--no-compile",
        // pip compares with the packages of the Python that runs it, which are not the box's.
        "--no-warn-conflicts",
        "--no-warn-script-location",
        "--implementation",
        "cp",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    args.push("--python-version".into());
    args.push(format!("3.{python}"));
    for tag in platform_tags(arch, glibc) {
        args.push("--platform".into());
        args.push(tag);
    }
    args.push("--find-links".into());
    args.push(wheels.display().to_string());
    args.push("--target".into());
    args.push(target.display().to_string());
    args.push(format!("vllm-router=={ROUTER_VERSION}"));
    match PIP.run(&args) {
        Ok(_) => Ok(()),
        Err(ImageError::ToolFailed { stderr, .. }) => Err(ImageError::Gateway {
            message: format!(
                "pip could not install vllm-router {ROUTER_VERSION} for {arch}, CPython 3.{python}, \
                 glibc 2.{glibc} from {}: {stderr}",
                wheels.display()
            ),
        }),
        Err(other) => Err(other),
    }
}

/// The script after `shebang`: pip's first line (or its `/bin/sh` trampoline for long
/// interpreter paths) replaced.
fn rewrite_shebang(text: &[u8], shebang: &str) -> Option<Vec<u8>> {
    let mut lines = text.split_inclusive(|b| *b == b'\n');
    let first = lines.next()?;
    let rest: Vec<&[u8]> = if first.starts_with(b"#!/bin/sh") {
        // #!/bin/sh / '''exec' /long/python "$0" "$@" / ' '''
        let exec = lines.next()?;
        let close = lines.next()?;
        if !exec.starts_with(b"'''exec'") || !close.starts_with(b"' '''") {
            return None;
        }
        lines.collect()
    } else if first.starts_with(b"#!") && first.windows(6).any(|w| w == b"python") {
        lines.collect()
    } else {
        return None;
    };
    let mut out = format!("{shebang}\n").into_bytes();
    for l in rest {
        out.extend_from_slice(l);
    }
    Some(out)
}

/// The RECORDs' script entries as installed here: `../../../bin/X` from site-packages (pip
/// `--target` wrote `../../bin/X`), with the new shebang's hash and size.
fn fix_records(site: &Path, scripts: &[(String, Vec<u8>)], from: &str) -> Result<(), ImageError> {
    for entry in std::fs::read_dir(site).map_err(ImageError::io(site))? {
        let entry = entry.map_err(ImageError::io(site))?;
        let record = entry.path().join("RECORD");
        if !entry.file_name().to_string_lossy().ends_with(".dist-info") || !record.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&record).map_err(ImageError::io(&record))?;
        if !text.contains(from) {
            continue;
        }
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            let script = line
                .strip_prefix(from)
                .and_then(|rest| rest.split(',').next())
                .and_then(|name| scripts.iter().find(|(n, _)| n == name));
            match script {
                Some((name, body)) => out.push_str(&format!(
                    "../../../bin/{name},sha256={},{}",
                    record_hash(body),
                    body.len()
                )),
                None => out.push_str(line),
            }
            out.push('\n');
        }
        std::fs::write(&record, out).map_err(ImageError::io(&record))?;
    }
    Ok(())
}

/// A RECORD hash: SHA-256, URL-safe base64 without padding (the wheel format, PEP 427).
fn record_hash(bytes: &[u8]) -> String {
    let hex = inferloop_manifest::hash::sha256_bytes(bytes);
    let raw: Vec<u8> = (0..hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect();
    base64_url(&raw)
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_urls_are_scheme_host_and_port_only() {
        for good in [
            "http://box-1.lan:8080",
            "https://10.0.0.7:443",
            "http://box",
            "http://[fe80::1]:8080",
            "http://[::1]",
        ] {
            assert_eq!(check_worker_url(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("box-1.lan:8080", "http://"),
            ("ftp://box:21", "http://"),
            ("http://box:8080/", "no path"),
            ("http://box:8080/v1", "no path"),
            ("http://user@box", "no path"),
            ("http://box:0", "port"),
            ("http://box:65536", "port"),
            ("http://box:80a", "port"),
            ("http://box:", "port"),
            ("http://", "host"),
            ("http://bad_host:80", "host"),
            ("http://-box", "host"),
            ("http://box..lan", "host"),
            ("http://[fe80::1", "unclosed"),
            ("http://[nope]:80", "IPv6"),
            ("http://[::1]x", "after the ]"),
            ("http://box 2:80", "no path"),
        ] {
            let err = check_worker_url(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn platform_tags_run_from_the_images_glibc_down_with_legacy_aliases() {
        let arm = platform_tags("aarch64", 36);
        assert_eq!(
            arm.first().map(String::as_str),
            Some("manylinux_2_36_aarch64")
        );
        assert!(arm.contains(&"manylinux_2_28_aarch64".to_string()));
        assert!(arm.contains(&"manylinux2014_aarch64".to_string()));
        assert_eq!(
            arm.last().map(String::as_str),
            Some("manylinux2014_aarch64")
        );
        // glibc 2.27 cannot run vllm-router's manylinux_2_28 wheel: pip is not offered it.
        assert!(!platform_tags("x86_64", 27).contains(&"manylinux_2_28_x86_64".to_string()));
        let x86 = platform_tags("x86_64", 17);
        for tag in [
            "manylinux2010_x86_64",
            "manylinux1_x86_64",
            "manylinux_2_5_x86_64",
        ] {
            assert!(x86.contains(&tag.to_string()), "{tag}");
        }
    }

    #[test]
    fn glibc_minor_is_read_from_the_banner() {
        let banner =
            b"\0\0GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n\0";
        assert_eq!(glibc_banner_minor(banner), Some(36));
        assert_eq!(glibc_banner_minor(b"no banner here"), None);
    }

    #[test]
    fn record_hashes_are_urlsafe_base64_sha256_without_padding() {
        // sha256("") in a wheel RECORD.
        assert_eq!(
            record_hash(b""),
            "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        assert_eq!(base64_url(b"f"), "Zg");
        assert_eq!(base64_url(b"fo"), "Zm8");
        assert_eq!(base64_url(b"foo"), "Zm9v");
    }

    #[test]
    fn shebangs_become_the_venvs_and_other_scripts_are_refused() {
        let s = "#!/opt/inferloop-router/bin/python";
        assert_eq!(
            rewrite_shebang(
                b"#!/root/.pyenv/versions/3.11.7/bin/python3\nimport re\n",
                s
            ),
            Some(format!("{s}\nimport re\n").into_bytes())
        );
        let trampoline =
            b"#!/bin/sh\n'''exec' /very/long/python \"$0\" \"$@\"\n' '''\nimport sys\n";
        assert_eq!(
            rewrite_shebang(trampoline, s),
            Some(format!("{s}\nimport sys\n").into_bytes())
        );
        assert_eq!(rewrite_shebang(b"\x7fELF...", s), None);
        assert_eq!(rewrite_shebang(b"#!/bin/sh\necho hi\n", s), None);
    }

    #[test]
    fn env_file_sets_every_variable_the_unit_uses() {
        let gw = GatewayInput {
            workers: vec!["http://a:8080".into(), "http://b:8080".into()],
            policy: Policy::PowerOfTwo,
            host: "0.0.0.0".into(),
            port: 9000,
            api_key_file: None,
            source: RouterSource::Wheels(PathBuf::from("w")),
            serve: false,
        };
        let text = env_text(&gw, "1.0.0", "qemu-virt-amd64");
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert!(
            text.contains("WORKER_URLS=\"http://a:8080 http://b:8080\"\n"),
            "{text}"
        );
        assert!(
            text.contains("ROUTER_POLICY=power_of_two\n") && text.contains("ROUTER_PORT=9000\n")
        );
        let exec = unit_exec_start().expect("ExecStart");
        assert!(exec.starts_with(ROUTER_BIN), "{exec}");
        let mut used = Vec::new();
        for word in exec.split_whitespace() {
            if let Some(v) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
                used.push(v);
            } else if let Some(v) = word.strip_prefix('$') {
                used.push(v);
            }
        }
        assert!(used.len() >= 8, "{used:?}");
        for v in used {
            assert!(
                keys.contains(&v),
                "the unit uses ${v}, router.env lacks it:\n{text}"
            );
        }
    }

    #[test]
    fn api_key_dropin_starts_the_units_own_command_through_the_launcher() {
        let dropin = api_key_dropin("/data/etc/router-api-key").expect("dropin");
        let exec = unit_exec_start().expect("ExecStart");
        assert!(dropin.contains("LoadCredential=router-api-key:/data/etc/router-api-key\n"));
        assert!(dropin.contains("RequiresMountsFor=/data/etc\n"));
        assert!(
            dropin.contains(&format!(
                "ExecStart=\nExecStart={API_KEY_LAUNCHER_PATH} {exec}\n"
            )),
            "{dropin}"
        );
        assert!(API_KEY_LAUNCHER.contains("/router-api-key\""));
    }
}
