//! The agent's settings: `/etc/inferloop/ota.toml` (rendered by `inferloop-image` from the
//! spec's `[ota]` table), flags over it, and the attributes the box reports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::OtaError;

/// Where the image keeps its manifest (`inferloop-image build` bakes it there).
pub const MANIFEST_PATH: &str = "/etc/inferloop/manifest.json";
pub const DEFAULT_TENANT: &str = "DEFAULT";
pub const DEFAULT_DOWNLOAD_DIR: &str = "/data/ota";
pub const DEFAULT_STATE_FILE: &str = "/data/ota/state.json";
/// Written by `inferloop-health` once the smoke set passed and the slot was marked good.
pub const DEFAULT_HEALTH_PASSED: &str = "/data/rauc/health-passed";

/// The file as written. Strict: a misspelt key would silently fall back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub server: Option<String>,
    pub tenant: Option<String>,
    pub controller_id: Option<String>,
    /// A file holding this box's token (`Authorization: TargetToken ...`); surrounding
    /// whitespace, a trailing newline included, is ignored. Read at start: missing or empty
    /// stops the agent rather than letting it poll unauthenticated.
    pub target_token_file: Option<PathBuf>,
    /// The same for a token shared by the tenant (`GatewayToken ...`).
    pub gateway_token_file: Option<PathBuf>,
    /// PEM CA certificates trusted for the server, added to the built-in (Mozilla) roots.
    pub ca_file: Option<PathBuf>,
    pub download_dir: Option<PathBuf>,
    pub state_file: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    /// Reboot after a successful install (default true).
    pub reboot: Option<bool>,
    pub reboot_command: Option<Vec<String>>,
    /// `""` confirms on RAUC's boot state alone.
    pub health_passed_file: Option<PathBuf>,
    /// How long a booted update may stay unconfirmed before it is reported failed.
    pub confirm_timeout_s: Option<u64>,
    /// Retry delays when the server is down: first and largest.
    pub retry_min_s: Option<f64>,
    pub retry_max_s: Option<f64>,
    /// Polling interval before the server named one, and the longest the agent sleeps.
    pub poll_default_s: Option<u64>,
    pub poll_max_s: Option<u64>,
    /// Extra `configData` attributes; these win over the values read from the manifest.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

/// How the box proves who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    /// `Authorization: TargetToken <token>`.
    Target(PathBuf),
    /// `Authorization: GatewayToken <token>`.
    Gateway(PathBuf),
}

/// Checked settings; nothing downstream looks at the raw file or flags again.
#[derive(Debug, Clone)]
pub struct Settings {
    pub server: String,
    pub tenant: String,
    pub controller_id: String,
    pub auth: Auth,
    pub ca_file: Option<PathBuf>,
    pub download_dir: PathBuf,
    pub state_file: PathBuf,
    pub manifest: PathBuf,
    pub reboot: bool,
    pub reboot_command: Vec<String>,
    pub health_passed_file: Option<PathBuf>,
    pub confirm_timeout: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub poll_default: Duration,
    pub poll_max: Duration,
    pub attributes: BTreeMap<String, String>,
}

/// Flags given on the command line; `Some` replaces the file's value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub server: Option<String>,
    pub tenant: Option<String>,
    pub controller_id: Option<String>,
    pub download_dir: Option<PathBuf>,
    pub state_file: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    pub reboot_command: Option<Vec<String>>,
}

impl Settings {
    /// Reads `path`, applies `over`, and checks the result.
    pub fn load(path: &Path, over: &Overrides) -> Result<Self, OtaError> {
        let text = std::fs::read_to_string(path).map_err(OtaError::io("reading config", path))?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| OtaError::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_file(file, over, path)
    }

