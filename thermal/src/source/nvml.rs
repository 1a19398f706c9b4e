//! NVML (libnvidia-ml, loaded at run time): GPU temperature, clocks, power and throttle reasons.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock as NvmlClock, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::Nvml;

use crate::snapshot::{Clock, Snapshot, Zone};
use crate::source::Source;
use crate::throttle::{Throttle, ThrottleCause};
use crate::ThermalError;

/// Reads one GPU through NVML.
pub struct NvmlSource {
    nvml: Nvml,
    index: u32,
}

impl NvmlSource {
    /// Loads NVML and checks that GPU `index` answers. An absent library is
    /// [`ThermalError::NvmlUnavailable`], which callers treat as "use sysfs".
    pub fn open(index: u32) -> Result<Self, ThermalError> {
        let nvml = inferloop_board::gpu::load_nvml()
            .map_err(|reason| ThermalError::NvmlUnavailable { reason })?;
        let name = nvml
            .device_by_index(index)
            .and_then(|d| d.name())
            .map_err(|e| ThermalError::NvmlUnavailable {
                reason: format!("GPU {index}: {e}"),
            })?;
        tracing::info!(gpu = %name, index, "reading the GPU through NVML");
        Ok(NvmlSource { nvml, index })
    }
}

/// NVML's throttle reasons sorted into what matters for serving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasonClasses {
    /// Flag names that mean "too hot".
    pub thermal: Vec<&'static str>,
    /// Flag names that mean "power limit".
    pub power: Vec<&'static str>,
    /// The GPU is idle: clocks are low because there is no work, not a throttle.
    pub idle: bool,
}

/// Sorts NVML throttle reasons. `HW_SLOWDOWN` is the aggregate hardware flag (temperature,
/// power brake or over-current); it counts as thermal since that is its usual cause on a
/// closed edge box, and newer GPUs also set the specific flag. Application/user clock
/// settings, sync boost and display settings are not throttling.
pub fn classify_throttle_reasons(reasons: ThrottleReasons) -> ReasonClasses {
    let mut classes = ReasonClasses {
        idle: reasons.contains(ThrottleReasons::GPU_IDLE),
        ..Default::default()
    };
    for (flag, name) in [
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    ] {
        if reasons.contains(flag) {
            classes.thermal.push(name);
        }
    }
    for (flag, name) in [
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
    ] {
        if reasons.contains(flag) {
            classes.power.push(name);
        }
    }
    classes
}

/// The throttles a set of NVML reasons reports, with the flags and the clock in the detail.
pub fn throttles_from_reasons(classes: &ReasonClasses, graphics: Option<&Clock>) -> Vec<Throttle> {
    let clock = graphics
        .map(|c| match c.max_hz {
            Some(max) => format!(
                " (graphics {} MHz of max {} MHz)",
                c.hz / 1_000_000,
                max / 1_000_000
            ),
            None => format!(" (graphics {} MHz)", c.hz / 1_000_000),
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    if !classes.thermal.is_empty() {
        out.push(Throttle {
            cause: ThrottleCause::Thermal,
            detail: format!("NVML reports {}{clock}", classes.thermal.join(", ")),
        });
    }
    if !classes.power.is_empty() {
        out.push(Throttle {
            cause: ThrottleCause::Power,
            detail: format!("NVML reports {}{clock}", classes.power.join(", ")),
        });
    }
    out
}

impl Source for NvmlSource {
    fn name(&self) -> &str {
        "nvml"
    }

    fn sample(&mut self) -> Result<Snapshot, ThermalError> {
        let device = self
            .nvml
            .device_by_index(self.index)
            .map_err(|e| ThermalError::Nvml {
                call: "device_by_index",
                message: e.to_string(),
            })?;
        let celsius =
            device
                .temperature(TemperatureSensor::Gpu)
                .map_err(|e| ThermalError::Nvml {
                    call: "temperature",
                    message: e.to_string(),
                })?;
        let threshold = |t| {
            device
                .temperature_threshold(t)
                .map(f64::from)
                .map_err(|e| tracing::debug!(error = %e, "NVML threshold not reported"))
                .ok()
        };
        let mut snapshot = Snapshot::new(self.name());
        snapshot.zones.push(Zone {
            name: "gpu".into(),
            celsius: f64::from(celsius),
            passive_trip: threshold(TemperatureThreshold::Slowdown),
            critical_trip: threshold(TemperatureThreshold::Shutdown),
        });
        for (domain, kind) in [
            ("graphics", NvmlClock::Graphics),
            ("sm", NvmlClock::SM),
            ("memory", NvmlClock::Memory),
        ] {
            match device.clock_info(kind) {
                Ok(mhz) => snapshot.clocks.push(Clock {
                    domain: domain.into(),
                    hz: u64::from(mhz) * 1_000_000,
                    max_hz: device
                        .max_clock_info(kind)
                        .ok()
                        .map(|m| u64::from(m) * 1_000_000),
                    min_hz: None,
                }),
                Err(e) => tracing::debug!(domain, error = %e, "NVML clock not reported"),
            }
        }
        match device.power_usage() {
            Ok(mw) => snapshot = snapshot.with_rail("gpu", f64::from(mw) / 1000.0),
            Err(e) => tracing::debug!(error = %e, "NVML power not reported"),
        }
        snapshot.gpu_load = device
            .utilization_rates()
            .ok()
            .map(|u| f64::from(u.gpu) / 100.0);
        match device.current_throttle_reasons() {
            Ok(reasons) => {
                let classes = classify_throttle_reasons(reasons);
                snapshot.throttle = throttles_from_reasons(&classes, snapshot.clock("graphics"));
            }
            Err(e) => tracing::debug!(error = %e, "NVML throttle reasons not reported"),
        }
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thermal_power_and_idle_reasons_are_told_apart() {
        let classes = classify_throttle_reasons(
            ThrottleReasons::SW_THERMAL_SLOWDOWN
                | ThrottleReasons::SW_POWER_CAP
                | ThrottleReasons::GPU_IDLE,
        );
        assert_eq!(classes.thermal, vec!["sw_thermal_slowdown"]);
        assert_eq!(classes.power, vec!["sw_power_cap"]);
        assert!(classes.idle);
    }

    #[test]
    fn idle_and_clock_settings_alone_are_not_throttling() {
        let classes = classify_throttle_reasons(
            ThrottleReasons::GPU_IDLE
                | ThrottleReasons::APPLICATIONS_CLOCKS_SETTING
                | ThrottleReasons::SYNC_BOOST,
        );
        assert!(throttles_from_reasons(&classes, None).is_empty());
    }

    #[test]
    fn hw_power_brake_is_power_and_hw_thermal_is_thermal() {
        let classes = classify_throttle_reasons(
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN,
        );
        let throttles = throttles_from_reasons(
            &classes,
            Some(&Clock::new("graphics", 1_200_000_000, Some(1_980_000_000))),
        );
        let causes: Vec<ThrottleCause> = throttles.iter().map(|t| t.cause).collect();
        assert_eq!(causes, vec![ThrottleCause::Thermal, ThrottleCause::Power]);
        assert!(
            throttles[0].detail.contains("1200 MHz of max 1980 MHz"),
            "{}",
            throttles[0].detail
        );
    }
}
