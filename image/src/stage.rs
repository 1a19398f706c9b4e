//! Assembling the staging tree that becomes the image: base root filesystem, overlay (with
//! its templates rendered), users, the daemon, the model, the config and the mount points.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use crate::error::ImageError;
use crate::spec::{Base, Spec, CONFIG_PATH, DAEMON_PATH, STATE_DIR};
use crate::tree::{self, mkdir_p, set_mode, Modes};

/// Copies or unpacks the base root filesystem into `root`.
pub fn base(base: &Base, root: &Path) -> Result<(), ImageError> {
    match base {
        Base::Dir(dir) => tree::copy_onto(dir, root, Modes::Keep),
        Base::Tar { path, zstd } => {
            let file = File::open(path).map_err(ImageError::io(path))?;
            let reader: Box<dyn Read> = if *zstd {
                Box::new(zstd::Decoder::new(file).map_err(ImageError::io(path))?)
            } else {
                Box::new(BufReader::new(file))
            };
            unpack_tar(reader, path, root)
        }
        // The builder runs mmdebstrap first and stages the resulting directory.
        Base::Debian(d) => Err(ImageError::UnsupportedEntry {
            path: PathBuf::from(&d.suite),
            message: "a Debian base must be built (debian::DebianBase::ensure) before staging"
                .into(),
        }),
    }
}

