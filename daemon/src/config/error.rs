//! What a config could not be: unreadable, unparsable, out of range, unsafe to bind.

use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The OS error is the `source()`, printed by the `{:#}` chain, not repeated here.
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}={value:?}: {message}")]
    Env {
        var: &'static str,
        value: String,
        message: String,
    },
    #[error("`{field}` {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(
        "refusing to bind {host} without an API key: set --api-key (or INFERLOOP_API_KEY), \
         or pass --insecure-no-auth to serve the LAN unauthenticated"
    )]
    UnauthenticatedBind { host: IpAddr },
}