    pub fn from_file(file: ConfigFile, over: &Overrides, origin: &Path) -> Result<Self, OtaError> {
        let bad = |message: String| OtaError::Config {
            path: origin.to_path_buf(),
            message,
        };
        let server = over.server.clone().or(file.server).ok_or_else(|| {
            bad("`server` is required (e.g. server = \"https://updates.example.com\")".into())
        })?;
        let server = server.trim_end_matches('/').to_string();
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(bad(format!(
                "`server` {server:?} must start with http:// or https://"
            )));
        }
        let tenant = over
            .tenant
            .clone()
            .or(file.tenant)
            .unwrap_or_else(|| DEFAULT_TENANT.into());
        check_segment("tenant", &tenant).map_err(bad)?;
        let controller_id = match over.controller_id.clone().or(file.controller_id) {
            Some(id) => id,
            None => default_controller_id().map_err(bad)?,
        };
        check_segment("controller_id", &controller_id).map_err(bad)?;
        let auth = match (file.target_token_file, file.gateway_token_file) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "set `target_token_file` or `gateway_token_file`, not both".into(),
                ))
            }
            (Some(t), None) => Auth::Target(t),
            (None, Some(g)) => Auth::Gateway(g),
            (None, None) => Auth::None,
        };
        let reboot_command = over
            .reboot_command
            .clone()
            .or(file.reboot_command)
            .unwrap_or_else(|| vec!["systemctl".into(), "reboot".into()]);
        if reboot_command.is_empty() {
            return Err(bad("`reboot_command` must name a program".into()));
        }
        let secs = |v: Option<f64>, default: f64, what: &str| -> Result<Duration, OtaError> {
            let v = v.unwrap_or(default);
            if !(v > 0.0 && v <= 86_400.0) {
                return Err(bad(format!("`{what}` must be in (0, 86400], got {v}")));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let retry_min = secs(file.retry_min_s, 1.0, "retry_min_s")?;
        let retry_max = secs(file.retry_max_s, 300.0, "retry_max_s")?;
        let poll_default = secs(
            file.poll_default_s.map(|v| v as f64),
            60.0,
            "poll_default_s",
        )?;
        let poll_max = secs(file.poll_max_s.map(|v| v as f64), 3600.0, "poll_max_s")?;
        let health_passed_file = match file.health_passed_file {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p),
            None => Some(PathBuf::from(DEFAULT_HEALTH_PASSED)),
        };
        Ok(Self {
            server,
            tenant,
            controller_id,
            auth,
            ca_file: file.ca_file,
            download_dir: over
                .download_dir
                .clone()
                .or(file.download_dir)
                .unwrap_or_else(|| DEFAULT_DOWNLOAD_DIR.into()),
            state_file: over
                .state_file
                .clone()
                .or(file.state_file)
                .unwrap_or_else(|| DEFAULT_STATE_FILE.into()),
            manifest: over
                .manifest
                .clone()
                .or(file.manifest)
                .unwrap_or_else(|| MANIFEST_PATH.into()),
            reboot: file.reboot.unwrap_or(true),
            reboot_command,
            health_passed_file,
            confirm_timeout: Duration::from_secs(file.confirm_timeout_s.unwrap_or(600)),
            retry_min,
            retry_max,
            poll_default,
            poll_max,
            attributes: file.attributes,
        })
    }

    /// `{server}/{tenant}/controller/v1/{controllerId}`.
    pub fn base_url(&self) -> String {
        format!(
            "{}/{}/controller/v1/{}",
            self.server, self.tenant, self.controller_id
        )
    }
}

