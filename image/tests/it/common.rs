//! Fixtures made on the fly: a tiny base root filesystem (a setuid binary, a symlink, a
//! sticky /tmp), a fake aarch64 daemon, a fake model, and a spec that uses the real
//! `rootfs/` overlay.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use inferloop_image::tools::Tool;
use inferloop_image::{BuildOptions, Built, Progress, Spec};

pub const EPOCH: u64 = 1_700_000_000;

/// True when `tool` is on PATH; otherwise prints why the calling test skips.
pub fn have(tool: Tool, test: &str) -> bool {
    match tool.find() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            false
        }
    }
}

/// Skips the test (returns) unless every tool is present.
#[macro_export]
macro_rules! require {
    ($test:expr, $($tool:expr),+) => {
        if !($($crate::common::have($tool, $test))&&+) {
            return;
        }
    };
}

pub fn overlay_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../rootfs")
}

pub fn write(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

pub fn mkdir(path: &Path, mode: u32) {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A tiny base root filesystem.
pub fn make_base(dir: &Path) {
    mkdir(dir, 0o755);
    write(
        &dir.join("etc/passwd"),
        b"root:x:0:0:root:/root:/bin/sh\n",
        0o644,
    );
    write(&dir.join("etc/group"), b"root:x:0:\n", 0o644);
    write(&dir.join("etc/hostname"), b"base\n", 0o644);
    write(
        &dir.join("usr/bin/su"),
        b"#!/bin/sh\necho pretend su\n",
        0o4755,
    );
    write(&dir.join("usr/bin/tool"), b"tool", 0o755);
    mkdir(&dir.join("tmp"), 0o1777);
    mkdir(&dir.join("root"), 0o700);
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).expect("symlink");
}

/// A fake daemon: an aarch64 ELF header and some bytes.
pub fn fake_daemon(path: &Path, extra: &[u8]) {
    let mut bytes = inferloop_image::elf::fake_header(0xb7);
    bytes.extend_from_slice(b"fake inferloopd ");
    bytes.extend_from_slice(extra);
    write(path, &bytes, 0o755);
}

/// Everything a spec needs, in its own directory.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

pub const MODEL_BYTES: &[u8] = b"GGUF fake weights for the image tests";

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        make_base(&dir.path().join("base"));
        fake_daemon(&dir.path().join("inferloopd"), b"v1");
        write(&dir.path().join("model.gguf"), MODEL_BYTES, 0o644);
        Fixture { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A spec with the given format and model table; paths relative to the fixture.
    pub fn spec_text(&self, format: &str, model: &str, config: &str) -> String {
        format!(
            r#"board = "jetson-orin-nx-16gb"
version = "1.2.3"
format = "{format}"
base = "base"
overlay = "{overlay}"
memory_max = "12G"

[daemon]
path = "inferloopd"
version = "0.1.0"

[model]
{model}

[config]
{config}
"#,
            overlay = overlay_dir().display()
        )
    }

    pub fn mounted_model() -> String {
        format!(
            "mount = \"/data/models/model.gguf\"\nsha256 = \"{}\"\nsize = {}",
            inferloop_manifest::hash::sha256_bytes(MODEL_BYTES),
            MODEL_BYTES.len()
        )
    }

    pub fn write_spec(&self, text: &str) -> PathBuf {
        let path = self.path("image.toml");
        std::fs::write(&path, text).expect("write spec");
        path
    }

    pub fn spec(&self, format: &str) -> Spec {
        let text = self.spec_text(format, &Self::mounted_model(), "port = 8080\nslots = 2");
        Spec::load(&self.write_spec(&text)).expect("valid spec")
    }

    pub fn build(&self, spec: &Spec, out: &str) -> Built {
        inferloop_image::build(spec, &self.path(out), &options()).expect("build")
    }
}

pub fn options() -> BuildOptions {
    BuildOptions {
        source_date_epoch: EPOCH,
        progress: Progress::hidden(),
        base_cache: None,
        tarball: true,
    }
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
