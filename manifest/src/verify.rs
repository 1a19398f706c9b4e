//! Checking weights against a pin: size first (cheap), then a full streaming SHA-256, unless
//! a verified-result cache vouches for the exact same file.
//!
//! The cache trades certainty for boot time: an entry is keyed by (device, inode, size,
//! mtime in ns, pinned SHA-256), so replacing, resizing, touching or re-pinning the file forces
//! a full rehash. What it cannot see is an in-place write that restores size and mtime on
//! purpose; boxes that must rule that out run without `--state-dir` and rehash every boot.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::hash::sha256_file;
use crate::schema::ModelPin;
use crate::IntegrityError;

/// How the weights were found good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// Hashed in full just now.
    Hashed,
    /// A cache entry for this exact file and pin.
    Cached,
}

/// Identity of a file as the cache sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    verified: Vec<CacheKey>,
}

/// A verified-weights cache kept as one JSON file in a writable state directory.
#[derive(Debug, Clone)]
pub struct VerifyCache {
    file: PathBuf,
}

impl VerifyCache {
    pub fn in_dir(state_dir: &Path) -> Self {
        Self {
            file: state_dir.join("verified-weights.json"),
        }
    }

    fn read(&self) -> CacheFile {
        // A missing or unreadable cache only costs a rehash.
        std::fs::read(&self.file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn contains(&self, key: &CacheKey) -> bool {
        self.read().verified.contains(key)
    }

    fn insert(&self, key: CacheKey) {
        let mut cache = self.read();
        // Older entries for the same file are stale now.
        cache
            .verified
            .retain(|k| !(k.dev == key.dev && k.ino == key.ino));
        cache.verified.push(key);
        let tmp = self.file.with_extension("json.tmp");
        let written = serde_json::to_vec_pretty(&cache)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, &self.file));
        if let Err(e) = written {
            tracing::warn!(file = %self.file.display(), error = %e, "cannot write verified-weights cache");
        }
    }
}

fn key_of(meta: &std::fs::Metadata, pin: &ModelPin) -> CacheKey {
    CacheKey {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        sha256: pin.sha256.clone(),
    }
}

/// Checks `path` against `pin`. Logs hashing progress every 10% for big files.
pub fn verify_weights(
    path: &Path,
    pin: &ModelPin,
    cache: Option<&VerifyCache>,
) -> Result<Verified, IntegrityError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|source| IntegrityError::WeightsMissing {
        path: shown.clone(),
        source,
    })?;
    if meta.len() != pin.size {
        return Err(IntegrityError::SizeMismatch {
            path: shown,
            expected: pin.size,
            actual: meta.len(),
        });
    }
    let key = key_of(&meta, pin);
    if cache.is_some_and(|c| c.contains(&key)) {
        tracing::info!(path = %shown, "weights match the manifest (verified-cache hit)");
        return Ok(Verified::Cached);
    }
    let actual = hash_with_progress(path)?;
    if actual != pin.sha256 {
        return Err(IntegrityError::HashMismatch {
            path: shown,
            expected: pin.sha256.clone(),
            actual,
        });
    }
    if let Some(c) = cache {
        c.insert(key);
    }
    tracing::info!(path = %shown, sha256 = %actual, "weights match the manifest");
    Ok(Verified::Hashed)
}

/// Streams the file through SHA-256, logging progress in 10% steps.
pub fn hash_with_progress(path: &Path) -> Result<String, IntegrityError> {
    let started = Instant::now();
    let mut next_report = 10;
    let digest = sha256_file(path, |done, total| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if pct >= next_report && total >= 256 << 20 {
            tracing::info!(path = %path.display(), percent = pct, "hashing weights");
            next_report = pct + 10;
        }
    })
    .map_err(|source| IntegrityError::WeightsRead {
        path: path.display().to_string(),
        source,
    })?;
    tracing::debug!(ms = started.elapsed().as_millis() as u64, "hashed weights");
    Ok(digest)
}
