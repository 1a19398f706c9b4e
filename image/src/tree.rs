//! Directory trees as sorted entry lists: walking one (without following symlinks), copying
//! one onto another, and turning one into the manifest's file list.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use inferloop_manifest::{FileEntry, FileKind};

use crate::error::ImageError;
use crate::progress::Progress;

/// One entry of a tree on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Path inside the tree: `/` for the root, else `/a/b`.
    pub path: String,
    pub kind: FileKind,
    pub mode: u32,
    /// Content bytes (files) or target bytes (symlinks); 0 for directories.
    pub size: u64,
    pub target: Option<String>,
    /// Where it is on disk.
    pub abs: PathBuf,
}

/// What `walk` does with device nodes, fifos and sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specials {
    /// Skip them below `/dev` (devtmpfs is mounted there at boot) and refuse them elsewhere.
    SkipUnderDev,
    /// Refuse them everywhere.
    Refuse,
}

/// Every entry under `root`, sorted by path. Names must be UTF-8 (the manifest is JSON).
pub fn walk(root: &Path, specials: Specials) -> Result<Vec<Node>, ImageError> {
    let mut out = Vec::new();
    let meta = std::fs::symlink_metadata(root).map_err(ImageError::io(root))?;
    out.push(Node {
        path: "/".into(),
        kind: FileKind::Dir,
        mode: meta.mode() & 0o7777,
        size: 0,
        target: None,
        abs: root.to_path_buf(),
    });
    walk_dir(root, "", specials, &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk_dir(
    dir: &Path,
    prefix: &str,
    specials: Specials,
    out: &mut Vec<Node>,
) -> Result<(), ImageError> {
    let entries = std::fs::read_dir(dir).map_err(ImageError::io(dir))?;
    for entry in entries {
        let entry = entry.map_err(ImageError::io(dir))?;
        let abs = entry.path();
        let name = entry
            .file_name()
            .into_string()
            .map_err(|raw| ImageError::UnsupportedEntry {
                path: dir.join(&raw),
                message: "file names in an image must be UTF-8".into(),
            })?;
        let path = format!("{prefix}/{name}");
        let meta = std::fs::symlink_metadata(&abs).map_err(ImageError::io(&abs))?;
        let ft = meta.file_type();
        let mode = meta.mode() & 0o7777;
        let node = if ft.is_dir() {
            Node {
                path: path.clone(),
                kind: FileKind::Dir,
                mode,
                size: 0,
                target: None,
                abs: abs.clone(),
            }
        } else if ft.is_file() {
            Node {
                path: path.clone(),
                kind: FileKind::File,
                mode,
                size: meta.len(),
                target: None,
                abs: abs.clone(),
            }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&abs)
                .map_err(ImageError::io(&abs))?
                .into_os_string()
                .into_string()
                .map_err(|_| ImageError::UnsupportedEntry {
                    path: abs.clone(),
                    message: "symlink targets in an image must be UTF-8".into(),
                })?;
            Node {
                path: path.clone(),
                kind: FileKind::Symlink,
                mode: 0o777,
                size: target.len() as u64,
                target: Some(target),
                abs: abs.clone(),
            }
        } else {
            let what = if ft.is_block_device() || ft.is_char_device() {
                "a device node"
            } else if ft.is_fifo() {
                "a fifo"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "of an unknown file type"
            };
            if specials == Specials::SkipUnderDev && path.starts_with("/dev/") {
                tracing::warn!(path = %path, "skipping {what}: /dev is devtmpfs at boot");
                continue;
            }
            return Err(ImageError::UnsupportedEntry {
                path: abs,
                message: format!("is {what}; an image holds only directories, files and symlinks"),
            });
        };
        let is_dir = node.kind == FileKind::Dir;
        out.push(node);
        if is_dir {
            walk_dir(&abs, &path, specials, out)?;
        }
    }
    Ok(())
}

/// How modes are taken when copying a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modes {
    /// Exactly as on disk (a base root filesystem: setuid bits and all).
    Keep,
    /// As git stores them: files 0755 if executable else 0644, new directories 0755, and
    /// existing directories left alone. A checkout's umask must not change the image.
    Git,
}

