//! The thermal series on `/metrics`: temperatures, clocks, power rails, throttling and the
//! admission state.

use inferloop_thermal::{Reading, ThermalState, ThrottleCause};

use crate::metrics::TextWriter;

/// The thermal series. Every family is announced even with no reading, so dashboards see
/// it exist; a label value seen twice keeps its first reading (two sources may name a
/// sensor alike).
pub fn render_metrics(reading: Option<&Reading>, w: &mut TextWriter) {
    let snapshot = reading.map(|r| &*r.snapshot);
    let zones = snapshot.map(|s| s.zones.as_slice()).unwrap_or_default();
    let clocks = snapshot.map(|s| s.clocks.as_slice()).unwrap_or_default();
    let rails = snapshot.map(|s| s.rails.as_slice()).unwrap_or_default();
    w.gauge_family(
        "inferloop_temperature_celsius",
        "Temperature of each thermal zone.",
        |family| {
            for z in zones {
                family.sample(&[("zone", &z.name)], z.celsius);
            }
        },
    );
    w.gauge_family(
        "inferloop_clock_hz",
        "Current clock of each domain.",
        |family| {
            for c in clocks {
                family.sample(&[("domain", &c.domain)], c.hz);
            }
        },
    );
    w.gauge_family(
        "inferloop_power_watts",
        "Power drawn on each rail.",
        |family| {
            for r in rails {
                family.sample(&[("rail", &r.name)], r.watts);
            }
        },
    );
    w.gauge_family(
        "inferloop_throttled",
        "1 while clocks are held down for this cause.",
        |family| {
            for cause in ThrottleCause::ALL {
                let on = snapshot.is_some_and(|s| s.throttled(cause));
                family.sample(&[("cause", cause.as_str())], u32::from(on));
            }
        },
    );
    let state = reading.map_or(ThermalState::Normal, Reading::state_or_normal);
    w.gauge(
        "inferloop_thermal_state",
        "Thermal admission state: 0 normal, 1 hot, 2 critical.",
        u32::from(state.as_gauge()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferloop_thermal::{Clock, Snapshot, Throttle, Zone};

    fn rendered(reading: Option<&Reading>) -> String {
        let reading = reading.cloned();
        crate::metrics::text::render(move |w| render_metrics(reading.as_ref(), w))
    }

    /// The exposition for the reading in the test below and for none: what the hand-rolled
    /// writer gave before, except that a whole float now prints with `.0` (`30.0`).
    const HOT_BEFORE: &str = r#"# HELP inferloop_temperature_celsius Temperature of each thermal zone.
# TYPE inferloop_temperature_celsius gauge
inferloop_temperature_celsius{zone="gpu-thermal"} 45.8
inferloop_temperature_celsius{zone="odd\"zone\nx"} 30.0
# HELP inferloop_clock_hz Current clock of each domain.
# TYPE inferloop_clock_hz gauge
inferloop_clock_hz{domain="gpu"} 306000000
inferloop_clock_hz{domain="cpu0"} 729600000
# HELP inferloop_power_watts Power drawn on each rail.
# TYPE inferloop_power_watts gauge
inferloop_power_watts{rail="VDD_IN"} 5.20192
# HELP inferloop_throttled 1 while clocks are held down for this cause.
# TYPE inferloop_throttled gauge
inferloop_throttled{cause="thermal"} 0
inferloop_throttled{cause="power"} 1
# HELP inferloop_thermal_state Thermal admission state: 0 normal, 1 hot, 2 critical.
# TYPE inferloop_thermal_state gauge
inferloop_thermal_state 1
"#;
    const NO_READING_BEFORE: &str = r#"# HELP inferloop_temperature_celsius Temperature of each thermal zone.
# TYPE inferloop_temperature_celsius gauge
# HELP inferloop_clock_hz Current clock of each domain.
# TYPE inferloop_clock_hz gauge
# HELP inferloop_power_watts Power drawn on each rail.
# TYPE inferloop_power_watts gauge
# HELP inferloop_throttled 1 while clocks are held down for this cause.
# TYPE inferloop_throttled gauge
inferloop_throttled{cause="thermal"} 0
inferloop_throttled{cause="power"} 0
# HELP inferloop_thermal_state Thermal admission state: 0 normal, 1 hot, 2 critical.
# TYPE inferloop_thermal_state gauge
inferloop_thermal_state 0
"#;

    #[test]
    fn metrics_export_every_family_with_escaped_labels_and_no_duplicates() {
        let mut s = Snapshot::new("test")
            .with_zone(Zone::new("gpu-thermal", 45.8))
            .with_zone(Zone::new("gpu-thermal", 99.0))
            .with_zone(Zone::new("odd\"zone\nx", 30.0))
            .with_clock(Clock::new("gpu", 306_000_000, Some(918_000_000)))
            .with_clock(Clock::new("cpu0", 729_600_000, None))
            .with_rail("VDD_IN", 5.20192);
        s.throttle = vec![Throttle {
            cause: ThrottleCause::Power,
            detail: "cap".into(),
        }];
        let hot = Reading::new(s, Some(ThermalState::Hot));
        assert_eq!(rendered(Some(&hot)), HOT_BEFORE);
        assert_eq!(rendered(None), NO_READING_BEFORE);
    }

    #[test]
    fn reading_without_admission_exports_normal() {
        let bare = Reading::new(Snapshot::new("test"), None);
        assert!(rendered(Some(&bare)).ends_with("inferloop_thermal_state 0\n"));
    }
}
