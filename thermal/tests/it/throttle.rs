//! Throttling inferred from clocks and trip points, reported by NVML, and its transitions.

use inferloop_thermal::throttle::detect;
use inferloop_thermal::{
    Clock, JetsonSysfs, LinuxSysfs, Snapshot, Source, Throttle, ThrottleCause, ThrottleTracker,
    ThrottleTransition, Zone,
};

use crate::{fixture_sys, ScriptedRunner};

fn hot_gpu(celsius: f64, clock_mhz: u64) -> Snapshot {
    Snapshot::new("test")
        .with_zone(
            Zone::new("gpu-thermal", celsius)
                .passive(99.0)
                .critical(104.5),
        )
        .with_clock(Clock::new("gpu", clock_mhz * 1_000_000, Some(918_000_000)))
}

#[test]
fn clock_below_max_while_zone_above_passive_trip_is_thermal_throttling() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp5"))
        .expect("fixture")
        .with_runner(ScriptedRunner::not_installed());
    let throttles = detect(&source.sample().expect("sample"));
    assert_eq!(throttles.len(), 1, "{throttles:?}");
    assert_eq!(throttles[0].cause, ThrottleCause::Thermal);
    let detail = &throttles[0].detail;
    assert!(detail.contains("gpu 612 MHz < max 918 MHz"), "{detail}");
    assert!(
        detail.contains("tj-thermal 100.6 °C >= passive 99.0 °C"),
        "{detail}"
    );
}

#[test]
fn clock_below_max_on_a_cool_board_is_not_throttling() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp6"))
        .expect("fixture")
        .with_runner(ScriptedRunner::not_installed());
    let snapshot = source.sample().expect("sample");
    assert!(snapshot
        .clock("gpu")
        .is_some_and(|c| c.hz < c.max_hz.unwrap_or(0)));
    assert!(detect(&snapshot).is_empty());
}

#[test]
fn hot_zone_with_every_clock_at_max_is_not_throttling() {
    assert!(detect(&hot_gpu(101.0, 918)).is_empty());
}

#[test]
fn zone_exactly_at_the_passive_trip_counts_as_hot() {
    assert_eq!(detect(&hot_gpu(99.0, 816)).len(), 1);
    assert!(detect(&hot_gpu(98.9, 816)).is_empty());
}

#[test]
fn x86_unset_zero_degree_trips_never_mean_throttling() {
    let mut source = LinuxSysfs::new(fixture_sys("x86")).expect("fixture");
    assert!(detect(&source.sample().expect("sample")).is_empty());
}

#[test]
fn reported_power_throttle_is_kept_next_to_inferred_thermal() {
    let mut snapshot = hot_gpu(100.0, 612);
    snapshot.throttle.push(Throttle {
        cause: ThrottleCause::Power,
        detail: "NVML reports sw_power_cap".into(),
    });
    let causes: Vec<ThrottleCause> = detect(&snapshot).iter().map(|t| t.cause).collect();
    assert_eq!(causes, [ThrottleCause::Thermal, ThrottleCause::Power]);
}

#[test]
fn reported_thermal_throttle_is_not_duplicated_by_inference() {
    let mut snapshot = hot_gpu(100.0, 612);
    snapshot.throttle.push(Throttle {
        cause: ThrottleCause::Thermal,
        detail: "NVML reports sw_thermal_slowdown".into(),
    });
    let found = detect(&snapshot);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].detail, "NVML reports sw_thermal_slowdown");
}

#[test]
fn tracker_reports_each_start_and_stop_once() {
    let mut tracker = ThrottleTracker::new();
    let hot = detect(&hot_gpu(100.0, 612));
    let hotter = detect(&hot_gpu(102.0, 408));
    let cool = detect(&hot_gpu(60.0, 306));

    let started = tracker.update(&hot);
    assert!(
        matches!(&started[..], [ThrottleTransition::Started(t)] if t.cause == ThrottleCause::Thermal)
    );
    assert!(
        tracker.update(&hotter).is_empty(),
        "still throttled: no new transition"
    );
    assert_eq!(tracker.active().len(), 1);
    assert_eq!(
        tracker.active()[0].detail,
        hot[0].detail,
        "the start detail is kept"
    );

    let stopped = tracker.update(&cool);
    assert_eq!(
        stopped,
        [ThrottleTransition::Stopped {
            cause: ThrottleCause::Thermal,
            detail: hot[0].detail.clone()
        }]
    );
    assert!(tracker.update(&cool).is_empty());
    assert!(tracker.active().is_empty());
}
