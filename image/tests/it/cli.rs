//! The binary end to end: build, inspect, verify (exit 0, then 1 after tampering), and a
//! bad spec (exit 2).

use std::process::Command;

use inferloop_image::tools::{MKSQUASHFS, UNSQUASHFS};

use crate::common::{Fixture, EPOCH};
use crate::require;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inferloop-image"))
}

#[test]
fn build_inspect_verify_and_tamper_through_the_binary() {
    require!(
        "build_inspect_verify_and_tamper_through_the_binary",
        MKSQUASHFS,
        UNSQUASHFS
    );
    let f = Fixture::new();
    let spec = f.write_spec(&f.spec_text("squashfs", &Fixture::mounted_model(), "port = 8080"));
    let out = f.path("out");
    let build = bin()
        .args(["--quiet", "build", "--spec"])
        .arg(&spec)
        .arg("--out")
        .arg(&out)
        .env("SOURCE_DATE_EPOCH", EPOCH.to_string())
        .output()
        .expect("run");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let stdout = String::from_utf8_lossy(&build.stdout);
    assert!(
        stdout.contains("rootfs.squashfs") && stdout.contains("manifest.json"),
        "{stdout}"
    );

    let inspect = bin()
        .arg("inspect")
        .arg(out.join("rootfs.squashfs"))
        .output()
        .expect("run");
    let table = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success());
    for needle in [
        "jetson-orin-nx-16gb",
        "2023-11-14T22:13:20Z",
        "mounted",
        "4755",
        "/usr/bin/su",
        "/bin -> usr/bin",
    ] {
        assert!(table.contains(needle), "{needle} missing from:\n{table}");
    }

    let image = out.join("rootfs.squashfs");
    let verify = || {
        bin()
            .args(["--quiet", "verify", "--image"])
            .arg(&image)
            .output()
            .expect("run")
    };
    let ok = verify();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    // The manifest alone names its image.
    let by_manifest = bin()
        .args(["--quiet", "verify", "--manifest"])
        .arg(out.join("manifest.json"))
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&by_manifest.stdout);
    assert_eq!(by_manifest.status.code(), Some(0), "{text}");
    assert!(text.starts_with("ok: image hash and "), "{text}");

    let mut bytes = std::fs::read(&image).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&image, bytes).expect("write");
    let bad = verify();
    let report = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{report}");
    assert!(
        report.contains("MISMATCH image") && report.contains("rootfs.squashfs"),
        "{report}"
    );
}

#[test]
fn bad_spec_exits_2_with_the_reason() {
    let f = Fixture::new();
    let spec = f.write_spec(
        &f.spec_text("squashfs", &Fixture::mounted_model(), "")
            .replace("jetson-orin-nx-16gb", "no-such-board"),
    );
    let out = bin()
        .args(["build", "--spec"])
        .arg(&spec)
        .args(["--out", "/nonexistent/never-created"])
        .env("SOURCE_DATE_EPOCH", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown board `no-such-board`"), "{stderr}");
}
