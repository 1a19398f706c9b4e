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