/// Copies `src` onto `dst`: directories merge, files and symlinks replace files and
/// symlinks, and a directory meeting a non-directory is a conflict.
pub fn copy_onto(src: &Path, dst: &Path, modes: Modes) -> Result<(), ImageError> {
    // Directory modes are applied last, deepest first, so a read-only directory (0555 is
    // common for /proc and /sys mount points) can still be filled by a non-root builder.
    let mut dir_modes = Vec::new();
    for node in walk(src, Specials::SkipUnderDev)? {
        let dest = join(dst, &node.path);
        let existing = std::fs::symlink_metadata(&dest).ok();
        let conflict = |message: &str| ImageError::OverlayConflict {
            path: src.join(node.path.trim_start_matches('/')),
            message: message.to_string(),
        };
        match node.kind {
            FileKind::Dir => {
                match &existing {
                    Some(m) if m.is_dir() => {
                        if modes == Modes::Git {
                            continue;
                        }
                    }
                    Some(_) => {
                        return Err(conflict(
                            "is a directory but the tree below has a file there",
                        ))
                    }
                    None => std::fs::create_dir(&dest).map_err(ImageError::io(&dest))?,
                }
                let mode = if modes == Modes::Git {
                    0o755
                } else {
                    node.mode
                };
                set_mode(&dest, 0o755)?;
                dir_modes.push((dest, mode));
            }
            FileKind::File | FileKind::Symlink => {
                match &existing {
                    Some(m) if m.is_dir() => {
                        return Err(conflict(
                            "is a file but the tree below has a directory there",
                        ))
                    }
                    Some(_) => std::fs::remove_file(&dest).map_err(ImageError::io(&dest))?,
                    None => {}
                }
                if node.kind == FileKind::Symlink {
                    let target = node.target.as_deref().unwrap_or_default();
                    std::os::unix::fs::symlink(target, &dest).map_err(ImageError::io(&dest))?;
                } else {
                    std::fs::copy(&node.abs, &dest).map_err(ImageError::io(&node.abs))?;
                    let mode = match modes {
                        Modes::Keep => node.mode,
                        Modes::Git if node.mode & 0o111 != 0 => 0o755,
                        Modes::Git => 0o644,
                    };
                    set_mode(&dest, mode)?;
                }
            }
        }
    }
    for (dir, mode) in dir_modes.iter().rev() {
        set_mode(dir, *mode)?;
    }
    Ok(())
}

/// `root` joined with an image path (`/` → `root`).
pub fn join(root: &Path, image_path: &str) -> PathBuf {
    let rel = image_path.trim_start_matches('/');
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

pub fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(ImageError::io(path))
}

/// Creates `path` and missing parents with mode 0755 (whatever the umask).
pub fn mkdir_p(path: &Path) -> Result<(), ImageError> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        mkdir_p(parent)?;
    }
    std::fs::create_dir(path).map_err(ImageError::io(path))?;
    set_mode(path, 0o755)
}

/// Writes `bytes` to `path` with `mode`, creating parent directories.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ImageError> {
    if let Some(parent) = path.parent() {
        mkdir_p(parent)?;
    }
    std::fs::write(path, bytes).map_err(ImageError::io(path))?;
    set_mode(path, mode)
}

/// The manifest's view of `nodes`, hashing every file (one progress bar over all bytes).
/// `skip` leaves out one path (the manifest itself).
pub fn entries(
    nodes: &[Node],
    skip: &str,
    progress: &Progress,
) -> Result<Vec<FileEntry>, ImageError> {
    let total: u64 = nodes
        .iter()
        .filter(|n| n.kind == FileKind::File)
        .map(|n| n.size)
        .sum();
    let bar = progress.bytes(total, "hashing");
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes.iter().filter(|n| n.path != skip) {
        let sha256 = if n.kind == FileKind::File {
            let mut last = 0;
            let digest = inferloop_manifest::hash::sha256_file(&n.abs, |done, _| {
                bar.inc(done - last);
                last = done;
            })
            .map_err(ImageError::io(&n.abs))?;
            Some(digest)
        } else {
            None
        };
        out.push(FileEntry {
            path: n.path.clone(),
            kind: n.kind,
            mode: n.mode,
            size: n.size,
            sha256,
            target: n.target.clone(),
        });
    }
    bar.finish_and_clear();
    Ok(out)
}
