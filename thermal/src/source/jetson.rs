//! Jetson sysfs: BPMP thermal zones, GPU devfreq and load, cpufreq, EMC, INA3221 rails, nvpmodel.

use std::io;
use std::path::{Path, PathBuf};

use crate::snapshot::{ActivePowerMode, Snapshot};
use crate::source::nvpmodel::{self, CommandRunner, SystemRunner};
use crate::source::Source;
use crate::{sysfs, ThermalError};

/// How many samples between two `nvpmodel -q` runs by default: the mode rarely changes and
/// the tool takes tens of milliseconds.
pub const DEFAULT_POWER_MODE_EVERY: u32 = 30;

/// Reads a Jetson under `sys_root` (normally `/sys`).
pub struct JetsonSysfs {
    sys_root: PathBuf,
    runner: Box<dyn CommandRunner>,
    power_mode_every: u32,
    samples: u64,
    power_mode: Option<ActivePowerMode>,
    /// Set once `nvpmodel` turned out not to be installed: stop asking.
    nvpmodel_missing: bool,
}

impl JetsonSysfs {
    /// A reader under `sys_root` that runs the real `nvpmodel`.
    pub fn new(sys_root: impl AsRef<Path>) -> Result<Self, ThermalError> {
        let sys_root = sys_root.as_ref().to_path_buf();
        super::check_root(&sys_root)?;
        Ok(JetsonSysfs {
            sys_root,
            runner: Box::new(SystemRunner),
            power_mode_every: DEFAULT_POWER_MODE_EVERY,
            samples: 0,
            power_mode: None,
            nvpmodel_missing: false,
        })
    }

    /// Replaces the command runner (tests, or a board where `nvpmodel` lives elsewhere).
    pub fn with_runner(mut self, runner: impl CommandRunner + 'static) -> Self {
        self.runner = Box::new(runner);
        self
    }

    /// Runs `nvpmodel -q` every `n` samples (at least 1).
    pub fn with_power_mode_every(mut self, n: u32) -> Self {
        self.power_mode_every = n.max(1);
        self
    }

    fn refresh_power_mode(&mut self) {
        if self.nvpmodel_missing {
            return;
        }
        match self.runner.run("nvpmodel", &["-q"]) {
            Ok(out) => {
                let mode = nvpmodel::parse_query(&out);
                if mode.is_none() {
                    tracing::debug!(output = %out.trim(), "nvpmodel -q printed no power mode");
                }
                if mode != self.power_mode {
                    if let Some(m) = &mode {
                        tracing::info!(mode = %m.name, id = ?m.id, "power mode");
                    }
                }
                self.power_mode = mode;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::info!("nvpmodel not installed; power mode not reported");
                self.nvpmodel_missing = true;
            }
            Err(e) => tracing::debug!(error = %e, "nvpmodel -q failed"),
        }
    }
}

impl Source for JetsonSysfs {
    fn name(&self) -> &str {
        "jetson-sysfs"
    }

    fn sample(&mut self) -> Result<Snapshot, ThermalError> {
        if self.samples % u64::from(self.power_mode_every) == 0 {
            self.refresh_power_mode();
        }
        self.samples += 1;
        let sys = &self.sys_root;
        let mut snapshot = Snapshot::new(self.name());
        snapshot.zones = sysfs::thermal_zones(sys);
        if let Some(gpu) = sysfs::gpu_devfreq(sys) {
            snapshot.clocks.push(gpu.clock);
            snapshot.gpu_load = gpu.load;
        }
        snapshot.clocks.extend(sysfs::cpu_clocks(sys));
        snapshot.clocks.extend(sysfs::emc_clock(sys));
        snapshot.rails = sysfs::ina3221_rails(sys);
        snapshot.power_mode = self.power_mode.clone();
        Ok(snapshot)
    }
}
