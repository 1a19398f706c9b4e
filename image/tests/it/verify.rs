//! verify: a good image passes; a flipped byte, an altered file, a wrong board or a broken
//! manifest is named.

use std::path::Path;

use inferloop_image::tools::{FSCK_EROFS, MKFS_EROFS, MKSQUASHFS, UNSQUASHFS};
use inferloop_image::verify::{unpack, Mismatch};
use inferloop_image::{pack, tree, ImageError, Progress, Subject};
use inferloop_manifest::{ImageFormat, IntegrityError};

use crate::common::{read, Fixture, EPOCH};
use crate::require;

fn verify_image(
    image: &Path,
    manifest: Option<&Path>,
) -> Result<inferloop_image::Report, ImageError> {
    inferloop_image::verify(
        &Subject::Image(image.to_path_buf()),
        manifest,
        None,
        &Progress::hidden(),
    )
}

fn good_image_verifies(format: &str) {
    let f = Fixture::new();
    let built = f.build(&f.spec(format), "out");
    let report = verify_image(&built.image, None).expect("verify");
    assert!(report.ok(), "{:#?}", report.mismatches);
    assert!(report.image_hash_checked);
    assert!(report.entries_checked > 10);
}

#[test]
fn good_squashfs_image_unpacks_to_exactly_its_manifest() {
    require!(
        "good_squashfs_image_unpacks_to_exactly_its_manifest",
        MKSQUASHFS,
        UNSQUASHFS
    );
    good_image_verifies("squashfs");
}

/// Regression: fsck.erofs 1.5 preserving owners chowns after chmod, which drops setuid.
#[test]
fn good_erofs_image_unpacks_to_exactly_its_manifest_setuid_included() {
    require!(
        "good_erofs_image_unpacks_to_exactly_its_manifest_setuid_included",
        MKFS_EROFS,
        FSCK_EROFS
    );
    good_image_verifies("erofs");
}

fn flipped_byte_is_named(format: &str) {
    let f = Fixture::new();
    let built = f.build(&f.spec(format), "out");
    let mut bytes = read(&built.image);
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&built.image, bytes).expect("write");
    let report = verify_image(&built.image, None).expect("verify");
    assert!(!report.ok());
    let named = report.mismatches.iter().any(|m| {
        matches!(m, Mismatch::ImageHash { file, .. } if file == &built.image)
            && m.to_string().contains(format!("rootfs.{format}").as_str())
    });
    assert!(named, "{:#?}", report.mismatches);
}

#[test]
fn flipped_byte_in_a_squashfs_image_is_named() {
    require!(
        "flipped_byte_in_a_squashfs_image_is_named",
        MKSQUASHFS,
        UNSQUASHFS
    );
    flipped_byte_is_named("squashfs");
}

#[test]
fn flipped_byte_in_an_erofs_image_is_named() {
    require!(
        "flipped_byte_in_an_erofs_image_is_named",
        MKFS_EROFS,
        FSCK_EROFS
    );
    flipped_byte_is_named("erofs");
}

/// Unpack, change one file, repack with the same options, keep the old manifest.
fn altered_file_is_named(format: ImageFormat) {
    let f = Fixture::new();
    let built = f.build(&f.spec(format.as_str()), "out");
    let tree_dir = f.path("altered");
    let mut problems = Vec::new();
    unpack(format, &built.image, &tree_dir, &mut problems).expect("unpack");
    assert!(problems.is_empty(), "{problems:?}");
    // Same length, other bytes: only the hash can tell.
    std::fs::write(tree_dir.join("etc/hostname"), b"BASE\n").expect("write");
    tree::set_mode(&tree_dir.join("usr/bin/tool"), 0o777).expect("chmod");
    pack::image(
        format,
        &tree_dir,
        &built.image,
        EPOCH,
        b"seed",
        None,
        &Progress::hidden(),
    )
    .expect("repack");

    let report = verify_image(&built.image, None).expect("verify");
    let mut paths: Vec<&str> = report.mismatches.iter().filter_map(|m| m.path()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/etc/hostname", "/usr/bin/tool"],
        "{:#?}",
        report.mismatches
    );
    assert!(report
        .mismatches
        .iter()
        .any(|m| matches!(m, Mismatch::Hash { path, .. } if path == "/etc/hostname")));
    assert!(
        report.mismatches.iter().any(|m| matches!(
            m,
            Mismatch::Mode { path, expected: 0o755, actual: 0o777 } if path == "/usr/bin/tool"
        )),
        "{:#?}",
        report.mismatches
    );
    assert!(report
        .mismatches
        .iter()
        .any(|m| matches!(m, Mismatch::ImageHash { .. })));
}

#[test]
fn altered_file_in_a_rebuilt_squashfs_image_is_named() {
    require!(
        "altered_file_in_a_rebuilt_squashfs_image_is_named",
        MKSQUASHFS,
        UNSQUASHFS
    );
    altered_file_is_named(ImageFormat::Squashfs);
}

