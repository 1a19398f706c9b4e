//! inferloop-ota's integration tests: one binary, modules inside.

mod agent;
mod ddi;
mod download;
mod fake;
