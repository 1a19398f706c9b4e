//! The disk tier: saved prefixes as files under `<state-dir>/prompt-cache/`, so that a box's
//! application prompts are warm again after a restart or an update with the same weights.
//!
//! - Written off the serving path: the scheduler hands a payload to a writer thread through
//!   a short queue (a full queue skips the write rather than wait), which writes a temporary
//!   file and renames it into place, so a reader never sees half an entry.
//! - Bounded in bytes: least recently used files go first (a hit touches the file's mtime,
//!   so the order survives restarts); an entry whose tokens another entry extends is
//!   removed as redundant.
//! - Never trusted: every entry is verified whole (SHA-256, key, tokens) before its payload
//!   reaches the backend. An entry saved for other weights or another KV layout, a corrupt
//!   or truncated one, is deleted and counted (`inferloop_prompt_cache_dropped_total`).
//! - The key needs the weights' SHA-256: pinned by the manifest it is known at once;
//!   otherwise the tier wakes when the background hash finishes.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use super::entry::{self, Key};
use super::TierMetrics;
use crate::engine::schedule::prefix::common_prefix;

/// Payloads waiting for the writer at most: each is up to a full context's KV rows, and
/// the ledger counts them.
pub const WRITE_QUEUE: usize = 1;
const TMP_SUFFIX: &str = ".tmp";

#[derive(Debug)]
struct DiskEntry {
    tokens: Arc<[i32]>,
    bytes: u64,
    used: u64,
    /// Queued for the writer: not on disk yet, so not served, but not written twice.
    pending: bool,
}

#[derive(Debug, Default)]
struct Index {
    /// Set once the directory was scanned under the key.
    key: Option<Key>,
    entries: HashMap<String, DiskEntry>,
    bytes: u64,
    budget: u64,
    tick: u64,
}

struct Job {
    name: String,
    tokens: Arc<[i32]>,
    payload: Arc<Vec<u8>>,
}

pub struct DiskTier {
    dir: PathBuf,
    index: Arc<Mutex<Index>>,
    jobs: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
    metrics: TierMetrics,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").field("dir", &self.dir).finish()
    }
}

impl DiskTier {
    /// Starts the writer thread, which indexes `dir` once the weights' SHA-256 is known.
    pub fn start(
        dir: PathBuf,
        budget: u64,
        weights_sha256: Arc<OnceLock<String>>,
        kv_layout: String,
        metrics: TierMetrics,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let index = Arc::new(Mutex::new(Index {
            budget,
            ..Index::default()
        }));
        let (jobs, rx) = sync_channel(WRITE_QUEUE);
        let writer = {
            let (dir, index, metrics) = (dir.clone(), index.clone(), metrics.clone());
            std::thread::Builder::new()
                .name("inferloop-prompt-disk".into())
                .spawn(move || {
                    writer_loop(&dir, &index, &metrics, &weights_sha256, kv_layout, &rx)
                })?
        };
        Ok(Self {
            dir,
            index,
            jobs: Some(jobs),
            writer: Some(writer),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry on disk sharing the longest prefix with `prompt`: (name, shared tokens,
    /// its tokens, file bytes).
    pub fn longest(&self, prompt: &[i32]) -> Option<(String, usize, usize, u64)> {
        let index = self.lock();
        index.key.as_ref()?;
        index
            .entries
            .iter()
            .filter(|(_, e)| !e.pending)
            .map(|(name, e)| (name, common_prefix(&e.tokens, prompt), e))
            .filter(|&(_, n, _)| n > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(name, n, e)| (name.clone(), n, e.tokens.len(), e.bytes))
    }

    /// An entry (written or queued) holds every one of `tokens`; also true while the tier
    /// is not ready, so nothing is saved for it then.
    pub fn covers(&self, tokens: &[i32]) -> bool {
        let index = self.lock();
        index.key.is_none()
            || index
                .entries
                .values()
                .any(|e| common_prefix(&e.tokens, tokens) == tokens.len())
    }

    /// Reads and verifies entry `name`: its tokens and payload. A bad entry is deleted and
    /// counted, and `None` returned.
    pub fn load(&self, name: &str) -> Option<(Arc<[i32]>, Vec<u8>)> {
        let (key, tokens) = {
            let mut index = self.lock();
            index.tick += 1;
            let tick = index.tick;
            let e = index.entries.get_mut(name)?;
            e.used = tick;
            let tokens = e.tokens.clone();
            (index.key.clone()?, tokens)
        };
        let path = self.dir.join(name);
        let checked = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|mut bytes| {
                let range = entry::verify(&bytes, &key, &tokens).map_err(|e| e.to_string())?;
                bytes.truncate(range.end);
                bytes.drain(..range.start);
                Ok(bytes)
            });
        match checked {
            Ok(payload) => {
                // The least-recently-used order across restarts: one cheap syscall.
                let touched = File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                if let Err(e) = touched {
                    tracing::debug!(entry = name, error = %e, "cannot touch a prompt cache entry");
                }
                Some((tokens, payload))
            }
            Err(why) => {
                tracing::warn!(entry = %path.display(), %why, "prompt cache entry dropped");
                self.forget(name, "corrupt");
                None
            }
        }
    }

    /// Removes an entry from the index and the disk, counting why.
    pub fn forget(&self, name: &str, reason: &'static str) {
        let mut index = self.lock();
        remove(&self.dir, &mut index, name);
        self.metrics.dropped(reason);
        self.metrics.set_size(index.bytes, index.entries.len());
    }

    /// Queues `payload` for writing unless an entry already holds these tokens; returns
    /// whether it was queued. A full queue skips it (the serving path never waits for the
    /// disk; the RAM tier's copy is written later, when the box is idle).
    pub fn save(&self, tokens: Arc<[i32]>, payload: Arc<Vec<u8>>) -> bool {
        let Some(jobs) = &self.jobs else {
            return false;
        };
        let name = {
            let mut index = self.lock();
            let Some(key) = index.key.clone() else {
                return false;
            };
            let name = entry::file_name(&key, &tokens);
            if index.entries.contains_key(&name) {
                return false;
            }
            index.tick += 1;
            let used = index.tick;
            index.entries.insert(
                name.clone(),
                DiskEntry {
                    tokens: tokens.clone(),
                    bytes: 0,
                    used,
                    pending: true,
                },
            );
            name
        };
        match jobs.try_send(Job {
            name: name.clone(),
            tokens,
            payload,
        }) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.lock().entries.remove(&name);
                false
            }
        }
    }

    /// Waits for queued writes (shutdown).
    pub fn flush(&mut self) {
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::warn!("prompt cache writer panicked");
            }
        }
    }

    /// True once the directory was indexed (tests wait for it).
    pub fn ready(&self) -> bool {
        self.lock().key.is_some()
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.flush();
    }
}

