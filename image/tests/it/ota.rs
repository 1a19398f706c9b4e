//! `[ota]` in a spec: the image carries RAUC's config, the keyring and the qualification
//! binary, listed in its manifest; without `[ota]` it carries none of them.

use std::path::{Path, PathBuf};

use inferloop_image::ota::{KEYRING_PATH, QUAL_PATH, SYSTEM_CONF_PATH};
use inferloop_image::tools::{MKSQUASHFS, UNSQUASHFS};
use inferloop_image::{ImageError, Progress, Spec, Subject};

use crate::bundle::{Keys, OPENSSL};
use crate::common::{fake_daemon, make_base, read, Fixture};
use crate::require;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fixture's spec plus an `[ota]` table.
fn ota_spec(f: &Fixture, ota: &str) -> Result<Spec, ImageError> {
    let text = format!(
        "{}\n[ota]\n{ota}\n",
        f.spec_text("squashfs", &Fixture::mounted_model(), "port = 8080")
    );
    Spec::load(&f.write_spec(&text))
}

fn entry<'a>(
    built: &'a inferloop_image::Built,
    path: &str,
) -> Option<&'a inferloop_manifest::FileEntry> {
    built
        .manifest
        .image
        .as_ref()
        .and_then(|i| i.files.iter().find(|e| e.path == path))
}

#[test]
fn ota_table_installs_rauc_conf_keyring_and_qual_listed_and_verifiable() {
    require!(
        "ota_table_installs_rauc_conf_keyring_and_qual_listed_and_verifiable",
        MKSQUASHFS,
        UNSQUASHFS,
        OPENSSL
    );
    let f = Fixture::new();
    let keys = Keys::make(f.path("keys"));
    fake_daemon(&f.path("inferloop-qual"), b"qual");
    let spec = ota_spec(
        &f,
        "keyring = \"keys/ca.cert.pem\"\nqual = \"inferloop-qual\"",
    )
    .expect("valid spec");
    let built = f.build(&spec, "out");
    let sha = |bytes: &[u8]| Some(inferloop_manifest::hash::sha256_bytes(bytes));

    let conf = inferloop_image::ota::system_conf(spec.board, &Default::default()).expect("conf");
    let e = entry(&built, SYSTEM_CONF_PATH).expect("system.conf listed");
    assert_eq!((e.mode, e.sha256.clone()), (0o644, sha(conf.as_bytes())));
    let e = entry(&built, KEYRING_PATH).expect("keyring listed");
    assert_eq!((e.mode, e.sha256.clone()), (0o644, sha(&read(&keys.ca))));
    let e = entry(&built, QUAL_PATH).expect("qual listed");
    assert_eq!(
        (e.mode, e.sha256.clone()),
        (0o755, sha(&read(&f.path("inferloop-qual"))))
    );

    let report = inferloop_image::verify(
        &Subject::Image(built.image.clone()),
        None,
        None,
        &Progress::hidden(),
    )
    .expect("verify");
    assert!(report.ok(), "{:#?}", report.mismatches);

    // Reproducible with [ota] too.
    let again = f.build(&spec, "out2");
    assert_eq!(read(&built.image), read(&again.image));
}

#[test]
fn without_ota_the_image_has_no_rauc_files() {
    require!("without_ota_the_image_has_no_rauc_files", MKSQUASHFS);
    let f = Fixture::new();
    let built = f.build(&f.spec("squashfs"), "out");
    for path in [SYSTEM_CONF_PATH, KEYRING_PATH, QUAL_PATH] {
        assert!(entry(&built, path).is_none(), "{path}");
    }
}

#[test]
fn ota_inputs_are_checked_before_building() {
    let f = Fixture::new();
    crate::common::write(
        &f.path("ca.cert.pem"),
        b"-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        0o644,
    );
    crate::common::write(
        &f.path("signing.key.pem"),
        b"-----BEGIN PRIVATE KEY-----\nMIG\n-----END PRIVATE KEY-----\n",
        0o600,
    );
    let mut x86 = inferloop_image::elf::fake_header(0x3e);
    x86.extend_from_slice(b"host qual");
    crate::common::write(&f.path("qual-x86"), &x86, 0o755);

    match ota_spec(&f, "keyring = \"signing.key.pem\"") {
        Err(ImageError::Certificate { message, .. }) => {
            assert!(message.contains("private key"), "{message}")
        }
        other => panic!("expected Certificate, got {other:?}"),
    }
    match ota_spec(&f, "keyring = \"ca.cert.pem\"\nqual = \"qual-x86\"") {
        Err(ImageError::QualBinary { message, .. }) => {
            assert!(message.contains("x86_64"), "{message}")
        }
        other => panic!("expected QualBinary, got {other:?}"),
    }
    assert!(matches!(
        ota_spec(&f, "keyring = \"missing.pem\""),
        Err(ImageError::InputMissing {
            field: "ota.keyring",
            ..
        })
    ));
    assert!(matches!(
        ota_spec(&f, "keyring = \"ca.cert.pem\"\nslots = 2"),
        Err(ImageError::SpecParse { .. })
    ));
    let generic = format!(
        "{}\n[ota]\nkeyring = \"ca.cert.pem\"\n",
        f.spec_text("squashfs", &Fixture::mounted_model(), "")
            .replace("jetson-orin-nx-16gb", "aarch64-cpu")
            .replace("memory_max = \"12G\"", "memory_max = \"50%\"")
    );
    assert!(matches!(
        Spec::load(&f.write_spec(&generic)),
        Err(ImageError::NoOta { ref board }) if board == "aarch64-cpu"
    ));
    assert!(ota_spec(&f, "keyring = \"ca.cert.pem\"").is_ok());
}

