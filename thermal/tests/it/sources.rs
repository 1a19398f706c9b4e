//! Sources read fixture trees laid out like real boards, and this machine's own `/sys`.

use std::path::Path;

use inferloop_thermal::{
    open_auto, FakeSource, FakeStep, JetsonSysfs, LinuxSysfs, Merged, NvmlSource, Snapshot, Source,
    ThermalError, Zone,
};

use crate::{fixture_sys, ScriptedRunner};

fn names(snapshot: &Snapshot) -> Vec<&str> {
    snapshot.zones.iter().map(|z| z.name.as_str()).collect()
}

fn jp6() -> (JetsonSysfs, ScriptedRunner) {
    let runner = ScriptedRunner::answering("NV Power Mode: 15W\n2\n");
    let source = JetsonSysfs::new(fixture_sys("orin-nx-jp6"))
        .expect("fixture root")
        .with_runner(runner.clone());
    (source, runner)
}

#[test]
fn orin_nx_jp6_zones_drop_the_offline_sensors_and_keep_trip_points() {
    let snapshot = jp6().0.sample().expect("sample");
    assert_eq!(
        names(&snapshot),
        [
            "cpu-thermal",
            "gpu-thermal",
            "soc0-thermal",
            "soc1-thermal",
            "soc2-thermal",
            "tj-thermal"
        ]
    );
    let cpu = snapshot.zone("cpu-thermal").expect("cpu zone");
    assert_eq!(cpu.celsius, 47.5);
    assert_eq!(
        (cpu.passive_trip, cpu.critical_trip),
        (Some(99.0), Some(104.5))
    );
    // tj-thermal's `active` fan trip at 85 °C is not a passive trip.
    let tj = snapshot.zone("tj-thermal").expect("tj zone");
    assert_eq!(tj.passive_trip, Some(99.0));
}

#[test]
fn orin_nx_jp6_gpu_clock_comes_from_the_devfreq_node_named_gpu() {
    let snapshot = jp6().0.sample().expect("sample");
    let gpu = snapshot.clock("gpu").expect("gpu clock");
    assert_eq!(gpu.hz, 306_000_000);
    assert_eq!(gpu.max_hz, Some(918_000_000));
    assert_eq!(gpu.min_hz, Some(306_000_000));
    assert_eq!(snapshot.gpu_load, Some(0.123));
    // The `vic` devfreq is not the GPU and is not reported.
    assert!(snapshot.clocks.iter().all(|c| !c.domain.contains("vic")));
}

#[test]
fn orin_nx_jp6_reports_eight_cpu_clocks_in_hz() {
    let snapshot = jp6().0.sample().expect("sample");
    let cpus: Vec<_> = snapshot
        .clocks
        .iter()
        .filter(|c| c.domain.starts_with("cpu"))
        .collect();
    assert_eq!(cpus.len(), 8);
    assert_eq!(cpus[0].domain, "cpu0");
    assert_eq!(cpus[7].domain, "cpu7");
    assert_eq!(cpus[0].hz, 729_600_000);
    assert_eq!(cpus[0].max_hz, Some(1_984_000_000));
    assert_eq!(cpus[0].min_hz, Some(115_200_000));
    assert!(
        snapshot.clock("emc").is_none(),
        "debugfs is absent in this tree"
    );
}

#[test]
fn orin_nx_jp6_rails_are_current_times_voltage_and_skip_the_shunt_sum() {
    let snapshot = jp6().0.sample().expect("sample");
    let rails: Vec<(&str, f64)> = snapshot
        .rails
        .iter()
        .map(|r| (r.name.as_str(), r.watts))
        .collect();
    assert_eq!(rails.len(), 3, "{rails:?}");
    let expect = [
        ("VDD_IN", 5080.0 * 1024.0 / 1e6),
        ("VDD_CPU_GPU_CV", 5072.0 * 240.0 / 1e6),
        ("VDD_SOC", 5072.0 * 328.0 / 1e6),
    ];
    for ((name, watts), (want_name, want_watts)) in rails.iter().zip(expect) {
        assert_eq!(*name, want_name);
        assert!(
            (watts - want_watts).abs() < 1e-9,
            "{name}: {watts} vs {want_watts}"
        );
    }
}

#[test]
fn power_mode_comes_from_nvpmodel_query() {
    let snapshot = jp6().0.sample().expect("sample");
    let mode = snapshot.power_mode.expect("power mode");
    assert_eq!((mode.id, mode.name.as_str()), (Some(2), "15W"));
}

