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
    /// The server's certificate did not verify (or the handshake failed otherwise).
    #[error("TLS with {url} failed: {message} (is `ca_file` the CA that signed the server's certificate?)")]
    Tls { url: String, message: String },
    /// 401 or 403: the server does not accept the box's token (or wants one).
    #[error("server refused the box's credentials: {status} to {method} {url}: {body} (check `target_token_file` / `gateway_token_file` and the token the server holds for this controller id)")]
    Unauthorized {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
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
            Self::Tls { .. } => "tls",
            Self::Unauthorized { .. } => "unauthorized",
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
                | Self::Tls { .. }
                | Self::Unauthorized { .. }
                | Self::Status { .. }
                | Self::Garbage { .. }
                | Self::Interrupted { .. }
                | Self::Rauc { .. }
        )
    }

    /// Retrying alone will not fix it: someone has to fix a token or a certificate (on
    /// the box or the server). Still retried, with backoff, since the fix may be theirs.
    pub fn needs_operator(&self) -> bool {
        matches!(self, Self::Tls { .. } | Self::Unauthorized { .. })
    }

    /// A non-success HTTP status: 401 and 403 are about credentials, the rest generic.
    pub(crate) fn status(method: &'static str, url: &str, status: u16, body: String) -> Self {
        let url = url.to_string();
        match status {
            401 | 403 => Self::Unauthorized {
                method,
                url,
                status,
                body,
            },
            _ => Self::Status {
                method,
                url,
                status,
                body,
            },
        }
    }

    /// A request that got no HTTP answer. reqwest's own message is only "error sending
    /// request for url (...)"; the cause (refused, timed out, a certificate rustls rejected)
    /// is further down the chain, so the whole chain goes into the message.
    pub(crate) fn unreachable(url: &str, e: &reqwest::Error) -> Self {
        let mut message = e.to_string();
        let mut tls = false;
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let text = s.to_string();
            // rustls' errors ("invalid peer certificate: UnknownIssuer", "received fatal
            // alert: ...") reach here only as text, wrapped in io::Error by hyper-rustls.
            tls |= text.contains("certificate") || text.contains("fatal alert");
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            source = s.source();
        }
        let url = url.to_string();
        if tls {
            Self::Tls { url, message }
        } else {
            Self::Unreachable { url, message }
        }
    }

    pub(crate) fn io(
        what: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io { what, path, source }
    }
}
