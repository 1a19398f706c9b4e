//! An artifact into the download directory: resumed with HTTP `Range` from a partial file
//! (a restart of the agent or of the server costs only what was not yet on disk), then
//! checked against the announced size and every hash the server gave.

use std::io::Read;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use md5::Md5;
use reqwest::header::{CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::ddi::Hashes;
use crate::OtaError;

/// What to fetch and where.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub url: &'a str,
    pub size: Option<u64>,
    pub hashes: &'a Hashes,
    /// The finished file; `dest.part` holds the bytes while they arrive.
    pub dest: PathBuf,
}

/// `dest` with `.part` appended.
pub fn partial_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Downloads (or resumes) `req`, verifies it and renames it into place. `progress` gets
/// (bytes on disk, total) as they grow. A failed check deletes the file: resuming onto
/// bad bytes would fail again. An interrupted transfer keeps the partial file.
pub async fn fetch(
    http: &reqwest::Client,
    req: &Request<'_>,
    mut progress: impl FnMut(u64, Option<u64>),
) -> Result<PathBuf, OtaError> {
    let part = partial_path(&req.dest);
    let name = req
        .dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if req.dest.exists() {
        // Finished earlier (before a restart, say): check it again, it may have rotted.
        match verify_file(&req.dest, req.size, req.hashes).await {
            Ok(()) => return Ok(req.dest.clone()),
            Err(e) => {
                tracing::warn!(file = %req.dest.display(), error = %e, "a finished download no longer verifies; fetching it again");
                remove(&req.dest)?;
            }
        }
    }
    let mut have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if req.size.is_some_and(|s| have > s) {
        tracing::warn!(file = %part.display(), have, size = ?req.size, "partial file larger than the artifact; starting over");
        remove(&part)?;
        have = 0;
    }
    if req.size != Some(have) || have == 0 {
        transfer(http, req.url, &part, have, req.size, &mut progress).await?;
    }
    let actual = std::fs::metadata(&part)
        .map_err(OtaError::io("reading", &part))?
        .len();
    progress(actual, req.size);
    if let Err(e) = verify_file(&part, req.size, req.hashes).await {
        remove(&part)?;
        return Err(match e {
            OtaError::SizeMismatch {
                expected, actual, ..
            } => OtaError::SizeMismatch {
                file: name,
                expected,
                actual,
            },
            OtaError::HashMismatch {
                algorithm,
                expected,
                actual,
                ..
            } => OtaError::HashMismatch {
                file: name,
                algorithm,
                expected,
                actual,
            },
            other => other,
        });
    }
    std::fs::rename(&part, &req.dest).map_err(OtaError::io("renaming", &part))?;
    Ok(req.dest.clone())
}

async fn transfer(
    http: &reqwest::Client,
    url: &str,
    part: &Path,
    mut have: u64,
    size: Option<u64>,
    progress: &mut impl FnMut(u64, Option<u64>),
) -> Result<(), OtaError> {
    let interrupted = |done: u64, message: String| OtaError::Interrupted {
        url: url.to_string(),
        done,
        message,
    };
    let mut attempt_from_zero = false;
    let resp = loop {
        let mut rq = http.get(url);
        if have > 0 {
            rq = rq.header(RANGE, format!("bytes={have}-"));
        }
        let resp = rq.send().await.map_err(|e| {
            // A certificate the box does not trust is no interruption to resume from.
            match OtaError::unreachable(url, &e) {
                tls @ OtaError::Tls { .. } => tls,
                other => interrupted(
                    have,
                    match other {
                        OtaError::Unreachable { message, .. } => message,
                        o => o.to_string(),
                    },
                ),
            }
        })?;
        match resp.status() {
            StatusCode::PARTIAL_CONTENT if have > 0 => {
                let start = resp
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range_start);
                if start != Some(have) {
                    return Err(OtaError::Garbage {
                        url: url.to_string(),
                        message: format!(
                            "asked for bytes {have}- and got Content-Range starting at {start:?}"
                        ),
                    });
                }
                tracing::info!(offset = have, "resuming the download");
                break resp;
            }
            StatusCode::OK => {
                if have > 0 {
                    tracing::info!(
                        had = have,
                        "the server ignored the Range header; downloading from the start"
                    );
                    have = 0;
                }
                break resp;
            }
            // The partial file is no prefix of what the server has now (it changed, or the
            // file is longer): start over once.
            StatusCode::RANGE_NOT_SATISFIABLE if have > 0 && !attempt_from_zero => {
                tracing::warn!(had = have, "the server refused the range; starting over");
                remove(part)?;
                have = 0;
                attempt_from_zero = true;
            }
            s => return Err(OtaError::status("GET", url, s.as_u16(), String::new())),
        }
    };
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(have == 0)
        .append(have > 0)
        .open(part)
        .await
        .map_err(OtaError::io("opening", part))?;
    let mut stream = resp.bytes_stream();
    let mut done = have;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                // Keep what arrived: the next try resumes from here.
                let _ = file.flush().await;
                return Err(interrupted(done, format!("{e:#}")));
            }
        };
        file.write_all(&chunk)
            .await
            .map_err(OtaError::io("writing", part))?;
        done += chunk.len() as u64;
        progress(done, size);
        if size.is_some_and(|s| done > s) {
            break;
        }
    }
    file.flush().await.map_err(OtaError::io("writing", part))?;
    file.sync_all()
        .await
        .map_err(OtaError::io("syncing", part))?;
    if size.is_some_and(|s| done < s) {
        return Err(interrupted(done, "the connection closed early".into()));
    }
    Ok(())
}

