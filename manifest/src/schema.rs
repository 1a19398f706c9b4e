//! Manifest types. Loading (bytes → struct, hashing the raw bytes) is separate from the checks
//! each stage runs; parsing is strict so a typo never silently drops a pin.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::hash::{is_sha256_hex, sha256_bytes};
use crate::IntegrityError;

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema: u32,
    pub model: ModelPin,
}

/// The weights a box may serve: where they are, and what they must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPin {
    /// Relative paths are relative to the manifest's directory.
    pub path: String,
    pub sha256: String,
    pub size: u64,
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
        if self.model.path.trim().is_empty() {
            return Err(bad("model.path", "must not be empty"));
        }
        if !is_sha256_hex(&self.model.sha256) {
            return Err(bad("model.sha256", "must be 64 lowercase hex digits"));
        }
        if self.model.size == 0 {
            return Err(bad("model.size", "must be positive"));
        }
        Ok(())
    }

    /// The pinned weights' location, resolving a relative path against the manifest's folder.
    pub fn model_path(&self, manifest_path: &Path) -> PathBuf {
        let p = Path::new(&self.model.path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            manifest_path
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(p)
        }
    }
}
