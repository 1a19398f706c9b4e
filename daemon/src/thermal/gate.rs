//! The decode thread's view of the thermal watch: the admission state, the cap that goes
//! with it, and the refusal while critical.

use std::sync::Arc;

use inferloop_thermal::{AdmissionConfig, Reading, ThermalState};
use tokio::sync::watch;

/// The thermal verdict on new work while the board is critical: the hottest watched zone
/// and the critical threshold. The engine turns it into its refusal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overheat {
    pub celsius: f64,
    pub critical: f64,
}

/// What the decode thread consults every loop iteration: a `watch` borrow, no lock held
/// across anything, no allocation.
#[derive(Debug, Clone)]
pub struct ThermalGate {
    latest: watch::Receiver<Option<Reading>>,
    admission: Arc<AdmissionConfig>,
}

impl ThermalGate {
    /// A view of the readings on `latest`, judged by `admission`.
    pub(super) fn new(
        latest: watch::Receiver<Option<Reading>>,
        admission: AdmissionConfig,
    ) -> Self {
        ThermalGate {
            latest,
            admission: Arc::new(admission),
        }
    }

    /// The admission state of the newest reading; `normal` before the first one.
    pub fn state(&self) -> ThermalState {
        self.latest
            .borrow()
            .as_ref()
            .map_or(ThermalState::Normal, Reading::state_or_normal)
    }

    /// The admission cap for `state` out of `slots`, as the thermal crate computes it.
    pub fn max_active(&self, state: ThermalState, slots: usize) -> usize {
        self.admission.max_active(state, slots)
    }

    /// `Some` while the board is critical: new requests are refused.
    pub fn refusal(&self) -> Option<Overheat> {
        let latest = self.latest.borrow();
        let reading = latest.as_ref()?;
        if reading.state != Some(ThermalState::Critical) {
            return None;
        }
        let celsius = reading
            .snapshot
            .hottest(Some(&self.admission.zones))
            .map_or(f64::NAN, |z| z.celsius);
        Some(Overheat {
            celsius,
            critical: self.admission.critical_c,
        })
    }
}

/// Publishes readings to a gate made by [`ThermalGate::test_feed`], in place of a sampler.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct GateFeed {
    tx: watch::Sender<Option<Reading>>,
}

#[cfg(test)]
impl GateFeed {
    /// The zone the gate watches; [`GateFeed::publish`] reads it at the given temperature.
    pub(crate) const ZONE: &'static str = "gpu-thermal";

    /// Makes the gate see `state`, reached with the watched zone at `celsius`.
    pub(crate) fn publish(&self, state: ThermalState, celsius: f64) {
        let snapshot = inferloop_thermal::Snapshot::new("test")
            .with_zone(inferloop_thermal::Zone::new(Self::ZONE, celsius));
        self.tx
            .send_replace(Some(Reading::new(snapshot, Some(state))));
    }
}

#[cfg(test)]
impl ThermalGate {
    /// A gate fed by hand, for the scheduler's tests: it caps at `hot_fraction` of the slots
    /// when hot or critical and reports `critical_c` in its refusal. Until the first
    /// [`GateFeed::publish`] it has no reading, so it is `normal`.
    pub(crate) fn test_feed(hot_fraction: f64, critical_c: f64) -> (GateFeed, ThermalGate) {
        // The gate never reads `hot_c`: the state comes with each reading.
        let mut admission = AdmissionConfig::new(critical_c - 10.0, critical_c);
        admission.hot_fraction = hot_fraction;
        admission.zones = vec![GateFeed::ZONE.to_string()];
        let (tx, rx) = watch::channel(None);
        (GateFeed { tx }, ThermalGate::new(rx, admission))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferloop_thermal::{Snapshot, Zone};

    #[test]
    fn gate_refuses_only_while_critical_and_reports_the_watched_zone() {
        let (tx, rx) = watch::channel(None);
        let mut admission = AdmissionConfig::new(80.0, 90.0);
        admission.zones = vec!["gpu-thermal".to_string()];
        let gate = ThermalGate::new(rx, admission);
        let hot = Snapshot::new("test")
            .with_zone(Zone::new("cpu-thermal", 99.0))
            .with_zone(Zone::new("gpu-thermal", 93.5));
        tx.send_replace(Some(Reading::new(hot, Some(ThermalState::Critical))));
        assert_eq!(gate.state(), ThermalState::Critical);
        match gate.refusal() {
            Some(Overheat { celsius, critical }) => {
                assert_eq!((celsius, critical), (93.5, 90.0));
            }
            other => panic!("expected Overheated, got {other:?}"),
        }
        let cool = Snapshot::new("test").with_zone(Zone::new("gpu-thermal", 50.0));
        tx.send_replace(Some(Reading::new(cool, Some(ThermalState::Normal))));
        assert_eq!(gate.state(), ThermalState::Normal);
        assert!(gate.refusal().is_none());
        tx.send_replace(None);
        assert_eq!(gate.state(), ThermalState::Normal, "no reading yet: normal");
    }

    #[test]
    fn gate_caps_as_the_thermal_crate_says() {
        let (_feed, gate) = ThermalGate::test_feed(0.5, 90.0);
        let config = AdmissionConfig {
            hot_fraction: 0.5,
            ..AdmissionConfig::new(80.0, 90.0)
        };
        for state in [
            ThermalState::Normal,
            ThermalState::Hot,
            ThermalState::Critical,
        ] {
            for slots in 0..6 {
                assert_eq!(
                    gate.max_active(state, slots),
                    config.max_active(state, slots),
                    "{state}, {slots} slots"
                );
            }
        }
    }

    #[test]
    fn test_feed_makes_the_gate_see_each_published_state() {
        let (feed, gate) = ThermalGate::test_feed(0.25, 90.0);
        assert_eq!(gate.state(), ThermalState::Normal, "nothing published yet");
        assert!(gate.refusal().is_none());
        assert_eq!(gate.max_active(ThermalState::Normal, 8), 8);

        feed.publish(ThermalState::Hot, 80.0);
        assert_eq!(gate.state(), ThermalState::Hot);
        assert_eq!(gate.max_active(gate.state(), 8), 2, "a quarter of 8");
        assert!(gate.refusal().is_none(), "hot still admits");

        let clone = gate.clone();
        feed.publish(ThermalState::Critical, 95.5);
        for g in [&gate, &clone] {
            assert_eq!(g.state(), ThermalState::Critical);
            match g.refusal() {
                Some(Overheat { celsius, critical }) => {
                    assert_eq!((celsius, critical), (95.5, 90.0));
                }
                other => panic!("expected Overheated, got {other:?}"),
            }
        }

        feed.publish(ThermalState::Normal, 50.0);
        assert_eq!(gate.state(), ThermalState::Normal);
        assert!(gate.refusal().is_none());
        drop(feed);
        assert_eq!(gate.state(), ThermalState::Normal, "the last reading stays");
    }
}
