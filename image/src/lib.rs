//! `inferloop-image`: builds what gets flashed to a board, a reproducible read-only root
//! filesystem holding the daemon, its config and a baked manifest, and checks images
//! against their manifests.
//!
//! # Layout
//! - [`spec`]: the build spec (`image.toml`), strict TOML, checked against the board
//!   profiles and the daemon's config keys before anything is built.
//! - [`stage`]: the staging tree: base rootfs (directory or tarball), the `rootfs/` overlay
//!   and its `*.in` templates, the generated config, mount points.
//! - [`sysusers`]: the overlay's sysusers.d users, groups and memberships written into the
//!   image's `/etc/passwd` and `/etc/group`.
//! - [`debian`]: a Debian base built by mmdebstrap (cached), its kernel and initrd.
//! - [`gateway`]: `role = "gateway"`: vllm-router installed from wheels into a venv at
//!   build time, its unit enabled, its `router.env` rendered from `[gateway]`.
//! - [`tree`]: walking and copying trees; the manifest's sorted file list.
//! - [`build`]: the whole build; outputs are renamed into place only when complete.
//! - [`pack`]: mksquashfs / mkfs.erofs with every byte-affecting option pinned, and the
//!   deterministic `rootfs.tar.zst`.
//! - [`verify`]: image hash, unpacking, per-file comparison, every mismatch reported.
//! - [`inspect`]: a manifest as a table.
//! - [`ota`]: RAUC's `system.conf` for a board's A/B slots (from its profile's `[ota]`) and
//!   where the update files live in the image.
//! - [`bundle`]: a build output signed into a RAUC bundle with `rauc bundle`, and a bundle
//!   read back with `rauc info`.
//! - [`tools`], [`elf`], [`progress`], [`error`]: external programs, the daemon's ELF
//!   header, progress bars, the one error type.
//!
//! The manifest types themselves live in `inferloop-manifest`, shared with the daemon.

pub mod build;
pub mod bundle;
pub mod debian;
pub mod elf;
pub mod error;
pub mod gateway;
pub mod inspect;
pub mod kernels;
pub mod ota;
pub mod pack;
pub mod progress;
pub mod spec;
pub mod stage;
pub mod sysusers;
pub mod tools;
pub mod tree;
pub mod verify;

pub use build::{build, BuildOptions, Built};
pub use error::ImageError;
pub use progress::Progress;
pub use spec::Spec;
pub use verify::{verify, Mismatch, Report, Subject};
