//! The `normal → hot → critical` admission state machine, every transition and its hysteresis.

use inferloop_thermal::{
    Admission, AdmissionConfig, Snapshot, StateChange, ThermalError, ThermalState, Zone,
};

use ThermalState::{Critical, Hot, Normal};

/// hot 85 °C, critical 95 °C, hysteresis 5 °C, half the slots when hot.
fn machine() -> Admission {
    Admission::new(AdmissionConfig::new(85.0, 95.0)).expect("valid config")
}

/// Feeds `temps` and returns the state after each.
fn states(admission: &mut Admission, temps: &[f64]) -> Vec<ThermalState> {
    temps
        .iter()
        .map(|&t| {
            admission.observe(t);
            admission.state()
        })
        .collect()
}

#[test]
fn starts_normal_with_every_slot_and_admitting() {
    let a = machine();
    assert_eq!(a.state(), Normal);
    assert_eq!(a.max_active(8), 8);
    assert!(a.admit_new());
}

#[test]
fn normal_becomes_hot_at_the_hot_threshold() {
    let mut a = machine();
    assert_eq!(states(&mut a, &[84.9]), [Normal]);
    let change = a.observe(85.0);
    assert_eq!(
        change,
        Some(StateChange {
            from: Normal,
            to: Hot,
            celsius: 85.0
        })
    );
}

#[test]
fn hot_becomes_critical_at_the_critical_threshold() {
    let mut a = machine();
    assert_eq!(states(&mut a, &[90.0, 94.9, 95.0]), [Hot, Hot, Critical]);
}

#[test]
fn normal_jumps_straight_to_critical_on_a_big_rise() {
    let mut a = machine();
    let change = a.observe(97.0).expect("changed");
    assert_eq!((change.from, change.to), (Normal, Critical));
}

#[test]
fn hot_stays_hot_until_below_threshold_minus_hysteresis() {
    let mut a = machine();
    assert_eq!(
        states(&mut a, &[86.0, 84.0, 82.0, 80.0]),
        [Hot, Hot, Hot, Hot]
    );
}

#[test]
fn hot_returns_to_normal_below_threshold_minus_hysteresis() {
    let mut a = machine();
    a.observe(86.0);
    let change = a.observe(79.9).expect("changed");
    assert_eq!((change.from, change.to), (Hot, Normal));
}

#[test]
fn critical_stays_critical_within_the_hysteresis_band() {
    let mut a = machine();
    assert_eq!(
        states(&mut a, &[96.0, 94.0, 91.0, 90.0]),
        [Critical, Critical, Critical, Critical]
    );
    assert!(!a.admit_new());
}

#[test]
fn critical_drops_to_hot_below_critical_minus_hysteresis() {
    let mut a = machine();
    a.observe(96.0);
    let change = a.observe(89.9).expect("changed");
    assert_eq!((change.from, change.to), (Critical, Hot));
    assert!(a.admit_new());
}

#[test]
fn critical_drops_straight_to_normal_on_a_big_fall() {
    let mut a = machine();
    a.observe(96.0);
    let change = a.observe(70.0).expect("changed");
    assert_eq!((change.from, change.to), (Critical, Normal));
}

#[test]
fn hovering_at_the_hot_line_does_not_flap() {
    let mut a = machine();
    let changes = [84.0, 85.5, 84.5, 85.2, 83.0, 85.0, 81.0]
        .iter()
        .filter_map(|&t| a.observe(t))
        .count();
    assert_eq!(changes, 1, "one rise, no fall while above 80 °C");
    assert_eq!(a.state(), Hot);
}

#[test]
fn zero_hysteresis_recovers_just_below_the_threshold() {
    let mut config = AdmissionConfig::new(85.0, 95.0);
    config.hysteresis_c = 0.0;
    let mut a = Admission::new(config).expect("valid");
    assert_eq!(states(&mut a, &[85.0, 84.9]), [Hot, Normal]);
}

#[test]
fn hot_halves_max_active_but_keeps_at_least_one() {
    let mut a = machine();
    a.observe(88.0);
    assert_eq!(a.max_active(8), 4);
    assert_eq!(a.max_active(5), 2);
    assert_eq!(a.max_active(1), 1);
    assert_eq!(a.max_active(0), 0);
    assert!(a.admit_new(), "hot still admits, only fewer at once");
}

