//! The scheduler with the prompt cache's RAM tier on the fake backend: a prefix that leaves
//! its slot is saved, a later prompt starting with it is restored instead of prefilled, a
//! refused restore falls back to prefilling, and idle slots are saved between requests.

use std::sync::Arc;

use super::scheduler_tests::{plan, rig_with, Rig, LONG};
use crate::engine::prompt_cache::{DiskPlan, PromptStore, Tier, TiersPlan};
use crate::engine::types::Event;

fn ram_rig(slots: usize) -> Rig {
    rig_with(plan(slots, 2), |metrics| {
        let tiers = TiersPlan {
            ram_bytes: 1 << 20,
            disk: None,
        };
        PromptStore::start(&tiers, Some("fake".into()), Arc::default(), metrics)
    })
}

/// Runs a prompt to its end; returns the prompt tokens it found cached.
fn run(r: &mut Rig, prompt: Vec<i32>) -> u32 {
    let mut req = r.request(0, 2);
    req.prompt_tokens = prompt;
    let mut rx = r.submit(req).expect("slot");
    match r.last(&mut rx).1 {
        Event::Finished { usage, .. } => usage.prompt_tokens_details.cached_tokens,
        other => panic!("expected Finished, got {other:?}"),
    }
}

fn prompt(tag: i32, n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| 100 + tag * 1000 + i).collect()
}

#[test]
fn a_prefix_pushed_out_of_its_slot_comes_back_from_ram() {
    let mut r = ram_rig(1);
    let a = prompt(1, 300);
    assert_eq!(run(&mut r, a.clone()), 0);
    // B takes the only slot: A (its prompt and one decoded row) is saved first.
    assert_eq!(run(&mut r, prompt(2, 200)), 0);
    assert!(r.fake.log().saved.contains(&(0, 301)), "{:?}", r.fake.log());
    // A again, with a new question: restored, only the question prefilled.
    let mut again = a.clone();
    again.extend([7; 20]);
    assert_eq!(run(&mut r, again), 300);
    assert_eq!(r.fake.log().restored, vec![(0, 301)]);
    let pc = &r.metrics.prompt_cache;
    assert_eq!(pc.hit_tokens("ram"), 300);
    assert_eq!(
        r.metrics.prefix_hit_tokens_total.get(),
        300,
        "restored tokens count as reused"
    );
}

#[test]
fn a_short_prefix_is_neither_saved_nor_worth_a_restore() {
    let mut r = ram_rig(1);
    run(&mut r, prompt(1, 20));
    run(&mut r, prompt(2, 20));
    assert!(r.fake.log().saved.is_empty(), "under MIN_SAVE tokens");
    assert!(r.fake.log().restored.is_empty());
}

#[test]
fn a_refused_restore_is_dropped_and_the_prompt_prefilled() {
    let mut r = ram_rig(1);
    let a = prompt(1, 300);
    run(&mut r, a.clone());
    run(&mut r, prompt(2, 200));
    r.fake.with(|c| c.fail_restore = true);
    assert_eq!(run(&mut r, a.clone()), 0, "prefilled after the refusal");
    assert_eq!(
        r.metrics
            .prompt_cache
            .dropped_count("ram", "restore_failed"),
        1
    );
    r.fake.with(|c| c.fail_restore = false);
    // The refused entry is gone, and A's new run is resident in the slot anyway.
    assert_eq!(run(&mut r, a), 299);
    assert!(r.fake.log().restored.is_empty());
}

#[test]
fn idle_slots_are_left_alone_without_a_disk_tier() {
    let mut r = ram_rig(1);
    run(&mut r, prompt(1, 300));
    assert!(!r.s.save_idle(), "RAM keeps only what leaves the cells");
    assert!(r.fake.log().saved.is_empty());
}

#[test]
fn idle_slots_are_written_to_disk_once_between_requests() {
    let dir = tempfile::tempdir().expect("tmp");
    let sha = Arc::new(std::sync::OnceLock::from("ab".repeat(32)));
    let mut r = rig_with(plan(2, 2), |metrics| {
        let tiers = TiersPlan {
            ram_bytes: 1 << 20,
            disk: Some(DiskPlan {
                dir: dir.path().to_path_buf(),
                bytes: 1 << 20,
            }),
        };
        PromptStore::start(&tiers, Some("fake".into()), sha, metrics)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !r.s.store.disk_ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "disk tier never ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut first = r
        .submit({
            let mut q = r.request(0, LONG);
            q.prompt_tokens = prompt(1, 300);
            q
        })
        .expect("slot");
    while !matches!(r.next(&mut first), Event::Text { .. }) {}
    assert!(!r.s.save_idle(), "a running slot is never saved");
    drop(first);
    r.turn();
    r.turn();
    assert!(r.s.save_idle(), "the slot went idle holding the prompt");
    assert!(!r.s.save_idle(), "and the disk has it now");
    let saved = r.fake.log().saved;
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(
        saved[0].1 > 300,
        "the prompt and its decoded rows: {saved:?}"
    );
    assert!(!r
        .s
        .store
        .longest(&prompt(1, 300))
        .is_some_and(|c| c.tier == Tier::Ram));
}

/// Regression (found by the soak): saving the prefix a slot leaves, just before a restore
/// into it, evicted another RAM entry and moved the candidate's place in the tier; the
/// restore then took the entry now at the old place (another prompt) under the candidate's
/// length, so the slot's cells and the prefix index disagreed and llama.cpp refused the
/// next step. A RAM tier that holds two of these entries, three prompts through one slot:
/// the fourth restores the right one.
#[test]
fn a_save_that_evicts_before_a_restore_does_not_restore_another_prompt() {
    let mut r = rig_with(plan(1, 2), |metrics| {
        let tiers = TiersPlan {
            // Two 301-token entries (1,272 B each) fit; a third of 251 evicts the oldest.
            ram_bytes: 3000,
            disk: None,
        };
        PromptStore::start(&tiers, Some("fake".into()), Arc::default(), metrics)
    });
    let (x, a, c) = (prompt(1, 300), prompt(2, 300), prompt(3, 250));
    run(&mut r, x);
    run(&mut r, a.clone());
    run(&mut r, c);
    // RAM holds X then A; the slot holds C. A again: saving C evicts X, and A moves.
    let mut again = a;
    again.extend([7; 20]);
    assert_eq!(run(&mut r, again), 300);
    assert_eq!(
        r.fake.log().restored,
        vec![(0, 301)],
        "A's 301 saved rows, not C's 251"
    );
}
