//! `role = "gateway"`: spec errors name the field; a real build installs vllm-router from
//! real wheels into a venv for the image's Python, with its unit and env file; a worker
//! image is what it was.

use std::path::{Path, PathBuf};
use std::process::Command;

use inferloop_image::gateway::{
    RouterSource, API_KEY_DROPIN_PATH, API_KEY_LAUNCHER_PATH, DAEMON_WANTS, ENV_PATH, ROUTER_BIN,
    ROUTER_PREFIX, ROUTER_VERSION, UNIT, UNIT_PATH, UNIT_WANTS_PATH,
};
use inferloop_image::tools::MKSQUASHFS;
use inferloop_image::{ImageError, Spec};
use inferloop_manifest::FileKind;

use crate::common::{read, write, Fixture};
use crate::require;

const X86_WHEEL: &str = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fixture with an x86-64 daemon on the x86-64 CPU board.
fn x86_fixture() -> Fixture {
    let f = Fixture::new();
    let mut bytes = inferloop_image::elf::fake_header(0x3e);
    bytes.extend_from_slice(b"fake x86-64 inferloopd");
    write(&f.path("inferloopd"), &bytes, 0o755);
    f
}

/// The fixture's spec as a gateway: `role` on top, `[gateway]` at the end.
fn gateway_text(f: &Fixture, board: &str, gateway: &str) -> String {
    let worker = f
        .spec_text("squashfs", &Fixture::mounted_model(), "port = 8081")
        .replace("jetson-orin-nx-16gb", board);
    format!("role = \"gateway\"\nsquashfs_compression = \"lz4\"\n{worker}\n[gateway]\n{gateway}\n")
}

/// A wheels directory holding files by these names (the spec reads only the names).
fn named_wheels(f: &Fixture, names: &[&str]) -> String {
    std::fs::create_dir_all(f.path("wheels")).expect("mkdir");
    for n in names {
        write(&f.path(&format!("wheels/{n}")), b"", 0o644);
    }
    "wheels".into()
}

fn spec_error(f: &Fixture, text: &str) -> ImageError {
    Spec::load(&f.write_spec(text)).expect_err("invalid spec")
}

fn assert_invalid(err: ImageError, want_field: &str, says: &str) {
    match &err {
        ImageError::SpecInvalid { field, message } => {
            assert_eq!(*field, want_field, "{err}");
            assert!(message.contains(says), "{err}");
        }
        other => panic!("expected SpecInvalid {want_field}, got {other:?}"),
    }
}

