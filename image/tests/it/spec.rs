//! Spec errors name what to fix, as a distinct error variant.

use inferloop_image::{ImageError, Spec};

use crate::common::{fake_daemon, Fixture};

fn load(f: &Fixture, text: &str) -> Result<Spec, ImageError> {
    Spec::load(&f.write_spec(text))
}

fn good(f: &Fixture) -> String {
    f.spec_text("squashfs", &Fixture::mounted_model(), "port = 8080")
}

#[test]
fn good_spec_loads_with_paths_resolved_against_its_directory() {
    let f = Fixture::new();
    let spec = load(&f, &good(&f)).expect("good");
    assert_eq!(spec.board.name, "jetson-orin-nx-16gb");
    assert_eq!(spec.daemon.path, f.path("inferloopd"));
    assert_eq!(spec.daemon.target, "aarch64-unknown-linux-gnu");
    assert_eq!(spec.model.device_path(), "/data/models/model.gguf");
}

#[test]
fn unknown_board_lists_the_known_ones() {
    let f = Fixture::new();
    match load(
        &f,
        &good(&f).replace("jetson-orin-nx-16gb", "jetson-nano-2gb"),
    ) {
        Err(e @ ImageError::UnknownBoard { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("jetson-nano-2gb") && text.contains("jetson-orin-nx-16gb"),
                "{text}"
            );
            assert_eq!(e.kind(), "unknown_board");
        }
        other => panic!("expected UnknownBoard, got {other:?}"),
    }
}

#[test]
fn missing_model_file_names_the_field_and_path() {
    let f = Fixture::new();
    let text = f.spec_text("squashfs", "file = \"no-such-model.gguf\"", "");
    match load(&f, &text) {
        Err(
            e @ ImageError::InputMissing {
                field: "model.file",
                ..
            },
        ) => {
            assert!(e.to_string().contains("no-such-model.gguf"), "{e}");
        }
        other => panic!("expected InputMissing model.file, got {other:?}"),
    }
}

#[test]
fn missing_daemon_names_the_field() {
    let f = Fixture::new();
    std::fs::remove_file(f.path("inferloopd")).expect("rm");
    assert!(matches!(
        load(&f, &good(&f)),
        Err(ImageError::InputMissing {
            field: "daemon.path",
            ..
        })
    ));
}

#[test]
fn missing_base_names_the_field() {
    let f = Fixture::new();
    assert!(matches!(
        load(
            &f,
            &good(&f).replace("base = \"base\"", "base = \"nowhere\"")
        ),
        Err(ImageError::InputMissing { field: "base", .. })
    ));
}

#[test]
fn host_daemon_in_an_aarch64_spec_is_refused() {
    let f = Fixture::new();
    let mut bytes = inferloop_image::elf::fake_header(0x3e);
    bytes.extend_from_slice(b"x86 build");
    std::fs::write(f.path("inferloopd"), bytes).expect("write");
    let text = good(&f).replace(
        "version = \"0.1.0\"",
        "version = \"0.1.0\"\ntarget = \"aarch64-unknown-linux-gnu\"",
    );
    assert!(matches!(
        load(&f, &text),
        Err(ImageError::DaemonBinary { .. })
    ));
    fake_daemon(&f.path("inferloopd"), b"");
    load(&f, &text).expect("aarch64 daemon is fine");
}

#[test]
fn model_with_both_file_and_mount_is_ambiguous() {
    let f = Fixture::new();
    let model = format!("file = \"model.gguf\"\n{}", Fixture::mounted_model());
    assert!(matches!(
        load(&f, &f.spec_text("squashfs", &model, "")),
        Err(ImageError::SpecInvalid { field: "model", .. })
    ));
}

#[test]
fn mounted_model_without_a_pin_is_refused() {
    let f = Fixture::new();
    assert!(matches!(
        load(
            &f,
            &f.spec_text("squashfs", "mount = \"/data/models/m.gguf\"", "")
        ),
        Err(ImageError::SpecInvalid { field: "model", .. })
    ));
}

