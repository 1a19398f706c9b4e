//! Generic Linux: thermal zones, hwmon temperatures and cpufreq, whatever the machine has.

use std::path::{Path, PathBuf};

use crate::snapshot::Snapshot;
use crate::source::Source;
use crate::{sysfs, ThermalError};

/// Reads an ordinary Linux machine (an x86 box, a VM, a container) under `sys_root`.
pub struct LinuxSysfs {
    sys_root: PathBuf,
}

impl LinuxSysfs {
    pub fn new(sys_root: impl AsRef<Path>) -> Result<Self, ThermalError> {
        let sys_root = sys_root.as_ref().to_path_buf();
        super::check_root(&sys_root)?;
        Ok(LinuxSysfs { sys_root })
    }
}

impl Source for LinuxSysfs {
    fn name(&self) -> &str {
        "linux"
    }

    fn sample(&mut self) -> Result<Snapshot, ThermalError> {
        let sys = &self.sys_root;
        let mut snapshot = Snapshot::new(self.name());
        snapshot.zones = sysfs::thermal_zones(sys);
        let mirrored: Vec<String> = snapshot
            .zones
            .iter()
            .map(|z| z.name.replace('-', "_"))
            .collect();
        snapshot
            .zones
            .extend(sysfs::hwmon_temperatures(sys, &mirrored));
        snapshot.clocks = sysfs::cpu_clocks(sys);
        Ok(snapshot)
    }
}