#[test]
fn gateway_spec_errors_name_the_field() {
    let f = x86_fixture();
    let wheels = named_wheels(&f, &[X86_WHEEL]);
    let good = format!("workers = [\"http://box-1.lan:8080\"]\nwheels = \"{wheels}\"");
    let spec =
        Spec::load(&f.write_spec(&gateway_text(&f, "x86_64-cpu", &good))).expect("good gateway");
    let gw = spec.gateway.as_ref().expect("gateway");
    assert_eq!(spec.role(), inferloop_image::spec::Role::Gateway);
    assert_eq!(gw.policy.as_str(), "cache_aware");
    assert_eq!(
        (gw.host.as_str(), gw.port, gw.serve),
        ("0.0.0.0", 8080, false)
    );
    assert_eq!(gw.source, RouterSource::Wheels(f.path("wheels")));

    let with = |extra: &str| gateway_text(&f, "x86_64-cpu", &format!("{good}\n{extra}"));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            gateway_text(&f, "x86_64-cpu", &format!("wheels = \"{wheels}\"")),
            "gateway.workers",
            "must list the boxes",
        ),
        (
            gateway_text(
                &f,
                "x86_64-cpu",
                &format!("workers = []\nwheels = \"{wheels}\""),
            ),
            "gateway.workers",
            "must list the boxes",
        ),
        (
            gateway_text(
                &f,
                "x86_64-cpu",
                &format!("workers = [\"box-1.lan:8080\"]\nwheels = \"{wheels}\""),
            ),
            "gateway.workers",
            "\"box-1.lan:8080\" must start with http://",
        ),
        (
            gateway_text(
                &f,
                "x86_64-cpu",
                &format!("workers = [\"http://box-1.lan:8080/\"]\nwheels = \"{wheels}\""),
            ),
            "gateway.workers",
            "no path",
        ),
        (
            gateway_text(
                &f,
                "x86_64-cpu",
                &format!("workers = [\"http://a:1\", \"http://a:1\"]\nwheels = \"{wheels}\""),
            ),
            "gateway.workers",
            "listed twice",
        ),
        (
            with("policy = \"fastest\""),
            "gateway.policy",
            "cache_aware, kv_aware, power_of_two or round_robin",
        ),
        (with("host = \"gateway.lan\""), "gateway.host", "IP address"),
        (with("port = 0"), "gateway.port", "1 to 65535"),
        (
            with("serve = true\nport = 8081"),
            "gateway.port",
            "daemon's port",
        ),
        (
            with("api_key_file = \"/etc/inferloop/key\""),
            "gateway.api_key_file",
            "under /data/",
        ),
        (
            with("api_key_file = \"/data/../etc/key\""),
            "gateway.api_key_file",
            "normalised",
        ),
        (
            gateway_text(&f, "x86_64-cpu", "workers = [\"http://a:1\"]"),
            "gateway.wheels",
            "or `venv` one built beforehand",
        ),
        (
            gateway_text(
                &f,
                "x86_64-cpu",
                "workers = [\"http://a:1\"]\nwheels = \"model.gguf\"",
            ),
            "gateway.wheels",
            "must be a directory",
        ),
        (
            format!(
                "{}\n[gateway]\n{good}\n",
                f.spec_text("squashfs", &Fixture::mounted_model(), "")
            ),
            "gateway",
            "role = \"gateway\" only",
        ),
        (
            format!(
                "role = \"gateway\"\n{}",
                f.spec_text("squashfs", &Fixture::mounted_model(), "")
            ),
            "role",
            "needs a [gateway] table",
        ),
    ];
    for (text, field, says) in cases {
        assert_invalid(spec_error(&f, &text), field, says);
    }

    match spec_error(
        &f,
        &gateway_text(
            &f,
            "x86_64-cpu",
            "workers = [\"http://a:1\"]\nwheels = \"nowhere\"",
        ),
    ) {
        ImageError::InputMissing {
            field: "gateway.wheels",
            path,
            ..
        } => assert_eq!(path, f.path("nowhere")),
        other => panic!("expected InputMissing gateway.wheels, got {other:?}"),
    }
    std::fs::create_dir_all(f.path("empty")).expect("mkdir");
    assert_invalid(
        spec_error(
            &f,
            &gateway_text(
                &f,
                "x86_64-cpu",
                "workers = [\"http://a:1\"]\nwheels = \"empty\"",
            ),
        ),
        "gateway.wheels",
        "holds no vllm-router 0.1.17 wheel",
    );
    // A misspelt key or role is a parse error, not a silent default.
    for text in [
        with("wheel = \"w\""),
        gateway_text(&f, "x86_64-cpu", &good).replace("role = \"gateway\"", "role = \"gatway\""),
    ] {
        assert!(
            matches!(spec_error(&f, &text), ImageError::SpecParse { .. }),
            "{text}"
        );
    }
}

/// A fake venv with vllm-router's dist-info, its native core for `machine` and its script.
fn fake_venv(f: &Fixture, name: &str, machine: u16, version: &str, cfg: &str) -> String {
    let site = format!("{name}/lib/python3.11/site-packages");
    write(
        &f.path(&format!("{name}/pyvenv.cfg")),
        cfg.as_bytes(),
        0o644,
    );
    std::fs::create_dir_all(f.path(&format!("{site}/vllm_router-{version}.dist-info")))
        .expect("mkdir");
    write(
        &f.path(&format!("{site}/vllm_router_rs.abi3.so")),
        &inferloop_image::elf::fake_header(machine),
        0o755,
    );
    write(
        &f.path(&format!("{name}/bin/vllm-router")),
        b"#!/x/bin/python\n",
        0o755,
    );
    name.into()
}

