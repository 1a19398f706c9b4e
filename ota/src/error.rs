//! The agent's errors, each with a stable `kind()` for logs and feedback.

use std::path::PathBuf;

/// Everything that can go wrong talking to the server, downloading, or installing.
#[derive(Debug, thiserror::Error)]
pub enum OtaError {
    #[error("config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("server unreachable ({url}): {message}")]
    Unreachable { url: String, message: String },
    #[error("server answered {status} to {method} {url}: {body}")]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("server answered garbage to {url}: {message}")]
    Garbage { url: String, message: String },
    #[error("download of {url} interrupted after {done} bytes: {message}")]
    Interrupted {
        url: String,
        done: u64,
        message: String,
    },
    #[error("{file}: size {actual} bytes, the server announced {expected}")]
    SizeMismatch {
        file: String,
        expected: u64,
        actual: u64,
    },
    #[error("{file}: {algorithm} mismatch: expected {expected}, got {actual}")]
    HashMismatch {
        file: String,
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error("deployment has no artifact to install ({message})")]
    NoArtifact { message: String },
    #[error("RAUC over D-Bus: {message}")]
    Rauc { message: String },
    #[error("RAUC refused the bundle: {last_error}")]
    InstallFailed { code: i32, last_error: String },
    #[error("reboot command {command:?} failed: {message}")]
    Reboot {
        command: Vec<String>,
        message: String,
    },
}

impl OtaError {
    /// A stable name for logs and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config { .. } => "config",
            Self::Io { .. } => "io",
            Self::Unreachable { .. } => "unreachable",
            Self::Status { .. } => "status",
            Self::Garbage { .. } => "garbage",
            Self::Interrupted { .. } => "interrupted",
            Self::SizeMismatch { .. } => "size_mismatch",
            Self::HashMismatch { .. } => "hash_mismatch",
            Self::NoArtifact { .. } => "no_artifact",
            Self::Rauc { .. } => "rauc",
            Self::InstallFailed { .. } => "install_failed",
            Self::Reboot { .. } => "reboot",
        }
    }

    /// Worth retrying later with the same action (the server or the network), as opposed
    /// to a final verdict on the update that must be reported as a failure.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. }
                | Self::Status { .. }
                | Self::Garbage { .. }
                | Self::Interrupted { .. }
                | Self::Rauc { .. }
        )
    }

    pub(crate) fn io(
        what: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { what, path, source }
    }
}
