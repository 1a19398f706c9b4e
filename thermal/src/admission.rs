//! Thermal admission: `normal → hot → critical` with hysteresis, as a plain struct the scheduler asks.

use std::fmt;

use inferloop_board::BoardProfile;
use serde::Serialize;

use crate::snapshot::Snapshot;
use crate::ThermalError;

/// How hot the board is, as far as admission cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThermalState {
    /// Full concurrency.
    Normal,
    /// Fewer sequences decode at once.
    Hot,
    /// New requests are refused (503 + `Retry-After`); running ones finish.
    Critical,
}

impl ThermalState {
    /// `normal`, `hot` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Hot => "hot",
            Self::Critical => "critical",
        }
    }

    /// The value of the `inferloop_thermal_state` gauge: 0, 1 or 2.
    pub fn as_gauge(self) -> u8 {
        match self {
            Self::Normal => 0,
            Self::Hot => 1,
            Self::Critical => 2,
        }
    }
}

impl fmt::Display for ThermalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Thresholds and the concurrency cut.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionConfig {
    /// At or above this (°C) the state is at least `hot`.
    pub hot_c: f64,
    /// At or above this (°C) the state is `critical`.
    pub critical_c: f64,
    /// A state is left only once the temperature is below its threshold minus this (°C).
    pub hysteresis_c: f64,
    /// In `hot`, this fraction of the slots may decode at once (rounded down, at least 1).
    pub hot_fraction: f64,
    /// Zones whose hottest reading drives the state; empty or none present means all zones.
    pub zones: Vec<String>,
}

impl AdmissionConfig {
    pub const DEFAULT_HYSTERESIS_C: f64 = 5.0;
    pub const DEFAULT_HOT_FRACTION: f64 = 0.5;
    /// Used when neither a profile nor trip points give thresholds.
    pub const FALLBACK_HOT_C: f64 = 85.0;
    pub const FALLBACK_CRITICAL_C: f64 = 95.0;

    /// Thresholds `hot_c`/`critical_c` with the default hysteresis and fraction, all zones.
    pub fn new(hot_c: f64, critical_c: f64) -> Self {
        AdmissionConfig {
            hot_c,
            critical_c,
            hysteresis_c: Self::DEFAULT_HYSTERESIS_C,
            hot_fraction: Self::DEFAULT_HOT_FRACTION,
            zones: Vec::new(),
        }
    }

    /// The profile's lowest throttle and critical temperatures over its watched zones, which
    /// also become the zones that drive the state. `None` when it watches no zone.
    pub fn from_profile(profile: &BoardProfile) -> Option<Self> {
        let (hot_c, critical_c) = profile.thermal_defaults()?;
        let mut config = Self::new(hot_c, critical_c);
        config.zones = profile
            .thermal_zones
            .iter()
            .map(|z| z.name.clone())
            .collect();
        Some(config)
    }

    /// The lowest passive and critical trip points in a reading, over the zones named in
    /// `zones` when any of them is in the reading, else over all zones. `None` unless both
    /// kinds are present and passive is below critical.
    pub fn from_trip_points(snapshot: &Snapshot, zones: &[String]) -> Option<Self> {
        let lowest = |watched_only: bool| {
            let considered = snapshot
                .zones
                .iter()
                .filter(|z| !watched_only || zones.contains(&z.name));
            let (mut passive, mut critical) = (None::<f64>, None::<f64>);
            for z in considered {
                if let Some(t) = z.passive_trip {
                    passive = Some(passive.map_or(t, |p| p.min(t)));
                }
                if let Some(t) = z.critical_trip {
                    critical = Some(critical.map_or(t, |c| c.min(t)));
                }
            }
            match (passive, critical) {
                (Some(p), Some(c)) if p < c => Some((p, c)),
                _ => None,
            }
        };
        let watched_present = snapshot.zones.iter().any(|z| zones.contains(&z.name));
        let (hot_c, critical_c) = lowest(watched_present)?;
        let mut config = Self::new(hot_c, critical_c);
        config.zones = zones.to_vec();
        Some(config)
    }

    /// Defaults in order of precedence: the trip points of a first reading (the running
    /// board knows best when it slows down), the board profile's numbers, then
    /// [`Self::FALLBACK_HOT_C`]/[`Self::FALLBACK_CRITICAL_C`]. The profile's zones, when it
    /// names any, drive the state in every case. Explicit settings from the daemon's config
    /// go on top of this.
    pub fn defaults_for(profile: Option<&BoardProfile>, first: Option<&Snapshot>) -> Self {
        let from_profile = profile.and_then(Self::from_profile);
        let zones = from_profile
            .as_ref()
            .map(|c| c.zones.clone())
            .unwrap_or_default();
        first
            .and_then(|s| Self::from_trip_points(s, &zones))
            .or(from_profile)
            .unwrap_or_else(|| {
                let mut config = Self::new(Self::FALLBACK_HOT_C, Self::FALLBACK_CRITICAL_C);
                config.zones = zones;
                config
            })
    }