#[test]
fn gateway_venv_is_checked_before_building() {
    let f = x86_fixture();
    let plain = "home = /usr/bin\ninclude-system-site-packages = false\n";
    let good = fake_venv(&f, "good", 0x3e, ROUTER_VERSION, plain);
    let spec_for = |venv: &str| {
        gateway_text(
            &f,
            "x86_64-cpu",
            &format!("workers = [\"http://a:1\"]\nvenv = \"{venv}\""),
        )
    };
    let spec = Spec::load(&f.write_spec(&spec_for(&good))).expect("a good venv");
    assert_eq!(
        spec.gateway.expect("gateway").source,
        RouterSource::Venv {
            dir: f.path("good"),
            python: 11
        }
    );
    let wheels = named_wheels(&f, &[X86_WHEEL]);
    let both = spec_for(&good).replace("venv = ", &format!("wheels = \"{wheels}\"\nvenv = "));
    assert_invalid(spec_error(&f, &both), "gateway", "not both");
    std::fs::create_dir_all(f.path("not-a-venv")).expect("mkdir");
    let cases = [
        ("not-a-venv".to_string(), "no pyvenv.cfg"),
        (
            fake_venv(
                &f,
                "system",
                0x3e,
                ROUTER_VERSION,
                "include-system-site-packages = true\n",
            ),
            "system site-packages",
        ),
        (
            fake_venv(&f, "old", 0x3e, "0.1.16", plain),
            "vllm_router-0.1.16.dist-info",
        ),
        // An aarch64 venv for this x86-64 image: the core says so.
        (
            fake_venv(&f, "arm", 0xb7, ROUTER_VERSION, plain),
            "aarch64 binary",
        ),
    ];
    for (venv, says) in cases {
        assert_invalid(spec_error(&f, &spec_for(&venv)), "gateway.venv", says);
    }
}

/// PyPI has vllm-router 0.1.17 for aarch64 (manylinux_2_28), but a wheels directory filled
/// on an x86-64 machine without `--platform` holds only that machine's: the spec says so
/// and how to fetch the right one, before anything is built.
#[test]
fn aarch64_gateway_without_an_aarch64_wheel_names_what_is_there_and_the_fix() {
    let f = Fixture::new(); // its daemon is aarch64
    let wheels = named_wheels(&f, &[X86_WHEEL, "fastapi-0.165.0-py3-none-any.whl"]);
    let text = gateway_text(
        &f,
        "jetson-orin-nx-16gb",
        &format!("workers = [\"http://a:8080\"]\nwheels = \"{wheels}\""),
    );
    let err = spec_error(&f, &text);
    assert_invalid(
        err,
        "gateway.wheels",
        "no vllm-router 0.1.17 wheel for aarch64",
    );
    let text_err = spec_error(&f, &text).to_string();
    assert!(text_err.contains(X86_WHEEL), "{text_err}");
    assert!(
        text_err.contains("--platform manylinux_2_28_aarch64"),
        "{text_err}"
    );

    named_wheels(
        &f,
        &["vllm_router-0.1.17-cp38-abi3-manylinux_2_28_aarch64.whl"],
    );
    let spec = Spec::load(&f.write_spec(&text)).expect("an aarch64 wheel is there now");
    assert_eq!(spec.daemon.target, "aarch64-unknown-linux-gnu");
}

/// A gateway that does not serve would leave nothing for the post-update health check.
#[test]
fn gateway_that_does_not_serve_refuses_ota() {
    let f = Fixture::new();
    write(
        &f.path("ca.cert.pem"),
        b"-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        0o644,
    );
    let wheels = named_wheels(
        &f,
        &["vllm_router-0.1.17-cp38-abi3-manylinux_2_28_aarch64.whl"],
    );
    let gateway = format!("workers = [\"http://a:8080\"]\nwheels = \"{wheels}\"");
    let text = gateway_text(&f, "jetson-orin-nx-16gb", &gateway).replace(
        "\n[gateway]\n",
        "\n[ota]\nkeyring = \"ca.cert.pem\"\n\n[gateway]\n",
    );
    assert_invalid(spec_error(&f, &text), "gateway.serve", "[ota]");
    let serving = text.replace(&gateway, &format!("{gateway}\nserve = true\nport = 9000"));
    Spec::load(&f.write_spec(&serving)).expect("a gateway that serves may take updates");
}

/// A wheels directory `make router-wheels` fills (`var` overrides it), or why the build test
/// cannot run.
fn router_wheels(test: &str, var: &str, default: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default));
    let has_router = std::fs::read_dir(&dir)
        .map(|l| {
            l.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with("vllm_router-"))
        })
        .unwrap_or(false);
    if has_router {
        return Some(dir);
    }
    let why = format!(
        "{} holds no vllm-router wheel (make router-wheels)",
        dir.display()
    );
    if std::env::var("ROUTER_REQUIRE").as_deref() == Ok("1") {
        panic!("{test}: {why}");
    }
    eprintln!("SKIP {test}: {why}");
    None
}

