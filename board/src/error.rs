//! The board crate's one error type.

use std::path::PathBuf;

/// What went wrong loading profiles or detecting the board.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    /// `--board NAME` named no compiled-in profile.
    #[error("unknown board `{name}`; known boards: {}", known.join(", "))]
    UnknownBoard { name: String, known: Vec<String> },

    /// A profile is not valid TOML or has an unknown, missing or mistyped field.
    #[error("board profile {origin}: {message}")]
    ProfileParse { origin: String, message: String },

    /// A profile parsed but one of its values makes no sense.
    #[error("board profile `{profile}`: `{field}` {message}")]
    InvalidProfile {
        profile: String,
        field: String,
        message: String,
    },

    /// Two profiles claim the same name or the same compatible string.
    #[error("board profiles `{first}` and `{second}` both claim {what}")]
    ProfileConflict {
        first: String,
        second: String,
        what: String,
    },

    /// No rule matched and the CPU architecture has no fallback profile.
    #[error("no board profile for CPU architecture `{arch}`; pass --board with one of: {}", known.join(", "))]
    UnsupportedArch { arch: String, known: Vec<String> },

    /// A profile file given by path could not be read.
    #[error("cannot read board profile {path}: {source}")]
    ReadProfile {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BoardError {
    /// Stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownBoard { .. } => "unknown_board",
            Self::ProfileParse { .. } => "profile_parse",
            Self::InvalidProfile { .. } => "invalid_profile",
            Self::ProfileConflict { .. } => "profile_conflict",
            Self::UnsupportedArch { .. } => "unsupported_arch",
            Self::ReadProfile { .. } => "read_profile",
        }
    }
}
