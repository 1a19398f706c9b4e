//! The tiers on their own: the disk tier across restarts, with a corrupt, a foreign and a
//! mismatched entry, its byte budget and least-recently-used order; the store's choice
//! between tiers.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::disk::{write_entry, DiskTier};
use super::entry::Key;
use super::*;

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn sha(s: &str) -> Arc<OnceLock<String>> {
    Arc::new(OnceLock::from(s.to_string()))
}

fn key() -> Key {
    Key {
        weights_sha256: SHA.into(),
        kv_layout: "fake".into(),
    }
}

fn tier(dir: &Path, budget: u64, metrics: &Arc<Metrics>) -> DiskTier {
    let t = DiskTier::start(
        dir.to_path_buf(),
        budget,
        sha(SHA),
        "fake".into(),
        TierMetrics::new(metrics.clone(), Tier::Disk),
    )
    .expect("disk tier starts");
    wait(|| t.ready(), "the disk tier indexes its directory");
    t
}

fn wait(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tokens(tag: i32, n: usize) -> Arc<[i32]> {
    (0..n as i32).map(|i| tag * 1000 + i).collect()
}

#[test]
fn an_entry_written_by_one_run_is_served_by_the_next() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = Arc::new(Metrics::default());
    let a = tokens(1, 100);
    {
        let t = tier(dir.path(), 1 << 20, &metrics);
        t.save(a.clone(), Arc::new(vec![7; 4000]));
        assert!(t.covers(&a[..50]), "queued entries count as held");
        // Dropping the tier waits for the writer (what shutdown does).
    }
    let t = tier(dir.path(), 1 << 20, &metrics);
    let mut prompt = a[..80].to_vec();
    prompt.push(5);
    let (name, shared, n, _) = t.longest(&prompt).expect("found after a restart");
    assert_eq!((shared, n), (80, 100));
    let (saved, payload) = t.load(&name).expect("verified");
    assert_eq!((&*saved, payload), (&*a, vec![7; 4000]));
}

#[test]
fn corrupt_foreign_and_mismatched_entries_are_dropped_and_counted() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = Arc::new(Metrics::default());
    let good = write_entry(dir.path(), &key(), &tokens(1, 10), &[1; 100]);
    let flipped = write_entry(dir.path(), &key(), &tokens(2, 10), &[2; 100]);
    let mut bytes = std::fs::read(&flipped).expect("read");
    let at = bytes.len() - 40;
    bytes[at] ^= 1;
    std::fs::write(&flipped, bytes).expect("write");
    let other = Key {
        weights_sha256: "f".repeat(64),
        ..key()
    };
    let mismatched = write_entry(dir.path(), &other, &tokens(3, 10), &[3; 100]);
    let foreign = dir.path().join("junk.kv");
    std::fs::write(&foreign, b"not an entry at all").expect("write");
    let torn = dir.path().join("abc.kv.tmp");
    std::fs::write(&torn, b"half").expect("write");

    let t = tier(dir.path(), 1 << 20, &metrics);
    let pc = &metrics.prompt_cache;
    assert_eq!(pc.dropped_count("disk", "mismatch"), 1);
    assert_eq!(pc.dropped_count("disk", "corrupt"), 1, "the foreign file");
    assert!(!mismatched.exists() && !foreign.exists() && !torn.exists());
    // The flipped payload byte passes the header scan and is caught when loaded.
    let (name, _, _, _) = t.longest(&tokens(2, 10)).expect("indexed");
    assert!(t.load(&name).is_none(), "never served");
    assert_eq!(pc.dropped_count("disk", "corrupt"), 2);
    assert!(!flipped.exists() && good.exists());
    assert!(t.longest(&tokens(2, 10)).is_none());
    let (name, _, _, _) = t.longest(&tokens(1, 10)).expect("the good one stays");
    assert!(t.load(&name).is_some());
}

