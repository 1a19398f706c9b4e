//! RAUC bundles with the real `rauc` and real keys from `scripts/ota-keys.sh`: plain and
//! verity bundles verify against their CA and not against another one, a flipped payload
//! byte is caught, and the binary's `bundle`, `inspect` and `rauc-conf` work end to end.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use inferloop_image::bundle::{self, BundleFormat, BundleRequest, Bundled, Trust};
use inferloop_image::ota::{self, ConfOverrides};
use inferloop_image::tools::{Tool, MKSQUASHFS, RAUC};
use inferloop_image::{ImageError, Progress};

use crate::common::{read, Fixture, EPOCH};
use crate::require;

pub const OPENSSL: Tool = Tool {
    name: "openssl",
    package: "openssl",
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh development CA and signing certificate: each call is another, unrelated CA.
pub struct Keys {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Keys {
    pub fn make(dir: PathBuf) -> Keys {
        let out = Command::new("bash")
            .arg(repo().join("scripts/ota-keys.sh"))
            .arg(&dir)
            .output()
            .expect("run ota-keys.sh");
        assert!(
            out.status.success(),
            "ota-keys.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("NEVER SHIP THEM"),
            "the script warns loudly"
        );
        Keys {
            ca: dir.join("ca.cert.pem"),
            cert: dir.join("signing.cert.pem"),
            key: dir.join("signing.key.pem"),
        }
    }
}

/// A built squashfs image and two unrelated key sets.
struct Setup {
    f: Fixture,
    image_dir: PathBuf,
    keys: Keys,
    other: Keys,
}

fn setup() -> Setup {
    let f = Fixture::new();
    f.build(&f.spec("squashfs"), "out");
    let keys = Keys::make(f.path("keys"));
    let other = Keys::make(f.path("other-keys"));
    Setup {
        image_dir: f.path("out"),
        f,
        keys,
        other,
    }
}

impl Setup {
    fn request<'a>(&'a self, format: BundleFormat, out: &'a Path) -> BundleRequest<'a> {
        BundleRequest {
            image_dir: &self.image_dir,
            spec: None,
            cert: &self.keys.cert,
            key: &self.keys.key,
            keyring: Some(&self.keys.ca),
            format,
            out,
            force: false,
        }
    }

    fn bundle(&self, format: BundleFormat, name: &str) -> Bundled {
        let out = self.f.path(name);
        let started = Instant::now();
        let bundled =
            bundle::create(&self.request(format, &out), &Progress::hidden()).expect("bundle");
        eprintln!(
            "{} bundle: {} bytes in {:.2} s (image {} bytes)",
            format.as_str(),
            bundled.size,
            started.elapsed().as_secs_f64(),
            std::fs::metadata(self.image_dir.join("rootfs.squashfs"))
                .map(|m| m.len())
                .unwrap_or(0)
        );
        bundled
    }
}

/// A RAUC config that sets what `rauc info`/`extract` need: check-purpose=codesign.
fn check_conf(dir: &Path) -> PathBuf {
    let conf = dir.join("check.conf");
    std::fs::write(
        &conf,
        "[system]\ncompatible=inferloop-jetson-orin-nx-16gb\nbootloader=noop\n\n\
         [keyring]\ncheck-purpose=codesign\n",
    )
    .expect("write conf");
    conf
}

#[test]
fn plain_and_verity_bundles_verify_with_their_ca_and_carry_board_and_version() {
    require!(
        "plain_and_verity_bundles_verify_with_their_ca_and_carry_board_and_version",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let manifest: serde_json::Value =
        serde_json::from_slice(&read(&s.image_dir.join("manifest.json"))).expect("json");
    let image = &manifest["artifacts"]["image"];
    for format in [BundleFormat::Verity, BundleFormat::Plain] {
        let name = format!("update-{}.raucb", format.as_str());
        let bundled = s.bundle(format, &name);
        assert_eq!(bundled.path, s.f.path(&name));
        assert_eq!(
            bundled.sha256,
            inferloop_manifest::hash::sha256_bytes(&read(&bundled.path))
        );
        assert_eq!(bundled.size, read(&bundled.path).len() as u64);
        let info = bundle::info(&bundled.path, Trust::Keyring(&s.keys.ca)).expect("verifies");
        assert_eq!(info, bundled.info);
        assert_eq!(info.compatible, "inferloop-jetson-orin-nx-16gb");
        assert_eq!(info.version, "1.2.3");
        assert_eq!(info.format, format.as_str());
        assert_eq!(info.images.len(), 1);
        let img = &info.images[0];
        assert_eq!(img.slot_class, "rootfs");
        assert_eq!(img.filename, "rootfs.squashfs");
        assert_eq!(img.size, image["size"].as_u64());
        assert_eq!(img.sha256.as_deref(), image["sha256"].as_str());
        let signer = info.signer.as_deref().unwrap_or_default();
        assert!(signer.contains("InferLoop development signing"), "{signer}");
        assert!(bundle::is_bundle(&bundled.path).expect("reads"));
        // By content too: the same bytes under another name.
        let renamed = s.f.path(&format!("{name}.bin"));
        std::fs::copy(&bundled.path, &renamed).expect("copy");
        assert!(bundle::is_bundle(&renamed).expect("reads"));
    }
    assert!(!bundle::is_bundle(&s.image_dir.join("rootfs.squashfs")).expect("reads"));
    let leftovers: Vec<_> = std::fs::read_dir(s.f.path(""))
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".bundle-"))
        .collect();
    assert!(leftovers.is_empty(), "staging removed: {leftovers:?}");
}

#[test]
fn another_cas_keyring_is_an_untrusted_signer() {
    require!(
        "another_cas_keyring_is_an_untrusted_signer",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let bundled = s.bundle(BundleFormat::Verity, "update.raucb");
    match bundle::info(&bundled.path, Trust::Keyring(&s.other.ca)) {
        Err(ImageError::BundleVerify { path, message }) => {
            assert_eq!(path, bundled.path);
            assert!(
                message.contains("unable to get local issuer certificate"),
                "{message}"
            );
        }
        other => panic!("expected BundleVerify, got {other:?}"),
    }
    // Signing with a certificate the given keyring does not trust fails before any file.
    let out = s.f.path("wrong-ca.raucb");
    let req = BundleRequest {
        keyring: Some(&s.other.ca),
        ..s.request(BundleFormat::Verity, &out)
    };
    match bundle::create(&req, &Progress::hidden()) {
        Err(ImageError::ToolFailed { tool, stderr, .. }) => {
            assert_eq!(tool, "rauc");
            assert!(stderr.contains("signature verification failed"), "{stderr}");
        }
        other => panic!("expected ToolFailed, got {other:?}"),
    }
    assert!(!out.exists());
}

/// `rauc info` checks a verity bundle's signed manifest only; `rauc extract` reads the
/// payload through the verity hash tree and must catch a flipped byte. A plain bundle's
/// signature covers the whole file, so `rauc info` catches it there.
#[test]
fn flipped_payload_byte_is_caught_by_extract_for_verity_and_by_info_for_plain() {
    require!(
        "flipped_payload_byte_is_caught_by_extract_for_verity_and_by_info_for_plain",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let conf = check_conf(s.f.path("").as_path());
    let extract = |bundle: &Path, into: &str| {
        Command::new("rauc")
            .arg("--conf")
            .arg(&conf)
            .arg("extract")
            .arg("--keyring")
            .arg(&s.keys.ca)
            .arg(bundle)
            .arg(s.f.path(into))
            .output()
            .expect("run rauc")
    };
    let verity = s.bundle(BundleFormat::Verity, "verity.raucb");
    let good = extract(&verity.path, "good");
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert_eq!(
        read(&s.f.path("good/rootfs.squashfs")),
        read(&s.image_dir.join("rootfs.squashfs")),
        "the bundle carries the built image byte for byte"
    );

    let flip = |path: &Path| {
        let mut bytes = read(path);
        // Inside the payload: the image starts right after the bundle's squashfs header.
        bytes[2000] ^= 0x01;
        std::fs::write(path, bytes).expect("write");
    };
    flip(&verity.path);
    let bad = extract(&verity.path, "bad");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("bundle payload is corrupted"), "{stderr}");

    let plain = s.bundle(BundleFormat::Plain, "plain.raucb");
    flip(&plain.path);
    assert!(matches!(
        bundle::info(&plain.path, Trust::Keyring(&s.keys.ca)),
        Err(ImageError::BundleVerify { .. })
    ));
}

#[test]
fn existing_bundle_is_kept_unless_forced() {
    require!(
        "existing_bundle_is_kept_unless_forced",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let out = s.f.path("update.raucb");
    std::fs::write(&out, b"an older bundle").expect("write");
    match bundle::create(&s.request(BundleFormat::Plain, &out), &Progress::hidden()) {
        Err(ImageError::BundleExists { path }) => assert_eq!(path, out),
        other => panic!("expected BundleExists, got {other:?}"),
    }
    assert_eq!(read(&out), b"an older bundle");
    let forced = BundleRequest {
        force: true,
        ..s.request(BundleFormat::Plain, &out)
    };
    let bundled = bundle::create(&forced, &Progress::hidden()).expect("replaced");
    assert_eq!(bundled.info.format, "plain");
}

#[test]
fn image_changed_since_its_build_is_not_bundled() {
    require!(
        "image_changed_since_its_build_is_not_bundled",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let image = s.image_dir.join("rootfs.squashfs");
    let mut bytes = read(&image);
    bytes[100] ^= 0xff;
    std::fs::write(&image, bytes).expect("write");
    let out = s.f.path("update.raucb");
    assert!(matches!(
        bundle::create(&s.request(BundleFormat::Verity, &out), &Progress::hidden()),
        Err(ImageError::BundleInput { .. })
    ));
    assert!(!out.exists());
}

/// `rauc info` loads the whole system.conf (unknown keys and groups are errors) and
/// verifies with its [keyring]: the rendered config must pass both.
#[test]
fn rauc_accepts_the_rendered_system_conf_and_verifies_with_its_keyring() {
    require!(
        "rauc_accepts_the_rendered_system_conf_and_verifies_with_its_keyring",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let bundled = s.bundle(BundleFormat::Verity, "update.raucb");
    let board = inferloop_board::profile::find("jetson-orin-nx-16gb").expect("board");
    let rauc_info = |keyring: &Path| {
        let conf = ota::system_conf(
            board,
            &ConfOverrides {
                slot_devices: [
                    ("rootfs.0".to_string(), "/dev/loop100".to_string()),
                    ("rootfs.1".to_string(), "/dev/loop101".to_string()),
                ]
                .into(),
                keyring: Some(keyring.display().to_string()),
                data_dir: Some(s.f.path("rauc-data").display().to_string()),
            },
        )
        .expect("renders");
        let path = s.f.path("system.conf");
        std::fs::write(&path, conf).expect("write");
        Command::new("rauc")
            .arg("--conf")
            .arg(&path)
            .arg("info")
            .arg(&bundled.path)
            .output()
            .expect("run rauc")
    };
    let ok = rauc_info(&s.keys.ca);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("inferloop-jetson-orin-nx-16gb"));
    let untrusted = rauc_info(&s.other.ca);
    assert!(!untrusted.status.success());
    assert!(
        String::from_utf8_lossy(&untrusted.stderr).contains("unable to get local issuer"),
        "{}",
        String::from_utf8_lossy(&untrusted.stderr)
    );
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inferloop-image"))
}

#[test]
fn bundle_inspect_and_rauc_conf_through_the_binary() {
    require!(
        "bundle_inspect_and_rauc_conf_through_the_binary",
        MKSQUASHFS,
        RAUC,
        OPENSSL
    );
    let s = setup();
    let out = s.f.path("bundles/update.raucb");
    let run = |extra: &[&str]| {
        bin()
            .args(["--quiet", "bundle", "--spec"])
            .arg(s.f.path("image.toml"))
            .arg("--image")
            .arg(&s.image_dir)
            .arg("--cert")
            .arg(&s.keys.cert)
            .arg("--key")
            .arg(&s.keys.key)
            .arg("--keyring")
            .arg(&s.keys.ca)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .env("SOURCE_DATE_EPOCH", EPOCH.to_string())
            .output()
            .expect("run")
    };
    let made = run(&[]);
    let stdout = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let sha = inferloop_manifest::hash::sha256_bytes(&read(&out));
    assert!(
        stdout.starts_with(&format!("{sha}  {}", out.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("bundle: {} bytes, verity", read(&out).len())),
        "{stdout}"
    );
    let again = run(&[]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists; remove it or pass --force"));
    assert!(run(&["--force", "--format", "plain"]).status.success());

    let inspect = |args: &[&str]| {
        bin()
            .arg("inspect")
            .arg(&out)
            .args(args)
            .output()
            .expect("run")
    };
    let shown = inspect(&["--keyring", &s.keys.ca.display().to_string()]);
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    for needle in [
        "compatible  inferloop-jetson-orin-nx-16gb",
        "version     1.2.3",
        "format      plain",
        "image       rootfs  rootfs.squashfs  ",
        "signer      O = InferLoop development, CN = InferLoop development signing",
        "issuer      O = InferLoop development, CN = InferLoop development CA",
    ] {
        assert!(table.contains(needle), "{needle:?} missing from:\n{table}");
    }
    let untrusted = inspect(&["--keyring", &s.other.ca.display().to_string()]);
    assert_eq!(untrusted.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&untrusted.stderr).contains("does not verify"));
    let no_keyring = inspect(&[]);
    assert_eq!(no_keyring.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_keyring.stderr).contains("--keyring"));
    let unchecked = inspect(&["--no-verify"]);
    assert!(unchecked.status.success());
    assert!(String::from_utf8_lossy(&unchecked.stdout).contains("NOT VERIFIED"));

    let conf_path = s.f.path("system.conf");
    let conf = bin()
        .args(["rauc-conf", "--board", "jetson-orin-nx-16gb"])
        .args([
            "--slot-device",
            "rootfs.1=/dev/loop9",
            "--data-dir",
            "/tmp/rauc",
        ])
        .arg("--out")
        .arg(&conf_path)
        .output()
        .expect("run");
    assert!(
        conf.status.success(),
        "{}",
        String::from_utf8_lossy(&conf.stderr)
    );
    let text = String::from_utf8_lossy(&read(&conf_path)).into_owned();
    assert!(
        text.contains("[slot.rootfs.1]\ndevice=/dev/loop9\n"),
        "{text}"
    );
    assert!(text.contains("data-directory=/tmp/rauc\n"), "{text}");
    let generic = bin()
        .args(["rauc-conf", "--board", "x86_64-cpu"])
        .output()
        .expect("run");
    assert_eq!(generic.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&generic.stderr).contains("no [ota] table"));
}
