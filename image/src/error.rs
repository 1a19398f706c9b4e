//! The image builder's one error type; every variant names what the user must fix.

use std::path::PathBuf;

use inferloop_manifest::IntegrityError;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read spec {path}: {source}")]
    SpecRead {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("spec {path} is invalid: {message}")]
    SpecParse { path: PathBuf, message: String },

    #[error("spec: `{field}` {message}")]
    SpecInvalid {
        field: &'static str,
        message: String,
    },

    #[error("spec: unknown board `{name}`; known boards: {}", known.join(", "))]
    UnknownBoard { name: String, known: Vec<String> },

    /// A path named by the spec does not exist or cannot be read.
    #[error("spec: `{field}` {path} cannot be read: {source}")]
    InputMissing {
        field: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    /// The daemon binary is not an ELF executable for the spec's target.
    #[error("daemon {path}: {message}")]
    DaemonBinary { path: PathBuf, message: String },

    /// A baked model does not match the SHA-256 or size the spec pins.
    #[error("model {path}: expected {field} {expected}, found {actual}")]
    ModelMismatch {
        path: PathBuf,
        field: &'static str,
        expected: String,
        actual: String,
    },

    /// Something in the base or overlay that an image cannot hold.
    #[error("{path}: {message}")]
    UnsupportedEntry { path: PathBuf, message: String },

    #[error("overlay {path}: {message}")]
    OverlayConflict { path: PathBuf, message: String },

    #[error("template {path}: {message}")]
    Template { path: PathBuf, message: String },

    #[error("{path} line {line}: {message}")]
    SysUsers {
        path: PathBuf,
        line: usize,
        message: String,
    },

    /// The board has no A/B slots to update.
    #[error("board `{board}` has no [ota] table in its profile: it has no A/B root filesystem slots for RAUC")]
    NoOta { board: String },

    /// A value that would go into RAUC's system.conf is unusable.
    #[error("RAUC config: {message}")]
    OtaConfig { message: String },

    /// The qualification binary is not an ELF executable for the spec's target.
    #[error("ota.qual {path}: {message}")]
    QualBinary { path: PathBuf, message: String },

    /// A keyring or certificate file is not a PEM certificate.
    #[error("{path}: {message}")]
    Certificate { path: PathBuf, message: String },

    /// The bundle's output file is there already.
    #[error("{path} exists; remove it or pass --force")]
    BundleExists { path: PathBuf },

    /// The build output to bundle is incomplete or not what the spec describes.
    #[error("cannot bundle {path}: {message}")]
    BundleInput { path: PathBuf, message: String },

    /// `rauc info` refused a bundle: untrusted signer, corrupt file, not a bundle.
    #[error("bundle {path} does not verify: {message}")]
    BundleVerify { path: PathBuf, message: String },

    /// The router of a gateway image cannot be installed into it.
    #[error("gateway: {message}")]
    Gateway { message: String },

    #[error("`{tool}` not found on PATH; install the Debian package `{package}`")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },

    #[error("`{tool}` failed ({status}): {stderr}")]
    ToolFailed {
        tool: &'static str,
        status: String,
        stderr: String,
    },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(transparent)]
    Manifest(#[from] IntegrityError),
}

impl ImageError {
    /// Stable label for logs and test assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SpecRead { .. } => "spec_read",
            Self::SpecParse { .. } => "spec_parse",
            Self::SpecInvalid { .. } => "spec_invalid",
            Self::UnknownBoard { .. } => "unknown_board",
            Self::InputMissing { .. } => "input_missing",
            Self::DaemonBinary { .. } => "daemon_binary",
            Self::ModelMismatch { .. } => "model_mismatch",
            Self::UnsupportedEntry { .. } => "unsupported_entry",
            Self::OverlayConflict { .. } => "overlay_conflict",
            Self::Template { .. } => "template",
            Self::SysUsers { .. } => "sysusers",
            Self::NoOta { .. } => "no_ota",
            Self::OtaConfig { .. } => "ota_config",
            Self::QualBinary { .. } => "qual_binary",
            Self::Certificate { .. } => "certificate",
            Self::BundleExists { .. } => "bundle_exists",
            Self::BundleInput { .. } => "bundle_input",
            Self::BundleVerify { .. } => "bundle_verify",
            Self::Gateway { .. } => "gateway",
            Self::ToolMissing { .. } => "tool_missing",
            Self::ToolFailed { .. } => "tool_failed",
            Self::Io { .. } => "io",
            Self::Manifest(e) => e.kind(),
        }
    }

    /// An I/O error with the path it happened on.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io { path, source }
    }
}
