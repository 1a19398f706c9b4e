//! Unit tests of the thresholds: defaults from trip points, profile and fallback, and the
//! configured values on top.

use super::*;
use inferloop_thermal::Zone;

fn settings() -> ThermalSettings {
    ThermalSettings::default()
}

fn profile(name: &str) -> BoardProfile {
    inferloop_board::profile::find(name)
        .unwrap_or_else(|e| panic!("{e}"))
        .clone()
}

#[test]
fn trip_points_win_over_the_profile_and_flags_win_over_both() {
    let first = Snapshot::new("test")
        .with_zone(Zone::new("gpu-thermal", 40.0).passive(80.0).critical(95.0));
    let orin = profile("jetson-orin-nx-16gb");
    let (config, origin) = admission_config(&settings(), Some(&orin), Some(&first)).expect("valid");
    assert_eq!((config.hot_c, config.critical_c), (80.0, 95.0));
    assert_eq!(origin, "the sensors' trip points");

    let flags = ThermalSettings {
        hot_c: Some(70.0),
        critical_c: Some(90.0),
        hysteresis_c: Some(2.0),
        hot_fraction: 0.25,
        ..settings()
    };
    let (config, _) = admission_config(&flags, Some(&orin), Some(&first)).expect("valid");
    assert_eq!((config.hot_c, config.critical_c), (70.0, 90.0));
    assert_eq!((config.hysteresis_c, config.hot_fraction), (2.0, 0.25));
    assert!(config.zones.contains(&"gpu-thermal".to_string()));
}

#[test]
fn profile_then_fallback_supply_defaults_without_trip_points() {
    let orin = profile("jetson-orin-nx-16gb");
    let (config, origin) = admission_config(&settings(), Some(&orin), None).expect("valid");
    assert_eq!((config.hot_c, config.critical_c), (99.0, 104.5));
    assert_eq!(origin, "the board profile");
    let (config, origin) = admission_config(&settings(), None, None).expect("valid");
    assert_eq!(
        (config.hot_c, config.critical_c),
        (
            AdmissionConfig::FALLBACK_HOT_C,
            AdmissionConfig::FALLBACK_CRITICAL_C
        )
    );
    assert_eq!(origin, "the built-in fallback");
}

#[test]
fn one_threshold_set_past_the_other_default_names_the_flag() {
    let orin = profile("jetson-orin-nx-16gb");
    let hot_only = ThermalSettings {
        hot_c: Some(110.0),
        ..settings()
    };
    let err = admission_config(&hot_only, Some(&orin), None).expect_err("110 > 104.5");
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "hot_celsius",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("critical_celsius"), "{err}");
    let critical_only = ThermalSettings {
        critical_c: Some(90.0),
        ..settings()
    };
    let err = admission_config(&critical_only, Some(&orin), None).expect_err("90 < 99");
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "critical_celsius",
                ..
            }
        ),
        "{err}"
    );
}