#[test]
fn altered_file_in_a_rebuilt_erofs_image_is_named() {
    require!(
        "altered_file_in_a_rebuilt_erofs_image_is_named",
        MKFS_EROFS,
        FSCK_EROFS
    );
    altered_file_is_named(ImageFormat::Erofs);
}

#[test]
fn unknown_field_in_the_manifest_beside_is_rejected() {
    require!(
        "unknown_field_in_the_manifest_beside_is_rejected",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let text = String::from_utf8(read(&built.manifest_path)).expect("utf8");
    let text = text.replacen(
        "\"schema\": 1,",
        "\"schema\": 1,\n  \"signature\": \"none\",",
        1,
    );
    std::fs::write(&built.manifest_path, text).expect("write");
    match verify_image(&built.image, None) {
        Err(ImageError::Manifest(IntegrityError::ManifestParse { message, .. })) => {
            assert!(message.contains("signature"), "{message}")
        }
        other => panic!("expected ManifestParse, got {other:?}"),
    }
}

#[test]
fn image_for_another_board_is_incompatible() {
    require!("image_for_another_board_is_incompatible", MKSQUASHFS);
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let result = inferloop_image::verify(
        &Subject::Image(built.image.clone()),
        None,
        Some("jetson-agx-orin-64gb"),
        &Progress::hidden(),
    );
    assert!(matches!(
        result,
        Err(ImageError::Manifest(IntegrityError::Incompatible { .. }))
    ));
}

#[test]
fn edited_manifest_beside_no_longer_matches_the_baked_copy() {
    require!(
        "edited_manifest_beside_no_longer_matches_the_baked_copy",
        MKSQUASHFS,
        UNSQUASHFS
    );
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let text = String::from_utf8(read(&built.manifest_path)).expect("utf8");
    std::fs::write(&built.manifest_path, text.replace("\"1.2.3\"", "\"9.9.9\"")).expect("write");
    let report = verify_image(&built.image, None).expect("verify");
    assert_eq!(report.mismatches.len(), 1, "{:#?}", report.mismatches);
    assert!(matches!(
        report.mismatches[0],
        Mismatch::BakedManifest { .. }
    ));
}

#[test]
fn baked_copy_checks_the_files_but_not_the_image_hash() {
    require!(
        "baked_copy_checks_the_files_but_not_the_image_hash",
        MKSQUASHFS,
        UNSQUASHFS
    );
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let baked = f.path("baked.json");
    std::fs::write(&baked, built.manifest.baked().to_json_bytes()).expect("write");
    let report = verify_image(&built.image, Some(&baked)).expect("verify");
    assert!(report.ok(), "{:#?}", report.mismatches);
    assert!(!report.image_hash_checked);
}

#[test]
fn mounted_root_is_checked_against_its_baked_manifest() {
    require!(
        "mounted_root_is_checked_against_its_baked_manifest",
        MKSQUASHFS,
        UNSQUASHFS
    );
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    let root = f.path("root");
    let mut problems = Vec::new();
    unpack(ImageFormat::Squashfs, &built.image, &root, &mut problems).expect("unpack");
    // Extra entries (a live root has /proc, /run, …) are not mismatches for a root.
    std::fs::write(root.join("run/extra"), b"x").expect("write");
    let check = || {
        inferloop_image::verify(
            &Subject::Root(root.clone()),
            None,
            None,
            &Progress::hidden(),
        )
        .expect("verify")
    };
    assert!(check().ok(), "{:#?}", check().mismatches);
    std::fs::remove_file(root.join("usr/bin/su")).expect("rm");
    let report = check();
    assert_eq!(
        report.mismatches,
        [Mismatch::Missing {
            path: "/usr/bin/su".into()
        }]
    );
}

#[test]
fn tarball_base_gives_the_same_image_as_the_directory_base() {
    require!(
        "tarball_base_gives_the_same_image_as_the_directory_base",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let from_dir = f.build(&f.spec("squashfs"), "out-dir");
    let nodes = tree::walk(&f.path("base"), tree::Specials::Refuse).expect("walk");
    pack::tarball(&nodes, &f.path("base.tar.zst"), 1, &Progress::hidden()).expect("tar");
    let text = f
        .spec_text(
            "squashfs",
            &Fixture::mounted_model(),
            "port = 8080\nslots = 2",
        )
        .replace("base = \"base\"", "base = \"base.tar.zst\"");
    let spec = inferloop_image::Spec::load(&f.write_spec(&text)).expect("spec");
    let from_tar = f.build(&spec, "out-tar");
    assert!(read(&from_dir.image) == read(&from_tar.image));
    assert!(read(&from_dir.manifest_path) == read(&from_tar.manifest_path));
}
