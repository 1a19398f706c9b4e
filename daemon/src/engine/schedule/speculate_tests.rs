//! Speculative decoding on the fake backend, whose "model" writes a cycle of 50 words that
//! its position decides (and, with `odd_every`, a token that never recurs every so often):
//! a prompt holding the cycle makes prompt lookup draft what the model writes, and every
//! run's text can be compared with a run without speculation.

use tokio::sync::mpsc::UnboundedReceiver;

use super::scheduler_tests::{plan, rig_with, Rig};
use crate::config::Spec;
use crate::engine::prompt_cache::PromptStore;
use crate::engine::types::{Event, FinishReason, GenerationRequest, Timings, Usage};

/// A prompt of `len` words of the model's cycle: it continues them.
pub(super) fn cycle(len: usize) -> Vec<i32> {
    (0..len as i32).map(|i| 10 + i % 50).collect()
}

pub(super) fn rig(slots: usize, spec: Spec, odd_every: Option<u32>) -> Rig {
    let r = rig_with(
        crate::engine::plan::EnginePlan {
            spec,
            ..plan(slots, 8)
        },
        |_| PromptStore::disabled(),
    );
    r.fake.with(|c| c.odd_every = odd_every);
    r
}

pub(super) fn request(r: &Rig, prompt: Vec<i32>, max_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt_tokens: prompt,
        ..r.request(1, max_tokens)
    }
}

/// The text, finish reason, usage and timings of a finished request.
pub(super) struct Done {
    pub(super) text: String,
    pub(super) reason: FinishReason,
    pub(super) usage: Usage,
    pub(super) timings: Timings,
}

pub(super) fn finish(r: &mut Rig, rx: &mut UnboundedReceiver<Event>) -> Done {
    match r.last(rx) {
        (
            text,
            Event::Finished {
                reason,
                usage,
                timings,
            },
        ) => Done {
            text,
            reason,
            usage,
            timings,
        },
        (_, other) => panic!("expected the end, got {other:?}"),
    }
}

/// One request alone on a fresh rig; with the rig, to read its log and metrics.
pub(super) fn run(
    spec: Spec,
    odd_every: Option<u32>,
    req: impl Fn(&Rig) -> GenerationRequest,
) -> (Done, Rig) {
    let mut r = rig(1, spec, odd_every);
    let mut rx = r.submit(req(&r)).expect("admitted");
    let done = finish(&mut r, &mut rx);
    (done, r)
}

pub(super) fn same_output(a: &Done, b: &Done) {
    assert_eq!(a.text, b.text);
    assert_eq!(a.reason, b.reason);
    assert_eq!(a.usage, b.usage);
}

#[test]
fn accepted_drafts_are_the_models_own_tokens_in_fewer_steps() {
    // Every 13th token departs from the cycle: most drafts are accepted whole, some are cut.
    let req = |r: &Rig| request(r, cycle(60), 200);
    let (off, off_rig) = run(Spec::Off, Some(13), req);
    let (on, on_rig) = run(Spec::Ngram, Some(13), req);
    same_output(&on, &off);
    assert_eq!(on.usage.completion_tokens, 200);
    let log = on_rig.fake.log();
    assert!(off_rig.fake.log().verified.is_empty());
    let drafted: usize = log.verified.iter().map(|v| v.1).sum();
    let accepted: usize = log.verified.iter().map(|v| v.2).sum();
    assert!(
        log.verified.iter().any(|&(_, d, a)| a < d),
        "some drafts rejected"
    );
    assert!(accepted * 2 > drafted, "{accepted} of {drafted} accepted");
    // Each accepted draft saved a step.
    assert_eq!(
        off_rig.fake.log().steps - log.steps,
        accepted as u64,
        "steps with and without speculation"
    );
    // The rejected drafts' rows were dropped: every step fed right after what was held.
    assert!(log.misplaced.is_empty(), "{:?}", log.misplaced);
    // The counts reach the timings and the metrics alike.
    assert_eq!(
        (on.timings.draft_n, on.timings.draft_n_accepted),
        (drafted as u32, accepted as u32)
    );
    assert_eq!(
        on_rig.metrics.spec_drafted_tokens_total.get(),
        drafted as u64
    );
    assert_eq!(
        on_rig.metrics.spec_accepted_tokens_total.get(),
        accepted as u64
    );
    assert_eq!(on_rig.metrics.generated_tokens_total.get(), 200);
    assert_eq!((off.timings.draft_n, off.timings.draft_n_accepted), (0, 0));
}

#[test]
fn a_draft_never_produces_past_max_tokens() {
    for max_tokens in [1, 2, 3, 7, 30] {
        let req = |r: &Rig| request(r, cycle(60), max_tokens);
        let (off, _) = run(Spec::Off, None, req);
        let (on, rig) = run(Spec::Ngram, None, req);
        same_output(&on, &off);
        assert_eq!(on.reason, FinishReason::Length);
        assert_eq!(on.usage.completion_tokens, max_tokens);
        // Drafted only while more than one token was left, and never beyond the budget.
        let log = rig.fake.log();
        let produced: usize = log.verified.iter().map(|v| v.2 + 1).sum();
        assert!(produced <= max_tokens as usize, "{log:?}");
        assert_eq!(
            rig.metrics.generated_tokens_total.get(),
            u64::from(max_tokens)
        );
    }
}

