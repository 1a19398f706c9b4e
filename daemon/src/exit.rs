//! Process exit codes, documented in docs/configuration.md; supervisors and the
//! qualification suite rely on them.

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    Clean = 0,
    /// The memory ledger refused the configuration at cold load.
    MemoryRefused = 1,
    /// Bad configuration or command-line usage.
    Usage = 2,
    /// Weights or manifest failed the integrity check.
    Integrity = 3,
    /// The model could not be loaded.
    ModelLoad = 4,
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c as u8)
    }
}
