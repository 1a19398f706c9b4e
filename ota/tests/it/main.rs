//! inferloop-ota's integration tests: one binary, modules inside.

mod agent;
mod auth;
mod ddi;
mod download;
mod fake;
mod tls;
