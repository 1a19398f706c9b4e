//! A Debian base root filesystem built with `mmdebstrap` (spec `base = { debian = ... }`):
//! minbase plus the spec's packages, the kernel modules pruned to the ones the spec keeps,
//! and cached by a key over everything that decides its contents.
//!
//! What pins the bytes: the suite and mirror (a `snapshot.debian.org` URL freezes the
//! package versions; `deb.debian.org` moves with point releases), the package list (entries
//! may pin `name=version`), the hooks compiled into this binary and `SOURCE_DATE_EPOCH`.
//! The tree records what it got in [`PACKAGES_PATH`], which the manifest hashes like every
//! file, so two images with different package versions never share a manifest.

use std::path::{Path, PathBuf};
use std::process::Command;

use inferloop_manifest::hash::sha256_bytes;

use crate::error::ImageError;
use crate::tools::MMDEBSTRAP;

/// `name=version arch` of every installed package, written by the customize hook.
pub const PACKAGES_PATH: &str = "/usr/share/inferloop/debian-packages.txt";

/// Packages every Debian base gets: an init, a bus for RAUC, module loading, an initramfs
/// that can mount a squashfs root, and the kernel itself.
pub const REQUIRED_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "initramfs-tools",
    "zstd",
];

const ESSENTIAL_HOOK: &str = include_str!("../debian/essential-hook.sh");
const INITRAMFS_HOOK: &str = include_str!("../debian/initramfs-hook");
const CUSTOMIZE_HOOK: &str = include_str!("../debian/customize-hook.sh");

/// A checked `base = { debian = ... }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianBase {
    /// Suite or codename, e.g. `bookworm`.
    pub suite: String,
    /// Debian architecture (`arm64`), from the daemon's target.
    pub arch: String,
    pub mirror: String,
    /// The spec's packages after [`REQUIRED_PACKAGES`], duplicates removed.
    pub packages: Vec<String>,
    /// Kernel modules to keep (with their dependencies); `None` keeps them all.
    pub keep_modules: Option<Vec<String>>,
    /// `SOURCE_DATE_EPOCH` for mmdebstrap; `None` uses the build's. A fixed value lets one
    /// cached base serve builds of many commits.
    pub epoch: Option<u64>,
}

impl DebianBase {
    /// The cache key: every input that decides the tree's bytes.
    pub fn key(&self, build_epoch: u64) -> String {
        let epoch = self.epoch.unwrap_or(build_epoch);
        let modules = self
            .keep_modules
            .as_ref()
            .map(|m| m.join(" "))
            .unwrap_or_else(|| "*".into());
        let text = format!(
            "suite={}\narch={}\nmirror={}\npackages={}\nmodules={modules}\nepoch={epoch}\n{ESSENTIAL_HOOK}\n{INITRAMFS_HOOK}\n{CUSTOMIZE_HOOK}",
            self.suite,
            self.arch,
            self.mirror,
            self.packages.join(","),
        );
        sha256_bytes(text.as_bytes())[..16].to_string()
    }

    /// The root tree in `cache`, built by mmdebstrap unless a tree for the same key is
    /// there already. A half-built tree never has the final name.
    pub fn ensure(&self, cache: &Path, build_epoch: u64) -> Result<PathBuf, ImageError> {
        let epoch = self.epoch.unwrap_or(build_epoch);
        let dir = cache.join(format!("{}-{}-{}", self.suite, self.arch, self.key(epoch)));
        let root = dir.join("root");
        if root.join("usr").is_dir() {
            tracing::info!(root = %root.display(), "Debian base from the cache");
            return Ok(root);
        }
        std::fs::create_dir_all(cache).map_err(ImageError::io(cache))?;
        let work = tempfile::Builder::new()
            .prefix(".mmdebstrap-")
            .tempdir_in(cache)
            .map_err(ImageError::io(cache))?;
        let hooks = work.path().join("hooks");
        std::fs::create_dir(&hooks).map_err(ImageError::io(&hooks))?;
        for (name, text) in [
            ("essential-hook.sh", ESSENTIAL_HOOK),
            ("initramfs-hook", INITRAMFS_HOOK),
            ("customize-hook.sh", CUSTOMIZE_HOOK),
        ] {
            let p = hooks.join(name);
            std::fs::write(&p, text).map_err(ImageError::io(&p))?;
        }
        let tree = work.path().join("root");
        let mut cmd = Command::new(MMDEBSTRAP.find()?);
        cmd.args(self.mmdebstrap_args(&hooks, &tree))
            .env("SOURCE_DATE_EPOCH", epoch.to_string())
            .env(
                "INFERLOOP_KEEP_MODULES",
                self.keep_modules
                    .as_ref()
                    .map(|m| m.join(" "))
                    .unwrap_or_default(),
            );
        tracing::info!(suite = %self.suite, arch = %self.arch, mirror = %self.mirror,
            "running mmdebstrap (minutes; a foreign architecture's packages are configured under qemu-user)");
        let out = cmd.output().map_err(ImageError::io("mmdebstrap"))?;
        if !out.status.success() {
            return Err(MMDEBSTRAP.failed(&out));
        }
        std::fs::rename(work.path(), &dir).map_err(ImageError::io(&dir))?;
        // The temporary directory was renamed away; nothing is left to delete.
        std::mem::forget(work);
        Ok(root)
    }