    /// How many of `slots` may decode at once in `state`: all when `normal`; when `hot` or
    /// `critical`, `hot_fraction` of them rounded down, at least 1 (0 slots stay 0). The one
    /// place this cap is computed: [`Admission::max_active`] and the daemon's decode gate
    /// both ask here.
    pub fn max_active(&self, state: ThermalState, slots: usize) -> usize {
        match state {
            ThermalState::Normal => slots,
            ThermalState::Hot | ThermalState::Critical => {
                let cut = (slots as f64 * self.hot_fraction).floor() as usize;
                cut.clamp(1.min(slots), slots)
            }
        }
    }

    /// Checks the values: finite, `hot_c < critical_c`, hysteresis ≥ 0, fraction in (0, 1].
    pub fn validate(&self) -> Result<(), ThermalError> {
        let invalid = |field, message| Err(ThermalError::InvalidConfig { field, message });
        if !self.hot_c.is_finite() {
            return invalid("hot_c", format!("must be a number, got {}", self.hot_c));
        }
        if !(self.critical_c.is_finite() && self.critical_c > self.hot_c) {
            return invalid(
                "critical_c",
                format!(
                    "must be above hot_c ({}), got {}",
                    self.hot_c, self.critical_c
                ),
            );
        }
        if !(self.hysteresis_c.is_finite() && self.hysteresis_c >= 0.0) {
            return invalid(
                "hysteresis_c",
                format!("must be 0 or more, got {}", self.hysteresis_c),
            );
        }
        if !(self.hot_fraction > 0.0 && self.hot_fraction <= 1.0) {
            return invalid(
                "hot_fraction",
                format!("must be in (0, 1], got {}", self.hot_fraction),
            );
        }
        Ok(())
    }
}

/// A change of state and the temperature that caused it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StateChange {
    pub from: ThermalState,
    pub to: ThermalState,
    pub celsius: f64,
}

/// The admission state machine. Feed it temperatures; ask it how many sequences may run.
///
/// Going up is immediate at the threshold; going down needs the temperature below the
/// threshold minus the hysteresis, so a board hovering at the line does not flap. A big
/// drop may skip a level (critical → normal) and a big rise too (normal → critical).
#[derive(Debug, Clone)]
pub struct Admission {
    config: AdmissionConfig,
    state: ThermalState,
    last_celsius: Option<f64>,
}

impl Admission {
    /// Starts in `normal`.
    pub fn new(config: AdmissionConfig) -> Result<Self, ThermalError> {
        config.validate()?;
        Ok(Admission {
            config,
            state: ThermalState::Normal,
            last_celsius: None,
        })
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    pub fn state(&self) -> ThermalState {
        self.state
    }

    /// The temperature behind the current state.
    pub fn last_celsius(&self) -> Option<f64> {
        self.last_celsius
    }

    /// The level `celsius` reaches when rising.
    fn level_rising(&self, celsius: f64) -> ThermalState {
        if celsius >= self.config.critical_c {
            ThermalState::Critical
        } else if celsius >= self.config.hot_c {
            ThermalState::Hot
        } else {
            ThermalState::Normal
        }
    }

    /// The level `celsius` still holds when falling.
    fn level_falling(&self, celsius: f64) -> ThermalState {
        let h = self.config.hysteresis_c;
        if celsius >= self.config.critical_c - h {
            ThermalState::Critical
        } else if celsius >= self.config.hot_c - h {
            ThermalState::Hot
        } else {
            ThermalState::Normal
        }
    }

    /// Feeds one temperature (°C); returns the change, if any, after logging it. A NaN
    /// reading changes nothing.
    pub fn observe(&mut self, celsius: f64) -> Option<StateChange> {
        if celsius.is_nan() {
            return None;
        }
        self.last_celsius = Some(celsius);
        let rising = self.level_rising(celsius);
        let next = if rising > self.state {
            rising
        } else {
            self.level_falling(celsius).min(self.state)
        };
        if next == self.state {
            return None;
        }
        let change = StateChange {
            from: self.state,
            to: next,
            celsius,
        };
        self.state = next;
        let (hot, critical) = (self.config.hot_c, self.config.critical_c);
        if next > change.from {
            tracing::warn!(from = %change.from, to = %next, celsius, hot, critical, "thermal state up");
        } else {
            tracing::info!(
                from = %change.from,
                to = %next,
                celsius,
                hysteresis = self.config.hysteresis_c,
                "thermal state down"
            );
        }
        Some(change)
    }

    /// Feeds the hottest configured zone of a reading. A reading with no zones keeps the
    /// state: losing the sensors is no reason to relax, nor to panic.
    pub fn observe_snapshot(&mut self, snapshot: &Snapshot) -> Option<StateChange> {
        let zone = snapshot.hottest(Some(&self.config.zones))?;
        self.observe(zone.celsius)
    }

    /// How many sequences may decode at once out of `slots` in the current state (see
    /// [`AdmissionConfig::max_active`]). The scheduler starts a queued sequence only while
    /// fewer are active; it never preempts running ones.
    pub fn max_active(&self, slots: usize) -> usize {
        self.config.max_active(self.state, slots)
    }

    /// Whether a newly arriving request may be accepted; `false` in `critical` (answer 503
    /// with `Retry-After`).
    pub fn admit_new(&self) -> bool {
        self.state != ThermalState::Critical
    }
}
