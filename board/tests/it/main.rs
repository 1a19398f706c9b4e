//! Integration tests for `inferloop-board`: profiles, detection on fixture trees, rendering.

mod detect;
mod profiles;
mod render;

use std::path::PathBuf;

use inferloop_board::Roots;

/// The fixture tree `board/tests/fixtures/<name>` as `/proc` and `/sys` roots.
pub fn fixture(name: &str) -> Roots {
    Roots::under(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
}