/// A URL path segment: no slash, no space, nothing to escape.
fn check_segment(what: &str, v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{what}` {v:?} must be 1-255 characters of letters, digits, - _ . :"
        ))
    }
}

/// `/etc/machine-id`, else the hostname.
fn default_controller_id() -> Result<String, String> {
    for path in ["/etc/machine-id", "/proc/sys/kernel/hostname"] {
        if let Ok(s) = std::fs::read_to_string(path) {
            let s = s.trim();
            if !s.is_empty() && check_segment("controller_id", s).is_ok() {
                return Ok(s.to_string());
            }
        }
    }
    Err("no `controller_id` given and neither /etc/machine-id nor the hostname is usable".into())
}

/// The `configData` the box reports: `hw_boardname` (RAUC's compatible, which goosebit
/// matches against a bundle's; `rauc_compatible` when RAUC answered, else derived from the
/// manifest's board), `sw_version` (the image version), the daemon version and the
/// weights' SHA-256 from the running image's manifest, then the file's `[attributes]`.
pub fn attributes(
    manifest: &Path,
    rauc_compatible: Option<&str>,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("inferloop_ota".into(), env!("CARGO_PKG_VERSION").into());
    match inferloop_manifest::Manifest::load(manifest) {
        Ok(loaded) => {
            let m = loaded.manifest;
            out.insert("weights_sha256".into(), m.model.sha256.clone());
            if let Some(image) = &m.image {
                // The manifest names the board; RAUC's compatible is `inferloop-<board>`
                // (inferloop_board::BoardProfile::rauc_compatible).
                out.insert(
                    "hw_boardname".into(),
                    format!("inferloop-{}", image.compatible),
                );
                out.insert("sw_version".into(), image.version.clone());
                out.insert("daemon_version".into(), image.daemon.version.clone());
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "no image manifest: reporting only the configured attributes")
        }
    }
    if let Some(c) = rauc_compatible {
        out.insert("hw_boardname".into(), c.to_string());
    }
    for (k, v) in extra {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// The running image's version, when its manifest says.
pub fn running_version(manifest: &Path) -> Option<String> {
    inferloop_manifest::Manifest::load(manifest)
        .ok()?
        .manifest
        .image
        .map(|i| i.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Settings, OtaError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| OtaError::Config {
            path: "t.toml".into(),
            message: e.to_string(),
        })?;
        Settings::from_file(file, &Overrides::default(), Path::new("t.toml"))
    }

    #[test]
    fn defaults_fill_in_and_the_base_url_has_tenant_and_controller() {
        let s =
            load("server = \"https://u.example.com/\"\ncontroller_id = \"box-1\"\n").expect("ok");
        assert_eq!(
            s.base_url(),
            "https://u.example.com/DEFAULT/controller/v1/box-1"
        );
        assert_eq!(s.download_dir, PathBuf::from(DEFAULT_DOWNLOAD_DIR));
        assert_eq!(s.reboot_command, ["systemctl", "reboot"]);
        assert_eq!(s.auth, Auth::None);
        assert_eq!(
            s.health_passed_file,
            Some(PathBuf::from(DEFAULT_HEALTH_PASSED))
        );
    }

    #[test]
    fn typos_missing_server_two_tokens_and_bad_ids_are_refused() {
        for bad in [
            "server = \"https://x\"\ncontroller_id = \"a\"\ndownload_dri = \"/d\"\n",
            "controller_id = \"a\"\n",
            "server = \"ftp://x\"\ncontroller_id = \"a\"\n",
            "server = \"https://x\"\ncontroller_id = \"a/b\"\n",
            "server = \"https://x\"\ncontroller_id = \"a\"\ntarget_token_file = \"/t\"\ngateway_token_file = \"/g\"\n",
            "server = \"https://x\"\ncontroller_id = \"a\"\nretry_max_s = 0\n",
        ] {
            assert!(
                matches!(load(bad), Err(OtaError::Config { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn flags_override_the_file() {
        let file: ConfigFile =
            toml::from_str("server = \"https://a\"\ncontroller_id = \"x\"\ntenant = \"T1\"\n")
                .expect("toml");
        let over = Overrides {
            server: Some("http://b:8080".into()),
            tenant: Some("T2".into()),
            ..Overrides::default()
        };
        let s = Settings::from_file(file, &over, Path::new("t")).expect("ok");
        assert_eq!(s.base_url(), "http://b:8080/T2/controller/v1/x");
    }

    #[test]
    fn attributes_come_from_the_manifest_then_rauc_then_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = BTreeMap::from([("site".to_string(), "lab-3".to_string())]);
        let none = attributes(&dir.path().join("missing.json"), None, &extra);
        assert_eq!(none.get("site").map(String::as_str), Some("lab-3"));
        assert!(!none.contains_key("hw_boardname"));
        let with_rauc = attributes(
            &dir.path().join("missing.json"),
            Some("inferloop-b"),
            &extra,
        );
        assert_eq!(with_rauc["hw_boardname"], "inferloop-b");
    }
}