#[test]
fn tokens_accepted_after_a_stop_sequence_are_dropped() {
    // The model writes "… 40 41 42 …": stop at "41", which a verification accepts in the
    // middle of a draft.
    let req = |r: &Rig| GenerationRequest {
        stop: vec!["41".into()],
        ..request(r, cycle(60), 100)
    };
    let (off, _) = run(Spec::Off, None, req);
    let (on, rig) = run(Spec::Ngram, None, req);
    same_output(&on, &off);
    assert_eq!(on.reason, FinishReason::Stop);
    assert!(on.text.ends_with("40 "), "{}", on.text);
    let log = rig.fake.log();
    let produced: usize = log.verified.iter().map(|v| v.2 + 1).sum();
    assert!(
        produced as u32 > on.usage.completion_tokens,
        "the last verification ran past the stop: {log:?}"
    );
    // What the slot's cells hold after the stop is what the prefix index says: a second
    // request reusing the prompt feeds exactly after it.
    let mut r = rig;
    let mut rx = r.submit(req(&r)).expect("admitted");
    let again = finish(&mut r, &mut rx);
    assert_eq!((again.text, again.reason), (off.text, off.reason));
    assert_eq!(again.usage.prompt_tokens_details.cached_tokens, 59);
    assert!(r.fake.log().misplaced.is_empty(), "{:?}", r.fake.log());
}

#[test]
fn a_draft_stops_before_an_end_of_generation_token() {
    // The prompt's cycle has the end token where word 35 would be (a chat template's end
    // of turn): lookup would draft it after "33 34".
    let mut prompt = cycle(60);
    prompt[25] = crate::engine::backend::fake::END;
    let req = |r: &Rig| request(r, prompt.clone(), 40);
    let (off, _) = run(Spec::Off, None, req);
    let (on, rig) = run(Spec::Ngram, None, req);
    same_output(&on, &off);
    let log = rig.fake.log();
    assert!(!log.verified.is_empty());
    assert_eq!(log.drafted_end, 0, "{log:?}");
}

#[test]
fn drafting_pauses_where_drafts_keep_missing() {
    // Every third token departs from the cycle, and never the same way twice: after two
    // cycle words the draft says a third one and the model writes something else.
    let req = |r: &Rig| request(r, cycle(60), 1200);
    let (off, off_rig) = run(Spec::Off, Some(3), req);
    let (on, rig) = run(Spec::Ngram, Some(3), req);
    same_output(&on, &off);
    let log = rig.fake.log();
    let drafted: usize = log.verified.iter().map(|v| v.1).sum();
    let accepted: usize = log.verified.iter().map(|v| v.2).sum();
    assert_eq!(accepted, 0);
    assert!(drafted > 0, "it tried");
    // Unchecked it would draft once every three tokens (400 times here); the pauses, each
    // twice as long as the last, leave it drafting fewer than one token in six.
    assert!(drafted * 6 < 1200, "{drafted} drafted");
    // Nothing gained, nothing lost: one token per step, as without speculation.
    assert_eq!(log.steps, off_rig.fake.log().steps);
}

#[test]
fn a_request_that_opts_out_never_verifies() {
    let req = |r: &Rig| GenerationRequest {
        speculative: false,
        ..request(r, cycle(60), 100)
    };
    let (on, rig) = run(Spec::Ngram, None, req);
    assert_eq!(on.usage.completion_tokens, 100);
    assert!(rig.fake.log().verified.is_empty());
    assert_eq!((on.timings.draft_n, on.timings.draft_n_accepted), (0, 0));
}

#[test]
fn several_sequences_verify_in_one_step_beside_a_prompt_chunk() {
    let mut r = rig(3, Spec::Ngram, Some(17));
    let mut a = r.submit(request(&r, cycle(60), 300)).expect("admitted");
    let mut b = r.submit(request(&r, cycle(75), 300)).expect("admitted");
    // Let both start decoding, then a long prompt arrives and is prefilled in chunks.
    for _ in 0..5 {
        r.turn();
    }
    let long: Vec<i32> = (0..3000).map(|i| 10 + (i * 7) % 50).collect();
    let mut c = r.submit(request(&r, long, 10)).expect("admitted");
    let (done_a, done_b, done_c) = (
        finish(&mut r, &mut a),
        finish(&mut r, &mut b),
        finish(&mut r, &mut c),
    );
    let log = r.fake.log();
    assert!(log.verified_mixed > 0, "{log:?}");
    assert!(log.misplaced.is_empty(), "{:?}", log.misplaced);
    // Each the same as alone without speculation.
    for (done, prompt) in [(&done_a, cycle(60)), (&done_b, cycle(75))] {
        let (alone, _) = run(Spec::Off, Some(17), |r| request(r, prompt.clone(), 300));
        same_output(done, &alone);
    }
    assert_eq!(done_c.usage.completion_tokens, 10);
}

#[test]
fn a_client_that_leaves_mid_verification_frees_its_slot() {
    let mut r = rig(1, Spec::Ngram, None);
    let mut rx = r.submit(request(&r, cycle(60), 1000)).expect("admitted");
    // Until it has verified a draft.
    for _ in 0..50 {
        r.turn();
        if !r.fake.log().verified.is_empty() {
            break;
        }
    }
    assert!(!r.fake.log().verified.is_empty());
    while rx.try_recv().is_ok() {}
    drop(rx);
    r.turn();
    let log = r.fake.log();
    assert_eq!(log.freed.len(), 1, "{log:?}");
    assert_eq!(r.metrics.cancelled_total.get(), 1);
}