/// The minor version of the host's python3, which the fixture's image claims as its own so
/// that the venv built for it can be imported here.
fn host_python_minor() -> Option<u32> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// The base's Python (a stand-in interpreter, a real-looking stdlib directory) and glibc.
fn add_python_and_glibc(f: &Fixture, minor: u32, arch: &str) {
    write(
        &f.path(&format!("base/usr/bin/python3.{minor}")),
        b"stand-in",
        0o755,
    );
    std::os::unix::fs::symlink(format!("python3.{minor}"), f.path("base/usr/bin/python3"))
        .expect("symlink");
    write(
        &f.path(&format!("base/usr/lib/python3.{minor}/os.py")),
        b"# stand-in\n",
        0o644,
    );
    write(
        &f.path(&format!("base/usr/lib/{arch}-linux-gnu/libc.so.6")),
        b"\x7fELF...GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n",
        0o755,
    );
}

fn unpack(built: &inferloop_image::Built, dest: &Path) {
    let file = std::fs::File::open(built.tarball.as_ref().expect("tarball")).expect("open");
    let mut archive = tar::Archive::new(zstd::Decoder::new(file).expect("zstd"));
    archive.set_preserve_permissions(true);
    archive.unpack(dest).expect("unpack");
}

fn text(path: &Path) -> String {
    String::from_utf8(read(path)).unwrap_or_else(|_| panic!("{} is not UTF-8", path.display()))
}

fn rel(p: &str) -> &str {
    p.trim_start_matches('/')
}

