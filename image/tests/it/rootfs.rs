//! The committed `rootfs/` overlay and example spec, as the builder renders them.

use std::path::{Path, PathBuf};

use inferloop_image::spec::{DAEMON_CONFIG_KEYS, RESERVED_CONFIG_KEYS};
use inferloop_image::tools::MKSQUASHFS;
use inferloop_image::{ImageError, Spec};

use crate::common::{fake_daemon, make_base, read, Fixture};
use crate::require;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds the fixture and unpacks its tarball (no external unpacker needed).
fn built_tree(f: &Fixture) -> PathBuf {
    let built = f.build(&f.spec("squashfs"), "out");
    let dest = f.path("unpacked");
    let file = std::fs::File::open(built.tarball.as_ref().expect("tarball")).expect("open");
    let mut archive = tar::Archive::new(zstd::Decoder::new(file).expect("zstd"));
    archive.set_preserve_permissions(true);
    archive.unpack(&dest).expect("unpack");
    dest
}

fn text(path: &Path) -> String {
    String::from_utf8(read(path)).expect("utf8")
}

#[test]
fn overlay_renders_the_unit_config_users_and_mount_points() {
    require!(
        "overlay_renders_the_unit_config_users_and_mount_points",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let root = built_tree(&f);

    let unit = text(&root.join("etc/systemd/system/inferloopd.service"));
    for line in [
        "Type=notify",
        "WatchdogSec=30",
        "Restart=on-failure",
        "RestartPreventExitStatus=1 2 3",
        "MemoryMax=12G",
        "ExecStart=/usr/bin/inferloopd serve --config /etc/inferloop/inferloopd.toml",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/inferloop /var/log/inferloop",
        "RequiresMountsFor=/var/lib/inferloop /data/models",
        "User=inferloop",
        "NoNewPrivileges=yes",
        // The Jetson GPU: its device nodes' groups and the L4T library path.
        "SupplementaryGroups=video render",
        "Environment=LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/tegra:/usr/local/cuda/lib64",
        "SystemCallFilter=~@clock",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "unit lacks {line:?}:\n{unit}"
        );
    }
    // A device allow-list, even the one ProtectClock=yes implies before systemd 253, would
    // hide the GPU's nodes.
    for key in [
        "PrivateDevices=",
        "DevicePolicy=",
        "DeviceAllow=",
        "ProtectClock=",
    ] {
        assert!(
            !unit.lines().any(|l| l.starts_with(key)),
            "unit sets {key}:\n{unit}"
        );
    }
    assert!(!unit.contains("@MEMORY_MAX@") && !unit.contains("@VERSION@"));
    assert!(!root
        .join("etc/systemd/system/inferloopd.service.in")
        .exists());
    assert_eq!(
        std::fs::read_link(
            root.join("etc/systemd/system/multi-user.target.wants/inferloopd.service")
        )
        .expect("enabled"),
        Path::new("../inferloopd.service")
    );

    let config: toml::Table =
        toml::from_str(&text(&root.join("etc/inferloop/inferloopd.toml"))).expect("toml");
    assert_eq!(
        config["manifest"].as_str(),
        Some("/etc/inferloop/manifest.json")
    );
    assert_eq!(config["state_dir"].as_str(), Some("/var/lib/inferloop"));
    assert_eq!(config["model"].as_str(), Some("/data/models/model.gguf"));
    assert_eq!(config["slots"].as_integer(), Some(2));
    // The fixture's board is an Orin: a GPU that cannot be opened refuses the start.
    assert_eq!(config["cpu_fallback"].as_bool(), Some(false));
    for key in config.keys() {
        assert!(DAEMON_CONFIG_KEYS.contains(&key.as_str()), "{key}");
    }

    let passwd = text(&root.join("etc/passwd"));
    assert!(
        passwd.contains(
            "\ninferloop:x:951:951:InferLoop daemon:/var/lib/inferloop:/usr/sbin/nologin\n"
        ),
        "{passwd}"
    );
    let group = text(&root.join("etc/group"));
    assert!(group.contains("inferloop:x:951:"), "{group}");
    for name in ["video", "render"] {
        let line = group
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no group {name}:\n{group}"));
        assert!(
            line.ends_with(":inferloop"),
            "inferloop is a member of {name}: {line}"
        );
    }
    for dir in [
        "data",
        "var/lib/inferloop",
        "var/log",
        "tmp",
        "proc",
        "sys",
        "dev",
        "run",
    ] {
        assert!(root.join(dir).is_dir(), "mount point {dir}");
    }
    assert_eq!(
        read(&root.join("etc/machine-id")),
        b"",
        "empty: systemd fills it at boot"
    );
    assert!(text(&root.join("etc/fstab")).contains("LABEL=inferloop-data"));
}