/// `bytes 100-199/200` → 100.
fn content_range_start(v: &str) -> Option<u64> {
    let rest = v.trim().strip_prefix("bytes ")?;
    rest.split('-').next()?.trim().parse().ok()
}

fn remove(path: &Path) -> Result<(), OtaError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(OtaError::io("removing", path)(e)),
    }
}

/// Size and every given hash of `path`, on a blocking thread (a bundle is hundreds of MiB).
pub async fn verify_file(path: &Path, size: Option<u64>, hashes: &Hashes) -> Result<(), OtaError> {
    let path = path.to_path_buf();
    let hashes = hashes.clone();
    tokio::task::spawn_blocking(move || verify_blocking(&path, size, &hashes))
        .await
        .map_err(|e| OtaError::Io {
            what: "hashing",
            path: PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

fn verify_blocking(path: &Path, size: Option<u64>, hashes: &Hashes) -> Result<(), OtaError> {
    let file_name = || {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let actual = std::fs::metadata(path)
        .map_err(OtaError::io("reading", path))?
        .len();
    if let Some(expected) = size {
        if actual != expected {
            return Err(OtaError::SizeMismatch {
                file: file_name(),
                expected,
                actual,
            });
        }
    }
    let digests = digest_file(path)?;
    for (algorithm, expected, got) in [
        ("sha256", &hashes.sha256, &digests.sha256),
        ("sha1", &hashes.sha1, &digests.sha1),
        ("md5", &hashes.md5, &digests.md5),
    ] {
        if let Some(expected) = expected {
            if !expected.trim().eq_ignore_ascii_case(got) {
                return Err(OtaError::HashMismatch {
                    file: file_name(),
                    algorithm,
                    expected: expected.trim().to_ascii_lowercase(),
                    actual: got.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The three digests of a file, in one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    pub sha256: String,
    pub sha1: String,
    pub md5: String,
}

pub fn digest_file(path: &Path) -> Result<Digests, OtaError> {
    let mut f = std::fs::File::open(path).map_err(OtaError::io("reading", path))?;
    let (mut a, mut b, mut c) = (Sha256::new(), Sha1::new(), Md5::new());
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(OtaError::io("reading", path))?;
        if n == 0 {
            break;
        }
        a.update(&buf[..n]);
        b.update(&buf[..n]);
        c.update(&buf[..n]);
    }
    Ok(Digests {
        sha256: hex(&a.finalize()),
        sha1: hex(&b.finalize()),
        md5: hex(&c.finalize()),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_start_reads_the_first_byte() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("items 1-2/3"), None);
    }

    #[test]
    fn digests_of_abc_are_the_published_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").expect("write");
        let d = digest_file(&p).expect("digests");
        assert_eq!(
            d.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.sha1, "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(d.md5, "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn every_given_hash_is_checked_and_case_does_not_matter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").expect("write");
        let good = Hashes {
            sha1: Some("A9993E364706816ABA3E25717850C26C9CD0D89D".into()),
            md5: Some("900150983cd24fb0d6963f7d28e17f72".into()),
            sha256: None,
        };
        assert!(verify_blocking(&p, Some(3), &good).is_ok());
        let bad_md5 = Hashes {
            md5: Some("00".repeat(16)),
            ..good.clone()
        };
        let err = verify_blocking(&p, Some(3), &bad_md5).expect_err("md5 differs");
        assert!(
            matches!(
                &err,
                OtaError::HashMismatch {
                    algorithm: "md5",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = verify_blocking(&p, Some(4), &good).expect_err("size differs");
        assert!(
            matches!(
                err,
                OtaError::SizeMismatch {
                    expected: 4,
                    actual: 3,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