/// The OTA example is the main example plus an `[ota]` table, so the two cannot drift.
#[test]
fn ota_example_spec_is_the_example_plus_an_ota_table() {
    let main =
        String::from_utf8(read(&repo().join("image/examples/orin-nx-16gb.toml"))).expect("utf-8");
    let ota = String::from_utf8(read(&repo().join("image/examples/orin-nx-16gb-ota.toml")))
        .expect("utf-8");
    let body = |t: &str| -> Vec<String> {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    let (main_body, ota_body) = (body(&main), body(&ota));
    let table = ota_body
        .iter()
        .position(|l| l == "[ota]")
        .expect("an [ota] table");
    assert_eq!(
        ota_body[..table],
        main_body[..],
        "settings before [ota] differ"
    );
    assert_eq!(
        ota_body[table + 1..],
        ["keyring = \"../../out/ota-keys/ca.cert.pem\"".to_string()]
    );

    // It loads where its relative paths exist.
    let f = Fixture::new();
    let origin = f.path("image/examples/orin-nx-16gb-ota.toml");
    std::fs::create_dir_all(f.path("image/examples")).expect("mkdir");
    fake_daemon(
        &f.path("target/aarch64-unknown-linux-gnu/release/inferloopd"),
        b"",
    );
    make_base(&f.path("out/base-rootfs"));
    std::os::unix::fs::symlink(repo().join("rootfs"), f.path("rootfs")).expect("symlink");
    crate::common::write(
        &f.path("models/SmolLM2-135M-Instruct.Q8_0.gguf"),
        b"stand-in",
        0o644,
    );
    crate::common::write(&f.path("out/kernels/ptx/rope.ptx"), b"// ptx", 0o644);
    crate::common::write(
        &f.path("out/ota-keys/ca.cert.pem"),
        b"-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        0o644,
    );
    let spec = Spec::from_toml(&ota, &origin).expect("OTA example spec");
    assert!(spec.ota.is_some());
}

#[test]
fn ota_server_renders_the_fleet_agent_config_and_needs_a_server_for_a_token() {
    require!(
        "ota_server_renders_the_fleet_agent_config_and_needs_a_server_for_a_token",
        MKSQUASHFS,
        OPENSSL
    );
    let f = Fixture::new();
    Keys::make(f.path("keys"));
    let spec = ota_spec(
        &f,
        "keyring = \"keys/ca.cert.pem\"\nserver = \"https://updates.example.com\"\n\
         tenant = \"DEFAULT\"\ntoken_file = \"/data/ota/target-token\"",
    )
    .expect("valid spec");
    let agent = spec
        .ota
        .as_ref()
        .and_then(|o| o.fleet.clone())
        .expect("agent");
    let built = f.build(&spec, "out");
    let e = entry(&built, inferloop_image::ota::AGENT_CONF_PATH).expect("ota.toml listed");
    assert_eq!(
        e.sha256.clone(),
        Some(inferloop_manifest::hash::sha256_bytes(
            agent.render().as_bytes()
        ))
    );
    assert!(agent
        .render()
        .contains("target_token_file = \"/data/ota/target-token\""));

    for (bad, field) in [
        (
            "keyring = \"keys/ca.cert.pem\"\ntoken_file = \"/data/t\"",
            "ota.server",
        ),
        (
            "keyring = \"keys/ca.cert.pem\"\nserver = \"https://x\"\ntoken_file = \"/etc/t\"",
            "ota.server",
        ),
    ] {
        match ota_spec(&f, bad) {
            Err(ImageError::SpecInvalid { field: got, .. }) => assert_eq!(got, field, "{bad}"),
            other => panic!("{bad}: expected SpecInvalid, got {other:?}"),
        }
    }
}
