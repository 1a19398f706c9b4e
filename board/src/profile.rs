//! Board profiles: the TOML data files under `board/profiles/`, parsed strictly and checked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::BoardError;

/// What InferLoop knows about one kind of board, from its profile file.
///
/// Fields that vary from machine to machine on generic profiles (`x86_64-cpu`, `cuda-dgpu`)
/// are `None` there; detection reports the host's own numbers next to the profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoardProfile {
    /// Stable name, also the file stem and the `--board` value.
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Device-tree `compatible` entries that identify this board (most specific first).
    #[serde(default)]
    pub compatible: Vec<String>,
    /// The SoC's compatible entry, shared by sibling modules (e.g. `nvidia,tegra234`). Not
    /// used to pick a profile: it only explains a near miss.
    #[serde(default)]
    pub soc_compatible: Option<String>,
    /// CPU cores on the module.
    #[serde(default)]
    pub cpu_cores: Option<u32>,
    /// DRAM size in bytes.
    #[serde(default)]
    pub dram_bytes: Option<u64>,
    /// Theoretical DRAM bandwidth in GB/s (10^9 bytes per second).
    #[serde(default)]
    pub dram_bandwidth_gb_s: Option<f64>,
    /// CPU and GPU share one DRAM (Jetson): model weights and KV cache count against it once.
    pub unified_memory: bool,
    /// The integrated or expected GPU.
    #[serde(default)]
    pub gpu: Option<GpuSpec>,
    /// `nvpmodel` modes by id.
    #[serde(default)]
    pub power_modes: Vec<PowerMode>,
    /// The mode a freshly flashed board boots in.
    #[serde(default)]
    pub default_power_mode: Option<u32>,
    /// Thermal zones worth watching and their default thresholds.
    #[serde(default)]
    pub thermal_zones: Vec<ThermalZoneSpec>,
    /// Performance floors for the default model; absent means "skipped, measured value recorded".
    #[serde(default)]
    pub perf_floors: Option<PerfFloors>,
    /// A/B root filesystem slots for RAUC updates; absent on boards InferLoop does not
    /// update in place (the generic profiles).
    #[serde(default)]
    pub ota: Option<OtaSpec>,
}

/// GPU facts from the data sheet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Streaming multiprocessors.
    #[serde(default)]
    pub sm_count: Option<u32>,
    /// CUDA compute capability, written `"8.7"` in the file.
    #[serde(default)]
    pub compute_capability: Option<ComputeCapability>,
    /// Highest GPU clock in the fastest power mode.
    #[serde(default)]
    pub max_clock_mhz: Option<u32>,
}

/// A CUDA compute capability such as 8.7 (`sm_87`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    /// The `sm_XY` name nvcc uses.
    pub fn sm_name(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl TryFrom<String> for ComputeCapability {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let parsed = text.split_once('.').and_then(|(major, minor)| {
            Some(ComputeCapability {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
            })
        });
        parsed.ok_or_else(|| format!("compute capability must look like \"8.7\", got {text:?}"))
    }
}

impl From<ComputeCapability> for String {
    fn from(cc: ComputeCapability) -> String {
        cc.to_string()
    }
}

/// One `nvpmodel` mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerMode {
    pub id: u32,
    pub name: String,
}

/// A thermal zone to watch (by its sysfs `type`, or `gpu` for NVML) and its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThermalZoneSpec {
    pub name: String,
    /// The temperature where clocks start to drop: the default "hot" threshold.
    pub throttle_c: f64,
    /// The temperature near shutdown: the default "critical" threshold.
    pub critical_c: f64,
}

/// Qualification floors for the default model on this board.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfFloors {
    /// Time to first token must not exceed this.
    #[serde(default)]
    pub ttft_ms_max: Option<f64>,
    /// Decode speed must reach at least this.
    #[serde(default)]
    pub decode_tok_s_min: Option<f64>,
}

/// The A/B update layout of a board: what RAUC's `system.conf` needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtaSpec {
    /// The root filesystem slots, one per bootloader slot.
    pub slots: Vec<OtaSlot>,
    /// Boots a freshly installed slot gets before the bootloader falls back to the other.
    pub boot_tries: u32,
}

/// One root filesystem slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtaSlot {
    /// RAUC's slot name, `rootfs.<index>`: bundles carry one `rootfs` image for the class.
    pub name: String,
    /// The block device, by a name that survives re-enumeration (`/dev/disk/by-partlabel/…`).
    pub device: String,
    /// The bootloader's name for the slot (`A`, `B`).
    pub bootname: String,
}

/// RAUC's slot class of root filesystem slots, and the image name in a bundle.
pub const OTA_SLOT_CLASS: &str = "rootfs";
/// Upper bound on `boot_tries`: Tegra's per-slot retry counter is 3 bits.
pub const OTA_MAX_BOOT_TRIES: u32 = 7;

