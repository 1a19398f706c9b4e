//! The optional image sections: what `inferloop-image` pins about a whole root filesystem.
//!
//! One manifest travels in two copies. The builder bakes one into the image at
//! [`BAKED_PATH`]; it cannot hold the image's own SHA-256 (writing it would change the image).
//! The copy written beside the image is the same document plus [`Artifacts`], which pin the
//! image file and the tarball from outside. Removing `artifacts` from the outside copy gives
//! back the baked bytes exactly ([`crate::Manifest::to_json_bytes`]), which `verify` checks.

use serde::{Deserialize, Serialize};

/// Where the image carries its own manifest. The file list leaves this path out: a list
/// cannot contain the hash of the file that holds it.
pub const BAKED_PATH: &str = "/etc/inferloop/manifest.json";

/// Facts about the image as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageInfo {
    /// The image's own version, from the build spec.
    pub version: String,
    /// The board profile name the image is built for (`inferloop-board`'s profiles).
    pub compatible: String,
    /// `SOURCE_DATE_EPOCH` of the build: every timestamp in the image and tarball.
    pub build_time: u64,
    pub format: ImageFormat,
    pub daemon: DaemonPin,
    /// SHA-256 of the daemon config baked at `/etc/inferloop/inferloopd.toml`.
    pub config_sha256: String,
    pub tools: Tools,
    /// Every directory, file and symlink in the image except [`BAKED_PATH`], sorted by path.
    pub files: Vec<FileEntry>,
}

/// The read-only filesystem the image is packed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Squashfs,
    Erofs,
}

impl ImageFormat {
    /// File name of the packed image in the output directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Squashfs => "rootfs.squashfs",
            Self::Erofs => "rootfs.erofs",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Squashfs => "squashfs",
            Self::Erofs => "erofs",
        }
    }
}

/// The daemon binary inside the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonPin {
    /// Absolute path inside the image.
    pub path: String,
    pub sha256: String,
    pub size: u64,
    /// Rust target triple the binary was built for, e.g. `aarch64-unknown-linux-gnu`.
    pub target: String,
    pub version: String,
}

/// Versions of the tools whose output is in the image; another version may pack other bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mksquashfs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mkfs_erofs: Option<String>,
    /// The zstd library that compressed `rootfs.tar.zst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd: Option<String>,
}

/// What kind of tree entry a [`FileEntry`] is. Nothing else (devices, fifos, sockets) may be
/// in an image: `/dev` and `/run` are mounted at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    Dir,
    File,
    Symlink,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dir => "dir",
            Self::File => "file",
            Self::Symlink => "symlink",
        }
    }
}

/// One entry of the image tree. Ownership is not listed: every entry is uid/gid 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Absolute, normalised path inside the image (`/` for the root).
    pub path: String,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky, as four octal digits.
    #[serde(with = "octal_mode")]
    pub mode: u32,
    /// Bytes of content for files, of the target for symlinks, 0 for directories.
    pub size: u64,
    /// Content hash, files only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Link target, symlinks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The artifacts beside the image, pinned from outside it (absent from the baked copy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifacts {
    pub image: Artifact,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tarball: Option<Artifact>,
}

/// One output file: its name in the output directory, size and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub file: String,
    pub sha256: String,
    pub size: u64,
}

/// Modes as `"4755"` rather than the decimal `2541` nobody can read.
mod octal_mode {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mode: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{mode:04o}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let text = String::deserialize(d)?;
        if text.len() != 4 || !text.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(serde::de::Error::custom(format!(
                "mode {text:?} must be four octal digits, e.g. \"0755\""
            )));
        }
        u32::from_str_radix(&text, 8).map_err(serde::de::Error::custom)
    }
}