#[test]
fn gateway_image_holds_the_router_venv_its_unit_and_env_file() {
    const TEST: &str = "gateway_image_holds_the_router_venv_its_unit_and_env_file";
    require!(TEST, MKSQUASHFS);
    let Some(wheels) = router_wheels(TEST, "INFERLOOP_ROUTER_WHEELS", "out/router-wheels") else {
        return;
    };
    let Some(minor) = host_python_minor() else {
        eprintln!("SKIP {TEST}: no python3 on this machine");
        return;
    };
    let f = x86_fixture();
    add_python_and_glibc(&f, minor, "x86_64");
    let gateway = format!(
        "workers = [\"http://box-1.lan:8080\", \"http://10.0.0.2:8080\"]\n\
         policy = \"power_of_two\"\nport = 9000\napi_key_file = \"/data/etc/router-api-key\"\n\
         wheels = \"{}\"",
        wheels.display()
    );
    let spec = Spec::load(&f.write_spec(&gateway_text(&f, "x86_64-cpu", &gateway))).expect("spec");
    let built = f.build(&spec, "out");
    let root = f.path("unpacked");
    unpack(&built, &root);

    // The venv: the router's entry point for the venv's Python, which is the image's.
    let site = format!("{ROUTER_PREFIX}/lib/python3.{minor}/site-packages");
    let bin = root.join(rel(ROUTER_BIN));
    let script = text(&bin);
    assert!(
        script.starts_with("#!/opt/inferloop-router/bin/python\n"),
        "{script}"
    );
    assert!(
        script.contains("from vllm_router.launch_router import main"),
        "{script}"
    );
    assert_eq!(
        std::fs::read_link(root.join(rel(&format!("{ROUTER_PREFIX}/bin/python")))).expect("link"),
        PathBuf::from(format!("/usr/bin/python3.{minor}"))
    );
    assert!(
        text(&root.join(rel(&format!("{ROUTER_PREFIX}/pyvenv.cfg"))))
            .contains("include-system-site-packages = false")
    );
    let native = root.join(rel(&format!("{site}/vllm_router_rs.abi3.so")));
    assert_eq!(
        inferloop_image::elf::check_arch(&native, "x86_64-unknown-linux-gnu"),
        Ok(())
    );
    let record = text(&root.join(rel(&format!(
        "{site}/vllm_router-{ROUTER_VERSION}.dist-info/RECORD"
    ))));
    assert!(
        record
            .lines()
            .any(|l| l.starts_with("../../../bin/vllm-router,sha256=")),
        "{record}"
    );
    // Not merely files: the installed closure runs (the native core loads, every import
    // resolves) with the venv's site-packages alone, -S keeping this machine's out.
    let help = Command::new("python3")
        .arg("-S")
        .arg(&bin)
        .arg("--help")
        .env("PYTHONPATH", root.join(rel(&site)))
        .env_remove("PYTHONHOME")
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && out.contains("--worker-urls"),
        "{}{}",
        out,
        String::from_utf8_lossy(&help.stderr)
    );

    // The unit (the deploy file itself), enabled; its config from [gateway].
    assert_eq!(text(&root.join(rel(UNIT_PATH))), UNIT);
    assert_eq!(
        std::fs::read_link(root.join(rel(UNIT_WANTS_PATH))).expect("enabled"),
        Path::new("../inferloop-router.service")
    );
    let env = text(&root.join(rel(ENV_PATH)));
    for line in [
        "WORKER_URLS=\"http://box-1.lan:8080 http://10.0.0.2:8080\"",
        "ROUTER_POLICY=power_of_two",
        "ROUTER_PORT=9000",
        "ROUTER_HOST=0.0.0.0",
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "router.env lacks {line:?}:\n{env}"
        );
    }
    assert!(!env.contains("api-key"), "no key in the image:\n{env}");

    // The key: loaded from the data partition, added by the launcher.
    let dropin = text(&root.join(rel(API_KEY_DROPIN_PATH)));
    assert!(dropin.contains("LoadCredential=router-api-key:/data/etc/router-api-key\n"));
    let launcher = root.join(rel(API_KEY_LAUNCHER_PATH));
    write(&f.path("creds/router-api-key"), b"sk-gateway\n", 0o600);
    let run = Command::new("sh")
        .arg(&launcher)
        .args(["printf", "%s|", "--port", "9000"])
        .env("CREDENTIALS_DIRECTORY", f.path("creds"))
        .output()
        .expect("sh");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "--port|9000|--api-key|sk-gateway|",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    write(&f.path("creds/router-api-key"), b"", 0o600);
    let empty = Command::new("sh")
        .arg(&launcher)
        .arg("true")
        .env("CREDENTIALS_DIRECTORY", f.path("creds"))
        .output()
        .expect("sh");
    assert!(!empty.status.success(), "an empty key file stops the start");

    // serve = false: the daemon is in the image (the manifest pins it) but does not start.
    assert!(root.join("usr/bin/inferloopd").is_file());
    for link in DAEMON_WANTS {
        assert!(
            std::fs::symlink_metadata(root.join(rel(link))).is_err(),
            "{link}"
        );
    }

    // Every router file is pinned by the manifest like the rest of the image.
    let files = &built.manifest.image.as_ref().expect("image").files;
    let venv: Vec<_> = files
        .iter()
        .filter(|e| e.path.starts_with(ROUTER_PREFIX))
        .cloned()
        .collect();
    assert!(venv.iter().any(|e| e.path == ROUTER_BIN && e.mode == 0o755));
    assert!(venv
        .iter()
        .all(|e| e.kind != FileKind::File || e.mode == 0o644 || e.mode == 0o755));
    assert!(
        venv.iter().all(|e| !e.path.ends_with(".pyc")),
        "no byte code from the build machine's Python"
    );

    // A gateway that also serves keeps the daemon's units; pip's second run over the same
    // wheels gives the same venv, byte for byte.
    let serving =
        gateway.replace("api_key_file = \"/data/etc/router-api-key\"\n", "") + "\nserve = true";
    let spec = Spec::load(&f.write_spec(&gateway_text(&f, "x86_64-cpu", &serving))).expect("spec");
    let no_tarball = inferloop_image::BuildOptions {
        tarball: false,
        ..crate::common::options()
    };
    let again = inferloop_image::build(&spec, &f.path("out-serving"), &no_tarball).expect("build");
    let files_again = &again.manifest.image.as_ref().expect("image").files;
    let venv_again: Vec<_> = files_again
        .iter()
        .filter(|e| e.path.starts_with(ROUTER_PREFIX))
        .cloned()
        .collect();
    assert_eq!(venv, venv_again, "the venv is reproducible");
    for link in DAEMON_WANTS {
        assert!(files_again.iter().any(|e| e.path == *link), "{link}");
    }
    assert!(!files_again.iter().any(|e| e.path == API_KEY_DROPIN_PATH));
}

