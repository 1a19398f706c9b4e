//! RAUC on the box: the `system.conf` for a board's A/B slots and where the update files
//! live in the image.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use inferloop_board::BoardProfile;

use crate::error::ImageError;

/// RAUC's system configuration inside the image.
pub const SYSTEM_CONF_PATH: &str = "/etc/rauc/system.conf";
/// The CA certificate(s) a box accepts bundles from.
pub const KEYRING_PATH: &str = "/etc/rauc/keyring.pem";
/// The qualification binary the pre-install and boot checks run, when the spec bakes one.
pub const QUAL_PATH: &str = "/usr/bin/inferloop-qual";
/// RAUC's custom bootloader backend (shipped by the `rootfs/` overlay).
pub const BOOTLOADER_BACKEND: &str = "/usr/lib/inferloop/rauc-bootloader";
/// RAUC's pre-install handler (shipped by the `rootfs/` overlay).
pub const PRE_INSTALL_HANDLER: &str = "/usr/lib/inferloop/rauc-pre-install";
/// RAUC's status and bookkeeping: on the data partition, the root is read-only.
pub const DATA_DIR: &str = "/data/rauc";
/// Where RAUC mounts bundles: the default `/mnt/rauc` cannot be created on a read-only
/// root, `/run` is a tmpfs.
pub const MOUNT_PREFIX: &str = "/run/rauc";
/// Largest bundle an HTTP install downloads. RAUC's default (8 MiB) refuses every real
/// image; 4 GiB holds a root filesystem with a baked small model.
pub const MAX_BUNDLE_DOWNLOAD_SIZE: u64 = 4 << 30;

/// The fleet agent binary, when the spec bakes one (`rootfs/` ships its unit).
pub const AGENT_PATH: &str = "/usr/bin/inferloop-ota";
/// The fleet agent's config (`inferloop-ota agent --config`), rendered when the spec's
/// `[ota]` names a server.
pub const AGENT_CONF_PATH: &str = "/etc/inferloop/ota.toml";

/// The spec's fleet-agent settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConf {
    pub server: String,
    pub tenant: Option<String>,
    pub token_file: Option<String>,
}

impl AgentConf {
    pub fn new(
        server: String,
        tenant: Option<String>,
        token_file: Option<String>,
    ) -> Result<Self, String> {
        if !(server.starts_with("http://") || server.starts_with("https://"))
            || server.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "server {server:?} must be an http:// or https:// URL without spaces"
            ));
        }
        if let Some(t) = &tenant {
            if t.is_empty()
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(format!("tenant {t:?} must be letters, digits, - _ ."));
            }
        }
        if let Some(f) = &token_file {
            // The image is shared by the whole fleet; each box's token lives on its data
            // partition.
            if !f.starts_with("/data/") || f.chars().any(|c| c.is_control()) {
                return Err(format!(
                    "token_file {f:?} must be a path on the data partition (/data/...)"
                ));
            }
        }
        Ok(Self {
            server,
            tenant,
            token_file,
        })
    }

    /// The TOML the agent reads.
    pub fn render(&self) -> String {
        let mut t = toml::Table::new();
        t.insert("server".into(), self.server.clone().into());
        if let Some(tenant) = &self.tenant {
            t.insert("tenant".into(), tenant.clone().into());
        }
        if let Some(f) = &self.token_file {
            t.insert("target_token_file".into(), f.clone().into());
        }
        t.insert("download_dir".into(), "/data/ota".into());
        t.insert("state_file".into(), "/data/ota/state.json".into());
        t.insert(
            "health_passed_file".into(),
            "/data/rauc/health-passed".into(),
        );
        format!(
            "# The fleet agent (inferloop-ota.service), written by inferloop-image from the spec's [ota].\n{}",
            toml::to_string(&t).unwrap_or_default()
        )
    }
}

/// Values tests replace to run RAUC against loop devices and temporary directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfOverrides {
    /// Slot name (`rootfs.0`) → device.
    pub slot_devices: BTreeMap<String, String>,
    /// Keyring path instead of [`KEYRING_PATH`].
    pub keyring: Option<String>,
    /// Data directory instead of [`DATA_DIR`].
    pub data_dir: Option<String>,
}

