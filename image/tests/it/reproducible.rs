//! Same inputs → the same bytes; any changed input → another manifest.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use inferloop_image::tools::{MKFS_EROFS, MKSQUASHFS};
use inferloop_image::{BuildOptions, Progress};
use inferloop_manifest::{FileKind, BAKED_PATH};

use crate::common::{fake_daemon, read, Fixture, EPOCH};
use crate::require;

/// Two fixtures made independently (other inodes, other mtimes, other directories).
fn builds_twice_identically(format: &str) {
    let (a, b) = (Fixture::new(), Fixture::new());
    let (built_a, built_b) = (
        a.build(&a.spec(format), "out"),
        b.build(&b.spec(format), "out"),
    );
    assert_ne!(built_a.image, built_b.image, "two different directories");
    for (x, y) in [
        (&built_a.image, &built_b.image),
        (
            built_a.tarball.as_ref().expect("tarball"),
            built_b.tarball.as_ref().expect("tarball"),
        ),
        (&built_a.manifest_path, &built_b.manifest_path),
    ] {
        assert!(
            read(x) == read(y),
            "{} and {} differ",
            x.display(),
            y.display()
        );
    }
    let artifacts = built_a.manifest.artifacts.as_ref().expect("artifacts");
    eprintln!(
        "{format}: image {} ({} B), tarball {}, manifest {}",
        artifacts.image.sha256,
        artifacts.image.size,
        artifacts.tarball.as_ref().expect("tarball").sha256,
        inferloop_manifest::hash::sha256_bytes(&read(&built_a.manifest_path))
    );
}

#[test]
fn two_squashfs_builds_from_the_same_inputs_are_byte_identical() {
    require!(
        "two_squashfs_builds_from_the_same_inputs_are_byte_identical",
        MKSQUASHFS
    );
    builds_twice_identically("squashfs");
}

#[test]
fn two_erofs_builds_from_the_same_inputs_are_byte_identical() {
    require!(
        "two_erofs_builds_from_the_same_inputs_are_byte_identical",
        MKFS_EROFS
    );
    builds_twice_identically("erofs");
}

#[test]
fn every_changed_input_changes_the_manifest() {
    require!("every_changed_input_changes_the_manifest", MKSQUASHFS);
    let f = Fixture::new();
    let model = Fixture::mounted_model();
    let config = "port = 8080\nslots = 2";
    let build = |name: &str, text: &str, epoch: u64| -> Vec<u8> {
        let spec = inferloop_image::Spec::load(&f.write_spec(text)).expect("spec");
        let opts = BuildOptions {
            source_date_epoch: epoch,
            progress: Progress::hidden(),
            base_cache: None,
            tarball: true,
        };
        let built = inferloop_image::build(&spec, &f.path(name), &opts).expect("build");
        read(&built.manifest_path)
    };
    let base_text = f.spec_text("squashfs", &model, config);
    let mut manifests = BTreeMap::new();
    manifests.insert("original", build("o0", &base_text, EPOCH));
    manifests.insert("epoch", build("o1", &base_text, EPOCH + 1));
    manifests.insert(
        "version",
        build("o2", &base_text.replace("1.2.3", "1.2.4"), EPOCH),
    );
    manifests.insert(
        "config",
        build(
            "o3",
            &f.spec_text("squashfs", &model, "port = 8080\nslots = 3"),
            EPOCH,
        ),
    );
    let sha = inferloop_manifest::hash::sha256_bytes(crate::common::MODEL_BYTES);
    let other_pin = model.replace(&sha, &"0".repeat(64));
    assert_ne!(other_pin, model);
    manifests.insert(
        "model pin",
        build("o4", &f.spec_text("squashfs", &other_pin, config), EPOCH),
    );
    manifests.insert(
        "memory_max",
        build("o5", &base_text.replace("\"12G\"", "\"11G\""), EPOCH),
    );
    fake_daemon(&f.path("inferloopd"), b"v2");
    manifests.insert("daemon", build("o6", &base_text, EPOCH));
    std::fs::write(f.path("base/etc/hostname"), b"changed\n").expect("write");
    manifests.insert("base content", build("o7", &base_text, EPOCH));
    std::fs::set_permissions(
        f.path("base/usr/bin/tool"),
        std::fs::Permissions::from_mode(0o750),
    )
    .expect("chmod");
    manifests.insert("base mode", build("o8", &base_text, EPOCH));
    if MKFS_EROFS.find().is_ok() {
        manifests.insert(
            "format",
            build("o9", &f.spec_text("erofs", &model, config), EPOCH),
        );
    }
    let names: Vec<&&str> = manifests.keys().collect();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            assert_ne!(
                manifests[**a], manifests[**b],
                "{a} and {b} gave the same manifest"
            );
        }
    }
}

#[test]
fn tarball_is_sorted_root_owned_and_keeps_setuid_and_symlinks() {
    require!(
        "tarball_is_sorted_root_owned_and_keeps_setuid_and_symlinks",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let file = std::fs::File::open(built.tarball.as_ref().expect("tarball")).expect("open");
    let mut archive = tar::Archive::new(zstd::Decoder::new(file).expect("zstd"));
    let mut paths = Vec::new();
    for entry in archive.entries().expect("entries") {
        let entry = entry.expect("entry");
        let h = entry.header();
        assert_eq!(h.mtime().expect("mtime"), EPOCH);
        assert_eq!((h.uid().expect("uid"), h.gid().expect("gid")), (0, 0));
        let raw = entry.path().expect("path").display().to_string();
        let path = if raw == "." || raw == "./" {
            "/".to_string()
        } else {
            format!("/{}", raw.trim_end_matches('/'))
        };
        let mode = h.mode().expect("mode");
        if path == "/usr/bin/su" {
            assert_eq!(mode, 0o4755);
        }
        if path == "/tmp" {
            assert_eq!(mode, 0o1777);
        }
        if path == "/bin" {
            assert_eq!(h.entry_type(), tar::EntryType::Symlink);
            assert_eq!(
                entry
                    .link_name()
                    .expect("link")
                    .expect("target")
                    .display()
                    .to_string(),
                "usr/bin"
            );
        }
        paths.push(path);
    }
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "entries are sorted");
    assert_eq!(paths[0], "/");
    let image = built.manifest.image.as_ref().expect("image");
    let mut listed: Vec<String> = image.files.iter().map(|e| e.path.clone()).collect();
    listed.push(BAKED_PATH.into());
    listed.sort();
    assert_eq!(
        paths, listed,
        "the tarball holds exactly the manifest's entries"
    );
    let su = image
        .files
        .iter()
        .find(|e| e.path == "/usr/bin/su")
        .expect("su");
    assert_eq!((su.kind, su.mode), (FileKind::File, 0o4755));
}
