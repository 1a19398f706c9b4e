//! Profile files: every compiled-in one parses, and parsing is strict.

use inferloop_board::profile::{self, check_set};
use inferloop_board::{BoardError, BoardProfile, ComputeCapability};

const MINIMAL: &str = r#"
name = "test-board"
description = "a test board"
unified_memory = false
"#;

#[test]
fn every_builtin_profile_parses_and_names_are_unique() {
    let profiles = profile::load_builtin().expect("compiled-in profiles load");
    let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "jetson-orin-nx-16gb",
            "jetson-orin-nx-8gb",
            "jetson-orin-nano-8gb",
            "jetson-agx-orin-64gb",
            "x86_64-cpu",
            "aarch64-cpu",
            "cuda-dgpu",
            "qemu-virt-arm64",
            "qemu-virt-amd64",
        ]
    );
    check_set(&profiles).expect("names and compatible strings unique");
    assert_eq!(profile::builtin().len(), profiles.len());
}

#[test]
fn orin_nx_16gb_profile_carries_the_data_sheet_numbers() {
    let p = profile::find("jetson-orin-nx-16gb").expect("profile exists");
    assert_eq!(p.compatible, ["nvidia,p3767-0000"]);
    assert_eq!(p.cpu_cores, Some(8));
    assert_eq!(p.dram_bytes, Some(16 * 1024 * 1024 * 1024));
    assert_eq!(p.dram_bandwidth_gb_s, Some(102.4));
    assert!(p.unified_memory);
    let gpu = p.gpu.as_ref().expect("gpu section");
    assert_eq!(gpu.sm_count, Some(8));
    assert_eq!(
        gpu.compute_capability,
        Some(ComputeCapability { major: 8, minor: 7 })
    );
    assert_eq!(gpu.max_clock_mhz, Some(918));
    let modes: Vec<(u32, &str)> = p
        .power_modes
        .iter()
        .map(|m| (m.id, m.name.as_str()))
        .collect();
    assert_eq!(modes, [(0, "MAXN"), (1, "10W"), (2, "15W"), (3, "25W")]);
    assert_eq!(p.power_mode_name(2), Some("15W"));
    assert!(p.perf_floors.is_none());
    assert_eq!(p.thermal_defaults(), Some((99.0, 104.5)));
}

#[test]
fn jetson_profiles_are_unified_memory_and_sm_87() {
    for p in profile::builtin()
        .iter()
        .filter(|p| p.name.starts_with("jetson-"))
    {
        assert!(p.unified_memory, "{}", p.name);
        let cc = p.gpu.as_ref().and_then(|g| g.compute_capability);
        assert_eq!(
            cc.map(|c| c.sm_name()),
            Some("sm_87".to_string()),
            "{}",
            p.name
        );
        assert!(
            p.compatible.iter().all(|c| c.starts_with("nvidia,p3")),
            "{}",
            p.name
        );
        assert_eq!(
            p.soc_compatible.as_deref(),
            Some("nvidia,tegra234"),
            "{}",
            p.name
        );
    }
}

#[test]
fn no_builtin_profile_sets_perf_floors_yet() {
    assert!(profile::builtin().iter().all(|p| p.perf_floors.is_none()));
}

#[test]
fn unknown_field_is_a_parse_error_naming_the_field() {
    let text = format!("{MINIMAL}\nfan_rpm = 3000\n");
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("unknown field rejected");
    match &err {
        BoardError::ProfileParse { origin, message } => {
            assert_eq!(origin, "inline");
            assert!(message.contains("fan_rpm"), "{message}");
        }
        other => panic!("expected ProfileParse, got {other:?}"),
    }
    assert_eq!(err.kind(), "profile_parse");
}

#[test]
fn unknown_field_in_a_nested_table_is_a_parse_error() {
    let text = format!("{MINIMAL}\n[gpu]\nsm_count = 8\ntensor_cores = 32\n");
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("rejected");
    assert!(
        matches!(err, BoardError::ProfileParse { ref message, .. } if message.contains("tensor_cores"))
    );
}

#[test]
fn missing_required_field_is_a_parse_error() {
    let err = BoardProfile::from_toml_str("inline", "name = \"x\"\nunified_memory = true\n")
        .expect_err("description missing");
    assert!(
        matches!(err, BoardError::ProfileParse { ref message, .. } if message.contains("description"))
    );
}

#[test]
fn malformed_compute_capability_is_a_parse_error() {
    let text = format!("{MINIMAL}\n[gpu]\ncompute_capability = \"sm_87\"\n");
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("rejected");
    assert!(matches!(err, BoardError::ProfileParse { ref message, .. } if message.contains("8.7")));
}

#[test]
fn throttle_above_critical_is_an_invalid_profile() {
    let text = format!(
        "{MINIMAL}\n[[thermal_zones]]\nname = \"cpu\"\nthrottle_c = 100.0\ncritical_c = 90.0\n"
    );
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("rejected");
    assert!(
        matches!(err, BoardError::InvalidProfile { ref field, .. } if field == "thermal_zones"),
        "{err:?}"
    );
}

#[test]
fn default_power_mode_must_be_a_listed_mode() {
    let text =
        format!("{MINIMAL}\ndefault_power_mode = 4\n[[power_modes]]\nid = 0\nname = \"MAXN\"\n");
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("rejected");
    assert!(
        matches!(err, BoardError::InvalidProfile { ref field, .. } if field == "default_power_mode"),
        "{err:?}"
    );
}

#[test]
fn duplicate_power_mode_id_is_an_invalid_profile() {
    let text = format!(
        "{MINIMAL}\n[[power_modes]]\nid = 0\nname = \"A\"\n[[power_modes]]\nid = 0\nname = \"B\"\n"
    );
    let err = BoardProfile::from_toml_str("inline", &text).expect_err("rejected");
    assert!(matches!(err, BoardError::InvalidProfile { ref field, .. } if field == "power_modes"));
}