#[test]
fn rendered_unit_passes_systemd_analyze_verify() {
    let Ok(status) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        eprintln!("SKIP rendered_unit_passes_systemd_analyze_verify: systemd-analyze not found");
        return;
    };
    assert!(status.status.success());
    let f = Fixture::new();
    let spec = f.spec("squashfs");
    let unit = read(&repo().join("rootfs/etc/systemd/system/inferloopd.service.in"));
    let rendered = inferloop_image::stage::render(
        std::str::from_utf8(&unit).expect("utf8"),
        &inferloop_image::stage::template_vars(&spec),
    )
    .expect("render")
    // The daemon is not installed on this host; verify would only complain about that.
    .replace("/usr/bin/inferloopd", "/bin/true");
    let path = f.path("inferloopd.service");
    std::fs::write(&path, rendered).expect("write");
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("inferloopd.service"))
        .filter(|l| !l.contains("User=") && !l.contains("Failed to resolve user"))
        .collect();
    assert!(problems.is_empty(), "{stderr}");
}

#[test]
fn config_keys_match_the_daemons_serve_layer() {
    let source = text(&repo().join("daemon/src/config/layer.rs"));
    let start = source
        .find("pub struct ServeLayer {")
        .expect("ServeLayer in daemon/src/config/layer.rs");
    let body = &source[start..start + source[start..].find("\n}").expect("end of struct")];
    // A field marked `#[serde(skip)]` is no file key (the environment-only test hooks).
    let mut fields = Vec::new();
    let mut skipped = false;
    for line in body.lines().map(str::trim) {
        if line == "#[serde(skip)]" {
            skipped = true;
        } else if let Some((name, _)) = line.strip_prefix("pub ").and_then(|l| l.split_once(':')) {
            if !name.contains(' ') && !skipped {
                fields.push(name);
            }
            skipped = false;
        }
    }
    let mut keys = DAEMON_CONFIG_KEYS.to_vec();
    fields.sort();
    keys.sort();
    assert_eq!(
        keys, fields,
        "update DAEMON_CONFIG_KEYS in image/src/spec.rs"
    );
    for key in RESERVED_CONFIG_KEYS {
        assert!(DAEMON_CONFIG_KEYS.contains(key), "{key}");
    }
}

/// The example spec, loaded where its relative paths exist (a fake cross-built daemon, a
/// stand-in for the Q8_0 weights), and its pin against the real `make model-q8` output.
#[test]
fn example_spec_bakes_the_q8_0_model_pinned_and_serves_on_the_gpu() {
    const Q8: &str = "models/SmolLM2-135M-Instruct.Q8_0.gguf";
    let f = Fixture::new();
    let spec_text = text(&repo().join("image/examples/orin-nx-16gb.toml"));
    let origin = f.path("image/examples/orin-nx-16gb.toml");
    std::fs::create_dir_all(f.path("image/examples")).expect("mkdir");
    fake_daemon(
        &f.path("target/aarch64-unknown-linux-gnu/release/inferloopd"),
        b"",
    );
    make_base(&f.path("out/base-rootfs"));
    std::os::unix::fs::symlink(repo().join("rootfs"), f.path("rootfs")).expect("symlink");
    crate::common::write(&f.path("out/kernels/ptx/rope.ptx"), b"// ptx", 0o644);
    crate::common::write(&f.path(Q8), b"stand-in", 0o644);
    let spec = Spec::from_toml(&spec_text, &origin).expect("example spec");
    assert_eq!(spec.board.name, "jetson-orin-nx-16gb");
    assert_eq!(
        spec.daemon.kernels.as_deref(),
        Some(f.path("image/examples/../../out/kernels").as_path()),
        "the example installs the shipped kernels"
    );
    assert_eq!(
        spec.daemon.version,
        env!("CARGO_PKG_VERSION"),
        "daemon.version follows the workspace"
    );
    let inferloop_image::spec::ModelInput::Baked { file, sha256, size } = &spec.model else {
        panic!("the example bakes the model: {:?}", spec.model);
    };
    assert!(file.ends_with(Q8), "{}", file.display());
    assert_eq!(
        spec.model.device_path(),
        "/usr/share/inferloop/models/SmolLM2-135M-Instruct.Q8_0.gguf"
    );
    let (Some(sha256), Some(size)) = (sha256, size) else {
        panic!("the baked Q8_0 file is pinned by sha256 and size");
    };
    assert_eq!(
        spec.config.get("model_id").and_then(|v| v.as_str()),
        Some("SmolLM2-135M-Instruct.Q8_0")
    );
    assert_eq!(
        spec.config.get("device").and_then(|v| v.as_str()),
        Some("cuda")
    );
    assert_eq!(
        spec.config.get("cpu_fallback").and_then(|v| v.as_bool()),
        Some(false)
    );
    // `make model-q8` (inferloopd quantize over the fetched Q4_1 model) must give the bytes
    // the example pins, or `make image` stops at the pin.
    let real = repo().join(Q8);
    match std::fs::metadata(&real) {
        Ok(meta) => {
            assert_eq!(meta.len(), *size, "{}", real.display());
            let got = inferloop_manifest::hash::sha256_file(&real, |_, _| {}).expect("hash");
            assert_eq!(&got, sha256, "{}", real.display());
        }
        Err(_) => eprintln!(
            "{} is absent (make model-q8 makes it): its pin was not compared",
            real.display()
        ),
    }
}

