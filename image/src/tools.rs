//! The external programs (squashfs-tools, erofs-utils, rauc): finding them, asking the
//! packers' version (it goes into the manifest: another version may pack other bytes) and
//! running them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::ImageError;

/// An external program and the Debian package that ships it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub name: &'static str,
    pub package: &'static str,
}

pub const MKSQUASHFS: Tool = Tool {
    name: "mksquashfs",
    package: "squashfs-tools",
};
pub const UNSQUASHFS: Tool = Tool {
    name: "unsquashfs",
    package: "squashfs-tools",
};
pub const MKFS_EROFS: Tool = Tool {
    name: "mkfs.erofs",
    package: "erofs-utils",
};
pub const RAUC: Tool = Tool {
    name: "rauc",
    package: "rauc",
};
pub const MMDEBSTRAP: Tool = Tool {
    name: "mmdebstrap",
    package: "mmdebstrap",
};
pub const FSCK_EROFS: Tool = Tool {
    name: "fsck.erofs",
    package: "erofs-utils",
};

impl Tool {
    /// The program on `PATH`.
    pub fn find(self) -> Result<PathBuf, ImageError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(self.name))
            .find(|p| p.is_file())
            .ok_or(ImageError::ToolMissing {
                tool: self.name,
                package: self.package,
            })
    }

    /// Runs the program; a non-zero exit is an error carrying the end of its stderr.
    pub fn run<I, S>(self, args: I) -> Result<std::process::Output, ImageError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let program = self.find()?;
        let out = Command::new(&program)
            .args(args)
            // The packers get every timestamp as an explicit option; mksquashfs 4.5.1 refuses
            // to run when SOURCE_DATE_EPOCH is set as well.
            .env_remove("SOURCE_DATE_EPOCH")
            .output()
            .map_err(ImageError::io(&program))?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(self.failed(&out))
        }
    }

    pub fn failed(self, out: &std::process::Output) -> ImageError {
        let text = String::from_utf8_lossy(&out.stderr);
        let text = if text.trim().is_empty() {
            String::from_utf8_lossy(&out.stdout)
        } else {
            text
        };
        // Packers can be chatty; the last lines say what went wrong.
        let lines: Vec<&str> = text.trim().lines().collect();
        let tail = lines[lines.len().saturating_sub(12)..].join("\n");
        ImageError::ToolFailed {
            tool: self.name,
            status: out.status.to_string(),
            stderr: tail,
        }
    }
}

/// `mksquashfs -version` → `4.5.1`.
pub fn mksquashfs_version() -> Result<String, ImageError> {
    let out = MKSQUASHFS.run(["-version"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_version(&text, "mksquashfs version ").ok_or_else(|| ImageError::ToolFailed {
        tool: MKSQUASHFS.name,
        status: "unexpected -version output".into(),
        stderr: text.lines().next().unwrap_or_default().to_string(),
    })
}

/// erofs-utils 1.5's mkfs.erofs has no version flag; it prints `mkfs.erofs 1.5` first when
/// it builds, so build an empty image in `scratch` and read that line.
pub fn mkfs_erofs_version(scratch: &Path) -> Result<String, ImageError> {
    let empty = scratch.join("empty");
    std::fs::create_dir_all(&empty).map_err(ImageError::io(&empty))?;
    let img = scratch.join("version-probe.erofs");
    let out = MKFS_EROFS.run([img.as_os_str(), empty.as_os_str()])?;
    let _ = std::fs::remove_file(&img);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_version(&text, "mkfs.erofs ").ok_or_else(|| ImageError::ToolFailed {
        tool: MKFS_EROFS.name,
        status: "no version banner".into(),
        stderr: text.lines().next().unwrap_or_default().to_string(),
    })
}

/// The first whitespace-delimited word after `prefix` on a line that starts with it.
fn parse_version(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_banners_debian_12_prints() {
        assert_eq!(
            parse_version(
                "mksquashfs version 4.5.1 (2022/03/17)\ncopyright (C) 2022",
                "mksquashfs version "
            )
            .as_deref(),
            Some("4.5.1")
        );
        assert_eq!(
            parse_version("mkfs.erofs 1.5\nBuild completed.\n", "mkfs.erofs ").as_deref(),
            Some("1.5")
        );
    }
}