#[test]
fn the_byte_budget_evicts_the_least_recently_used_and_a_longer_prefix_replaces_a_shorter() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = Arc::new(Metrics::default());
    // Room for two entries of ~10 kB, not three.
    let t = tier(dir.path(), 25_000, &metrics);
    let files = |t: &DiskTier| {
        let _ = t;
        std::fs::read_dir(dir.path()).expect("ls").count()
    };
    for tag in [1, 2] {
        t.save(tokens(tag, 10), Arc::new(vec![0; 10_000]));
        wait(|| t.longest(&tokens(tag, 10)).is_some(), "written");
    }
    // Entry 1 is used, so entry 2 is the oldest when entry 3 arrives.
    let (name, _, _, _) = t.longest(&tokens(1, 10)).expect("1");
    assert!(t.load(&name).is_some());
    t.save(tokens(3, 10), Arc::new(vec![0; 10_000]));
    wait(|| t.longest(&tokens(3, 10)).is_some(), "written");
    assert!(t.longest(&tokens(2, 10)).is_none(), "evicted");
    assert!(t.longest(&tokens(1, 10)).is_some());
    assert_eq!(files(&t), 2);
    assert_eq!(metrics.prompt_cache.dropped_count("disk", "evicted"), 1);
    // Entry 1 extended: the longer one replaces it.
    t.save(tokens(1, 12), Arc::new(vec![0; 100]));
    wait(
        || t.longest(&tokens(1, 12)).map(|h| h.1) == Some(12),
        "written",
    );
    assert_eq!(files(&t), 2, "the shorter entry went");
}

#[test]
fn the_disk_tier_waits_for_the_weights_hash() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = Arc::new(Metrics::default());
    let pending = Arc::new(OnceLock::new());
    let t = DiskTier::start(
        dir.path().to_path_buf(),
        1 << 20,
        pending.clone(),
        "fake".into(),
        TierMetrics::new(metrics.clone(), Tier::Disk),
    )
    .expect("starts");
    std::thread::sleep(Duration::from_millis(150));
    assert!(!t.ready());
    assert!(
        t.covers(&tokens(1, 100)),
        "nothing is saved before the key is known"
    );
    pending.set(SHA.into()).expect("set once");
    wait(|| t.ready(), "ready once hashed");
}

#[test]
fn the_store_prefers_the_longer_prefix_and_promotes_a_disk_hit_to_ram() {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = Arc::new(Metrics::default());
    let plan = TiersPlan {
        ram_bytes: 1 << 20,
        disk: Some(DiskPlan {
            dir: dir.path().to_path_buf(),
            bytes: 1 << 20,
        }),
    };
    let a = tokens(1, 100);
    {
        let mut s = PromptStore::start(&plan, Some("fake".into()), sha(SHA), &metrics);
        wait(|| s.disk_ready(), "disk ready");
        assert!(s.wants(&a) && !s.wants(&a[..MIN_SAVE - 1]));
        s.save(&a, vec![9; 1000]);
        assert!(!s.wants(&a[..90]), "both tiers hold it");
        let c = s.longest(&a[..90]).expect("hit");
        assert_eq!((c.tier, c.shared, c.tokens), (Tier::Ram, 90, 100));
        s.flush();
    }
    let mut s = PromptStore::start(&plan, Some("fake".into()), sha(SHA), &metrics);
    wait(|| s.disk_ready(), "disk ready");
    let c = s.longest(&a).expect("on disk after a restart");
    assert_eq!(c.tier, Tier::Disk);
    let (_, payload) = s.fetch(&c).expect("verified");
    assert_eq!(*payload, vec![9; 1000]);
    assert_eq!(s.longest(&a).map(|c| c.tier), Some(Tier::Ram), "promoted");
    let other = PromptStore::start(&plan, None, sha(SHA), &metrics);
    assert!(!other.enabled(), "a backend that cannot save has no tiers");
}
