//! Streaming SHA-256: big weight files are hashed in fixed-size reads, never loaded whole.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

const CHUNK: usize = 1 << 20;

/// Hashes a file, calling `progress(done, total)` after every chunk.
pub fn sha256_file(path: &Path, mut progress: impl FnMut(u64, u64)) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let total = file.metadata()?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        done += n as u64;
        progress(done, total);
    }
    Ok(to_hex(&hasher.finalize()))
}

/// SHA-256 of bytes in memory, lowercase hex.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// True for 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_of_abc() {
        assert_eq!(
            sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn file_hash_matches_bytes_hash_and_reports_progress() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let data = vec![7u8; CHUNK * 2 + 5];
        std::fs::write(&path, &data).expect("write");
        let mut calls = Vec::new();
        let h = sha256_file(&path, |d, t| calls.push((d, t))).expect("hash");
        assert_eq!(h, sha256_bytes(&data));
        assert_eq!(calls.last(), Some(&(data.len() as u64, data.len() as u64)));
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn sha_hex_shape_is_checked() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex("abc"));
    }
}