impl OtaSpec {
    /// Checks the layout; `invalid(field, message)` builds the profile's error.
    fn check(&self, invalid: &dyn Fn(&str, String) -> BoardError) -> Result<(), BoardError> {
        if self.slots.len() < 2 {
            return Err(invalid(
                "ota.slots",
                format!("needs at least two slots (A/B), got {}", self.slots.len()),
            ));
        }
        if !(1..=OTA_MAX_BOOT_TRIES).contains(&self.boot_tries) {
            return Err(invalid(
                "ota.boot_tries",
                format!(
                    "must be in 1..={OTA_MAX_BOOT_TRIES}, got {}",
                    self.boot_tries
                ),
            ));
        }
        let (mut names, mut devices, mut bootnames) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for slot in &self.slots {
            let index_ok = slot
                .name
                .strip_prefix(OTA_SLOT_CLASS)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
            if !index_ok {
                return Err(invalid(
                    "ota.slots",
                    format!(
                        "slot name {:?} must be `{OTA_SLOT_CLASS}.<index>`",
                        slot.name
                    ),
                ));
            }
            // RAUC's config is a key file: a newline or a leading/trailing space in a
            // value would change its meaning.
            let device_ok = slot.device.starts_with('/')
                && slot.device.len() > 1
                && !slot
                    .device
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control());
            if !device_ok {
                return Err(invalid(
                    "ota.slots",
                    format!(
                        "slot {}: device {:?} must be an absolute path without spaces",
                        slot.name, slot.device
                    ),
                ));
            }
            let bootname_ok = !slot.bootname.is_empty()
                && slot
                    .bootname
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !bootname_ok {
                return Err(invalid(
                    "ota.slots",
                    format!(
                        "slot {}: bootname {:?} must be letters, digits, `_` or `-`",
                        slot.name, slot.bootname
                    ),
                ));
            }
            for (seen, value, what) in [
                (&mut names, &slot.name, "name"),
                (&mut devices, &slot.device, "device"),
                (&mut bootnames, &slot.bootname, "bootname"),
            ] {
                if !seen.insert(value.clone()) {
                    return Err(invalid(
                        "ota.slots",
                        format!("two slots have the {what} {value:?}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl BoardProfile {
    /// Parses one profile and checks its values. `origin` names it in errors (a path or a
    /// file name).
    pub fn from_toml_str(origin: &str, text: &str) -> Result<Self, BoardError> {
        let profile: BoardProfile = toml::from_str(text).map_err(|e| BoardError::ProfileParse {
            origin: origin.to_string(),
            message: e.message().to_string(),
        })?;
        profile.check()?;
        Ok(profile)
    }

    /// Reads and parses a profile file (for boards that are not compiled in).
    pub fn from_file(path: &Path) -> Result<Self, BoardError> {
        let text = std::fs::read_to_string(path).map_err(|source| BoardError::ReadProfile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&path.display().to_string(), &text)
    }

    /// The name of a power mode id, if the profile knows it.
    pub fn power_mode_name(&self, id: u32) -> Option<&str> {
        self.power_modes
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.name.as_str())
    }

    /// The lowest throttle and critical temperatures over the watched zones, the defaults
    /// for thermal admission. `None` when the profile watches no zone.
    pub fn thermal_defaults(&self) -> Option<(f64, f64)> {
        let throttle = self
            .thermal_zones
            .iter()
            .map(|z| z.throttle_c)
            .reduce(f64::min)?;
        let critical = self
            .thermal_zones
            .iter()
            .map(|z| z.critical_c)
            .reduce(f64::min)?;
        Some((throttle, critical))
    }

    /// Checks the values a strict parse cannot.
    pub fn check(&self) -> Result<(), BoardError> {
        let invalid = |field: &str, message: String| BoardError::InvalidProfile {
            profile: self.name.clone(),
            field: field.to_string(),
            message,
        };
        let name_ok = !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(invalid(
                "name",
                format!(
                    "must be non-empty lowercase letters, digits, `-` or `_`, got {:?}",
                    self.name
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for entry in &self.compatible {
            if entry.is_empty() {
                return Err(invalid("compatible", "has an empty entry".into()));
            }
            if !seen.insert(entry) {
                return Err(invalid("compatible", format!("lists {entry:?} twice")));
            }
        }
        if self.cpu_cores == Some(0) {
            return Err(invalid("cpu_cores", "must be at least 1".into()));
        }
        if self.dram_bytes == Some(0) {
            return Err(invalid("dram_bytes", "must be at least 1".into()));
        }
        if let Some(bw) = self.dram_bandwidth_gb_s {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(invalid(
                    "dram_bandwidth_gb_s",
                    format!("must be positive, got {bw}"),
                ));
            }
        }
        let mut ids = BTreeSet::new();
        for mode in &self.power_modes {
            if !ids.insert(mode.id) {
                return Err(invalid(
                    "power_modes",
                    format!("lists id {} twice", mode.id),
                ));
            }
        }
        if let Some(id) = self.default_power_mode {
            if !ids.contains(&id) {
                return Err(invalid(
                    "default_power_mode",
                    format!("is {id}, which is not one of the power_modes ids {ids:?}"),
                ));
            }
        }
        let mut zones = BTreeSet::new();
        for zone in &self.thermal_zones {
            if !zones.insert(zone.name.as_str()) {
                return Err(invalid(
                    "thermal_zones",
                    format!("lists {:?} twice", zone.name),
                ));
            }
            let ordered = zone.throttle_c.is_finite()
                && zone.critical_c.is_finite()
                && zone.throttle_c < zone.critical_c;
            if !ordered {
                return Err(invalid(
                    "thermal_zones",
                    format!(
                        "zone {:?}: throttle_c ({}) must be below critical_c ({})",
                        zone.name, zone.throttle_c, zone.critical_c
                    ),
                ));
            }
        }
        if let Some(floors) = &self.perf_floors {
            for (field, value) in [
                ("perf_floors.ttft_ms_max", floors.ttft_ms_max),
                ("perf_floors.decode_tok_s_min", floors.decode_tok_s_min),
            ] {
                if let Some(v) = value {
                    if !(v.is_finite() && v > 0.0) {
                        return Err(invalid(field, format!("must be positive, got {v}")));
                    }
                }
            }
        }
        if let Some(ota) = &self.ota {
            ota.check(&invalid)?;
        }
        Ok(())
    }

    /// The RAUC `compatible` of this board: bundles for it must carry the same string.
    pub fn rauc_compatible(&self) -> String {
        format!("inferloop-{}", self.name)
    }
}

/// The compiled-in profile files, by file stem.
const BUILTIN_FILES: &[(&str, &str)] = &[
    (
        "jetson-orin-nx-16gb",
        include_str!("../profiles/jetson-orin-nx-16gb.toml"),
    ),
    (
        "jetson-orin-nx-8gb",
        include_str!("../profiles/jetson-orin-nx-8gb.toml"),
    ),
    (
        "jetson-orin-nano-8gb",
        include_str!("../profiles/jetson-orin-nano-8gb.toml"),
    ),
    (
        "jetson-agx-orin-64gb",
        include_str!("../profiles/jetson-agx-orin-64gb.toml"),
    ),
    ("x86_64-cpu", include_str!("../profiles/x86_64-cpu.toml")),
    ("aarch64-cpu", include_str!("../profiles/aarch64-cpu.toml")),
    ("cuda-dgpu", include_str!("../profiles/cuda-dgpu.toml")),
    (
        "qemu-virt-arm64",
        include_str!("../profiles/qemu-virt-arm64.toml"),
    ),
    (
        "qemu-virt-amd64",
        include_str!("../profiles/qemu-virt-amd64.toml"),
    ),
];

/// Parses and checks every compiled-in profile, and the set as a whole (unique names, each
/// compatible string claimed by one profile, file stem equal to the name).
pub fn load_builtin() -> Result<Vec<BoardProfile>, BoardError> {
    let mut profiles = Vec::with_capacity(BUILTIN_FILES.len());
    for (stem, text) in BUILTIN_FILES {
        let profile = BoardProfile::from_toml_str(&format!("profiles/{stem}.toml"), text)?;
        if profile.name != *stem {
            return Err(BoardError::InvalidProfile {
                profile: profile.name,
                field: "name".into(),
                message: format!("must equal the file stem `{stem}`"),
            });
        }
        profiles.push(profile);
    }
    check_set(&profiles)?;
    Ok(profiles)
}

/// Checks that names and compatible strings are unique across a set of profiles.
pub fn check_set(profiles: &[BoardProfile]) -> Result<(), BoardError> {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut claims: BTreeMap<&str, &str> = BTreeMap::new();
    for profile in profiles {
        if let Some(first) = names.insert(&profile.name, &profile.name) {
            return Err(BoardError::ProfileConflict {
                first: first.to_string(),
                second: profile.name.clone(),
                what: "the same name".into(),
            });
        }
        for entry in &profile.compatible {
            if let Some(first) = claims.insert(entry, &profile.name) {
                return Err(BoardError::ProfileConflict {
                    first: first.to_string(),
                    second: profile.name.clone(),
                    what: format!("compatible {entry:?}"),
                });
            }
        }
    }
    Ok(())
}

/// Every compiled-in profile, parsed once.
pub fn builtin() -> &'static [BoardProfile] {
    static PROFILES: OnceLock<Vec<BoardProfile>> = OnceLock::new();
    PROFILES.get_or_init(|| {
        // The files are part of the binary, not user input, and the test
        // `every_builtin_profile_parses_and_names_are_unique` loads them the same way:
        // a failure here is a build defect.
        load_builtin().unwrap_or_else(|e| panic!("compiled-in board profiles are broken: {e}"))
    })
}

/// Names of the compiled-in profiles, in file order.
pub fn builtin_names() -> Vec<String> {
    builtin().iter().map(|p| p.name.clone()).collect()
}

/// The compiled-in profile called `name`.
pub fn find(name: &str) -> Result<&'static BoardProfile, BoardError> {
    builtin()
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| BoardError::UnknownBoard {
            name: name.to_string(),
            known: builtin_names(),
        })
}
