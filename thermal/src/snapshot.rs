//! One reading of every sensor: zones, clocks, rails, load, power mode, throttling.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::throttle::{Throttle, ThrottleCause};

/// Everything one sample saw, and nothing about what it means for admission (that rides
/// beside it in a [`crate::Reading`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Wall-clock time of the reading, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Which source produced it: `jetson-sysfs`, `nvml`, `linux`, `fake`, or several joined by `+`.
    pub source: String,
    pub zones: Vec<Zone>,
    pub clocks: Vec<Clock>,
    pub rails: Vec<Rail>,
    /// GPU busy fraction in `[0, 1]`.
    pub gpu_load: Option<f64>,
    pub power_mode: Option<ActivePowerMode>,
    /// Throttling now: reported by the hardware (NVML) and, after the sampler ran
    /// [`crate::throttle::detect`], inferred from clocks and trip points.
    pub throttle: Vec<Throttle>,
}

/// A temperature sensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Zone {
    /// The sysfs zone `type` (`gpu-thermal`), `hwmon-name/label` for hwmon, `gpu` for NVML.
    pub name: String,
    pub celsius: f64,
    /// Lowest passive trip point: where the kernel starts slowing clocks.
    pub passive_trip: Option<f64>,
    /// Lowest critical trip point: where the board shuts down.
    pub critical_trip: Option<f64>,
}

/// A clock domain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Clock {
    /// `gpu`, `cpu0`..`cpuN`, `emc`, or NVML's `graphics`/`sm`/`memory`.
    pub domain: String,
    pub hz: u64,
    /// The hardware maximum (not the current thermal cap) when known.
    pub max_hz: Option<u64>,
    pub min_hz: Option<u64>,
}

/// A power rail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rail {
    /// The INA3221 channel label (`VDD_IN`) or `gpu` for NVML.
    pub name: String,
    pub watts: f64,
}

/// The `nvpmodel` mode in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActivePowerMode {
    pub id: Option<u32>,
    pub name: String,
}

/// Milliseconds since the Unix epoch, now; 0 if the clock is before 1970.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Snapshot {
    /// An empty reading from `source`, stamped now.
    pub fn new(source: impl Into<String>) -> Self {
        Snapshot {
            timestamp_ms: now_ms(),
            source: source.into(),
            zones: Vec::new(),
            clocks: Vec::new(),
            rails: Vec::new(),
            gpu_load: None,
            power_mode: None,
            throttle: Vec::new(),
        }
    }

    /// Adds a zone (builder style, for tests and fakes).
    pub fn with_zone(mut self, zone: Zone) -> Self {
        self.zones.push(zone);
        self
    }

    /// Adds a clock (builder style, for tests and fakes).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clocks.push(clock);
        self
    }

    /// Adds a rail (builder style, for tests and fakes).
    pub fn with_rail(mut self, name: impl Into<String>, watts: f64) -> Self {
        self.rails.push(Rail {
            name: name.into(),
            watts,
        });
        self
    }

    /// The zone called `name`.
    pub fn zone(&self, name: &str) -> Option<&Zone> {
        self.zones.iter().find(|z| z.name == name)
    }

    /// The clock called `domain`.
    pub fn clock(&self, domain: &str) -> Option<&Clock> {
        self.clocks.iter().find(|c| c.domain == domain)
    }

    /// The rail called `name`.
    pub fn rail(&self, name: &str) -> Option<&Rail> {
        self.rails.iter().find(|r| r.name == name)
    }

    /// Whether throttling with `cause` is in force (for `inferloop_throttled{cause}`).
    pub fn throttled(&self, cause: ThrottleCause) -> bool {
        self.throttle.iter().any(|t| t.cause == cause)
    }

    /// The hottest zone, among `watched` when given and any of them is present, else among
    /// all zones.
    pub fn hottest(&self, watched: Option<&[String]>) -> Option<&Zone> {
        fn max_of<'a>(zones: impl Iterator<Item = &'a Zone>) -> Option<&'a Zone> {
            zones.max_by(|a, b| a.celsius.total_cmp(&b.celsius))
        }
        if let Some(names) = watched.filter(|n| !n.is_empty()) {
            let found = max_of(self.zones.iter().filter(|z| names.contains(&z.name)));
            if found.is_some() {
                return found;
            }
        }
        max_of(self.zones.iter())
    }
}

impl Zone {
    /// A zone without trip points.
    pub fn new(name: impl Into<String>, celsius: f64) -> Self {
        Zone {
            name: name.into(),
            celsius,
            passive_trip: None,
            critical_trip: None,
        }
    }

    /// Sets the passive trip point.
    pub fn passive(mut self, celsius: f64) -> Self {
        self.passive_trip = Some(celsius);
        self
    }

    /// Sets the critical trip point.
    pub fn critical(mut self, celsius: f64) -> Self {
        self.critical_trip = Some(celsius);
        self
    }
}

impl Clock {
    /// A clock at `hz` with a known hardware maximum.
    pub fn new(domain: impl Into<String>, hz: u64, max_hz: Option<u64>) -> Self {
        Clock {
            domain: domain.into(),
            hz,
            max_hz,
            min_hz: None,
        }
    }
}
