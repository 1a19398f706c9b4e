//! inferloop-image integration tests: one binary, modules inside.
//!
//! Tests that pack or unpack images need squashfs-tools / erofs-utils; without them they
//! print why they skipped and pass.

mod cli;
mod common;
mod reproducible;
mod rootfs;
mod spec;
mod verify;
