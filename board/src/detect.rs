//! Detection: override, then device tree, then a CUDA GPU via NVML, then the CPU architecture.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::gpu::{GpuInfo, GpuProbe, NvmlProbe};
use crate::{profile, BoardError, BoardProfile};

/// Where `/proc` and `/sys` live; tests point these at fixture trees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Roots {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }
}

impl Roots {
    /// `<dir>/proc` and `<dir>/sys`: the layout of a fixture tree or a copied root file system.
    pub fn under(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Roots {
            proc_root: dir.join("proc"),
            sys_root: dir.join("sys"),
        }
    }
}

/// Why a profile was chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Reason {
    /// `--board NAME`.
    Override { name: String },
    /// A device-tree compatible entry that the profile claims.
    DeviceTree { file: PathBuf, compatible: String },
    /// NVML found a CUDA GPU.
    CudaGpu { gpu: String },
    /// Nothing else matched; the CPU architecture picked the profile.
    CpuArch { arch: String },
}

impl Reason {
    /// Stable label: `override`, `device_tree`, `cuda_gpu`, `cpu_arch`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Override { .. } => "override",
            Self::DeviceTree { .. } => "device_tree",
            Self::CudaGpu { .. } => "cuda_gpu",
            Self::CpuArch { .. } => "cpu_arch",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Override { name } => write!(f, "override (--board {name})"),
            Self::DeviceTree { file, compatible } => {
                write!(f, "{} lists {compatible:?}", file.display())
            }
            Self::CudaGpu { gpu } => write!(f, "NVML reports a CUDA GPU: {gpu}"),
            Self::CpuArch { arch } => write!(f, "cpu architecture fallback ({arch})"),
        }
    }
}

/// What the running machine itself reports, next to the profile's data-sheet numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostFacts {
    /// CPUs listed in `<sys>/devices/system/cpu/online`.
    pub cpus_online: Option<u32>,
    /// `MemTotal` from `<proc>/meminfo`, in bytes.
    pub mem_total_bytes: Option<u64>,
}

/// The detected board and the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    pub profile: BoardProfile,
    pub reason: Reason,
    /// `<proc>/device-tree/model`, when present.
    pub model: Option<String>,
    /// `<proc>/device-tree/compatible` entries, in file order.
    pub compatible: Vec<String>,
    /// The GPU NVML reported, when it was asked and answered.
    pub gpu: Option<GpuInfo>,
    pub host: HostFacts,
    /// The rules tried before the one that matched, and anything odd on the way.
    pub notes: Vec<String>,
}

/// Decides which board this is. Build with [`Detector::new`], adjust, then [`Detector::detect`].
pub struct Detector {
    roots: Roots,
    board_override: Option<String>,
    probe: Box<dyn GpuProbe>,
    arch: String,
}

impl Detector {
    /// Detection under `roots` with the real NVML probe and this binary's CPU architecture.
    pub fn new(roots: Roots) -> Self {
        Detector {
            roots,
            board_override: None,
            probe: Box::new(NvmlProbe),
            arch: std::env::consts::ARCH.to_string(),
        }
    }

    /// `--board NAME`: when `Some`, wins over every other rule.
    pub fn with_override(mut self, name: Option<String>) -> Self {
        self.board_override = name;
        self
    }

    /// Replaces the NVML probe (tests, or callers that must not load NVML).
    pub fn with_gpu_probe(mut self, probe: impl GpuProbe + 'static) -> Self {
        self.probe = Box::new(probe);
        self
    }

    /// Replaces the CPU architecture used by the last rule.
    pub fn with_arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// Runs the rules in order against the compiled-in profiles.
    pub fn detect(&self) -> Result<Detection, BoardError> {
        self.detect_among(profile::builtin())
    }

