//! `inferloop-image verify`: an image (or a mounted root) against its manifest. Every
//! mismatch is collected and reported; errors are only for what stops the check itself.

use std::collections::BTreeSet;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use inferloop_manifest::{FileEntry, FileKind, ImageFormat, IntegrityError, Manifest, BAKED_PATH};

use crate::build::MANIFEST_FILE;
use crate::error::ImageError;
use crate::progress::Progress;
use crate::tools::{FSCK_EROFS, UNSQUASHFS};
use crate::tree::{self, Specials};

/// What to check.
#[derive(Debug, Clone)]
pub enum Subject {
    /// An image file: its hash, then every file unpacked from it.
    Image(PathBuf),
    /// A root filesystem already mounted or unpacked: every listed entry. Entries not in
    /// the manifest are not reported (a live root has /proc, /run, mounted data, …).
    Root(PathBuf),
}

/// One difference between the manifest and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    ImageSize {
        file: PathBuf,
        expected: u64,
        actual: u64,
    },
    ImageHash {
        file: PathBuf,
        expected: String,
        actual: String,
    },
    Format {
        file: PathBuf,
        expected: ImageFormat,
        actual: Option<ImageFormat>,
    },
    /// The unpacker failed; what it did extract is still compared.
    Unpack {
        tool: &'static str,
        message: String,
    },
    Missing {
        path: String,
    },
    Unexpected {
        path: String,
    },
    Kind {
        path: String,
        expected: FileKind,
        actual: FileKind,
    },
    Mode {
        path: String,
        expected: u32,
        actual: u32,
    },
    Size {
        path: String,
        expected: u64,
        actual: u64,
    },
    Hash {
        path: String,
        expected: String,
        actual: String,
    },
    Target {
        path: String,
        expected: String,
        actual: String,
    },
    /// The manifest inside the image is not the outside one minus `artifacts`.
    BakedManifest {
        message: String,
    },
}

impl Mismatch {
    /// The image path the mismatch is about, when it is about one entry.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Missing { path }
            | Self::Unexpected { path }
            | Self::Kind { path, .. }
            | Self::Mode { path, .. }
            | Self::Size { path, .. }
            | Self::Hash { path, .. }
            | Self::Target { path, .. } => Some(path),
            Self::BakedManifest { .. } => Some(BAKED_PATH),
            _ => None,
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ImageSize {
                file,
                expected,
                actual,
            } => write!(
                f,
                "image {}: size expected {expected} bytes, found {actual}",
                file.display()
            ),
            Self::ImageHash {
                file,
                expected,
                actual,
            } => write!(
                f,
                "image {}: SHA-256 expected {expected}, found {actual}",
                file.display()
            ),
            Self::Format {
                file,
                expected,
                actual,
            } => write!(
                f,
                "image {}: the manifest says {}, the file is {}",
                file.display(),
                expected.as_str(),
                actual.map_or("neither squashfs nor erofs", |a| a.as_str())
            ),
            Self::Unpack { tool, message } => write!(f, "unpacking with {tool} failed: {message}"),
            Self::Missing { path } => write!(f, "{path}: missing"),
            Self::Unexpected { path } => write!(f, "{path}: not in the manifest"),
            Self::Kind {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{path}: expected a {}, found a {}",
                expected.as_str(),
                actual.as_str()
            ),
            Self::Mode {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{path}: mode expected {expected:04o}, found {actual:04o}"
            ),
            Self::Size {
                path,
                expected,
                actual,
            } => write!(f, "{path}: size expected {expected} bytes, found {actual}"),
            Self::Hash {
                path,
                expected,
                actual,
            } => write!(f, "{path}: SHA-256 expected {expected}, found {actual}"),
            Self::Target {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{path}: link target expected {expected:?}, found {actual:?}"
            ),
            Self::BakedManifest { message } => write!(f, "{BAKED_PATH}: {message}"),
        }
    }
}

