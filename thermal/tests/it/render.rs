//! The `inferloopd thermal` table.

use inferloop_thermal::throttle::detect;
use inferloop_thermal::{render_table, JetsonSysfs, Reading, Snapshot, Source, ThermalState};

use crate::{fixture_sys, ScriptedRunner};

#[test]
fn table_lists_zones_clocks_rails_mode_and_state() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp6"))
        .expect("fixture")
        .with_runner(ScriptedRunner::answering("NV Power Mode: 15W\n2\n"));
    let snapshot = source.sample().expect("sample");
    let text = render_table(&Reading::new(snapshot, Some(ThermalState::Normal)));
    for expected in [
        "source: jetson-sysfs",
        "power mode: 15W (2)",
        "state: normal",
        "gpu load: 12.3 %",
        "cpu-thermal",
        "47.5",
        "99.0",
        "104.5",
        "VDD_IN",
        "5.202",
        "throttling: none",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    for row in [
        ["cpu-thermal", "47.5", "99.0", "104.5"].as_slice(),
        &["gpu", "306", "918"],
        &["cpu7", "730", "1984"],
        &["VDD_SOC", "1.664"],
    ] {
        assert!(has_row(&text, row), "no row {row:?} in:\n{text}");
    }
    assert!(!text.contains("cv0-thermal"), "offline zone shown:\n{text}");
}

/// Whether some line's columns are exactly `cells`.
fn has_row(text: &str, cells: &[&str]) -> bool {
    text.lines()
        .any(|line| line.split_whitespace().eq(cells.iter().copied()))
}

#[test]
fn table_names_the_throttle_cause_and_numbers() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp5"))
        .expect("fixture")
        .with_runner(ScriptedRunner::not_installed());
    let mut snapshot = source.sample().expect("sample");
    snapshot.throttle = detect(&snapshot);
    let text = render_table(&Reading::new(snapshot, None));
    assert!(
        !text.contains("state:"),
        "no admission, no state shown:\n{text}"
    );
    assert!(
        text.contains("throttling: thermal (gpu 612 MHz < max 918 MHz"),
        "{text}"
    );
    assert!(text.contains("emc"), "{text}");
}

#[test]
fn empty_snapshot_says_what_is_missing() {
    let text = render_table(&Reading::new(Snapshot::new("linux"), None));
    for expected in [
        "ZONES: none found",
        "CLOCKS: none found",
        "RAILS: none found",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