    /// Runs the rules in order against `profiles`.
    pub fn detect_among(&self, profiles: &[BoardProfile]) -> Result<Detection, BoardError> {
        let mut notes = Vec::new();
        let dt_dir = self.roots.proc_root.join("device-tree");
        let compatible_file = dt_dir.join("compatible");
        let compatible = read_nul_list(&compatible_file, &mut notes);
        let model = read_nul_list(&dt_dir.join("model"), &mut notes)
            .into_iter()
            .next();
        let host = read_host_facts(&self.roots);
        let known = || profiles.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let done = |profile: &BoardProfile,
                    reason: Reason,
                    gpu: Option<GpuInfo>,
                    notes: Vec<String>|
         -> Result<Detection, BoardError> {
            tracing::info!(board = %profile.name, why = %reason, "board detected");
            Ok(Detection {
                profile: profile.clone(),
                reason,
                model: model.clone(),
                compatible: compatible.clone(),
                gpu,
                host: host.clone(),
                notes,
            })
        };

        if let Some(name) = &self.board_override {
            let profile = profiles.iter().find(|p| &p.name == name).ok_or_else(|| {
                BoardError::UnknownBoard {
                    name: name.clone(),
                    known: known(),
                }
            })?;
            let reason = Reason::Override { name: name.clone() };
            return done(profile, reason, None, notes);
        }

        // Device-tree entries run from most to least specific; the first one a profile
        // claims decides.
        for entry in &compatible {
            if let Some(profile) = profiles.iter().find(|p| p.compatible.contains(entry)) {
                let reason = Reason::DeviceTree {
                    file: compatible_file.clone(),
                    compatible: entry.clone(),
                };
                return done(profile, reason, None, notes);
            }
        }
        if !compatible.is_empty() {
            let soc = profiles.iter().find_map(|p| {
                p.soc_compatible
                    .as_ref()
                    .filter(|soc| compatible.contains(soc))
            });
            let note = match soc {
                Some(soc) => format!(
                    "device tree names the SoC {soc:?} but a module no profile knows ({}); \
                     pass --board to choose one",
                    compatible.join(", ")
                ),
                None => format!(
                    "no profile claims any device-tree compatible entry ({})",
                    compatible.join(", ")
                ),
            };
            tracing::warn!("{note}");
            notes.push(note);
        }

        match self.probe.probe() {
            Ok(gpu) => {
                if let Some(profile) = profiles.iter().find(|p| p.name == "cuda-dgpu") {
                    let reason = Reason::CudaGpu {
                        gpu: gpu.name.clone(),
                    };
                    return done(profile, reason, Some(gpu), notes);
                }
                notes.push(format!(
                    "NVML reports {} but no `cuda-dgpu` profile exists",
                    gpu.name
                ));
            }
            Err(miss) => notes.push(miss.reason),
        }

        let wanted = format!("{}-cpu", self.arch);
        match profiles.iter().find(|p| p.name == wanted) {
            Some(profile) => {
                let reason = Reason::CpuArch {
                    arch: self.arch.clone(),
                };
                done(profile, reason, None, notes)
            }
            None => Err(BoardError::UnsupportedArch {
                arch: self.arch.clone(),
                known: known(),
            }),
        }
    }
}

/// Reads a device-tree string list (NUL-separated, NUL-terminated). A missing file is an
/// empty list and a note; any other read error is logged and noted, never fatal.
fn read_nul_list(path: &Path, notes: &mut Vec<String>) -> Vec<String> {
    match std::fs::read(path) {
        Ok(bytes) => bytes
            .split(|&b| b == 0)
            .map(|part| String::from_utf8_lossy(part).trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            notes.push(format!("no {}", path.display()));
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read device-tree file");
            notes.push(format!("cannot read {}: {e}", path.display()));
            Vec::new()
        }
    }
}

fn read_host_facts(roots: &Roots) -> HostFacts {
    let cpus_online = std::fs::read_to_string(roots.sys_root.join("devices/system/cpu/online"))
        .ok()
        .and_then(|text| count_cpu_list(text.trim()));
    let mem_total_bytes = std::fs::read_to_string(roots.proc_root.join("meminfo"))
        .ok()
        .and_then(|text| parse_mem_total(&text));
    HostFacts {
        cpus_online,
        mem_total_bytes,
    }
}

/// Counts a kernel CPU list such as `0-3,6,8-9`.
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut count = 0u32;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                hi.checked_sub(lo)? + 1
            }
            None => {
                part.trim().parse::<u32>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// `MemTotal:  16010140 kB` → bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_counts_ranges_and_singles() {
        assert_eq!(count_cpu_list("0-7"), Some(8));
        assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       15655232 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(15_655_232 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
    }
}
