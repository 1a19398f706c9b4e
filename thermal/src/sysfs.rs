//! Readers for the sysfs files both Linux sources share; a missing or odd file is skipped, never fatal.
//!
//! Sensors come and go (offline zones return errors, hwmon drivers answer `EIO`, debugfs is
//! root-only), so every reader here returns what it could read and logs the rest at debug
//! level: the sampler runs every second and must not flood the log.

use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::snapshot::{Clock, Rail, Zone};

/// What an offline Tegra BPMP sensor reads, in milli-°C.
pub const OFFLINE_MILLI_C: i64 = -256_000;

/// Reads a small text file, trimming whitespace and the NULs device-tree files end with.
/// `None` when it is missing or unreadable (logged at debug unless simply absent).
pub fn read_text(path: &Path) -> Option<String> {
    match std::fs::read(path) {
        Ok(bytes) => Some(
            String::from_utf8_lossy(&bytes)
                .trim_matches(|c: char| c.is_whitespace() || c == '\0')
                .to_string(),
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "unreadable sysfs file");
            None
        }
    }
}

/// Reads and parses a number; `None` (logged at debug) when absent or not a number.
pub fn read_num<T: FromStr>(path: &Path) -> Option<T> {
    let text = read_text(path)?;
    match text.parse() {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::debug!(path = %path.display(), value = %text, "not a number");
            None
        }
    }
}

/// Entries of `dir` named `<prefix><number><suffix>`, as (number, path), sorted by number.
/// A missing directory is an empty list.
pub fn numbered(dir: &Path, prefix: &str, suffix: &str) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let n: u32 = name
                .to_str()?
                .strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()?;
            Some((n, entry.path()))
        })
        .collect();
    found.sort_by_key(|(n, _)| *n);
    found
}

/// Every entry of `dir`, sorted by name; empty when the directory is missing.
fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    paths
}

fn milli_to_c(milli: i64) -> f64 {
    milli as f64 / 1000.0
}

/// `<sys>/devices/virtual/thermal/thermal_zone*`: name from `type`, milli-°C `temp`, the lowest
/// passive and critical trip points. Offline sensors (−256 °C) and unreadable ones are dropped.
pub fn thermal_zones(sys: &Path) -> Vec<Zone> {
    let dir = sys.join("devices/virtual/thermal");
    let mut zones = Vec::new();
    for (n, zone_dir) in numbered(&dir, "thermal_zone", "") {
        let name = read_text(&zone_dir.join("type")).unwrap_or_else(|| format!("thermal_zone{n}"));
        let Some(milli) = read_num::<i64>(&zone_dir.join("temp")) else {
            tracing::debug!(zone = %name, "zone temperature unreadable; dropped");
            continue;
        };
        if milli <= OFFLINE_MILLI_C {
            tracing::debug!(zone = %name, milli, "offline sensor; dropped");
            continue;
        }
        let mut zone = Zone::new(name, milli_to_c(milli));
        for (i, type_path) in numbered(&zone_dir, "trip_point_", "_type") {
            let Some(kind) = read_text(&type_path) else {
                continue;
            };
            let Some(temp) = read_num::<i64>(&zone_dir.join(format!("trip_point_{i}_temp"))) else {
                continue;
            };
            // Unset trips read 0 (x86_pkg_temp shows two passive trips at 0 °C).
            if temp <= 0 {
                continue;
            }
            let c = milli_to_c(temp);
            let slot = match kind.as_str() {
                "passive" => &mut zone.passive_trip,
                "critical" => &mut zone.critical_trip,
                _ => continue, // `active` (fans) and `hot` do not slow clocks
            };
            *slot = Some(slot.map_or(c, |old: f64| old.min(c)));
        }
        zones.push(zone);
    }
    zones
}