/// Unpacks a base tarball. Hard links become copies (the image tree has none, so every
/// packer and the manifest see plain files); device nodes under `/dev` are skipped.
fn unpack_tar(reader: impl Read, origin: &Path, root: &Path) -> Result<(), ImageError> {
    use tar::EntryType;
    let unsupported = |path: &str, message: String| ImageError::UnsupportedEntry {
        path: PathBuf::from(format!("{}:{path}", origin.display())),
        message,
    };
    let mut archive = tar::Archive::new(reader);
    let mut dir_modes = Vec::new();
    for entry in archive.entries().map_err(ImageError::io(origin))? {
        let mut entry = entry.map_err(ImageError::io(origin))?;
        let raw = entry.path().map_err(ImageError::io(origin))?.into_owned();
        let path = normalize(&raw).map_err(|m| unsupported(&raw.display().to_string(), m))?;
        let dest = tree::join(root, &path);
        let mode = entry.header().mode().map_err(ImageError::io(origin))? & 0o7777;
        let kind = entry.header().entry_type();
        if dest != root {
            if let Some(parent) = dest.parent() {
                mkdir_p(parent)?;
            }
        }
        let existing = std::fs::symlink_metadata(&dest).ok();
        if let Some(m) = &existing {
            if m.is_dir() != (kind == EntryType::Directory) {
                return Err(unsupported(
                    &path,
                    "appears twice, as a directory and as a non-directory".into(),
                ));
            }
            if !m.is_dir() {
                std::fs::remove_file(&dest).map_err(ImageError::io(&dest))?;
            }
        }
        match kind {
            EntryType::Directory => {
                if existing.is_none() {
                    std::fs::create_dir(&dest).map_err(ImageError::io(&dest))?;
                }
                set_mode(&dest, 0o755)?;
                dir_modes.push((dest, mode));
            }
            EntryType::Regular | EntryType::Continuous => {
                let mut out = File::create(&dest).map_err(ImageError::io(&dest))?;
                std::io::copy(&mut entry, &mut out).map_err(ImageError::io(&dest))?;
                set_mode(&dest, mode)?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(ImageError::io(origin))?
                    .ok_or_else(|| unsupported(&path, "symlink without a target".into()))?;
                std::os::unix::fs::symlink(&target, &dest).map_err(ImageError::io(&dest))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(ImageError::io(origin))?
                    .ok_or_else(|| unsupported(&path, "hard link without a target".into()))?;
                let target = normalize(&target).map_err(|m| unsupported(&path, m))?;
                let source = tree::join(root, &target);
                std::fs::copy(&source, &dest).map_err(ImageError::io(&source))?;
                let mode = std::fs::metadata(&source).map_err(ImageError::io(&source))?;
                set_mode(&dest, std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777)?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo if path.starts_with("/dev/") => {
                tracing::warn!(path = %path, "skipping a special file: /dev is devtmpfs at boot");
            }
            other => {
                return Err(unsupported(
                    &path,
                    format!("has tar entry type {other:?}; an image holds only directories, files and symlinks"),
                ))
            }
        }
    }
    for (dir, mode) in dir_modes.iter().rev() {
        set_mode(dir, *mode)?;
    }
    Ok(())
}

/// A tar member path as an image path (`./a/b` → `/a/b`, `./` → `/`); `..` is refused.
fn normalize(raw: &Path) -> Result<String, String> {
    let mut out = String::new();
    for c in raw.components() {
        match c {
            Component::CurDir | Component::RootDir => {}
            Component::Normal(s) => {
                let s = s.to_str().ok_or("file names in an image must be UTF-8")?;
                out.push('/');
                out.push_str(s);
            }
            Component::ParentDir | Component::Prefix(_) => {
                return Err("path leaves the archive root (`..`)".into())
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Values the overlay's `*.in` templates may use as `@NAME@`.
pub fn template_vars(spec: &Spec) -> BTreeMap<&'static str, String> {
    let model_path = spec.model.device_path();
    let dir_of = |path: &str| {
        Path::new(path)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "/".into())
    };
    // The directories the unit needs mounted: the model's, and the draft's where it differs
    // (RequiresMountsFor= takes a space-separated list).
    let mut model_dir = dir_of(&model_path);
    if let Some(draft) = &spec.draft_model {
        let draft_dir = dir_of(&draft.device_path());
        if draft_dir != model_dir {
            model_dir = format!("{model_dir} {draft_dir}");
        }
    }
    BTreeMap::from([
        ("BOARD", spec.board.name.clone()),
        ("CONFIG_PATH", CONFIG_PATH.to_string()),
        ("DAEMON_PATH", DAEMON_PATH.to_string()),
        ("MEMORY_MAX", spec.memory_max.clone()),
        ("MODEL_DIR", model_dir),
        ("MODEL_PATH", model_path),
        ("STATE_DIR", STATE_DIR.to_string()),
        ("VERSION", spec.version.clone()),
        // For the overlay's RAUC scripts; OTA_BOOT_TRIES is empty on a board without [ota].
        ("RAUC_COMPATIBLE", spec.board.rauc_compatible()),
        (
            "OTA_BOOT_TRIES",
            spec.board
                .ota
                .as_ref()
                .map(|o| o.boot_tries.to_string())
                .unwrap_or_default(),
        ),
    ])
}

/// Copies the overlay onto `root` with git-normalised modes, then renders every `X.in`
/// from the overlay into `X` (same mode) and removes `X.in`.
pub fn overlay(
    dir: &Path,
    root: &Path,
    vars: &BTreeMap<&'static str, String>,
) -> Result<(), ImageError> {
    tree::copy_onto(dir, root, Modes::Git)?;
    for node in tree::walk(dir, tree::Specials::Refuse)? {
        let Some(out_path) = node.path.strip_suffix(".in") else {
            continue;
        };
        if node.kind != inferloop_manifest::FileKind::File {
            continue;
        }
        let text = std::fs::read_to_string(&node.abs).map_err(ImageError::io(&node.abs))?;
        let rendered = render(&text, vars).map_err(|message| ImageError::Template {
            path: node.abs.clone(),
            message,
        })?;
        let staged_in = tree::join(root, &node.path);
        let staged_out = tree::join(root, out_path);
        let mode = if node.mode & 0o111 != 0 { 0o755 } else { 0o644 };
        std::fs::remove_file(&staged_in).map_err(ImageError::io(&staged_in))?;
        if staged_out.is_dir() {
            return Err(ImageError::OverlayConflict {
                path: node.abs.clone(),
                message: format!("renders to {out_path}, which is a directory"),
            });
        }
        tree::write_file(&staged_out, rendered.as_bytes(), mode)?;
    }
    Ok(())
}

/// Replaces every `@NAME@` (upper-case letters, digits, `_`) with its value; an unknown
/// name is an error, and an `@` that does not start a placeholder stays as it is.
pub fn render(text: &str, vars: &BTreeMap<&'static str, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let len = after
            .bytes()
            .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
            .count();
        if len > 0 && after.as_bytes().get(len) == Some(&b'@') {
            let name = &after[..len];
            let value = vars.get(name).ok_or_else(|| {
                let known: Vec<String> = vars.keys().map(|k| format!("@{k}@")).collect();
                format!("unknown placeholder @{name}@; known: {}", known.join(", "))
            })?;
            out.push_str(value);
            rest = &after[len + 1..];
        } else {
            out.push('@');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The daemon config baked at [`CONFIG_PATH`]: the spec's `[config]` plus the keys the
/// builder owns (model, draft_model, manifest, state_dir), sorted (toml's map is a BTreeMap).
pub fn config_text(spec: &Spec) -> String {
    let mut table = spec.config.clone();
    table.insert(
        "model".into(),
        toml::Value::String(spec.model.device_path()),
    );
    if let Some(draft) = &spec.draft_model {
        table.insert(
            "draft_model".into(),
            toml::Value::String(draft.device_path()),
        );
    }
    table.insert(
        "manifest".into(),
        toml::Value::String(inferloop_manifest::BAKED_PATH.into()),
    );
    table.insert("state_dir".into(), toml::Value::String(STATE_DIR.into()));
    let body = toml::to_string(&table).unwrap_or_default();
    format!(
        "# inferloopd settings for image {} ({}), written by inferloop-image.\n\
         # The root filesystem is read-only: change the image spec, or override one box with\n\
         # INFERLOOP_* variables in /data/etc/inferloopd.env (read by inferloopd.service).\n\
         {body}",
        spec.version, spec.board.name
    )
}

/// Creates every directory the image needs as a mount point: the API filesystems and each
/// absolute mount point in `etc/fstab` that is not inside another one.
pub fn mount_points(root: &Path) -> Result<(), ImageError> {
    let mut points: Vec<String> = ["/dev", "/proc", "/run", "/sys"]
        .into_iter()
        .map(String::from)
        .collect();
    let fstab = root.join("etc/fstab");
    if let Ok(text) = std::fs::read_to_string(&fstab) {
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(point) = line.split_whitespace().nth(1) {
                if point.starts_with('/') && point != "/" {
                    points.push(point.trim_end_matches('/').to_string());
                }
            }
        }
    }
    points.sort();
    points.dedup();
    let nested = |p: &String| {
        points
            .iter()
            .any(|q| q != p && p.starts_with(q.as_str()) && p[q.len()..].starts_with('/'))
    };
    for point in points.iter().filter(|p| !nested(p)) {
        let dest = tree::join(root, point);
        match std::fs::symlink_metadata(&dest) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::UnsupportedEntry {
                    path: dest,
                    message: format!("is the mount point {point} in etc/fstab but not a directory"),
                })
            }
            Err(_) => mkdir_p(&dest)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<&'static str, String> {
        BTreeMap::from([("MEMORY_MAX", "12G".to_string())])
    }

    #[test]
    fn placeholders_are_replaced_and_stray_at_signs_kept() {
        assert_eq!(
            render("MemoryMax=@MEMORY_MAX@ # mail a@b.c @ @lower@", &vars()).expect("ok"),
            "MemoryMax=12G # mail a@b.c @ @lower@"
        );
    }

    #[test]
    fn unknown_placeholder_is_an_error_naming_it() {
        let err = render("x=@MEMROY_MAX@", &vars()).expect_err("typo");
        assert!(
            err.contains("@MEMROY_MAX@") && err.contains("@MEMORY_MAX@"),
            "{err}"
        );
    }

    #[test]
    fn tar_paths_are_normalised_and_parent_dirs_refused() {
        assert_eq!(normalize(Path::new("./")).expect("root"), "/");
        assert_eq!(
            normalize(Path::new("./usr/bin/x")).expect("ok"),
            "/usr/bin/x"
        );
        assert_eq!(normalize(Path::new("/etc")).expect("ok"), "/etc");
        assert!(normalize(Path::new("../etc/passwd")).is_err());
    }

    #[test]
    fn mount_points_come_from_fstab_without_nested_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        tree::write_file(
            &root.join("etc/fstab"),
            b"# c\n/dev/root / auto ro 0 0\nLABEL=d /data ext4 defaults 0 2\n/data/state /var/lib/inferloop none bind 0 0\ntmpfs /tmp tmpfs defaults 0 0\nx /data/models none bind 0 0\n",
            0o644,
        )
        .expect("fstab");
        mount_points(root).expect("created");
        for p in [
            "data",
            "var/lib/inferloop",
            "tmp",
            "proc",
            "sys",
            "dev",
            "run",
        ] {
            assert!(root.join(p).is_dir(), "{p}");
        }
        assert!(!root.join("data/models").exists(), "nested in /data");
    }
}
