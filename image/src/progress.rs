//! Progress bars for hashing and packing: shown on a terminal, hidden with `--quiet` or
//! when stderr is not a TTY (CI logs get the tracing lines instead).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Whether bars are drawn; cheap to copy into every stage.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    visible: bool,
}

impl Progress {
    /// Bars on stderr unless `quiet` or stderr is not a terminal.
    pub fn new(quiet: bool) -> Self {
        Self {
            visible: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Never draws (library callers, tests).
    pub fn hidden() -> Self {
        Self { visible: false }
    }

    /// A byte-counting bar.
    pub fn bytes(&self, total: u64, what: &'static str) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:>8} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what);
        bar
    }

    /// A spinner for a step whose length is unknown (an external packer running).
    pub fn spinner(&self, what: String) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new_spinner();
        bar.set_message(what);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }
}