/// hwmon temperature inputs (`<sys>/class/hwmon/hwmon*/temp*_input`), named
/// `<name>/<label>`; `temp*_max` and `temp*_crit` stand in for passive and critical trips.
/// Chips named in `skip` are left out (the thermal core mirrors each zone as a hwmon chip
/// whose name is the zone type with `-` turned into `_`).
pub fn hwmon_temperatures(sys: &Path, skip: &[String]) -> Vec<Zone> {
    let mut zones = Vec::new();
    for (n, dir) in numbered(&sys.join("class/hwmon"), "hwmon", "") {
        let chip = read_text(&dir.join("name")).unwrap_or_else(|| format!("hwmon{n}"));
        if skip.contains(&chip) {
            continue;
        }
        for (i, input) in numbered(&dir, "temp", "_input") {
            let Some(milli) = read_num::<i64>(&input) else {
                continue;
            };
            if milli <= OFFLINE_MILLI_C {
                continue;
            }
            let label = read_text(&dir.join(format!("temp{i}_label")))
                .unwrap_or_else(|| format!("temp{i}"));
            zones.push(Zone {
                name: format!("{chip}/{label}"),
                celsius: milli_to_c(milli),
                passive_trip: read_num::<i64>(&dir.join(format!("temp{i}_max"))).map(milli_to_c),
                critical_trip: read_num::<i64>(&dir.join(format!("temp{i}_crit"))).map(milli_to_c),
            });
        }
    }
    zones
}

/// Per-CPU clocks from `cpufreq/scaling_cur_freq` with `cpuinfo_max_freq`/`cpuinfo_min_freq`
/// (kHz). Offline CPUs have no `cpufreq` directory and are skipped.
pub fn cpu_clocks(sys: &Path) -> Vec<Clock> {
    let mut clocks = Vec::new();
    for (n, dir) in numbered(&sys.join("devices/system/cpu"), "cpu", "") {
        let freq = dir.join("cpufreq");
        let Some(khz) = read_num::<u64>(&freq.join("scaling_cur_freq")) else {
            continue;
        };
        let khz_to_hz = |k: u64| k.saturating_mul(1000);
        clocks.push(Clock {
            domain: format!("cpu{n}"),
            hz: khz_to_hz(khz),
            max_hz: read_num::<u64>(&freq.join("cpuinfo_max_freq")).map(khz_to_hz),
            min_hz: read_num::<u64>(&freq.join("cpuinfo_min_freq")).map(khz_to_hz),
        });
    }
    clocks
}

/// The GPU's devfreq device, its clock and its load.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevfreq {
    /// The `<sys>/class/devfreq/<name>` directory.
    pub dir: PathBuf,
    pub clock: Clock,
    /// `device/load` per mille, as a fraction.
    pub load: Option<f64>,
}

/// Device-tree node names of the Orin GPU: `gpu` on JetPack 6, `ga10b` before.
const GPU_NODE_NAMES: &[&str] = &["gpu", "ga10b"];

/// Finds the GPU among `<sys>/class/devfreq/*` by `device/of_node/name` (or, when the node
/// link is missing, by a directory name ending in `.gpu`/`.ga10b`). The maximum is the top
/// of `available_frequencies`, because `max_freq` itself drops under a thermal cap.
pub fn gpu_devfreq(sys: &Path) -> Option<GpuDevfreq> {
    for dir in sorted_entries(&sys.join("class/devfreq")) {
        let node = read_text(&dir.join("device/of_node/name"));
        let by_node = node.as_deref().is_some_and(|n| GPU_NODE_NAMES.contains(&n));
        let by_dir = node.is_none()
            && dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit_once('.'))
                .is_some_and(|(_, ext)| GPU_NODE_NAMES.contains(&ext));
        if !(by_node || by_dir) {
            continue;
        }
        let Some(hz) = read_num::<u64>(&dir.join("cur_freq")) else {
            tracing::debug!(dir = %dir.display(), "GPU devfreq without a readable cur_freq");
            continue;
        };
        let top_available = read_text(&dir.join("available_frequencies")).and_then(|list| {
            list.split_whitespace()
                .filter_map(|f| f.parse::<u64>().ok())
                .max()
        });
        let max_hz = top_available.or_else(|| read_num(&dir.join("max_freq")));
        let load = read_num::<u64>(&dir.join("device/load")).map(|pm| pm as f64 / 1000.0);
        return Some(GpuDevfreq {
            clock: Clock {
                domain: "gpu".into(),
                hz,
                max_hz,
                min_hz: read_num(&dir.join("min_freq")),
            },
            dir,
            load,
        });
    }
    None
}

