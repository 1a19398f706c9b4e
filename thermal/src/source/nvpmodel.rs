//! The Jetson power mode from `nvpmodel -q`, through an injectable command runner.

use std::io;
use std::process::Command;

use crate::snapshot::ActivePowerMode;

/// Runs a program and returns its standard output. Injectable so tests need no `nvpmodel`.
pub trait CommandRunner: Send {
    /// `Err` with kind `NotFound` means the tool is not installed.
    fn run(&self, program: &str, args: &[&str]) -> io::Result<String>;
}

/// Runs real processes.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, program: &str, args: &[&str]) -> io::Result<String> {
        let output = Command::new(program).args(args).output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "{program} exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// Parses `nvpmodel -q`:
///
/// ```text
/// NV Power Mode: MAXN
/// 0
/// ```
///
/// Warning lines (`NVPM WARN: ...`) may come first. The id line is optional.
pub fn parse_query(output: &str) -> Option<ActivePowerMode> {
    let mut lines = output.lines().map(str::trim);
    let name = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("NV Power Mode:"))?
        .trim()
        .to_string();
    if name.is_empty() {
        return None;
    }
    let id = lines.find(|l| !l.is_empty()).and_then(|l| l.parse().ok());
    Some(ActivePowerMode { id, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_output_gives_name_and_id() {
        let mode = parse_query("NV Power Mode: MAXN\n0\n");
        assert_eq!(
            mode,
            Some(ActivePowerMode {
                id: Some(0),
                name: "MAXN".into()
            })
        );
    }

    #[test]
    fn warnings_before_the_mode_line_are_skipped() {
        let out = "NVPM WARN: fan mode is not set!\nNV Power Mode: 15W\n2\n";
        let mode = parse_query(out).expect("mode parsed");
        assert_eq!((mode.id, mode.name.as_str()), (Some(2), "15W"));
    }

    #[test]
    fn missing_id_line_keeps_the_name() {
        let mode = parse_query("NV Power Mode: 25W\n").expect("mode parsed");
        assert_eq!((mode.id, mode.name.as_str()), (None, "25W"));
    }

    #[test]
    fn output_without_a_mode_line_is_none() {
        assert_eq!(parse_query("nvpmodel: command failed\n"), None);
        assert_eq!(parse_query("NV Power Mode:   \n0\n"), None);
    }
}
