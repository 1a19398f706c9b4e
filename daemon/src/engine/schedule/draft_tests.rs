//! Drafting with a draft model, on two fake backends: the serving one departs from its
//! cycle of words every so often, the drafting one never does, so its drafts are mostly
//! accepted and sometimes cut, and the draft model's cells must follow each cut.

use super::scheduler_tests::Rig;
use super::speculate_tests::{cycle, finish, request, rig, run, same_output};
use crate::config::Spec;
use crate::engine::backend::fake::Fake;
use crate::engine::clock::ManualClock;

/// A rig whose drafts come from a fake draft model (returned for its log and controls).
fn rig_drafting(slots: usize, odd_every: Option<u32>) -> (Rig, Fake) {
    let mut r = rig(slots, Spec::Draft, odd_every);
    let draft = Fake::new(r.s.plan.sequences(), ManualClock::new(), Default::default());
    r.s = r.s.with_draft(Box::new(draft.clone()));
    (r, draft)
}

#[test]
fn a_draft_models_tokens_are_verified_and_its_cells_follow_each_rejection() {
    let (off, off_rig) = run(Spec::Off, Some(13), |r| request(r, cycle(30), 150));
    let (mut r, draft) = rig_drafting(1, Some(13));
    let mut rx = r.submit(request(&r, cycle(30), 150)).expect("admitted");
    let on = finish(&mut r, &mut rx);
    same_output(&on, &off);
    let log = r.fake.log();
    let drafted: usize = log.verified.iter().map(|v| v.1).sum();
    let accepted: usize = log.verified.iter().map(|v| v.2).sum();
    assert!(log.verified.iter().any(|&(_, d, a)| a < d), "some cut");
    assert!(accepted * 2 > drafted, "{accepted} of {drafted} accepted");
    assert_eq!(off_rig.fake.log().steps - log.steps, accepted as u64);
    assert_eq!(
        (on.timings.draft_n, on.timings.draft_n_accepted),
        (drafted as u32, accepted as u32)
    );
    let d = draft.log();
    // Every draft-model step fed right after what its cells held: the rows of rejected
    // drafts were cut before the next catch-up.
    assert!(d.misplaced.is_empty(), "{:?}", d.misplaced);
    assert!(
        !d.truncated.is_empty(),
        "rejections cut the draft cells back"
    );
    assert_eq!(d.opened.len(), 1, "one greedy sampler for the sequence");
    // The prompt and the first token went into the draft model once; later catch-ups
    // feed only what the last verification produced.
    assert_eq!(d.most_prefill, 31);
    // Its cells go when the request leaves the slot.
    assert_eq!(d.freed.len(), 1);
}

#[test]
fn several_sequences_draft_in_the_same_draft_steps() {
    let (mut r, draft) = rig_drafting(3, None);
    let mut rxs: Vec<_> = (0..3)
        .map(|i| {
            let req = request(&r, cycle(20 + 7 * i), 60);
            r.submit(req).expect("admitted")
        })
        .collect();
    let texts: Vec<String> = rxs.iter_mut().map(|rx| finish(&mut r, rx).text).collect();
    for (i, text) in texts.iter().enumerate() {
        let (alone, _) = run(Spec::Off, None, |r| request(r, cycle(20 + 7 * i), 60));
        assert_eq!(text, &alone.text, "sequence {i}");
    }
    assert!(draft.log().widest >= 2, "draft steps batch the sequences");
    assert!(draft.log().misplaced.is_empty());
}

#[test]
fn a_failing_draft_model_costs_drafts_not_requests() {
    let (off, _) = run(Spec::Off, Some(13), |r| request(r, cycle(30), 80));
    let (mut r, draft) = rig_drafting(1, Some(13));
    let mut rx = r.submit(request(&r, cycle(30), 80)).expect("admitted");
    // Fail the draft model's first step for the sequence, then a later one.
    draft.with(|c| {
        c.fail_seqs.insert(0);
    });
    for _ in 0..20 {
        r.turn();
    }
    draft.with(|c| c.fail_step = true);
    let on = finish(&mut r, &mut rx);
    same_output(&on, &off);
    assert!(
        on.timings.draft_n_accepted > 0,
        "drafting resumed after the failures"
    );
    assert!(draft.log().misplaced.is_empty());
}

#[test]
fn a_request_that_opts_out_never_reaches_the_draft_model() {
    let (mut r, draft) = rig_drafting(1, None);
    let mut req = request(&r, cycle(30), 40);
    req.speculative = false;
    let mut rx = r.submit(req).expect("admitted");
    let done = finish(&mut r, &mut rx);
    assert_eq!(done.usage.completion_tokens, 40);
    assert_eq!(draft.log().steps, 0);
    assert!(r.fake.log().verified.is_empty());
}

#[test]
fn a_long_prompt_reaches_the_draft_model_a_chunk_per_step() {
    let (off, _) = run(Spec::Off, Some(13), |r| request(r, cycle(1300), 60));
    let (mut r, draft) = rig_drafting(1, Some(13));
    let n_batch = r.s.plan.n_batch as usize;
    let mut rx = r.submit(request(&r, cycle(1300), 60)).expect("admitted");
    let on = finish(&mut r, &mut rx);
    same_output(&on, &off);
    let d = draft.log();
    assert!(d.most_prefill <= n_batch, "{} > {n_batch}", d.most_prefill);
    assert!(d.misplaced.is_empty(), "{:?}", d.misplaced);
    assert!(on.timings.draft_n_accepted > 0);
}