#[test]
fn two_profiles_claiming_one_compatible_string_conflict() {
    let a = BoardProfile::from_toml_str("a", &format!("{MINIMAL}\ncompatible = [\"v,x\"]\n"))
        .expect("parses");
    let mut b = a.clone();
    b.name = "other-board".into();
    let err = check_set(&[a, b]).expect_err("conflict");
    assert!(
        matches!(err, BoardError::ProfileConflict { ref what, .. } if what.contains("v,x")),
        "{err:?}"
    );
}

#[test]
fn unknown_board_name_lists_the_known_ones() {
    let err = profile::find("raspberry-pi-5").expect_err("unknown");
    match &err {
        BoardError::UnknownBoard { name, known } => {
            assert_eq!(name, "raspberry-pi-5");
            assert!(known.contains(&"jetson-orin-nx-16gb".to_string()));
        }
        other => panic!("expected UnknownBoard, got {other:?}"),
    }
    assert!(err.to_string().contains("x86_64-cpu"), "{err}");
}

#[test]
fn profile_file_can_be_loaded_by_path() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/cuda-dgpu.toml");
    let p = BoardProfile::from_file(&path).expect("loads");
    assert_eq!(p.name, "cuda-dgpu");
    let missing = BoardProfile::from_file(std::path::Path::new("/nonexistent/board.toml"));
    assert!(matches!(missing, Err(BoardError::ReadProfile { .. })));
}

#[test]
fn jetson_profiles_update_app_and_app_b_and_generic_ones_have_no_ota() {
    for p in profile::builtin() {
        let Some(ota) = &p.ota else {
            assert!(!p.name.starts_with("jetson-"), "{} lacks [ota]", p.name);
            continue;
        };
        let slots: Vec<(&str, &str, &str)> = ota
            .slots
            .iter()
            .map(|s| (s.name.as_str(), s.device.as_str(), s.bootname.as_str()))
            .collect();
        // The VM's slots are its first two virtio disks (tests/vm/vm.py).
        let (a, b) = if p.name.starts_with("qemu-virt-") {
            ("/dev/vda", "/dev/vdb")
        } else {
            ("/dev/disk/by-partlabel/APP", "/dev/disk/by-partlabel/APP_b")
        };
        assert_eq!(
            slots,
            [("rootfs.0", a, "A"), ("rootfs.1", b, "B")],
            "{}",
            p.name
        );
        assert_eq!(ota.boot_tries, 3, "{}", p.name);
        assert_eq!(p.rauc_compatible(), format!("inferloop-{}", p.name));
    }
    assert!(profile::find("x86_64-cpu").expect("exists").ota.is_none());
}

const OTA_AB: &str = r#"
[ota]
boot_tries = 3
slots = [
    { name = "rootfs.0", device = "/dev/sda2", bootname = "A" },
    { name = "rootfs.1", device = "/dev/sda3", bootname = "B" },
]
"#;

fn ota_error(ota: &str) -> BoardError {
    BoardProfile::from_toml_str("inline", &format!("{MINIMAL}{ota}")).expect_err("rejected")
}

#[test]
fn ota_table_parses_and_rejects_unknown_keys() {
    let p = BoardProfile::from_toml_str("inline", &format!("{MINIMAL}{OTA_AB}")).expect("parses");
    assert_eq!(p.ota.as_ref().map(|o| o.slots.len()), Some(2));
    let err = ota_error(&OTA_AB.replace("bootname = \"B\"", "bootname = \"B\", size = 1"));
    assert!(
        matches!(err, BoardError::ProfileParse { ref message, .. } if message.contains("size")),
        "{err:?}"
    );
}

#[test]
fn ota_with_one_slot_or_zero_boot_tries_is_an_invalid_profile() {
    let one = OTA_AB.replace(
        "    { name = \"rootfs.1\", device = \"/dev/sda3\", bootname = \"B\" },\n",
        "",
    );
    for (ota, field) in [
        (one, "ota.slots"),
        (
            OTA_AB.replace("boot_tries = 3", "boot_tries = 0"),
            "ota.boot_tries",
        ),
        (
            OTA_AB.replace("boot_tries = 3", "boot_tries = 8"),
            "ota.boot_tries",
        ),
    ] {
        let err = ota_error(&ota);
        assert!(
            matches!(err, BoardError::InvalidProfile { field: ref f, .. } if f == field),
            "{ota}: {err:?}"
        );
    }
}

#[test]
fn ota_slots_must_be_rootfs_n_with_distinct_absolute_devices_and_bootnames() {
    for (ota, needle) in [
        (OTA_AB.replace("rootfs.1", "data.1"), "rootfs.<index>"),
        (OTA_AB.replace("rootfs.1", "rootfs.0"), "name \"rootfs.0\""),
        (OTA_AB.replace("/dev/sda3", "/dev/sda2"), "device"),
        (OTA_AB.replace("/dev/sda3", "sda3"), "absolute path"),
        (OTA_AB.replace("/dev/sda3", "/dev/sda 3"), "absolute path"),
        (
            OTA_AB.replace("bootname = \"B\"", "bootname = \"A\""),
            "bootname \"A\"",
        ),
        (
            OTA_AB.replace("bootname = \"B\"", "bootname = \"\""),
            "bootname",
        ),
    ] {
        match ota_error(&ota) {
            BoardError::InvalidProfile { field, message, .. } => {
                assert_eq!(field, "ota.slots");
                assert!(message.contains(needle), "{needle:?} not in {message}");
            }
            other => panic!("expected InvalidProfile, got {other:?}"),
        }
    }
}