fn remove(dir: &Path, index: &mut Index, name: &str) {
    if let Some(e) = index.entries.remove(name) {
        index.bytes -= e.bytes;
    }
    if let Err(e) = std::fs::remove_file(dir.join(name)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(entry = name, error = %e, "cannot delete a prompt cache entry");
        }
    }
}

fn writer_loop(
    dir: &Path,
    index: &Mutex<Index>,
    metrics: &TierMetrics,
    sha: &OnceLock<String>,
    kv_layout: String,
    rx: &Receiver<Job>,
) {
    // Unpinned weights: the background hash sets the SHA-256 within a few seconds (or
    // minutes for big weights on a slow disk).
    let weights_sha256 = loop {
        if let Some(s) = sha.get() {
            break s.clone();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let key = Key {
        weights_sha256,
        kv_layout,
    };
    {
        let mut index = index.lock().unwrap_or_else(|e| e.into_inner());
        scan(dir, &key, &mut index, metrics);
        index.key = Some(key.clone());
        evict(dir, &mut index, metrics);
        metrics.set_size(index.bytes, index.entries.len());
        metrics.set_ready();
        tracing::info!(
            dir = %dir.display(),
            entries = index.entries.len(),
            bytes = index.bytes,
            "prompt cache disk tier ready"
        );
    }
    let mut failures = WriteFailures::default();
    while let Ok(job) = rx.recv() {
        write(dir, index, metrics, &key, &job, &mut failures);
    }
}

/// Whether a failed write is worth a warning: the first of a run is, the rest of the run
/// (a full or read-only disk fails every save, one per request) are counted in
/// `inferloop_prompt_cache_dropped_total{reason="write_failed"}` and logged at debug only,
/// until a write succeeds again.
#[derive(Debug, Default)]
struct WriteFailures {
    since_last_success: u64,
}

impl WriteFailures {
    /// Counts a failure; true for the first of a run.
    fn failed(&mut self) -> bool {
        self.since_last_success += 1;
        self.since_last_success == 1
    }

    /// Counts a success; the number of failures it ends.
    fn succeeded(&mut self) -> u64 {
        std::mem::take(&mut self.since_last_success)
    }
}

fn write(
    dir: &Path,
    index: &Mutex<Index>,
    metrics: &TierMetrics,
    key: &Key,
    job: &Job,
    failures: &mut WriteFailures,
) {
    let Job {
        name,
        tokens,
        payload,
    } = job;
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let written = File::create(&tmp)
        .and_then(|f| {
            let mut w = BufWriter::with_capacity(1 << 20, f);
            let n = entry::write_to(&mut w, key, tokens, payload)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_data()?;
            Ok(n)
        })
        .and_then(|n| std::fs::rename(&tmp, dir.join(name)).map(|()| n));
    let mut index = index.lock().unwrap_or_else(|e| e.into_inner());
    match written {
        Ok(bytes) => {
            let ended = failures.succeeded();
            if ended > 0 {
                tracing::info!(failed = ended, "prompt cache entries are written again");
            }
            let Some(e) = index.entries.get_mut(name) else {
                // Forgotten while queued.
                let _ = std::fs::remove_file(dir.join(name));
                return;
            };
            e.pending = false;
            e.bytes = bytes;
            index.bytes += bytes;
            // Entries the new one extends are redundant now.
            let subsumed: Vec<String> = index
                .entries
                .iter()
                .filter(|(n, e)| {
                    n.as_str() != name
                        && !e.pending
                        && common_prefix(&e.tokens, tokens) == e.tokens.len()
                })
                .map(|(n, _)| n.clone())
                .collect();
            for n in subsumed {
                remove(dir, &mut index, &n);
            }
            metrics.saved();
            evict(dir, &mut index, metrics);
        }
        Err(e) => {
            if failures.failed() {
                tracing::warn!(entry = %tmp.display(), error = %e,
                    "prompt cache entry not written; serving goes on, and further failures are only counted until a write succeeds");
            } else {
                tracing::debug!(entry = %tmp.display(), error = %e, "prompt cache entry not written");
            }
            let _ = std::fs::remove_file(&tmp);
            index.entries.remove(name);
            metrics.dropped("write_failed");
        }
    }
    metrics.set_size(index.bytes, index.entries.len());
}

/// Least recently used entries out until the written ones fit the budget.
fn evict(dir: &Path, index: &mut Index, metrics: &TierMetrics) {
    while index.bytes > index.budget {
        let Some(oldest) = index
            .entries
            .iter()
            .filter(|(_, e)| !e.pending)
            .min_by_key(|(_, e)| e.used)
            .map(|(n, _)| n.clone())
        else {
            return;
        };
        remove(dir, index, &oldest);
        metrics.dropped("evicted");
    }
}

/// Indexes the entries left by earlier runs: headers and tokens only, oldest first by
/// mtime. Leftover temporary files, foreign, corrupt and mismatched entries go.
fn scan(dir: &Path, key: &Key, index: &mut Index, metrics: &TierMetrics) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found = Vec::new();
    for item in listing.flatten() {
        let path = item.path();
        let name = item.file_name().to_string_lossy().into_owned();
        if name.ends_with(TMP_SUFFIX) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if !name.ends_with(".kv") {
            continue;
        }
        match read_head(&path) {
            Ok((header, tokens, len, mtime)) if header.key == *key => {
                found.push((mtime, name, tokens, len))
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
                metrics.dropped("mismatch");
            }
            Err(why) => {
                tracing::warn!(entry = %path.display(), %why, "prompt cache entry dropped");
                let _ = std::fs::remove_file(&path);
                metrics.dropped("corrupt");
            }
        }
    }
    found.sort_by_key(|f| f.0);
    for (_, name, tokens, bytes) in found {
        index.tick += 1;
        index.bytes += bytes;
        let used = index.tick;
        index.entries.insert(
            name,
            DiskEntry {
                tokens: tokens.into(),
                bytes,
                used,
                pending: false,
            },
        );
    }
}

type Head = (entry::Header, Vec<i32>, u64, SystemTime);

fn read_head(path: &Path) -> Result<Head, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    let mut pre = [0u8; 16];
    f.read_exact(&mut pre).map_err(|e| e.to_string())?;
    let head = entry::head_len(&pre).map_err(|e| e.to_string())?;
    let mut bytes = pre.to_vec();
    bytes.resize(head, 0);
    f.read_exact(&mut bytes[16..]).map_err(|e| e.to_string())?;
    // The tokens follow the header: read them too.
    let header: entry::Header = serde_json::from_slice(&bytes[16..]).map_err(|e| e.to_string())?;
    // Checked before allocating: a corrupt count must not ask for gigabytes.
    if (head as u64).saturating_add(4 * u64::from(header.n_tokens)) > meta.len() {
        return Err("token count runs past the end of the file".into());
    }
    let mut tokens = vec![0u8; 4 * header.n_tokens as usize];
    f.read_exact(&mut tokens).map_err(|e| e.to_string())?;
    bytes.extend_from_slice(&tokens);
    let (header, tokens) = entry::read_head(&bytes, meta.len()).map_err(|e| e.to_string())?;
    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    Ok((header, tokens, meta.len(), mtime))
}

/// Writes `payload` through the writer's own path, for tests of other modules.
#[cfg(test)]
pub fn write_entry(dir: &Path, key: &Key, tokens: &[i32], payload: &[u8]) -> PathBuf {
    let path = dir.join(entry::file_name(key, tokens));
    let mut f = File::create(&path).expect("create entry");
    entry::write_to(&mut f, key, tokens, payload).expect("write entry");
    std::io::Write::flush(&mut f).expect("flush entry");
    path
}

#[cfg(test)]
mod write_failure_tests {
    use super::WriteFailures;

    /// A disk that fails every save warns once per run of failures, not once per request.
    #[test]
    fn a_run_of_failed_writes_warns_once_and_a_success_ends_it() {
        let mut f = WriteFailures::default();
        let warned: Vec<bool> = (0..5).map(|_| f.failed()).collect();
        assert_eq!(warned, [true, false, false, false, false]);
        assert_eq!(f.succeeded(), 5);
        assert_eq!(f.succeeded(), 0);
        assert!(f.failed(), "a new run warns again");
    }
}