#[test]
fn unknown_spec_key_is_a_parse_error() {
    let f = Fixture::new();
    match load(&f, &format!("compression = \"xz\"\n{}", good(&f))) {
        Err(ImageError::SpecParse { message, .. }) => {
            assert!(message.contains("compression"), "{message}")
        }
        other => panic!("expected SpecParse, got {other:?}"),
    }
}

#[test]
fn unknown_daemon_setting_is_refused_at_build_time() {
    let f = Fixture::new();
    match load(
        &f,
        &f.spec_text("squashfs", &Fixture::mounted_model(), "slot = 2"),
    ) {
        Err(ImageError::SpecInvalid {
            field: "config",
            message,
        }) => {
            assert!(message.contains("`slot`"), "{message}")
        }
        other => panic!("expected SpecInvalid config, got {other:?}"),
    }
}

#[test]
fn builder_owned_and_secret_settings_are_refused() {
    let f = Fixture::new();
    for key in [
        "state_dir = \"/tmp\"",
        "manifest = \"/m.json\"",
        "api_key = \"secret\"",
        "draft_model = \"/small.gguf\"",
    ] {
        assert!(
            matches!(
                load(&f, &f.spec_text("squashfs", &Fixture::mounted_model(), key)),
                Err(ImageError::SpecInvalid {
                    field: "config",
                    ..
                })
            ),
            "{key}"
        );
    }
}

#[test]
fn memory_max_above_the_boards_dram_is_refused() {
    let f = Fixture::new();
    for (value, ok) in [
        ("17G", false),
        ("16G", true),
        ("80%", true),
        ("infinity", true),
        ("12 G", false),
        ("0", false),
    ] {
        let result = load(&f, &good(&f).replace("\"12G\"", &format!("\"{value}\"")));
        match (ok, result) {
            (true, Ok(_)) => {}
            (
                false,
                Err(ImageError::SpecInvalid {
                    field: "memory_max",
                    ..
                }),
            ) => {}
            (_, other) => panic!("memory_max {value}: {other:?}"),
        }
    }
}

#[test]
fn base_tarball_must_be_tar_or_tar_zst() {
    let f = Fixture::new();
    std::fs::write(f.path("base.tar.gz"), b"").expect("write");
    assert!(matches!(
        load(
            &f,
            &good(&f).replace("base = \"base\"", "base = \"base.tar.gz\"")
        ),
        Err(ImageError::SpecInvalid { field: "base", .. })
    ));
}

#[test]
fn debian_base_table_loads_with_required_packages_first_and_arch_from_target() {
    let f = Fixture::new();
    let text = good(&f).replace(
        "base = \"base\"",
        "base = { debian = \"bookworm\", packages = [\"linux-image-arm64\", \"rauc\", \"systemd\"], \
         keep_modules = [\"virtio_blk\", \"dm-verity\"] }",
    );
    let spec = load(&f, &text).expect("debian base");
    let inferloop_image::spec::Base::Debian(d) = &spec.base else {
        panic!("expected a Debian base, got {:?}", spec.base);
    };
    assert_eq!(d.suite, "bookworm");
    assert_eq!(d.arch, "arm64");
    assert_eq!(d.mirror, "http://deb.debian.org/debian");
    let required = inferloop_image::debian::REQUIRED_PACKAGES;
    assert_eq!(&d.packages[..required.len()], required);
    // "systemd" is required already: listed once.
    assert_eq!(&d.packages[required.len()..], ["linux-image-arm64", "rauc"]);
    assert_eq!(
        d.keep_modules.as_deref(),
        Some(&["virtio_blk".to_string(), "dm-verity".to_string()][..])
    );
}

#[test]
fn debian_base_without_a_kernel_is_refused() {
    let f = Fixture::new();
    let text = good(&f).replace("base = \"base\"", "base = { debian = \"bookworm\" }");
    match load(&f, &text) {
        Err(
            e @ ImageError::SpecInvalid {
                field: "base.packages",
                ..
            },
        ) => assert!(e.to_string().contains("linux-image"), "{e}"),
        other => panic!("expected SpecInvalid base.packages, got {other:?}"),
    }
}

