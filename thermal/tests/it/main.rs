//! Integration tests for `inferloop-thermal`: sources on fixture trees and the real `/sys`,
//! throttling, admission, the sampler under paused time, rendering.

mod admission;
mod render;
mod sampler;
mod sources;
mod throttle;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use inferloop_thermal::CommandRunner;

/// `thermal/tests/fixtures/<name>/sys`.
pub fn fixture_sys(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join("sys")
}

/// A command runner that answers with fixed output (or "not installed") and counts calls.
#[derive(Clone)]
pub struct ScriptedRunner {
    pub output: Option<String>,
    pub calls: Arc<AtomicUsize>,
}

impl ScriptedRunner {
    pub fn answering(output: &str) -> Self {
        ScriptedRunner {
            output: Some(output.to_string()),
            calls: Arc::default(),
        }
    }

    pub fn not_installed() -> Self {
        ScriptedRunner {
            output: None,
            calls: Arc::default(),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl CommandRunner for ScriptedRunner {
    fn run(&self, program: &str, args: &[&str]) -> io::Result<String> {
        assert_eq!((program, args), ("nvpmodel", &["-q"][..]));
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.output
            .clone()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "nvpmodel: not found"))
    }
}