    /// mmdebstrap's arguments; `hooks` holds the hook scripts, `tree` is the output.
    pub fn mmdebstrap_args(&self, hooks: &Path, tree: &Path) -> Vec<String> {
        let hook = |name: &str| format!("sh {} \"$1\"", hooks.join(name).display());
        let mut args = vec![
            format!("--arch={}", self.arch),
            "--variant=minbase".into(),
            "--mode=root".into(),
            format!("--include={}", self.packages.join(",")),
            "--aptopt=Acquire::Languages \"none\"".into(),
            format!("--essential-hook={}", hook("essential-hook.sh")),
            format!("--customize-hook={}", hook("customize-hook.sh")),
        ];
        // Documentation, manual pages and translations are of no use on a box; licences stay.
        for exclude in [
            "path-exclude=/usr/share/man/*",
            "path-exclude=/usr/share/info/*",
            "path-exclude=/usr/share/locale/*",
            "path-exclude=/usr/share/doc/*",
            "path-include=/usr/share/doc/*/copyright",
        ] {
            args.push(format!("--dpkgopt={exclude}"));
        }
        args.push(self.suite.clone());
        args.push(tree.display().to_string());
        args.push(self.mirror.clone());
        args
    }
}

/// The Debian architecture of a Rust target triple.
pub fn debian_arch(target: &str) -> Option<&'static str> {
    match target.split('-').next()? {
        "aarch64" => Some("arm64"),
        "x86_64" => Some("amd64"),
        "armv7" => Some("armhf"),
        "riscv64gc" => Some("riscv64"),
        _ => None,
    }
}

/// A Debian package name, optionally pinned (`name=version`).
pub fn is_package(p: &str) -> bool {
    let (name, version) = match p.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (p, None),
    };
    let name_ok = name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    let version_ok = version.is_none_or(|v| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+-~:".contains(&b))
    });
    name_ok && version_ok
}

/// The kernel and initrd in a staged Debian root (`/boot/vmlinuz-*`, `/boot/initrd.img-*`),
/// for booting the image without a bootloader inside it (QEMU's `-kernel`/`-initrd`).
pub fn kernel_files(root: &Path) -> Result<Option<(PathBuf, PathBuf)>, ImageError> {
    let boot = root.join("boot");
    let Ok(entries) = std::fs::read_dir(&boot) else {
        return Ok(None);
    };
    let mut names: Vec<String> = Vec::new();
    for e in entries {
        let e = e.map_err(ImageError::io(&boot))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let kernel = names.iter().rev().find(|n| n.starts_with("vmlinuz-"));
    let Some(kernel) = kernel else {
        return Ok(None);
    };
    let version = &kernel["vmlinuz-".len()..];
    let initrd = format!("initrd.img-{version}");
    if !names.contains(&initrd) {
        return Err(ImageError::UnsupportedEntry {
            path: boot.join(kernel),
            message: format!("has no {initrd} beside it (was initramfs-tools installed?)"),
        });
    }
    Ok(Some((boot.join(kernel), boot.join(initrd))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> DebianBase {
        DebianBase {
            suite: "bookworm".into(),
            arch: "arm64".into(),
            mirror: "http://deb.debian.org/debian".into(),
            packages: vec!["systemd".into(), "rauc".into()],
            keep_modules: Some(vec!["virtio_blk".into()]),
            epoch: None,
        }
    }

    #[test]
    fn key_changes_with_every_input() {
        let a = base();
        let k = a.key(1);
        assert_eq!(k, base().key(1));
        assert_ne!(k, a.key(2));
        let mut b = base();
        b.packages.push("curl".into());
        assert_ne!(k, b.key(1));
        let mut c = base();
        c.keep_modules = None;
        assert_ne!(k, c.key(1));
        let mut d = base();
        d.mirror = "http://snapshot.debian.org/archive/debian/20250101T000000Z".into();
        assert_ne!(k, d.key(1));
        // A pinned epoch wins over the build's.
        let mut e = base();
        e.epoch = Some(7);
        assert_eq!(e.key(1), e.key(2));
        assert_eq!(e.key(1), base().key(7));
    }

    #[test]
    fn mmdebstrap_args_name_suite_tree_and_mirror_last() {
        let args = base().mmdebstrap_args(Path::new("/h"), Path::new("/t"));
        assert!(args.contains(&"--arch=arm64".to_string()));
        assert!(args.contains(&"--include=systemd,rauc".to_string()));
        assert!(args.contains(&"--customize-hook=sh /h/customize-hook.sh \"$1\"".to_string()));
        assert_eq!(
            &args[args.len() - 3..],
            &["bookworm", "/t", "http://deb.debian.org/debian"]
        );
    }

    #[test]
    fn package_names_and_pins() {
        assert!(is_package("linux-image-arm64"));
        assert!(is_package("libstdc++6"));
        assert!(is_package("rauc=1.8-2"));
        assert!(!is_package("Rauc"));
        assert!(!is_package("rauc="));
        assert!(!is_package("a"));
        assert!(!is_package("rauc;rm"));
    }

    #[test]
    fn arch_from_target() {
        assert_eq!(debian_arch("aarch64-unknown-linux-gnu"), Some("arm64"));
        assert_eq!(debian_arch("x86_64-unknown-linux-gnu"), Some("amd64"));
        assert_eq!(debian_arch("mips-unknown-linux-gnu"), None);
    }
}