#[test]
fn hot_fraction_is_configurable() {
    let mut config = AdmissionConfig::new(85.0, 95.0);
    config.hot_fraction = 0.25;
    let mut a = Admission::new(config).expect("valid");
    a.observe(90.0);
    assert_eq!(a.max_active(8), 2);
    assert_eq!(a.max_active(3), 1);
}

#[test]
fn cap_for_a_state_is_all_slots_when_normal_and_a_floored_fraction_otherwise() {
    let half = AdmissionConfig::new(85.0, 95.0);
    assert_eq!(half.max_active(Normal, 4), 4);
    assert_eq!(half.max_active(Hot, 4), 2);
    assert_eq!(half.max_active(Hot, 2), 1);
    assert_eq!(half.max_active(Hot, 1), 1);
    assert_eq!(half.max_active(Critical, 3), 1);
    assert_eq!(half.max_active(Critical, 0), 0);
    let all = AdmissionConfig {
        hot_fraction: 1.0,
        ..half.clone()
    };
    assert_eq!(all.max_active(Hot, 8), 8);
    let tiny = AdmissionConfig {
        hot_fraction: 0.01,
        ..half
    };
    assert_eq!(tiny.max_active(Hot, 8), 1, "never none while slots exist");
}

#[test]
fn machine_caps_as_its_config_says_for_its_state() {
    let mut a = machine();
    for celsius in [50.0, 88.0, 99.0, 80.0] {
        a.observe(celsius);
        for slots in 0..6 {
            assert_eq!(
                a.max_active(slots),
                a.config().max_active(a.state(), slots),
                "{celsius} °C, {slots} slots"
            );
        }
    }
}

#[test]
fn critical_refuses_new_requests_but_lets_running_ones_finish() {
    let mut a = machine();
    a.observe(99.0);
    assert!(!a.admit_new());
    assert_eq!(a.max_active(8), 4, "never asks to preempt; caps like hot");
}

#[test]
fn nan_reading_changes_nothing() {
    let mut a = machine();
    a.observe(90.0);
    assert_eq!(a.observe(f64::NAN), None);
    assert_eq!((a.state(), a.last_celsius()), (Hot, Some(90.0)));
}

#[test]
fn snapshot_without_zones_keeps_the_state() {
    let mut a = machine();
    a.observe(96.0);
    assert_eq!(a.observe_snapshot(&Snapshot::new("test")), None);
    assert_eq!(a.state(), Critical);
}

#[test]
fn hottest_configured_zone_drives_the_state() {
    let mut config = AdmissionConfig::new(85.0, 95.0);
    config.zones = vec!["gpu-thermal".into(), "tj-thermal".into()];
    let mut a = Admission::new(config).expect("valid");
    let reading = Snapshot::new("test")
        .with_zone(Zone::new("pmic", 120.0))
        .with_zone(Zone::new("gpu-thermal", 70.0))
        .with_zone(Zone::new("tj-thermal", 88.0));
    a.observe_snapshot(&reading);
    assert_eq!((a.state(), a.last_celsius()), (Hot, Some(88.0)));
}

#[test]
fn without_the_configured_zones_every_zone_counts() {
    let mut config = AdmissionConfig::new(85.0, 95.0);
    config.zones = vec!["gpu-thermal".into()];
    let mut a = Admission::new(config).expect("valid");
    let reading = Snapshot::new("test")
        .with_zone(Zone::new("acpitz", 40.0))
        .with_zone(Zone::new("x86_pkg_temp", 96.0));
    a.observe_snapshot(&reading);
    assert_eq!(a.state(), Critical);
}