/// The outcome of a check that ran to the end.
#[derive(Debug, Clone)]
pub struct Report {
    pub manifest: PathBuf,
    /// False when the manifest has no `artifacts` (the copy from inside an image).
    pub image_hash_checked: bool,
    pub entries_checked: usize,
    pub mismatches: Vec<Mismatch>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Checks `subject` against `manifest` (default: `manifest.json` beside an image, or the
/// baked copy inside a root), and its board when `board` is given.
pub fn verify(
    subject: &Subject,
    manifest: Option<&Path>,
    board: Option<&str>,
    progress: &Progress,
) -> Result<Report, ImageError> {
    let manifest_path = match (manifest, subject) {
        (Some(p), _) => p.to_path_buf(),
        (None, Subject::Image(img)) => img
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(MANIFEST_FILE),
        (None, Subject::Root(root)) => tree::join(root, BAKED_PATH),
    };
    let loaded = Manifest::load(&manifest_path)?;
    let m = &loaded.manifest;
    if m.artifacts.is_some() {
        m.check_for_install(&manifest_path, board)?;
    } else {
        m.check_for_build(&manifest_path)?;
    }
    let info = m
        .image
        .as_ref()
        .ok_or_else(|| IntegrityError::MissingSection {
            path: manifest_path.display().to_string(),
            section: "image",
        })?;
    if let Some(board) = board {
        if info.compatible != board {
            return Err(IntegrityError::Incompatible {
                path: manifest_path.display().to_string(),
                compatible: info.compatible.clone(),
                board: board.to_string(),
            }
            .into());
        }
    }

    let mut mismatches = Vec::new();
    let mut image_hash_checked = false;
    let (tree_root, _unpacked, extras) = match subject {
        Subject::Root(root) => (root.clone(), None, false),
        Subject::Image(img) => {
            if let Some(artifacts) = &m.artifacts {
                image_hash_checked = true;
                check_image_file(img, &artifacts.image, progress, &mut mismatches)?;
            }
            let actual = detect_format(img)?;
            if actual != Some(info.format) {
                mismatches.push(Mismatch::Format {
                    file: img.clone(),
                    expected: info.format,
                    actual,
                });
            }
            let dir = tempfile::Builder::new()
                .prefix("inferloop-verify-")
                .tempdir()
                .map_err(ImageError::io(std::env::temp_dir()))?;
            let root = dir.path().join("root");
            unpack(actual.unwrap_or(info.format), img, &root, &mut mismatches)?;
            (root, Some(dir), true)
        }
    };

    compare(&tree_root, &info.files, extras, progress, &mut mismatches)?;
    check_baked_copy(&tree_root, m, &mut mismatches);
    Ok(Report {
        manifest: manifest_path,
        image_hash_checked,
        entries_checked: info.files.len(),
        mismatches,
    })
}

fn check_image_file(
    img: &Path,
    pin: &inferloop_manifest::Artifact,
    progress: &Progress,
    mismatches: &mut Vec<Mismatch>,
) -> Result<(), ImageError> {
    let size = std::fs::metadata(img).map_err(ImageError::io(img))?.len();
    if size != pin.size {
        mismatches.push(Mismatch::ImageSize {
            file: img.to_path_buf(),
            expected: pin.size,
            actual: size,
        });
    }
    let bar = progress.bytes(size, "hashing");
    let mut last = 0;
    let actual = inferloop_manifest::hash::sha256_file(img, |done, _| {
        bar.inc(done - last);
        last = done;
    })
    .map_err(ImageError::io(img))?;
    bar.finish_and_clear();
    if actual != pin.sha256 {
        mismatches.push(Mismatch::ImageHash {
            file: img.to_path_buf(),
            expected: pin.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

/// squashfs starts with `hsqs`; erofs has 0xE0F5E1E2 (little endian) at offset 1024.
pub fn detect_format(img: &Path) -> Result<Option<ImageFormat>, ImageError> {
    let mut head = vec![0u8; 1028];
    let mut file = std::fs::File::open(img).map_err(ImageError::io(img))?;
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]).map_err(ImageError::io(img))? {
            0 => break,
            k => n += k,
        }
    }
    if n >= 4 && &head[..4] == b"hsqs" {
        return Ok(Some(ImageFormat::Squashfs));
    }
    if n >= 1028 && head[1024..1028] == 0xE0F5_E1E2u32.to_le_bytes() {
        return Ok(Some(ImageFormat::Erofs));
    }
    Ok(None)
}

/// Unpacks `img` into `dest` (which must not exist). A failing unpacker is a mismatch, not
/// an error: a damaged image is exactly what verify is for.
pub fn unpack(
    format: ImageFormat,
    img: &Path,
    dest: &Path,
    mismatches: &mut Vec<Mismatch>,
) -> Result<(), ImageError> {
    let (tool, args): (_, Vec<std::ffi::OsString>) = match format {
        ImageFormat::Squashfs => (
            UNSQUASHFS,
            vec![
                "-d".into(),
                dest.into(),
                "-no-xattrs".into(),
                "-n".into(),
                "-q".into(),
                img.into(),
            ],
        ),
        // --no-preserve-owner: fsck.erofs 1.5 chowns after chmod when it preserves owners,
        // and chown clears setuid and setgid, so the check would report every setuid file.
        // The image is all uid/gid 0 by construction; modes are what the manifest pins.
        ImageFormat::Erofs => (
            FSCK_EROFS,
            vec![
                format!("--extract={}", dest.display()).into(),
                "--no-preserve-owner".into(),
                "--preserve-perms".into(),
                img.into(),
            ],
        ),
    };
    let program = tool.find()?;
    let out = std::process::Command::new(&program)
        .args(&args)
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .map_err(ImageError::io(&program))?;
    if !out.status.success() {
        let message = match tool.failed(&out) {
            ImageError::ToolFailed { status, stderr, .. } => format!("{status}: {stderr}"),
            other => other.to_string(),
        };
        mismatches.push(Mismatch::Unpack {
            tool: tool.name,
            message,
        });
    }
    if !dest.exists() {
        std::fs::create_dir_all(dest).map_err(ImageError::io(dest))?;
    }
    Ok(())
}

/// Compares the tree at `root` with the listed entries; with `extras`, also reports what
/// is in the tree but not listed.
pub fn compare(
    root: &Path,
    files: &[FileEntry],
    extras: bool,
    progress: &Progress,
    mismatches: &mut Vec<Mismatch>,
) -> Result<(), ImageError> {
    let total: u64 = files
        .iter()
        .filter(|e| e.kind == FileKind::File)
        .map(|e| e.size)
        .sum();
    let bar = progress.bytes(total, "checking");
    for e in files {
        let path = tree::join(root, &e.path);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            mismatches.push(Mismatch::Missing {
                path: e.path.clone(),
            });
            continue;
        };
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            FileKind::Dir
        } else if ft.is_symlink() {
            FileKind::Symlink
        } else {
            FileKind::File
        };
        if kind != e.kind {
            mismatches.push(Mismatch::Kind {
                path: e.path.clone(),
                expected: e.kind,
                actual: kind,
            });
            continue;
        }
        let mode = meta.mode() & 0o7777;
        // A symlink's own mode means nothing on Linux.
        if kind != FileKind::Symlink && mode != e.mode {
            mismatches.push(Mismatch::Mode {
                path: e.path.clone(),
                expected: e.mode,
                actual: mode,
            });
        }
        match kind {
            FileKind::Dir => {}
            FileKind::Symlink => {
                let actual = std::fs::read_link(&path)
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let expected = e.target.clone().unwrap_or_default();
                if actual != expected {
                    mismatches.push(Mismatch::Target {
                        path: e.path.clone(),
                        expected,
                        actual,
                    });
                }
            }
            FileKind::File => {
                if meta.len() != e.size {
                    mismatches.push(Mismatch::Size {
                        path: e.path.clone(),
                        expected: e.size,
                        actual: meta.len(),
                    });
                    bar.inc(e.size);
                    continue;
                }
                let mut last = 0;
                let actual = inferloop_manifest::hash::sha256_file(&path, |done, _| {
                    bar.inc(done - last);
                    last = done;
                })
                .map_err(ImageError::io(&path))?;
                if Some(&actual) != e.sha256.as_ref() {
                    mismatches.push(Mismatch::Hash {
                        path: e.path.clone(),
                        expected: e.sha256.clone().unwrap_or_default(),
                        actual,
                    });
                }
            }
        }
    }
    bar.finish_and_clear();
    if extras {
        let listed: BTreeSet<&str> = files.iter().map(|e| e.path.as_str()).collect();
        for node in tree::walk(root, Specials::Refuse)? {
            if node.path != BAKED_PATH && !listed.contains(node.path.as_str()) {
                mismatches.push(Mismatch::Unexpected { path: node.path });
            }
        }
    }
    Ok(())
}

/// The baked copy must be the outside manifest minus `artifacts`, byte for byte.
fn check_baked_copy(root: &Path, m: &Manifest, mismatches: &mut Vec<Mismatch>) {
    let path = tree::join(root, BAKED_PATH);
    let message = match std::fs::read(&path) {
        Err(_) => "missing: the image carries no manifest".to_string(),
        Ok(bytes) if bytes == m.baked().to_json_bytes() => return,
        Ok(_) => "differs from the manifest it is checked against (minus artifacts)".to_string(),
    };
    mismatches.push(Mismatch::BakedManifest { message });
}
