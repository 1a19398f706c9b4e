//! Board and thermal-watch settings, checked from a merged layer.

use std::time::Duration;

use inferloop_board::Roots;
use inferloop_thermal::AdmissionConfig;

use super::error::ConfigError;
use super::layer::ServeLayer;

/// Board and thermal-watch settings. Thresholds left `None` come from the sysfs trip points
/// or the board profile at start (see [`crate::thermal`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ThermalSettings {
    /// `--board`: skips detection.
    pub board: Option<String>,
    /// Where `/proc` and `/sys` are: for detection, the thermal watch and the memory ledger.
    pub roots: Roots,
    pub interval: Duration,
    pub hot_c: Option<f64>,
    pub critical_c: Option<f64>,
    pub hysteresis_c: Option<f64>,
    pub hot_fraction: f64,
}

impl Default for ThermalSettings {
    fn default() -> Self {
        ThermalSettings {
            board: None,
            roots: Roots::default(),
            interval: Duration::from_millis(DEFAULT_THERMAL_INTERVAL_MS),
            hot_c: None,
            critical_c: None,
            hysteresis_c: None,
            hot_fraction: AdmissionConfig::DEFAULT_HOT_FRACTION,
        }
    }
}

/// The thermal watch samples once a second unless told otherwise.
pub const DEFAULT_THERMAL_INTERVAL_MS: u64 = 1000;
/// Thresholds outside this range (°C) are a typo, not a board.
const CELSIUS_RANGE: std::ops::RangeInclusive<f64> = 1.0..=150.0;

impl ThermalSettings {
    /// Checks the thermal keys of a merged layer; every message names its key.
    pub(super) fn from_layer(l: &ServeLayer) -> Result<Self, ConfigError> {
        let invalid = |field, message: String| ConfigError::Invalid { field, message };
        let board = match &l.board {
            Some(b) if b.trim().is_empty() => {
                return Err(invalid("board", "must not be empty".into()))
            }
            other => other.clone(),
        };
        let interval_ms = l.thermal_interval_ms.unwrap_or(DEFAULT_THERMAL_INTERVAL_MS);
        if !(10..=60_000).contains(&interval_ms) {
            return Err(invalid(
                "thermal_interval_ms",
                format!("must be between 10 and 60000, got {interval_ms}"),
            ));
        }
        let celsius = |field, v: Option<f64>| match v {
            Some(c) if !CELSIUS_RANGE.contains(&c) => Err(invalid(
                field,
                format!(
                    "must be between {} and {} °C, got {c}",
                    CELSIUS_RANGE.start(),
                    CELSIUS_RANGE.end()
                ),
            )),
            other => Ok(other),
        };
        let hot_c = celsius("hot_celsius", l.hot_celsius)?;
        let critical_c = celsius("critical_celsius", l.critical_celsius)?;
        if let (Some(hot), Some(critical)) = (hot_c, critical_c) {
            if critical <= hot {
                return Err(invalid(
                    "critical_celsius",
                    format!("({critical}) must be above `hot_celsius` ({hot})"),
                ));
            }
        }
        let hysteresis_c = match l.hysteresis_celsius {
            Some(h) if !(0.0..=50.0).contains(&h) => {
                return Err(invalid(
                    "hysteresis_celsius",
                    format!("must be between 0 and 50 °C, got {h}"),
                ))
            }
            other => other,
        };
        let hot_fraction = l
            .hot_fraction
            .unwrap_or(AdmissionConfig::DEFAULT_HOT_FRACTION);
        if !(hot_fraction > 0.0 && hot_fraction <= 1.0) {
            return Err(invalid(
                "hot_fraction",
                format!("must be in (0, 1], got {hot_fraction}"),
            ));
        }
        let defaults = Roots::default();
        Ok(ThermalSettings {
            board,
            roots: Roots {
                proc_root: l.proc_root.clone().unwrap_or(defaults.proc_root),
                sys_root: l.sysfs_root.clone().unwrap_or(defaults.sys_root),
            },
            interval: Duration::from_millis(interval_ms),
            hot_c,
            critical_c,
            hysteresis_c,
            hot_fraction,
        })
    }
}
