//! The fleet agent: a hawkBit DDI client that installs RAUC bundles over D-Bus.
//!
//! # Layout
//! - [`config`]: the TOML file (`/etc/inferloop/ota.toml`), flag overrides, and the values
//!   the box reports as `configData` (read from the image's manifest).
//! - [`ddi`]: the wire types of hawkBit's Direct Device Integration API (hawkBit's full
//!   replies and goosebit's minimal ones) and the `HH:MM:SS` polling interval.
//! - [`client`]: the HTTP side: poll, `configData`, feedback, authentication, TLS.
//! - [`download`]: an artifact into the download directory, resumed with HTTP `Range`,
//!   checked against its size and every hash the server gave.
//! - [`rauc`]: RAUC's `de.pengutronix.rauc.Installer` interface (install, progress, slots)
//!   behind the [`rauc::Installer`] trait.
//! - [`state`]: what must survive a reboot (an installed action awaiting confirmation, the
//!   last final report).
//! - [`backoff`]: the retry delay when the server is down or answers garbage.
//! - [`agent`]: the loop tying them together.
//!
//! `main.rs` only parses flags, sets up logging and maps the outcome to an exit code.

pub mod agent;
pub mod backoff;
pub mod client;
pub mod config;
pub mod ddi;
pub mod download;
pub mod error;
pub mod rauc;
pub mod state;

pub use error::OtaError;
