//! Manifest types. Loading (bytes → struct, hashing the raw bytes) is separate from the checks
//! each stage runs; parsing is strict so a typo never silently drops a pin.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hash::{is_sha256_hex, sha256_bytes};
use crate::image::{Artifact, Artifacts, FileEntry, FileKind, ImageInfo, BAKED_PATH};
use crate::IntegrityError;

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// A manifest. The daemon's own manifests carry only `schema` and `model`; images built by
/// `inferloop-image` add `image` (and, in the copy beside the image, `artifacts`). The
/// sections are optional so both kinds parse with the same strict type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema: u32,
    pub model: ModelPin,
    /// The smaller model that drafts for speculative decoding (`inferloopd serve
    /// --spec draft`), pinned the same way as `model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<ModelPin>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageInfo>,
    /// Only in the copy written beside the image: see [`crate::image`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Artifacts>,
}

/// The weights a box may serve: where they are, and what they must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPin {
    /// Relative paths are relative to the manifest's directory.
    pub path: String,
    pub sha256: String,
    pub size: u64,
    /// Inside the image or on the data partition; images always say which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Where an image's weights live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Inside the read-only image, listed in `image.files`.
    Baked,
    /// On a data partition mounted at run time, pinned by SHA-256 and size only.
    Mounted,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Baked => "baked",
            Self::Mounted => "mounted",
        }
    }
}

/// A parsed manifest with where it came from and the SHA-256 of its exact bytes.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub manifest: Manifest,
    pub path: PathBuf,
    pub raw_sha256: String,
}

impl Manifest {
    /// Reads and strictly parses a manifest file.
    pub fn load(path: &Path) -> Result<Loaded, IntegrityError> {
        let bytes = std::fs::read(path).map_err(|source| IntegrityError::ManifestRead {
            path: path.display().to_string(),
            source,
        })?;
        let manifest = Self::from_bytes(&bytes, path)?;
        Ok(Loaded {
            manifest,
            path: path.to_path_buf(),
            raw_sha256: sha256_bytes(&bytes),
        })
    }