/// The EMC (memory controller) clock from the BPMP debugfs, readable as root only.
pub fn emc_clock(sys: &Path) -> Option<Clock> {
    let dir = sys.join("kernel/debug/bpmp/debug/clk/emc");
    let hz = read_num::<u64>(&dir.join("rate"))?;
    Some(Clock {
        domain: "emc".into(),
        hz,
        max_hz: read_num(&dir.join("max_rate")),
        min_hz: read_num(&dir.join("min_rate")),
    })
}

/// Power rails of INA3221 monitors under `<sys>/class/hwmon/hwmon*` (name `ina3221`).
///
/// Per channel `N` with a label (`inN_label`, or `rail_name_N` on older layouts) the power
/// is, in order of preference: `in_powerN_input` (mW), `powerN_input` (µW, the hwmon unit),
/// or `currN_input` (mA) × `inN_input` (mV). The "sum of shunt voltages" channel is skipped.
pub fn ina3221_rails(sys: &Path) -> Vec<Rail> {
    let mut rails = Vec::new();
    for (_, dir) in numbered(&sys.join("class/hwmon"), "hwmon", "") {
        let chip = read_text(&dir.join("name")).unwrap_or_default();
        if !chip.starts_with("ina3221") {
            continue;
        }
        let mut channels: Vec<u32> = numbered(&dir, "in", "_label")
            .into_iter()
            .chain(numbered(&dir, "rail_name_", ""))
            .map(|(n, _)| n)
            .collect();
        channels.sort_unstable();
        channels.dedup();
        for n in channels {
            let Some(label) = read_text(&dir.join(format!("in{n}_label")))
                .or_else(|| read_text(&dir.join(format!("rail_name_{n}"))))
            else {
                continue;
            };
            if label.is_empty() || label.to_ascii_lowercase().starts_with("sum of shunt") {
                continue;
            }
            let watts = if let Some(mw) = read_num::<f64>(&dir.join(format!("in_power{n}_input"))) {
                mw / 1000.0
            } else if let Some(uw) = read_num::<f64>(&dir.join(format!("power{n}_input"))) {
                uw / 1_000_000.0
            } else {
                let ma = read_num::<f64>(&dir.join(format!("curr{n}_input")));
                let mv = read_num::<f64>(&dir.join(format!("in{n}_input")));
                match (ma, mv) {
                    (Some(ma), Some(mv)) => ma * mv / 1_000_000.0,
                    _ => continue,
                }
            };
            rails.push(Rail { name: label, watts });
        }
    }
    rails
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_entries_sort_by_number_not_by_text() {
        let dir = std::env::temp_dir().join(format!("inferloop-numbered-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for name in [
            "thermal_zone10",
            "thermal_zone2",
            "thermal_zone0",
            "cooling_device0",
        ] {
            std::fs::create_dir_all(dir.join(name)).expect("create fixture dir");
        }
        let found: Vec<u32> = numbered(&dir, "thermal_zone", "")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, vec![0, 2, 10]);
    }

    #[test]
    fn missing_directory_is_an_empty_list() {
        assert!(numbered(Path::new("/nonexistent/inferloop"), "x", "").is_empty());
        assert!(thermal_zones(Path::new("/nonexistent/inferloop")).is_empty());
    }
}