/// A venv made beforehand (`.venv-router`, which `make router-venv` makes with this
/// machine's Python): its packages and scripts are copied into the image's venv, without byte
/// code or activate scripts, and the router runs from there.
#[test]
fn gateway_image_from_a_prebuilt_venv_runs_the_router() {
    const TEST: &str = "gateway_image_from_a_prebuilt_venv_runs_the_router";
    require!(TEST, MKSQUASHFS);
    let venv = std::env::var_os("INFERLOOP_ROUTER_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv-router"));
    if !venv.join("bin/vllm-router").is_file() {
        let why = format!(
            "{} has no bin/vllm-router (make router-venv)",
            venv.display()
        );
        if std::env::var("ROUTER_REQUIRE").as_deref() == Ok("1") {
            panic!("{TEST}: {why}");
        }
        eprintln!("SKIP {TEST}: {why}");
        return;
    }
    let Some(minor) = host_python_minor() else {
        eprintln!("SKIP {TEST}: no python3 on this machine");
        return;
    };
    let f = x86_fixture();
    add_python_and_glibc(&f, minor, "x86_64");
    let gateway = format!(
        "workers = [\"http://box-1.lan:8080\"]\nvenv = \"{}\"",
        venv.display()
    );
    let spec = Spec::load(&f.write_spec(&gateway_text(&f, "x86_64-cpu", &gateway))).expect("spec");
    let built = f.build(&spec, "out");
    let root = f.path("unpacked");
    unpack(&built, &root);
    let site = format!("{ROUTER_PREFIX}/lib/python3.{minor}/site-packages");
    let bin = root.join(rel(ROUTER_BIN));
    let script = text(&bin);
    assert!(
        script.starts_with("#!/opt/inferloop-router/bin/python\n"),
        "{script}"
    );
    let files = &built.manifest.image.as_ref().expect("image").files;
    let venv_files: Vec<&str> = files
        .iter()
        .filter(|e| e.path.starts_with(ROUTER_PREFIX))
        .map(|e| e.path.as_str())
        .collect();
    assert!(
        !venv_files
            .iter()
            .any(|p| p.ends_with(".pyc") || p.contains("__pycache__")),
        "no byte code"
    );
    assert!(
        !venv_files.iter().any(|p| p.contains("/bin/activate")),
        "no activate scripts"
    );
    let record = text(&root.join(rel(&format!(
        "{site}/vllm_router-{ROUTER_VERSION}.dist-info/RECORD"
    ))));
    let line = record
        .lines()
        .find(|l| l.starts_with("../../../bin/vllm-router,"))
        .unwrap_or_else(|| panic!("no script entry:\n{record}"));
    assert!(line.ends_with(&format!(",{}", script.len())), "{line}");
    let help = Command::new("python3")
        .arg("-S")
        .arg(&bin)
        .arg("--help")
        .env("PYTHONPATH", root.join(rel(&site)))
        .env_remove("PYTHONHOME")
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && out.contains("--worker-urls"),
        "{}{}",
        out,
        String::from_utf8_lossy(&help.stderr)
    );
}

/// The Orin case, built on any machine: an aarch64 image gets the aarch64 router and the
/// aarch64 builds of every native dependency, for the image's Python (3.11 here).
#[test]
fn aarch64_gateway_image_gets_aarch64_wheels_for_its_python() {
    const TEST: &str = "aarch64_gateway_image_gets_aarch64_wheels_for_its_python";
    require!(TEST, MKSQUASHFS);
    let Some(wheels) = router_wheels(
        TEST,
        "INFERLOOP_ROUTER_WHEELS_AARCH64",
        "out/router-wheels-aarch64",
    ) else {
        return;
    };
    let f = Fixture::new(); // its daemon is aarch64
    add_python_and_glibc(&f, 11, "aarch64");
    let gateway = format!(
        "workers = [\"http://orin-1.lan:8080\"]\nwheels = \"{}\"",
        wheels.display()
    );
    let spec = Spec::load(&f.write_spec(&gateway_text(&f, "jetson-orin-nx-16gb", &gateway)))
        .expect("spec");
    let built = f.build(&spec, "out");
    let root = f.path("unpacked");
    unpack(&built, &root);
    let site = root.join(rel(&format!(
        "{ROUTER_PREFIX}/lib/python3.11/site-packages"
    )));
    let mut native = Vec::new();
    for node in
        inferloop_image::tree::walk(&site, inferloop_image::tree::Specials::Refuse).expect("walk")
    {
        let name = node.path.rsplit('/').next().unwrap_or_default().to_string();
        if node.kind == FileKind::File && (name.ends_with(".so") || name.contains(".so.")) {
            // The router's bundled libssl and friends sit beside its core; all are ELF.
            assert_eq!(
                inferloop_image::elf::check_arch(&node.abs, "aarch64-unknown-linux-gnu"),
                Ok(()),
                "{}",
                node.path
            );
            native.push(name);
        }
    }
    for want in [
        "vllm_router_rs.abi3.so",
        "_pydantic_core.cpython-311-aarch64-linux-gnu.so",
    ] {
        assert!(native.iter().any(|n| n == want), "{want} in {native:?}");
    }
    assert!(text(&root.join(rel(ROUTER_BIN))).starts_with("#!/opt/inferloop-router/bin/python\n"));
    assert_eq!(
        std::fs::read_link(root.join(rel(&format!("{ROUTER_PREFIX}/bin/python")))).expect("link"),
        PathBuf::from("/usr/bin/python3.11")
    );
}