    /// Parses bytes; `origin` only names the source in errors.
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self, IntegrityError> {
        serde_json::from_slice(bytes).map_err(|e| IntegrityError::ManifestParse {
            path: origin.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The canonical bytes: pretty JSON with a final newline. The builder writes these, and
    /// `verify` compares the baked copy with the outside one re-serialized without artifacts.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        // Serializing plain structs of strings and integers cannot fail.
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// This manifest as baked into the image: the same document without `artifacts`.
    pub fn baked(&self) -> Manifest {
        Manifest {
            artifacts: None,
            ..self.clone()
        }
    }

    /// What `inferloop-image build` checks before it bakes a manifest into an image: the
    /// serve checks, a complete and self-consistent `image` section, and no `artifacts`
    /// (the copy inside cannot pin the image that contains it).
    pub fn check_for_build(&self, origin: &Path) -> Result<(), IntegrityError> {
        self.check_for_serve(origin)?;
        self.check_image(origin)?;
        if self.artifacts.is_some() {
            return Err(IntegrityError::UnexpectedSection {
                path: origin.display().to_string(),
                section: "artifacts",
                reason: "the copy baked into an image cannot pin the image itself",
            });
        }
        Ok(())
    }

    /// What installing (or verifying) an image needs from the manifest beside it: the
    /// build checks plus `artifacts`, and, when `board` is given, a matching `compatible`.
    pub fn check_for_install(
        &self,
        origin: &Path,
        board: Option<&str>,
    ) -> Result<(), IntegrityError> {
        let path = origin.display().to_string();
        self.check_for_serve(origin)?;
        let image = self.check_image(origin)?;
        let artifacts = self
            .artifacts
            .as_ref()
            .ok_or_else(|| IntegrityError::MissingSection {
                path: path.clone(),
                section: "artifacts",
            })?;
        check_artifact(&path, "artifacts.image", &artifacts.image)?;
        if let Some(tarball) = &artifacts.tarball {
            check_artifact(&path, "artifacts.tarball", tarball)?;
        }
        if artifacts.image.file != image.format.file_name() {
            return Err(bad(
                &path,
                "artifacts.image.file",
                format!(
                    "is {:?} but a {} image is called {:?}",
                    artifacts.image.file,
                    image.format.as_str(),
                    image.format.file_name()
                ),
            ));
        }
        if let Some(board) = board {
            if image.compatible != board {
                return Err(IntegrityError::Incompatible {
                    path,
                    compatible: image.compatible.clone(),
                    board: board.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The `image` section: present, well-formed and consistent with `model`.
    fn check_image(&self, origin: &Path) -> Result<&ImageInfo, IntegrityError> {
        let path = origin.display().to_string();
        let image = self
            .image
            .as_ref()
            .ok_or_else(|| IntegrityError::MissingSection {
                path: path.clone(),
                section: "image",
            })?;
        if image.version.trim().is_empty() {
            return Err(bad(&path, "image.version", "must not be empty"));
        }
        if image.compatible.trim().is_empty() {
            return Err(bad(&path, "image.compatible", "must not be empty"));
        }
        for (field, value) in [
            ("image.daemon.sha256", &image.daemon.sha256),
            ("image.config_sha256", &image.config_sha256),
        ] {
            if !is_sha256_hex(value) {
                return Err(bad(&path, field, "must be 64 lowercase hex digits"));
            }
        }
        if image.daemon.target.trim().is_empty() {
            return Err(bad(&path, "image.daemon.target", "must not be empty"));
        }
        if image.daemon.version.trim().is_empty() {
            return Err(bad(&path, "image.daemon.version", "must not be empty"));
        }
        check_files(&path, &image.files)?;

        let find = |p: &str| {
            image
                .files
                .binary_search_by(|e| e.path.as_str().cmp(p))
                .ok()
                .map(|i| &image.files[i])
        };
        match find(&image.daemon.path) {
            Some(e)
                if e.kind == FileKind::File
                    && e.sha256.as_deref() == Some(image.daemon.sha256.as_str())
                    && e.size == image.daemon.size => {}
            _ => {
                return Err(bad(
                    &path,
                    "image.daemon",
                    format!(
                        "{} is not in image.files with the pinned size and SHA-256",
                        image.daemon.path
                    ),
                ))
            }
        }
        let placement = self
            .model
            .placement
            .ok_or_else(|| bad(&path, "model.placement", "is required in an image manifest"))?;
        if !self.model.path.starts_with('/') {
            return Err(bad(
                &path,
                "model.path",
                "must be absolute in an image manifest",
            ));
        }
        let listed = find(&self.model.path);
        match (placement, listed) {
            (Placement::Baked, Some(e))
                if e.kind == FileKind::File
                    && e.sha256.as_deref() == Some(self.model.sha256.as_str())
                    && e.size == self.model.size => {}
            (Placement::Baked, _) => {
                return Err(bad(
                    &path,
                    "model",
                    format!(
                        "is baked but {} is not in image.files with the pinned size and SHA-256",
                        self.model.path
                    ),
                ))
            }
            (Placement::Mounted, Some(_)) => {
                return Err(bad(
                    &path,
                    "model",
                    format!(
                        "is mounted at run time but {} is also inside the image",
                        self.model.path
                    ),
                ))
            }
            (Placement::Mounted, None) => {}
        }
        Ok(image)
    }

    /// What `inferloopd serve --manifest` needs before it trusts the pin.
    pub fn check_for_serve(&self, origin: &Path) -> Result<(), IntegrityError> {
        let path = origin.display().to_string();
        if self.schema != SCHEMA_VERSION {
            return Err(IntegrityError::UnsupportedSchema {
                path,
                found: self.schema,
                supported: SCHEMA_VERSION,
            });
        }
        let bad = |field, message: &str| IntegrityError::BadField {
            path: path.clone(),
            field,
            message: message.to_string(),
        };
        let model = (&self.model, ["model.path", "model.sha256", "model.size"]);
        let draft = (self.draft_model.as_ref()).map(|pin| {
            let fields = ["draft_model.path", "draft_model.sha256", "draft_model.size"];
            (pin, fields)
        });
        for (pin, [path_field, sha_field, size_field]) in std::iter::once(model).chain(draft) {
            if pin.path.trim().is_empty() {
                return Err(bad(path_field, "must not be empty"));
            }
            if !is_sha256_hex(&pin.sha256) {
                return Err(bad(sha_field, "must be 64 lowercase hex digits"));
            }
            if pin.size == 0 {
                return Err(bad(size_field, "must be positive"));
            }
        }
        Ok(())
    }

    /// The pinned weights' location, resolving a relative path against the manifest's folder.
    pub fn model_path(&self, manifest_path: &Path) -> PathBuf {
        pin_path(&self.model, manifest_path)
    }

    /// The pinned draft model's location, when the manifest pins one.
    pub fn draft_model_path(&self, manifest_path: &Path) -> Option<PathBuf> {
        self.draft_model
            .as_ref()
            .map(|pin| pin_path(pin, manifest_path))
    }
}

/// A pin's path, a relative one resolved against the manifest's folder.
fn pin_path(pin: &ModelPin, manifest_path: &Path) -> PathBuf {
    let p = Path::new(&pin.path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        manifest_path
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(p)
    }
}

fn bad(path: &str, field: &'static str, message: impl Into<String>) -> IntegrityError {
    IntegrityError::BadField {
        path: path.to_string(),
        field,
        message: message.into(),
    }
}

fn check_artifact(path: &str, field: &'static str, a: &Artifact) -> Result<(), IntegrityError> {
    if a.file.is_empty() || a.file.contains('/') {
        return Err(bad(path, field, "`file` must be a bare file name"));
    }
    if !is_sha256_hex(&a.sha256) {
        return Err(bad(path, field, "`sha256` must be 64 lowercase hex digits"));
    }
    Ok(())
}

/// `/`, or `/` followed by non-empty components that are neither `.` nor `..`.
pub fn is_normal_image_path(p: &str) -> bool {
    p == "/"
        || (p.starts_with('/')
            && p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

/// The file list: sorted, unique, normalised paths, and fields that fit each kind.
fn check_files(path: &str, files: &[FileEntry]) -> Result<(), IntegrityError> {
    const FIELD: &str = "image.files";
    if files.first().map(|e| e.path.as_str()) != Some("/") {
        return Err(bad(path, FIELD, "must start with the root directory `/`"));
    }
    for pair in files.windows(2) {
        if pair[0].path >= pair[1].path {
            return Err(bad(
                path,
                FIELD,
                format!(
                    "must be sorted by path without duplicates: {} comes before {}",
                    pair[0].path, pair[1].path
                ),
            ));
        }
    }
    for e in files {
        let p = &e.path;
        if !is_normal_image_path(p) {
            return Err(bad(
                path,
                FIELD,
                format!("{p:?} is not a normalised absolute path"),
            ));
        }
        if p == BAKED_PATH {
            return Err(bad(
                path,
                FIELD,
                format!("must not list {BAKED_PATH}, the manifest itself"),
            ));
        }
        if e.mode > 0o7777 {
            return Err(bad(
                path,
                FIELD,
                format!("{p}: mode {:o} has type bits", e.mode),
            ));
        }
        let ok = match e.kind {
            FileKind::Dir => e.size == 0 && e.sha256.is_none() && e.target.is_none(),
            FileKind::File => e.target.is_none() && e.sha256.as_deref().is_some_and(is_sha256_hex),
            FileKind::Symlink => {
                e.sha256.is_none()
                    && e.target
                        .as_deref()
                        .is_some_and(|t| !t.is_empty() && t.len() as u64 == e.size)
            }
        };
        if !ok {
            let rule = match e.kind {
                FileKind::Dir => "a dir has size 0, no sha256 and no target",
                FileKind::File => "a file has a 64-hex-digit sha256 and no target",
                FileKind::Symlink => {
                    "a symlink has a non-empty target whose length is its size, and no sha256"
                }
            };
            return Err(bad(path, FIELD, format!("{p}: {rule}")));
        }
    }
    Ok(())
}
