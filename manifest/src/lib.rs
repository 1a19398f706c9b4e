//! The InferLoop manifest: the JSON document that pins what a box may run, shared by the
//! daemon (which refuses weights that do not match) and the image builder (which writes it).
//!
//! # Layout
//! - [`schema`]: the types, strict parsing (unknown fields are errors) and per-stage checks
//!   (`check_for_serve`, `check_for_build`, `check_for_install`).
//! - [`image`]: the optional sections an image manifest adds (file list, daemon, tools,
//!   artifacts), and where the image carries its own copy.
//! - [`hash`]: streaming SHA-256 of files with progress reporting.
//! - [`verify`]: weights against a pin, with an optional verified-result cache.
//! - [`time`]: epoch seconds as UTC text, as manifests and reports show them.

pub mod hash;
pub mod image;
pub mod schema;
pub mod time;
pub mod verify;

pub use image::{
    Artifact, Artifacts, DaemonPin, FileEntry, FileKind, ImageFormat, ImageInfo, Tools, BAKED_PATH,
};
pub use schema::{Loaded, Manifest, ModelPin, Placement, SCHEMA_VERSION};
pub use verify::{verify_weights, Verified, VerifyCache};

/// Everything that can go wrong reading a manifest or checking weights against it.
///
/// An OS error is the variant's `source()`, not part of its message: binaries print the
/// chain with `{:#}`, which would otherwise show it twice.
#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    #[error("cannot read manifest {path}")]
    ManifestRead {
        path: String,
        source: std::io::Error,
    },
    #[error("manifest {path} is invalid: {message}")]
    ManifestParse { path: String, message: String },
    #[error(
        "manifest {path}: schema {found} is not supported (this build reads schema {supported})"
    )]
    UnsupportedSchema {
        path: String,
        found: u32,
        supported: u32,
    },
    #[error("manifest {path}: `{field}` {message}")]
    BadField {
        path: String,
        field: &'static str,
        message: String,
    },
    #[error("manifest {path}: the `{section}` section is missing")]
    MissingSection { path: String, section: &'static str },
    #[error("manifest {path}: the `{section}` section must not be here: {reason}")]
    UnexpectedSection {
        path: String,
        section: &'static str,
        reason: &'static str,
    },
    #[error("manifest {path} is for board `{compatible}`, not `{board}`")]
    Incompatible {
        path: String,
        compatible: String,
        board: String,
    },
    #[error("weights {path} are missing")]
    WeightsMissing {
        path: String,
        source: std::io::Error,
    },
    #[error("weights {path} have the wrong size: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("weights {path} have the wrong SHA-256: expected {expected}, found {actual}")]
    HashMismatch {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("cannot read weights {path}")]
    WeightsRead {
        path: String,
        source: std::io::Error,
    },
}

impl IntegrityError {
    /// Stable label for logs, metrics and test assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ManifestRead { .. } => "manifest_read",
            Self::ManifestParse { .. } => "manifest_parse",
            Self::UnsupportedSchema { .. } => "unsupported_schema",
            Self::BadField { .. } => "bad_field",
            Self::MissingSection { .. } => "missing_section",
            Self::UnexpectedSection { .. } => "unexpected_section",
            Self::Incompatible { .. } => "incompatible",
            Self::WeightsMissing { .. } => "weights_missing",
            Self::SizeMismatch { .. } => "size_mismatch",
            Self::HashMismatch { .. } => "hash_mismatch",
            Self::WeightsRead { .. } => "weights_read",
        }
    }
}
