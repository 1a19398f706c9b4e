//! Throttling: detected from a snapshot, and its start/stop transitions logged once each.

use std::fmt;

use serde::Serialize;

use crate::snapshot::{Clock, Snapshot, Zone};

/// Why clocks are being held down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThrottleCause {
    Thermal,
    Power,
}

impl ThrottleCause {
    /// All causes, for metrics that export every label.
    pub const ALL: [ThrottleCause; 2] = [ThrottleCause::Thermal, ThrottleCause::Power];

    /// The metric label: `thermal` or `power`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Thermal => "thermal",
            Self::Power => "power",
        }
    }
}

impl fmt::Display for ThrottleCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Throttling in force, with the numbers that show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Throttle {
    pub cause: ThrottleCause,
    pub detail: String,
}

fn mhz(hz: u64) -> u64 {
    hz / 1_000_000
}

/// The throttles in force in `snapshot`: those the hardware reported (kept as they are) and
/// a thermal throttle inferred when some clock runs below its maximum while some zone is
/// at or above its passive trip point. One entry per cause.
///
/// Any hot zone counts against any slow clock: on Jetson the junction (`tj-thermal`) caps
/// every domain, so pairing by name would miss real throttling.
pub fn detect(snapshot: &Snapshot) -> Vec<Throttle> {
    let mut found: Vec<Throttle> = Vec::new();
    for reported in &snapshot.throttle {
        if !found.iter().any(|t| t.cause == reported.cause) {
            found.push(reported.clone());
        }
    }
    if found.iter().any(|t| t.cause == ThrottleCause::Thermal) {
        return found;
    }
    let hot: Vec<(&Zone, f64)> = snapshot
        .zones
        .iter()
        .filter_map(|z| {
            z.passive_trip
                .filter(|&trip| z.celsius >= trip)
                .map(|trip| (z, trip))
        })
        .collect();
    let slow: Vec<(&Clock, u64)> = snapshot
        .clocks
        .iter()
        .filter_map(|c| c.max_hz.filter(|&max| c.hz < max).map(|max| (c, max)))
        .collect();
    if hot.is_empty() || slow.is_empty() {
        return found;
    }
    let hottest = hot
        .iter()
        .max_by(|a, b| (a.0.celsius - a.1).total_cmp(&(b.0.celsius - b.1)))
        .map(|(z, trip)| format!("{} {:.1} °C >= passive {:.1} °C", z.name, z.celsius, trip))
        .unwrap_or_default();
    const SHOWN: usize = 3;
    let mut clocks: Vec<String> = slow
        .iter()
        .take(SHOWN)
        .map(|(c, max)| format!("{} {} MHz < max {} MHz", c.domain, mhz(c.hz), mhz(*max)))
        .collect();
    if slow.len() > SHOWN {
        clocks.push(format!("{} more", slow.len() - SHOWN));
    }
    let zones = if hot.len() > 1 {
        format!("{hottest} (+{} more zones)", hot.len() - 1)
    } else {
        hottest
    };
    found.push(Throttle {
        cause: ThrottleCause::Thermal,
        detail: format!("{} while {zones}", clocks.join(", ")),
    });
    found.sort_by_key(|t| t.cause);
    found
}

/// A throttle starting or stopping.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum ThrottleTransition {
    Started(Throttle),
    Stopped {
        cause: ThrottleCause,
        /// What was seen when it started.
        detail: String,
    },
}

/// Remembers which causes are active so each start and each stop is logged once.
#[derive(Debug, Clone, Default)]
pub struct ThrottleTracker {
    active: Vec<Throttle>,
}

impl ThrottleTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Causes active after the last update.
    pub fn active(&self) -> &[Throttle] {
        &self.active
    }

    /// Compares `now` with what was active, logs and returns the transitions.
    pub fn update(&mut self, now: &[Throttle]) -> Vec<ThrottleTransition> {
        let mut transitions = Vec::new();
        for old in &self.active {
            if !now.iter().any(|t| t.cause == old.cause) {
                tracing::info!(cause = %old.cause, was = %old.detail, "throttling stopped");
                transitions.push(ThrottleTransition::Stopped {
                    cause: old.cause,
                    detail: old.detail.clone(),
                });
            }
        }
        let mut next = Vec::with_capacity(now.len());
        for t in now {
            if next.iter().any(|n: &Throttle| n.cause == t.cause) {
                continue;
            }
            match self.active.iter().find(|a| a.cause == t.cause) {
                // Keep the detail seen at the start: the stop message then says what began it.
                Some(existing) => next.push(existing.clone()),
                None => {
                    tracing::warn!(cause = %t.cause, detail = %t.detail, "throttling started");
                    transitions.push(ThrottleTransition::Started(t.clone()));
                    next.push(t.clone());
                }
            }
        }
        self.active = next;
        transitions
    }
}
