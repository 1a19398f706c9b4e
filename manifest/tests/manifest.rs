//! Manifest fixtures, named by the outcome they must produce.

use std::path::{Path, PathBuf};

use inferloop_manifest::{verify_weights, IntegrityError, Manifest, Verified, VerifyCache};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load_and_verify(name: &str) -> Result<Verified, IntegrityError> {
    let loaded = Manifest::load(&fixture(name))?;
    loaded.manifest.check_for_serve(&loaded.path)?;
    let weights = loaded.manifest.model_path(&loaded.path);
    verify_weights(&weights, &loaded.manifest.model, None)
}

#[test]
fn good_manifest_verifies_its_weights() {
    assert_eq!(
        load_and_verify("good-manifest.json").expect("good"),
        Verified::Hashed
    );
}

#[test]
fn wrong_sha_manifest_names_expected_and_actual() {
    match load_and_verify("wrong-sha-manifest.json") {
        Err(IntegrityError::HashMismatch {
            expected, actual, ..
        }) => {
            assert_ne!(expected, actual);
            assert_eq!(actual.len(), 64);
        }
        other => panic!("expected HashMismatch, got {other:?}"),
    }
}

#[test]
fn wrong_size_manifest_fails_before_hashing() {
    assert!(matches!(
        load_and_verify("wrong-size-manifest.json"),
        Err(IntegrityError::SizeMismatch { expected: 1, .. })
    ));
}

#[test]
fn unknown_field_manifest_is_rejected() {
    match load_and_verify("unknown-field-manifest.json") {
        Err(IntegrityError::ManifestParse { message, .. }) => {
            assert!(message.contains("sha265"), "{message}")
        }
        other => panic!("expected ManifestParse, got {other:?}"),
    }
}

#[test]
fn future_schema_manifest_is_unsupported() {
    assert!(matches!(
        load_and_verify("future-schema-manifest.json"),
        Err(IntegrityError::UnsupportedSchema { found: 2, .. })
    ));
}

#[test]
fn missing_weights_manifest_names_the_path() {
    match load_and_verify("missing-weights-manifest.json") {
        Err(e @ IntegrityError::WeightsMissing { .. }) => {
            assert!(e.to_string().contains("no-such-weights.bin"), "{e}");
            assert_eq!(e.kind(), "weights_missing");
        }
        other => panic!("expected WeightsMissing, got {other:?}"),
    }
}

#[test]
fn broken_manifest_is_a_parse_error() {
    assert!(matches!(
        load_and_verify("broken-manifest.json"),
        Err(IntegrityError::ManifestParse { .. })
    ));
}

#[test]
fn absent_manifest_is_a_read_error() {
    assert!(matches!(
        load_and_verify("no-such-manifest.json"),
        Err(IntegrityError::ManifestRead { .. })
    ));
}

/// The message and its `source()` chain joined as anyhow's `{:#}` prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// The OS error was in the message and in `source()`, so `{:#}` printed it twice.
#[test]
fn read_errors_print_the_os_error_once() {
    // ENOENT as the OS words it: "No such file or directory (os error 2)".
    let os = std::io::Error::from_raw_os_error(2).to_string();
    for (fixture, path) in [
        ("no-such-manifest.json", "no-such-manifest.json"),
        ("missing-weights-manifest.json", "no-such-weights.bin"),
    ] {
        let printed = chain(&load_and_verify(fixture).expect_err("absent"));
        assert_eq!(printed.matches(&os).count(), 1, "{printed}");
        assert!(printed.contains(path), "{printed}");
    }
}

#[test]
fn raw_hash_covers_the_exact_bytes() {
    let path = fixture("good-manifest.json");
    let loaded = Manifest::load(&path).expect("good");
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(
        loaded.raw_sha256,
        inferloop_manifest::hash::sha256_bytes(&bytes)
    );
}

#[test]
fn cache_skips_rehash_until_the_file_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let weights = dir.path().join("w.bin");
    std::fs::write(&weights, b"weights v1").expect("write");
    let pin = inferloop_manifest::ModelPin {
        path: "w.bin".into(),
        sha256: inferloop_manifest::hash::sha256_bytes(b"weights v1"),
        size: 10,
        placement: None,
    };
    let cache = VerifyCache::in_dir(dir.path());
    assert_eq!(
        verify_weights(&weights, &pin, Some(&cache)).expect("ok"),
        Verified::Hashed
    );
    assert_eq!(
        verify_weights(&weights, &pin, Some(&cache)).expect("ok"),
        Verified::Cached
    );
    // Same size, new content and mtime: the key changes, so the file is hashed and caught.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&weights, b"weights v2").expect("write");
    assert!(matches!(
        verify_weights(&weights, &pin, Some(&cache)),
        Err(IntegrityError::HashMismatch { .. })
    ));
}

// --- image manifests (written by inferloop-image) ---------------------------------------

fn load(name: &str) -> Result<inferloop_manifest::Loaded, IntegrityError> {
    Manifest::load(&fixture(name))
}

fn build_check(name: &str) -> Result<(), IntegrityError> {
    let loaded = load(name)?;
    loaded.manifest.check_for_build(&loaded.path)
}