#[test]
fn config_file_in_the_base_conflicts_with_the_generated_one() {
    require!(
        "config_file_in_the_base_conflicts_with_the_generated_one",
        MKSQUASHFS
    );
    let f = Fixture::new();
    crate::common::write(
        &f.path("base/etc/inferloop/inferloopd.toml"),
        b"port = 1\n",
        0o644,
    );
    let spec = f.spec("squashfs");
    assert!(matches!(
        inferloop_image::build(&spec, &f.path("out"), &crate::common::options()),
        Err(ImageError::OverlayConflict { .. })
    ));
    assert!(!f.path("out/manifest.json").exists(), "no partial outputs");
}

#[test]
fn baked_model_with_a_wrong_pin_is_refused() {
    require!("baked_model_with_a_wrong_pin_is_refused", MKSQUASHFS);
    let f = Fixture::new();
    let model = format!("file = \"model.gguf\"\nsha256 = \"{}\"", "0".repeat(64));
    let spec = Spec::load(&f.write_spec(&f.spec_text("squashfs", &model, ""))).expect("spec");
    assert!(matches!(
        inferloop_image::build(&spec, &f.path("out"), &crate::common::options()),
        Err(ImageError::ModelMismatch {
            field: "sha256",
            ..
        })
    ));
}

#[test]
fn baked_model_is_listed_in_the_image() {
    require!("baked_model_is_listed_in_the_image", MKSQUASHFS);
    let f = Fixture::new();
    let spec = Spec::load(&f.write_spec(&f.spec_text("squashfs", "file = \"model.gguf\"", "")))
        .expect("spec");
    let built = f.build(&spec, "out");
    let m = &built.manifest;
    assert_eq!(m.model.path, "/usr/share/inferloop/models/model.gguf");
    assert_eq!(
        m.model.placement,
        Some(inferloop_manifest::Placement::Baked)
    );
    let files = &m.image.as_ref().expect("image").files;
    let entry = files
        .iter()
        .find(|e| e.path == m.model.path)
        .expect("listed");
    assert_eq!(entry.sha256.as_deref(), Some(m.model.sha256.as_str()));
    assert_eq!(entry.mode, 0o644);
}

