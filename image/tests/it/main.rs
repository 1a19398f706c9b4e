//! inferloop-image integration tests: one binary, modules inside.
//!
//! Tests that pack or unpack images need squashfs-tools / erofs-utils, and bundle tests
//! rauc and openssl; without them they print why they skipped and pass.

mod bundle;
mod cli;
mod common;
mod gateway;
mod ota;
mod reproducible;
mod rootfs;
mod spec;
mod verify;