fn install_check(name: &str, board: Option<&str>) -> Result<(), IntegrityError> {
    let loaded = load(name)?;
    loaded.manifest.check_for_install(&loaded.path, board)
}

fn bad_field(result: Result<(), IntegrityError>) -> (&'static str, String) {
    match result {
        Err(IntegrityError::BadField { field, message, .. }) => (field, message),
        other => panic!("expected BadField, got {other:?}"),
    }
}

#[test]
fn good_baked_manifest_passes_the_build_checks() {
    build_check("good-baked-manifest.json").expect("good");
}

#[test]
fn good_image_manifest_passes_the_install_checks_for_its_board() {
    install_check("good-image-manifest.json", Some("jetson-orin-nx-16gb")).expect("good");
    install_check("good-image-manifest.json", None).expect("good without a board");
}

#[test]
fn image_manifest_still_passes_the_daemon_serve_checks() {
    let loaded = load("good-image-manifest.json").expect("parses");
    loaded
        .manifest
        .check_for_serve(&loaded.path)
        .expect("serve");
}

#[test]
fn daemon_only_manifest_has_no_image_section_for_a_build() {
    assert!(matches!(
        build_check("good-manifest.json"),
        Err(IntegrityError::MissingSection {
            section: "image",
            ..
        })
    ));
}

#[test]
fn baked_manifest_is_not_installable_without_artifacts() {
    assert!(matches!(
        install_check("good-baked-manifest.json", None),
        Err(IntegrityError::MissingSection {
            section: "artifacts",
            ..
        })
    ));
}

#[test]
fn image_manifest_with_artifacts_cannot_be_baked() {
    assert!(matches!(
        build_check("good-image-manifest.json"),
        Err(IntegrityError::UnexpectedSection {
            section: "artifacts",
            ..
        })
    ));
}

#[test]
fn image_manifest_for_another_board_is_incompatible() {
    match install_check("good-image-manifest.json", Some("jetson-orin-nano-8gb")) {
        Err(e @ IntegrityError::Incompatible { .. }) => {
            assert_eq!(e.kind(), "incompatible");
            let text = e.to_string();
            assert!(text.contains("jetson-orin-nx-16gb") && text.contains("jetson-orin-nano-8gb"));
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
}

#[test]
fn stripping_artifacts_gives_back_the_baked_bytes() {
    let beside = load("good-image-manifest.json").expect("beside").manifest;
    let baked = std::fs::read(fixture("good-baked-manifest.json")).expect("read");
    assert_eq!(
        String::from_utf8(beside.baked().to_json_bytes()).expect("utf8"),
        String::from_utf8(baked).expect("utf8")
    );
}

#[test]
fn unknown_field_image_manifest_is_rejected() {
    match load("unknown-field-image-manifest.json") {
        Err(IntegrityError::ManifestParse { message, .. }) => {
            assert!(message.contains("setuid"), "{message}")
        }
        other => panic!("expected ManifestParse, got {other:?}"),
    }
}

#[test]
fn artifacts_without_image_manifest_is_a_parse_error() {
    match load("artifacts-without-image-manifest.json") {
        Err(IntegrityError::ManifestParse { message, .. }) => {
            assert!(message.contains("image"), "{message}")
        }
        other => panic!("expected ManifestParse, got {other:?}"),
    }
}

#[test]
fn bad_mode_manifest_names_the_mode() {
    match load("bad-mode-manifest.json") {
        Err(IntegrityError::ManifestParse { message, .. }) => {
            assert!(message.contains("four octal digits"), "{message}")
        }
        other => panic!("expected ManifestParse, got {other:?}"),
    }
}

#[test]
fn unsorted_files_manifest_is_a_bad_file_list() {
    let (field, message) = bad_field(build_check("unsorted-files-manifest.json"));
    assert_eq!(field, "image.files");
    assert!(message.contains("sorted"), "{message}");
}

#[test]
fn self_listing_manifest_is_a_bad_file_list() {
    let (field, message) = bad_field(build_check("self-listing-manifest.json"));
    assert_eq!(field, "image.files");
    assert!(
        message.contains("/etc/inferloop/manifest.json"),
        "{message}"
    );
}

#[test]
fn baked_model_not_listed_manifest_is_inconsistent() {
    let (field, message) = bad_field(build_check("baked-model-not-listed-manifest.json"));
    assert_eq!(field, "model");
    assert!(message.contains("SmolLM2"), "{message}");
}

#[test]
fn wrong_daemon_sha_manifest_is_inconsistent() {
    let (field, _) = bad_field(build_check("wrong-daemon-sha-manifest.json"));
    assert_eq!(field, "image.daemon");
}

#[test]
fn modes_round_trip_as_four_octal_digits() {
    let loaded = load("good-baked-manifest.json").expect("good");
    let files = &loaded.manifest.image.as_ref().expect("image").files;
    let su = files.iter().find(|e| e.path == "/usr/bin/su").expect("su");
    assert_eq!(su.mode, 0o4755);
    let tmp = files.iter().find(|e| e.path == "/tmp").expect("tmp");
    assert_eq!(tmp.mode, 0o1777);
}