/// Parses a `--slot-device rootfs.0=/dev/loop3` argument.
pub fn parse_slot_device(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((slot, device)) if !slot.is_empty() && !device.is_empty() => {
            Ok((slot.to_string(), device.to_string()))
        }
        _ => Err(format!(
            "expected SLOT=DEVICE (e.g. rootfs.0=/dev/loop3), got {arg:?}"
        )),
    }
}

/// Checks that `path` holds PEM certificates and no private key: the keyring goes into
/// every image, and a key in it would let anyone sign updates.
pub fn check_keyring(path: &Path) -> Result<(), ImageError> {
    let fail = |message: &str| ImageError::Certificate {
        path: path.to_path_buf(),
        message: message.to_string(),
    };
    let text = std::fs::read_to_string(path).map_err(|_| fail("is not a PEM text file"))?;
    if text.contains("PRIVATE KEY-----") {
        return Err(fail(
            "holds a private key; the keyring is the CA certificate (ca.cert.pem), never a key",
        ));
    }
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(fail(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(())
}

/// A path written into the key file: absolute, and nothing that would end the value early.
fn check_path(what: &str, value: &str) -> Result<(), ImageError> {
    let ok =
        value.starts_with('/') && !value.chars().any(|c| c.is_control()) && value.trim() == value;
    if ok {
        Ok(())
    } else {
        Err(ImageError::OtaConfig {
            message: format!("{what} {value:?} must be an absolute path without control characters or surrounding spaces"),
        })
    }
}

/// RAUC's `system.conf` for `board`, with `overrides` applied. A board without an `[ota]`
/// table has no slots to update and is an error.
pub fn system_conf(board: &BoardProfile, overrides: &ConfOverrides) -> Result<String, ImageError> {
    let ota = board.ota.as_ref().ok_or_else(|| ImageError::NoOta {
        board: board.name.clone(),
    })?;
    for slot in overrides.slot_devices.keys() {
        if !ota.slots.iter().any(|s| &s.name == slot) {
            let known: Vec<&str> = ota.slots.iter().map(|s| s.name.as_str()).collect();
            return Err(ImageError::OtaConfig {
                message: format!(
                    "board `{}` has no slot `{slot}`; its slots: {}",
                    board.name,
                    known.join(", ")
                ),
            });
        }
    }
    let keyring = overrides.keyring.as_deref().unwrap_or(KEYRING_PATH);
    let data_dir = overrides.data_dir.as_deref().unwrap_or(DATA_DIR);
    check_path("keyring", keyring)?;
    check_path("data directory", data_dir)?;

    let mut out = String::new();
    // `let _ =`: writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# RAUC system configuration for {} ({}), written by inferloop-image.\n\
         # Slots come from the board profile's [ota] table; boots allowed before fallback: {}.\n",
        board.name, board.description, ota.boot_tries
    );
    let _ = writeln!(
        out,
        "[system]\n\
         compatible={}\n\
         bootloader=custom\n\
         data-directory={data_dir}\n\
         mountprefix={MOUNT_PREFIX}\n\
         max-bundle-download-size={MAX_BUNDLE_DOWNLOAD_SIZE}\n",
        board.rauc_compatible()
    );
    // Without check-purpose=codesign, RAUC 1.8 refuses a codeSigning-only certificate
    // ("unsuitable certificate purpose").
    let _ = writeln!(
        out,
        "[keyring]\n\
         path={keyring}\n\
         check-purpose=codesign\n"
    );
    let _ = writeln!(
        out,
        "[handlers]\n\
         bootloader-custom-backend={BOOTLOADER_BACKEND}\n\
         pre-install={PRE_INSTALL_HANDLER}"
    );
    for slot in &ota.slots {
        let device = overrides
            .slot_devices
            .get(&slot.name)
            .map(String::as_str)
            .unwrap_or(&slot.device);
        check_path(&format!("slot {} device", slot.name), device)?;
        let _ = writeln!(
            out,
            "\n[slot.{}]\n\
             device={device}\n\
             type=raw\n\
             bootname={}",
            slot.name, slot.bootname
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orin() -> &'static BoardProfile {
        inferloop_board::profile::find("jetson-orin-nx-16gb").expect("profile")
    }

    #[test]
    fn orin_conf_has_the_compatible_keyring_handlers_and_both_slots() {
        let conf = system_conf(orin(), &ConfOverrides::default()).expect("renders");
        let body: Vec<&str> = conf
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .collect();
        assert_eq!(
            body,
            [
                "[system]",
                "compatible=inferloop-jetson-orin-nx-16gb",
                "bootloader=custom",
                "data-directory=/data/rauc",
                "mountprefix=/run/rauc",
                "max-bundle-download-size=4294967296",
                "[keyring]",
                "path=/etc/rauc/keyring.pem",
                "check-purpose=codesign",
                "[handlers]",
                "bootloader-custom-backend=/usr/lib/inferloop/rauc-bootloader",
                "pre-install=/usr/lib/inferloop/rauc-pre-install",
                "[slot.rootfs.0]",
                "device=/dev/disk/by-partlabel/APP",
                "type=raw",
                "bootname=A",
                "[slot.rootfs.1]",
                "device=/dev/disk/by-partlabel/APP_b",
                "type=raw",
                "bootname=B",
            ]
        );
        assert!(conf.contains("fallback: 3."), "{conf}");
    }

    #[test]
    fn overrides_replace_devices_keyring_and_data_dir_only() {
        let overrides = ConfOverrides {
            slot_devices: BTreeMap::from([("rootfs.1".to_string(), "/dev/loop7".to_string())]),
            keyring: Some("/tmp/k/ca.cert.pem".into()),
            data_dir: Some("/tmp/d".into()),
        };
        let conf = system_conf(orin(), &overrides).expect("renders");
        for line in [
            "device=/dev/disk/by-partlabel/APP\n",
            "device=/dev/loop7\n",
            "path=/tmp/k/ca.cert.pem\n",
            "data-directory=/tmp/d\n",
        ] {
            assert!(conf.contains(line), "{line:?} missing from\n{conf}");
        }
        assert!(!conf.contains("APP_b"), "{conf}");
    }

    #[test]
    fn board_without_ota_is_no_ota() {
        let cpu = inferloop_board::profile::find("x86_64-cpu").expect("profile");
        let err = system_conf(cpu, &ConfOverrides::default()).expect_err("no slots");
        assert!(
            matches!(&err, ImageError::NoOta { board } if board == "x86_64-cpu"),
            "{err:?}"
        );
        assert!(err.to_string().contains("[ota]"), "{err}");
    }

    #[test]
    fn unknown_slot_or_relative_device_is_refused() {
        let unknown = ConfOverrides {
            slot_devices: BTreeMap::from([("rootfs.2".to_string(), "/dev/loop1".to_string())]),
            ..ConfOverrides::default()
        };
        let err = system_conf(orin(), &unknown).expect_err("unknown slot");
        assert!(err.to_string().contains("rootfs.0, rootfs.1"), "{err}");
        let relative = ConfOverrides {
            slot_devices: BTreeMap::from([("rootfs.0".to_string(), "loop1".to_string())]),
            ..ConfOverrides::default()
        };
        assert!(matches!(
            system_conf(orin(), &relative),
            Err(ImageError::OtaConfig { .. })
        ));
        let newline = ConfOverrides {
            data_dir: Some("/data\n[system]".into()),
            ..ConfOverrides::default()
        };
        assert!(matches!(
            system_conf(orin(), &newline),
            Err(ImageError::OtaConfig { .. })
        ));
    }

    #[test]
    fn agent_conf_renders_what_the_agent_reads_and_refuses_tokens_in_the_image() {
        let conf = AgentConf::new(
            "https://updates.example.com".into(),
            Some("DEFAULT".into()),
            Some("/data/ota/target-token".into()),
        )
        .expect("valid");
        let text = conf.render();
        let t: toml::Table = toml::from_str(&text).expect("toml");
        assert_eq!(t["server"].as_str(), Some("https://updates.example.com"));
        assert_eq!(
            t["target_token_file"].as_str(),
            Some("/data/ota/target-token")
        );
        assert_eq!(t["download_dir"].as_str(), Some("/data/ota"));
        assert!(AgentConf::new("ftp://x".into(), None, None).is_err());
        assert!(AgentConf::new("https://x".into(), None, Some("/etc/token".into())).is_err());
        assert!(AgentConf::new("https://x".into(), Some("a b".into()), None).is_err());
    }

    #[test]
    fn slot_device_arguments_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_slot_device("rootfs.0=/dev/disk/by-id/a=b"),
            Ok(("rootfs.0".into(), "/dev/disk/by-id/a=b".into()))
        );
        assert!(parse_slot_device("rootfs.0").is_err());
        assert!(parse_slot_device("=/dev/x").is_err());
    }
}