/// `[draft_model]`: the baked draft is staged beside a mounted main model, pinned by the
/// manifest's `draft_model` like the main one, named by the config, and the unit waits for
/// both models' directories.
#[test]
fn a_draft_model_is_baked_pinned_and_named_by_the_config() {
    require!(
        "a_draft_model_is_baked_pinned_and_named_by_the_config",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let draft_bytes = b"GGUF fake draft weights";
    crate::common::write(&f.path("draft.gguf"), draft_bytes, 0o644);
    let text_spec = f.spec_text("squashfs", &Fixture::mounted_model(), "spec = \"draft\"")
        + "\n[draft_model]\nfile = \"draft.gguf\"\n";
    let spec = Spec::load(&f.write_spec(&text_spec)).expect("spec");
    let built = f.build(&spec, "out");
    let m = &built.manifest;
    let draft = m.draft_model.as_ref().expect("the manifest pins the draft");
    assert_eq!(draft.path, "/usr/share/inferloop/models/draft.gguf");
    assert_eq!(draft.placement, Some(inferloop_manifest::Placement::Baked));
    assert_eq!(
        draft.sha256,
        inferloop_manifest::hash::sha256_bytes(draft_bytes)
    );
    assert_eq!(draft.size, draft_bytes.len() as u64);
    let files = &m.image.as_ref().expect("image").files;
    let entry = files.iter().find(|e| e.path == draft.path).expect("listed");
    assert_eq!(entry.sha256.as_deref(), Some(draft.sha256.as_str()));
    assert_eq!(m.model.path, "/data/models/model.gguf");

    let dest = f.path("unpacked");
    let file = std::fs::File::open(built.tarball.as_ref().expect("tarball")).expect("open");
    tar::Archive::new(zstd::Decoder::new(file).expect("zstd"))
        .unpack(&dest)
        .expect("unpack");
    assert_eq!(
        read(&dest.join("usr/share/inferloop/models/draft.gguf")),
        draft_bytes
    );
    let config: toml::Table =
        toml::from_str(&text(&dest.join("etc/inferloop/inferloopd.toml"))).expect("toml");
    assert_eq!(config["draft_model"].as_str(), Some(draft.path.as_str()));
    assert_eq!(config["spec"].as_str(), Some("draft"));
    let unit = text(&dest.join("etc/systemd/system/inferloopd.service"));
    assert!(
        unit.lines().any(|l| l
            == "RequiresMountsFor=/var/lib/inferloop /data/models /usr/share/inferloop/models"),
        "{unit}"
    );
}

#[test]
fn a_draft_model_where_the_model_is_or_set_in_the_config_is_refused() {
    let f = Fixture::new();
    let same = f.spec_text("squashfs", &Fixture::mounted_model(), "")
        + &format!("\n[draft_model]\n{}\n", Fixture::mounted_model());
    match Spec::load(&f.write_spec(&same)) {
        Err(ImageError::SpecInvalid { field, message }) => {
            assert_eq!(field, "draft_model");
            assert!(message.contains("/data/models/model.gguf"), "{message}");
        }
        other => panic!("expected SpecInvalid draft_model, got {other:?}"),
    }
    let in_config = f.spec_text(
        "squashfs",
        &Fixture::mounted_model(),
        "draft_model = \"/data/models/small.gguf\"",
    );
    match Spec::load(&f.write_spec(&in_config)) {
        Err(ImageError::SpecInvalid { field, message }) => {
            assert_eq!(field, "config");
            assert!(message.contains("[draft_model]"), "{message}");
        }
        other => panic!("expected SpecInvalid config, got {other:?}"),
    }
    let unpinned = f.spec_text("squashfs", &Fixture::mounted_model(), "")
        + "\n[draft_model]\nmount = \"/data/models/small.gguf\"\n";
    match Spec::load(&f.write_spec(&unpinned)) {
        Err(ImageError::SpecInvalid { field, .. }) => assert_eq!(field, "draft_model"),
        other => panic!("expected SpecInvalid draft_model, got {other:?}"),
    }
}

/// `daemon.kernels` installs the cubins and PTX (nothing else from the directory) where the
/// daemon's loader looks, each listed and pinned by the manifest; a directory without PTX is
/// refused at the spec.
#[test]
fn kernels_are_installed_where_the_daemon_looks_and_pinned() {
    require!(
        "kernels_are_installed_where_the_daemon_looks_and_pinned",
        MKSQUASHFS
    );
    let f = Fixture::new();
    crate::common::write(&f.path("kernels/sm_87/rope.cubin"), b"sass 87", 0o600);
    crate::common::write(&f.path("kernels/sm_90/rope.cubin"), b"sass 90", 0o600);
    crate::common::write(&f.path("kernels/ptx/rope.ptx"), b"// ptx 8.2", 0o600);
    crate::common::write(&f.path("kernels/kernels.json"), b"{}", 0o644);
    crate::common::write(&f.path("kernels/build/rope.log"), b"ptxas", 0o644);
    let with = |dir: &str| {
        f.spec_text("squashfs", &Fixture::mounted_model(), "")
            .replace(
                "version = \"0.1.0\"\n",
                &format!("version = \"0.1.0\"\nkernels = \"{dir}\"\n"),
            )
    };
    let spec = Spec::load(&f.write_spec(&with("kernels"))).expect("spec");
    let built = f.build(&spec, "out");
    let files = &built.manifest.image.as_ref().expect("image").files;
    let kernels: Vec<_> = files
        .iter()
        .filter(|e| e.path.starts_with("/usr/lib/inferloop/kernels/"))
        .filter(|e| e.sha256.is_some())
        .map(|e| (e.path.as_str(), e.mode, e.sha256.clone()))
        .collect();
    let sha = |b: &[u8]| Some(inferloop_manifest::hash::sha256_bytes(b));
    assert_eq!(
        kernels,
        [
            (
                "/usr/lib/inferloop/kernels/ptx/rope.ptx",
                0o644,
                sha(b"// ptx 8.2")
            ),
            (
                "/usr/lib/inferloop/kernels/sm_87/rope.cubin",
                0o644,
                sha(b"sass 87")
            ),
            (
                "/usr/lib/inferloop/kernels/sm_90/rope.cubin",
                0o644,
                sha(b"sass 90")
            ),
        ]
    );

    std::fs::remove_file(f.path("kernels/ptx/rope.ptx")).expect("rm");
    let err = Spec::load(&f.write_spec(&with("kernels"))).expect_err("no PTX");
    assert!(
        matches!(
            err,
            ImageError::SpecInvalid {
                field: "daemon.kernels",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ptx"), "{err}");
}