#[test]
fn debian_base_refuses_unknown_keys_bad_names_and_mirrors() {
    let f = Fixture::new();
    let with = |base: &str| good(&f).replace("base = \"base\"", &format!("base = {base}"));
    for (base, field) in [
        (
            "{ debian = \"bookworm\", packages = [\"linux-image-arm64\"], extra = 1 }",
            "base",
        ),
        ("{ debian = \"Bookworm!\", packages = [\"linux-image-arm64\"] }", "base.debian"),
        ("{ debian = \"bookworm\", packages = [\"linux-image-arm64\", \"a;b\"] }", "base.packages"),
        (
            "{ debian = \"bookworm\", packages = [\"linux-image-arm64\"], mirror = \"ftp://x\" }",
            "base.mirror",
        ),
        (
            "{ debian = \"bookworm\", packages = [\"linux-image-arm64\"], keep_modules = [\"a b\"] }",
            "base.keep_modules",
        ),
        ("42", "base"),
    ] {
        match load(&f, &with(base)) {
            Err(ImageError::SpecInvalid { field: got, .. }) => {
                assert_eq!(got, field, "{base}")
            }
            other => panic!("{base}: expected SpecInvalid {field}, got {other:?}"),
        }
    }
}

#[test]
fn overlay_list_and_squashfs_compression() {
    let f = Fixture::new();
    let overlay = crate::common::overlay_dir();
    let second = f.path("second-overlay");
    std::fs::create_dir(&second).expect("mkdir");
    let text = good(&f).replace(
        &format!("overlay = \"{}\"", overlay.display()),
        &format!(
            "overlay = [\"{}\", \"second-overlay\"]\nsquashfs_compression = \"lz4\"",
            overlay.display()
        ),
    );
    let spec = load(&f, &text).expect("spec");
    assert_eq!(spec.overlays, [overlay, second]);
    assert_eq!(
        spec.squashfs_compression,
        Some(inferloop_image::pack::SquashComp::Lz4)
    );
    let bad = good(&f).replace("memory_max", "squashfs_compression = \"gzip\"\nmemory_max");
    assert!(matches!(
        load(&f, &bad),
        Err(ImageError::SpecInvalid {
            field: "squashfs_compression",
            ..
        })
    ));
}

#[test]
fn a_gpu_board_fails_closed_unless_its_spec_allows_the_cpu() {
    let f = Fixture::new();
    let with = |config: &str| f.spec_text("squashfs", &Fixture::mounted_model(), config);
    let fallback = |spec: &Spec| spec.config.get("cpu_fallback").and_then(|v| v.as_bool());
    // The Orin has a CUDA GPU: nothing said means a box whose GPU cannot be opened refuses
    // to start (the builder writes cpu_fallback = false into the daemon's config).
    for config in ["", "device = \"auto\"", "device = \"cuda\""] {
        let spec = load(&f, &with(config)).expect("valid");
        assert_eq!(fallback(&spec), Some(false), "{config:?}");
    }
    let spec = load(&f, &with("device = \"cuda\"\ncpu_fallback = true")).expect("valid");
    assert_eq!(fallback(&spec), Some(true));
    // On the CPU on purpose, or on a board without a GPU: nothing to fall back from.
    let spec = load(&f, &with("device = \"cpu\"")).expect("valid");
    assert_eq!(fallback(&spec), None);
    let cpu_board = with("")
        .replace("jetson-orin-nx-16gb", "aarch64-cpu")
        .replace("memory_max = \"12G\"", "memory_max = \"50%\"");
    assert_eq!(fallback(&load(&f, &cpu_board).expect("valid")), None);
    // Values the daemon would refuse at boot are refused at build time.
    for (config, field) in [
        ("device = \"gpu\"", "config.device"),
        ("cpu_fallback = \"no\"", "config.cpu_fallback"),
    ] {
        match load(&f, &with(config)) {
            Err(ImageError::SpecInvalid { field: got, .. }) => assert_eq!(got, field),
            other => panic!("{config}: expected SpecInvalid, got {other:?}"),
        }
    }
}
