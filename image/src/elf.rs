//! Just enough of the ELF header to catch the classic packaging mistake: the host's x86-64
//! build shipped in an aarch64 image.

use std::io::Read;
use std::path::Path;

use crate::error::ImageError;

/// The CPU architecture in an ELF header, as the first part of a Rust target triple.
pub fn arch_of(header: &[u8]) -> Result<&'static str, String> {
    if header.len() < 20 || &header[..4] != b"\x7fELF" {
        return Err("is not an ELF executable".into());
    }
    if header[4] != 2 {
        return Err("is a 32-bit ELF file; images hold 64-bit daemons".into());
    }
    let machine = match header[5] {
        1 => u16::from_le_bytes([header[18], header[19]]),
        2 => u16::from_be_bytes([header[18], header[19]]),
        other => return Err(format!("has an unknown ELF data encoding {other}")),
    };
    match machine {
        0x3e => Ok("x86_64"),
        0xb7 => Ok("aarch64"),
        0xf3 => Ok("riscv64"),
        other => Err(format!(
            "is for ELF machine {other:#x}, which images do not support"
        )),
    }
}

/// Reads the header of `path` and returns the target triple: `declared` when it matches the
/// binary's architecture, else `<arch>-unknown-linux-gnu`.
pub fn check_target(path: &Path, declared: Option<&str>) -> Result<String, ImageError> {
    let fail = |message: String| ImageError::DaemonBinary {
        path: path.to_path_buf(),
        message,
    };
    let arch = arch_of_file(path).map_err(fail)?;
    match declared {
        Some(target) if target.split('-').next() == Some(arch) => Ok(target.to_string()),
        Some(target) => Err(fail(format!(
            "is an {arch} binary but the spec says daemon.target = {target:?}"
        ))),
        None => Ok(format!("{arch}-unknown-linux-gnu")),
    }
}

/// The architecture of the ELF file at `path`.
pub fn arch_of_file(path: &Path) -> Result<&'static str, String> {
    let mut header = [0u8; 20];
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let n = file.read(&mut header).map_err(|e| e.to_string())?;
    arch_of(&header[..n])
}

/// Checks that the ELF file at `path` runs on `target` (a Rust target triple); the message
/// says what it is instead.
pub fn check_arch(path: &Path, target: &str) -> Result<(), String> {
    let arch = arch_of_file(path)?;
    if target.split('-').next() == Some(arch) {
        Ok(())
    } else {
        Err(format!("is an {arch} binary but the image is for {target}"))
    }
}

/// A minimal 64-bit little-endian ELF header for `machine`, for tests' fake daemons.
pub fn fake_header(machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // 64-bit
    h[5] = 1; // little endian
    h[6] = 1; // version
    h[16] = 2; // ET_EXEC
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_architecture_of_aarch64_and_x86_64_headers() {
        assert_eq!(arch_of(&fake_header(0xb7)), Ok("aarch64"));
        assert_eq!(arch_of(&fake_header(0x3e)), Ok("x86_64"));
    }

    #[test]
    fn a_shell_script_is_not_a_daemon() {
        assert!(arch_of(b"#!/bin/sh\necho hi\n").is_err());
    }

    #[test]
    fn host_binary_in_an_aarch64_spec_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("inferloopd");
        std::fs::write(&bin, fake_header(0x3e)).expect("write");
        match check_target(&bin, Some("aarch64-unknown-linux-gnu")) {
            Err(ImageError::DaemonBinary { message, .. }) => {
                assert!(message.contains("x86_64"), "{message}")
            }
            other => panic!("expected DaemonBinary, got {other:?}"),
        }
        assert_eq!(
            check_target(&bin, None).expect("defaults"),
            "x86_64-unknown-linux-gnu"
        );
    }
}