/// `role = "worker"` is the default and changes nothing: the same bytes as a spec without
/// `role`, and none of the gateway's files.
#[test]
fn worker_role_is_the_default_and_builds_the_same_image() {
    require!(
        "worker_role_is_the_default_and_builds_the_same_image",
        MKSQUASHFS
    );
    let f = Fixture::new();
    let plain = f.build(&f.spec("squashfs"), "out-plain");
    let text = format!(
        "role = \"worker\"\n{}",
        f.spec_text(
            "squashfs",
            &Fixture::mounted_model(),
            "port = 8080\nslots = 2"
        )
    );
    let spec = Spec::load(&f.write_spec(&text)).expect("spec");
    assert!(spec.gateway.is_none());
    let worker = f.build(&spec, "out-worker");
    assert!(
        read(&plain.image) == read(&worker.image),
        "same image bytes"
    );
    let files = &worker.manifest.image.as_ref().expect("image").files;
    for path in [
        ROUTER_PREFIX,
        UNIT_PATH,
        UNIT_WANTS_PATH,
        ENV_PATH,
        API_KEY_LAUNCHER_PATH,
    ] {
        assert!(!files.iter().any(|e| e.path == path), "{path}");
    }
    for link in DAEMON_WANTS {
        assert!(files.iter().any(|e| e.path == *link), "{link}");
    }
}

/// The example gateway spec, loaded where its relative paths exist: a gateway for two
/// boxes on the VM's Debian base, python3 added to its packages.
#[test]
fn gateway_example_spec_routes_for_two_boxes_on_a_debian_base_with_python() {
    let f = x86_fixture();
    let spec_text = text(&repo().join("image/examples/qemu-virt-amd64-gateway.toml"));
    let origin = f.path("image/examples/qemu-virt-amd64-gateway.toml");
    std::fs::create_dir_all(f.path("image/examples")).expect("mkdir");
    std::fs::create_dir_all(f.path("target/release")).expect("mkdir");
    std::fs::rename(f.path("inferloopd"), f.path("target/release/inferloopd")).expect("mv");
    for overlay in ["rootfs", "rootfs-qemu-virt"] {
        std::os::unix::fs::symlink(repo().join(overlay), f.path(overlay)).expect("symlink");
    }
    std::fs::create_dir_all(f.path("out/router-wheels")).expect("mkdir");
    write(
        &f.path(&format!("out/router-wheels/{X86_WHEEL}")),
        b"",
        0o644,
    );
    let spec = Spec::from_toml(&spec_text, &origin).expect("example spec");
    let gw = spec.gateway.as_ref().expect("a gateway");
    assert_eq!(
        gw.workers,
        ["http://box-1.lan:8080", "http://box-2.lan:8080"]
    );
    assert_eq!(gw.policy.as_str(), "cache_aware");
    assert_eq!(gw.api_key_file.as_deref(), Some("/data/etc/router-api-key"));
    assert!(!gw.serve && spec.ota.is_none());
    let inferloop_image::spec::Base::Debian(base) = &spec.base else {
        panic!("a Debian base: {:?}", spec.base);
    };
    assert!(
        base.packages.iter().any(|p| p == "python3"),
        "{:?}",
        base.packages
    );
    assert_eq!(base.arch, "amd64");
}