#[test]
fn critical_at_or_below_hot_is_invalid_and_names_the_field() {
    let err = Admission::new(AdmissionConfig::new(90.0, 90.0)).expect_err("invalid");
    assert!(
        matches!(
            err,
            ThermalError::InvalidConfig {
                field: "critical_c",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("hot_c (90)"), "{err}");
}

#[test]
fn hot_fraction_outside_zero_to_one_is_invalid() {
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let mut config = AdmissionConfig::new(85.0, 95.0);
        config.hot_fraction = bad;
        let err = Admission::new(config).expect_err("invalid");
        assert!(matches!(
            err,
            ThermalError::InvalidConfig {
                field: "hot_fraction",
                ..
            }
        ));
    }
}

#[test]
fn negative_hysteresis_is_invalid() {
    let mut config = AdmissionConfig::new(85.0, 95.0);
    config.hysteresis_c = -1.0;
    let err = Admission::new(config).expect_err("invalid");
    assert!(matches!(
        err,
        ThermalError::InvalidConfig {
            field: "hysteresis_c",
            ..
        }
    ));
}

#[test]
fn trip_points_of_the_watched_zones_win_over_the_profile_numbers() {
    let profile = inferloop_board::profile::find("jetson-orin-nx-16gb").expect("profile");
    let reading = Snapshot::new("t")
        .with_zone(Zone::new("pmic", 40.0).passive(60.0).critical(70.0))
        .with_zone(Zone::new("tj-thermal", 40.0).passive(97.0).critical(103.0));
    let config = AdmissionConfig::defaults_for(Some(profile), Some(&reading));
    assert_eq!((config.hot_c, config.critical_c), (97.0, 103.0));
    assert!(config.zones.contains(&"tj-thermal".to_string()));
    assert!(!config.zones.contains(&"pmic".to_string()));
}

#[test]
fn profile_numbers_apply_when_the_reading_has_no_trip_points() {
    let profile = inferloop_board::profile::find("jetson-orin-nx-16gb").expect("profile");
    let reading = Snapshot::new("t").with_zone(Zone::new("tj-thermal", 40.0));
    let config = AdmissionConfig::defaults_for(Some(profile), Some(&reading));
    assert_eq!((config.hot_c, config.critical_c), (99.0, 104.5));
    assert_eq!(config.hysteresis_c, 5.0);
    assert_eq!(config.hot_fraction, 0.5);
    assert_eq!(config.zones.len(), 4);
    let before_first_reading = AdmissionConfig::defaults_for(Some(profile), None);
    assert_eq!(before_first_reading, config);
}

#[test]
fn without_a_profile_all_trip_points_count_then_built_in_values() {
    let trips = Snapshot::new("t")
        .with_zone(Zone::new("a", 40.0).passive(90.0).critical(100.0))
        .with_zone(Zone::new("b", 40.0).passive(80.0).critical(105.0));
    let config = AdmissionConfig::defaults_for(None, Some(&trips));
    assert_eq!((config.hot_c, config.critical_c), (80.0, 100.0));
    let bare = AdmissionConfig::defaults_for(None, Some(&Snapshot::new("t")));
    assert_eq!(
        (bare.hot_c, bare.critical_c),
        (
            AdmissionConfig::FALLBACK_HOT_C,
            AdmissionConfig::FALLBACK_CRITICAL_C
        )
    );
}

#[test]
fn x86_fixture_trips_give_no_thresholds_so_the_profile_applies() {
    let mut source =
        inferloop_thermal::LinuxSysfs::new(crate::fixture_sys("x86")).expect("fixture");
    let reading = inferloop_thermal::Source::sample(&mut source).expect("sample");
    let profile = inferloop_board::profile::find("x86_64-cpu").expect("profile");
    // The profile watches x86_pkg_temp, whose trips are unset (0 °C): coretemp's limits
    // do not stand in for them.
    let config = AdmissionConfig::defaults_for(Some(profile), Some(&reading));
    assert_eq!((config.hot_c, config.critical_c), (90.0, 100.0));
}

#[test]
fn state_labels_and_gauge_values_are_stable() {
    let labels: Vec<(&str, u8)> = [Normal, Hot, Critical]
        .iter()
        .map(|s| (s.as_str(), s.as_gauge()))
        .collect();
    assert_eq!(labels, [("normal", 0), ("hot", 1), ("critical", 2)]);
    assert_eq!(
        serde_json::to_string(&Critical).expect("json"),
        "\"critical\""
    );
}
