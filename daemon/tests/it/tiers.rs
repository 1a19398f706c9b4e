//! The prompt cache's RAM and disk tiers on the real model: a prompt pushed out of the
//! only slot comes back from RAM, a restarted box finds its prompts on disk, and a corrupt
//! entry is detected, dropped and counted. Exact mode, so that text with and without a
//! restore must be the same.

use std::path::Path;

use serde_json::{json, Value};

use crate::harness::{metric_or_zero as series, text_of, Daemon, SETTLE};

/// An application's system prompt, long enough to be saved (over 64 tokens).
fn app(n: usize) -> String {
    let mut s = format!("You are the help desk of appliance model {n}. ");
    for i in 0..25 {
        s.push_str(&format!(
            "Rule {}: answer about part {} in one sentence. ",
            i + 1,
            n * 31 + i
        ));
    }
    s
}

fn ask(system: &str, question: &str) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 16,
        "temperature": 0,
    })
}

/// Text and cached prompt tokens.
async fn run(d: &Daemon, body: &Value) -> (String, u64) {
    let v = d.chat(body).await;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    (text_of(&v), cached)
}

const DISK_ENTRIES: &str = "inferloop_prompt_cache_entries{tier=\"disk\"}";

#[tokio::test]
async fn a_prompt_pushed_out_of_the_only_slot_is_restored_from_ram_with_the_same_text() {
    let base = ["--slots", "1", "--ctx", "1024", "--prefix-cache"];
    let tiered = Daemon::start(&[&base[..], &["exact", "--prompt-cache-ram-mb", "64"]].concat());
    let off = Daemon::start(&[&base[..], &["off"]].concat());
    let (a, b) = (app(1), app(2));
    let work = [
        ask(&a, "Which part is rule 3 about?"),
        ask(&b, "Which part is rule 3 about?"),
        ask(&a, "Which part is rule 7 about?"),
    ];
    let mut cached = Vec::new();
    for (i, body) in work.iter().enumerate() {
        let (text, n) = run(&tiered, body).await;
        let (text_off, _) = run(&off, body).await;
        assert_eq!(text, text_off, "request {i} differs after a restore");
        cached.push(n);
    }
    assert!(cached[2] > 64, "A came back from RAM: {cached:?}");
    let m = tiered.metrics().await;
    assert_eq!(
        series(&m, "inferloop_prompt_cache_hit_tokens_total{tier=\"ram\"}"),
        cached[2] as f64,
        "{m}"
    );
    assert!(series(&m, "inferloop_prompt_cache_saves_total{tier=\"ram\"}") >= 2.0);
    assert!(
        series(&m, "inferloop_memory_required_bytes{term=\"prompt_cache\"}") >= (64 << 20) as f64,
        "the ledger counts the tier"
    );
}

/// A one-slot daemon on `state` with the disk tier only, plus `extra` flags, once the tier
/// is ready.
pub(crate) async fn start_on(state: &Path, extra: &[&str]) -> Daemon {
    let state = state.to_str().expect("utf-8 path");
    let mut args = vec![
        "--slots",
        "1",
        "--ctx",
        "1024",
        "--prefix-cache",
        "exact",
        "--prompt-cache-ram-mb",
        "0",
        "--state-dir",
        state,
    ];
    args.extend_from_slice(extra);
    let d = Daemon::start(&args);
    // The disk tier is keyed by the weights' SHA-256, hashed in the background here.
    d.wait_status(SETTLE, "the disk tier indexed its directory", |s| {
        s["prefix_cache"]["tiers"]["disk"]["ready"] == true
    })
    .await;
    d
}

pub(crate) async fn stop(mut d: Daemon) {
    d.sigterm();
    let status = d.wait_exit(SETTLE).expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}: {}", d.log_tail());
}

#[tokio::test]
async fn a_restarted_box_finds_its_prompt_on_disk_and_a_corrupt_entry_is_dropped_and_counted() {
    let state = tempfile::tempdir().expect("tmp");
    let body = ask(&app(3), "Which part is rule 5 about?");
    let d = start_on(state.path(), &[]).await;
    let (first, cached) = run(&d, &body).await;
    assert_eq!(cached, 0);
    // Saved while the box is idle, written off the serving path.
    d.wait_metrics(SETTLE, "the idle slot saved to disk", |m| {
        series(m, DISK_ENTRIES) >= 1.0
    })
    .await;
    stop(d).await;

    let d = start_on(state.path(), &[]).await;
    let (again, cached) = run(&d, &body).await;
    assert_eq!(again, first, "the same text from restored rows");
    assert!(cached > 64, "warm after the restart: {cached} cached");
    let m = d.metrics().await;
    assert_eq!(
        series(&m, "inferloop_prompt_cache_hit_tokens_total{tier=\"disk\"}"),
        cached as f64
    );
    stop(d).await;

    // Flip one byte in the middle of every entry: none may be served.
    let dir = state.path().join("prompt-cache");
    let mut flipped = 0;
    for entry in std::fs::read_dir(&dir).expect("entries") {
        let path = entry.expect("entry").path();
        let mut bytes = std::fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&path, bytes).expect("write");
        flipped += 1;
    }
    assert!(flipped >= 1);
    let d = start_on(state.path(), &[]).await;
    let (after, cached) = run(&d, &body).await;
    assert_eq!(after, first, "recomputed, the same text");
    assert_eq!(cached, 0, "a corrupt entry is never restored");
    let m = d.metrics().await;
    assert!(
        series(
            &m,
            "inferloop_prompt_cache_dropped_total{tier=\"disk\",reason=\"corrupt\"}"
        ) >= 1.0,
        "{m}"
    );
    assert_eq!(
        series(&m, "inferloop_prompt_cache_hit_tokens_total{tier=\"disk\"}"),
        0.0
    );
}