#[test]
fn nvpmodel_runs_every_nth_sample_only() {
    let (source, runner) = jp6();
    let mut source = source.with_power_mode_every(3);
    for _ in 0..7 {
        let snapshot = source.sample().expect("sample");
        assert!(snapshot.power_mode.is_some(), "cached between runs");
    }
    assert_eq!(runner.calls(), 3, "samples 0, 3 and 6");
}

#[test]
fn missing_nvpmodel_is_asked_once_and_leaves_the_power_mode_empty() {
    let runner = ScriptedRunner::not_installed();
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp6"))
        .expect("fixture root")
        .with_runner(runner.clone())
        .with_power_mode_every(1);
    for _ in 0..3 {
        assert_eq!(source.sample().expect("sample").power_mode, None);
    }
    assert_eq!(runner.calls(), 1);
}

#[test]
fn orin_nx_jp5_gpu_is_found_by_the_ga10b_node_name() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp5"))
        .expect("fixture root")
        .with_runner(ScriptedRunner::answering("NV Power Mode: MAXN\n0\n"));
    let snapshot = source.sample().expect("sample");
    let gpu = snapshot.clock("gpu").expect("gpu clock");
    assert_eq!((gpu.hz, gpu.max_hz), (612_000_000, Some(918_000_000)));
    assert_eq!(snapshot.gpu_load, Some(0.987));
    assert_eq!(snapshot.zone("gpu-thermal").map(|z| z.celsius), Some(100.2));
}

#[test]
fn orin_nx_jp5_emc_clock_is_read_from_bpmp_debugfs() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp5"))
        .expect("fixture root")
        .with_runner(ScriptedRunner::not_installed());
    let snapshot = source.sample().expect("sample");
    let emc = snapshot.clock("emc").expect("emc clock");
    assert_eq!((emc.hz, emc.max_hz), (3_199_000_000, Some(3_199_000_000)));
}

#[test]
fn orin_nx_jp5_legacy_rail_files_are_milliwatts() {
    let mut source = JetsonSysfs::new(fixture_sys("orin-nx-jp5"))
        .expect("fixture root")
        .with_runner(ScriptedRunner::not_installed());
    let snapshot = source.sample().expect("sample");
    let rails: Vec<(&str, f64)> = snapshot
        .rails
        .iter()
        .map(|r| (r.name.as_str(), r.watts))
        .collect();
    assert_eq!(
        rails,
        [
            ("VDD_IN", 14.85),
            ("VDD_CPU_GPU_CV", 8.12),
            ("VDD_SOC", 2.93)
        ]
    );
}

#[test]
fn x86_box_reads_acpi_and_package_zones_and_coretemp() {
    let mut source = LinuxSysfs::new(fixture_sys("x86")).expect("fixture root");
    let snapshot = source.sample().expect("sample");
    assert_eq!(
        names(&snapshot),
        [
            "acpitz",
            "x86_pkg_temp",
            "coretemp/Package id 0",
            "coretemp/Core 0",
            "coretemp/Core 1"
        ],
        "the acpitz hwmon mirror of the zone is not listed twice"
    );
    let acpi = snapshot.zone("acpitz").expect("acpitz");
    assert_eq!((acpi.celsius, acpi.critical_trip), (27.8, Some(119.0)));
    let pkg = snapshot.zone("x86_pkg_temp").expect("pkg");
    assert_eq!(pkg.passive_trip, None, "0 °C trips are unset, not real");
    let core = snapshot.zone("coretemp/Package id 0").expect("coretemp");
    assert_eq!(
        (core.celsius, core.passive_trip, core.critical_trip),
        (52.0, Some(80.0), Some(100.0))
    );
    assert_eq!(snapshot.clocks.len(), 2);
    assert_eq!(snapshot.clock("cpu1").map(|c| c.hz), Some(2_450_000_000));
    assert!(snapshot.rails.is_empty() && snapshot.gpu_load.is_none());
}

#[test]
fn missing_sysfs_root_is_an_error_naming_the_path() {
    let err = LinuxSysfs::new("/nonexistent/inferloop-sys")
        .err()
        .expect("error");
    match &err {
        ThermalError::SysRoot { path, .. } => {
            assert_eq!(path, Path::new("/nonexistent/inferloop-sys"))
        }
        other => panic!("expected SysRoot, got {other:?}"),
    }
    assert_eq!(err.kind(), "sysfs_root");
    assert!(JetsonSysfs::new("/nonexistent/inferloop-sys").is_err());
}

