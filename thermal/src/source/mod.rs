//! The [`Source`] trait and its implementations: Jetson sysfs, NVML, generic Linux, a fake.

use std::path::Path;

use inferloop_board::BoardProfile;

use crate::snapshot::{now_ms, Snapshot};
use crate::ThermalError;

pub mod fake;
pub mod jetson;
pub mod linux;
pub mod nvml;
pub mod nvpmodel;

/// Something that can read the sensors. Sampling does blocking file I/O (and may run
/// `nvpmodel`), so the sampler calls it on the blocking pool.
pub trait Source: Send {
    /// Short stable name, copied into [`Snapshot::source`].
    fn name(&self) -> &str;

    /// Reads every sensor once. Sensors that are missing or offline are left out; an error
    /// means the source as a whole could not answer.
    fn sample(&mut self) -> Result<Snapshot, ThermalError>;
}

/// Several sources read one after the other into one snapshot (an x86 box with a dGPU:
/// Linux zones plus NVML). Fails only when every part fails.
pub struct Merged {
    name: String,
    parts: Vec<Box<dyn Source>>,
}

impl Merged {
    pub fn new(parts: Vec<Box<dyn Source>>) -> Self {
        let name = parts
            .iter()
            .map(|p| p.name().to_string())
            .collect::<Vec<_>>()
            .join("+");
        Merged { name, parts }
    }
}

impl Source for Merged {
    fn name(&self) -> &str {
        &self.name
    }

    fn sample(&mut self) -> Result<Snapshot, ThermalError> {
        let mut merged = Snapshot::new(self.name.clone());
        let mut failures = Vec::new();
        let mut any_ok = false;
        for part in &mut self.parts {
            match part.sample() {
                Ok(s) => {
                    any_ok = true;
                    merged.zones.extend(s.zones);
                    merged.clocks.extend(s.clocks);
                    merged.rails.extend(s.rails);
                    merged.throttle.extend(s.throttle);
                    merged.gpu_load = merged.gpu_load.or(s.gpu_load);
                    merged.power_mode = merged.power_mode.or(s.power_mode);
                }
                Err(e) => failures.push(format!("{}: {e}", part.name())),
            }
        }
        if !any_ok && !self.parts.is_empty() {
            return Err(ThermalError::SourceFailed {
                source_name: self.name.clone(),
                message: failures.join("; "),
            });
        }
        for failure in failures {
            tracing::debug!(%failure, "part of a merged thermal source failed");
        }
        merged.timestamp_ms = now_ms();
        Ok(merged)
    }
}

/// Picks the source for this machine: Jetson sysfs when the board is a Jetson or a Jetson
/// GPU devfreq node exists under `sys_root`; otherwise generic Linux, merged with NVML when
/// libnvidia-ml loads. NVML being absent is logged, not an error.
pub fn open_auto(
    sys_root: &Path,
    profile: Option<&BoardProfile>,
) -> Result<Box<dyn Source>, ThermalError> {
    let jetson_profile = profile.is_some_and(|p| p.name.starts_with("jetson-"));
    if jetson_profile || crate::sysfs::gpu_devfreq(sys_root).is_some() {
        return Ok(Box::new(jetson::JetsonSysfs::new(sys_root)?));
    }
    let linux = linux::LinuxSysfs::new(sys_root)?;
    match nvml::NvmlSource::open(0) {
        Ok(gpu) => Ok(Box::new(Merged::new(vec![Box::new(linux), Box::new(gpu)]))),
        Err(e) => {
            tracing::info!(error = %e, "no NVML GPU; reading Linux thermal zones and hwmon only");
            Ok(Box::new(linux))
        }
    }
}

/// Checks that `sys_root` is a readable directory.
pub(crate) fn check_root(sys_root: &Path) -> Result<(), ThermalError> {
    std::fs::read_dir(sys_root)
        .map(|_| ())
        .map_err(|source| ThermalError::SysRoot {
            path: sys_root.to_path_buf(),
            source,
        })
}