#[test]
fn auto_picks_jetson_sysfs_where_a_jetson_gpu_devfreq_exists() {
    let mut source = open_auto(&fixture_sys("orin-nx-jp6"), None).expect("source");
    assert_eq!(source.name(), "jetson-sysfs");
    let mut source2 = open_auto(&fixture_sys("orin-nx-jp5"), None).expect("source");
    assert_eq!(source2.name(), "jetson-sysfs");
    assert!(source.sample().is_ok() && source2.sample().is_ok());
}

#[test]
fn auto_picks_jetson_sysfs_for_a_jetson_profile() {
    let profile = inferloop_board::profile::find("jetson-orin-nx-16gb").expect("profile");
    let source = open_auto(&fixture_sys("x86"), Some(profile)).expect("source");
    assert_eq!(source.name(), "jetson-sysfs");
}

#[test]
fn auto_picks_generic_linux_on_an_x86_box() {
    let source = open_auto(&fixture_sys("x86"), None).expect("source");
    // With NVML present (a GPU machine) the NVML reader is merged in.
    assert!(
        source.name() == "linux" || source.name() == "linux+nvml",
        "{}",
        source.name()
    );
}

#[test]
fn this_machines_real_sys_is_read_without_error() {
    let sys = Path::new("/sys");
    let mut generic = LinuxSysfs::new(sys).expect("/sys exists");
    let snapshot = generic.sample().expect("generic sample");
    eprintln!(
        "real /sys: {} zones, {} clocks, {} rails",
        snapshot.zones.len(),
        snapshot.clocks.len(),
        snapshot.rails.len()
    );
    let mut jetson = JetsonSysfs::new(sys)
        .expect("/sys exists")
        .with_runner(ScriptedRunner::not_installed());
    jetson
        .sample()
        .expect("jetson reader tolerates a non-Jetson /sys");
    let mut auto = open_auto(sys, None).expect("auto source");
    auto.sample().expect("auto sample");
}

#[test]
fn nvml_source_reads_a_gpu_or_reports_nvml_unavailable() {
    match NvmlSource::open(0) {
        Ok(mut source) => {
            let snapshot = source.sample().expect("NVML sample");
            let gpu = snapshot.zone("gpu").expect("gpu temperature");
            assert!(gpu.celsius > 0.0 && gpu.celsius < 120.0, "{gpu:?}");
            let graphics = snapshot.clock("graphics").expect("graphics clock");
            assert!(graphics.max_hz.is_some());
            eprintln!("NVML: {snapshot:?}");
        }
        Err(ThermalError::NvmlUnavailable { reason }) => {
            eprintln!("skipped NVML reading: capability `nvml` absent ({reason})");
        }
        Err(other) => panic!("expected NvmlUnavailable, got {other:?}"),
    }
}

#[test]
fn merged_source_combines_parts_and_survives_one_failing() {
    let cpu = FakeSource::new([Snapshot::new("fake").with_zone(Zone::new("cpu", 40.0))]);
    let broken = FakeSource::with_steps([FakeStep::Fail("sensor gone".into())]);
    let gpu = FakeSource::new([Snapshot::new("fake").with_zone(Zone::new("gpu", 60.0))]);
    let mut merged = Merged::new(vec![Box::new(cpu), Box::new(broken), Box::new(gpu)]);
    assert_eq!(merged.name(), "fake+fake+fake");
    let snapshot = merged.sample().expect("two parts answered");
    assert_eq!(names(&snapshot), ["cpu", "gpu"]);
}

#[test]
fn merged_source_fails_when_every_part_fails() {
    let broken = FakeSource::with_steps([FakeStep::Fail("gone".into())]);
    let mut merged = Merged::new(vec![Box::new(broken)]);
    let err = merged.sample().expect_err("all failed");
    assert_eq!(err.kind(), "source_failed");
}

#[test]
fn fake_source_repeats_its_last_reading_and_takes_pushed_steps() {
    let mut fake = FakeSource::temperatures("gpu", [50.0, 60.0]);
    let handle = fake.handle();
    let temps: Vec<f64> = (0..3)
        .map(|_| fake.sample().expect("reading").zones[0].celsius)
        .collect();
    assert_eq!(temps, [50.0, 60.0, 60.0]);
    handle.push_temperature("gpu", 70.0);
    handle.push_failure("unplugged");
    assert_eq!(fake.sample().expect("pushed").zones[0].celsius, 70.0);
    assert!(matches!(
        fake.sample(),
        Err(ThermalError::SourceFailed { ref message, .. }) if message == "unplugged"
    ));
    assert_eq!(fake.sample().expect("last again").zones[0].celsius, 70.0);
    assert_eq!(handle.samples(), 6);
}

#[test]
fn fake_source_with_an_empty_script_fails() {
    let mut fake = FakeSource::new([]);
    assert!(fake.sample().is_err());
}
