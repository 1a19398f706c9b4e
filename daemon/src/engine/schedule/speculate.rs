//! Speculative decoding by prompt lookup: a sequence's next tokens are guessed from its own
//! prompt and output, with no second model, and checked in one step ([`Work::Verify`]).
//!
//! Where the output quotes its input (answers grounded in a context, extraction, code
//! edits), the last few tokens generated usually appeared before, followed by what comes
//! next. The drafter finds, among the earlier occurrences of the last [`NGRAM_MIN`]
//! tokens, the one whose match runs furthest back (the latest of equals) and proposes the
//! tokens that followed it. One step then feeds them all and the backend keeps those the
//! model itself would have sampled, so the output is the model's own; only the steps it
//! takes change.
//!
//! How far the match runs back says how likely the draft is: in the benchmark's traces
//! (bench/speed_workloads.py, temperature 0), a draft after a 2-token match began with the
//! model's own next token about half the time, after a match of 16 or more 97–99% of the
//! time (a copy in progress). So acceptance is learnt per match length ([`MATCH_BUCKETS`]),
//! and a draft is verified as far as its own bucket's rate makes its rows pay.
//!
//! The draft length adapts: one more after a fully accepted draft, down to what was
//! accepted after a rejection. A sequence whose drafts are rarely accepted (open chat)
//! pauses drafting for a while, each pause twice as long as the last, so it soon runs as
//! if speculation were off.
//!
//! [`Work::Verify`]: crate::engine::backend::seam::Work::Verify

use crate::engine::plan::MAX_DRAFT;

/// Shortest match looked up: a single token recurs too often by chance to predict what
/// follows it.
pub const NGRAM_MIN: usize = 2;
/// Longest match measured: acceptance rises no further beyond it.
pub const MATCH_CAP: usize = 16;
/// Prompt-lookup drafts are judged apart by the length of the match they came from: each
/// bucket holds matches from its length up to the next one's, and starts from the rate
/// given (about what the benchmark's traces showed for a draft's first token, a little
/// less). Drafts from a draft model have a bucket of their own, [`MODEL_PRIOR`].
const MATCH_BUCKETS: [(usize, f64); 6] = [
    (2, 0.5),
    (3, 0.6),
    (4, 0.75),
    (6, 0.85),
    (10, 0.9),
    (MATCH_CAP, 0.95),
];
/// A draft model's prior: hopeful, so that a sequence tries its drafts.
const MODEL_PRIOR: f64 = 0.75;
/// How many observed positions each bucket's prior weighs.
const PRIOR_WEIGHT: f64 = 4.0;
/// Positions a bucket remembers before older ones are halved.
const RATE_MEMORY: f64 = 64.0;
/// The draft length a sequence starts with.
const START_DRAFT: usize = 4;
/// Drafted tokens after which the acceptance rate is judged, and the rate below which
/// drafting pauses.
const WINDOW: u32 = 32;
const LOW_RATE: f64 = 0.3;
/// Generated tokens the first pause lasts, and the longest pause.
const FIRST_PAUSE: u32 = 32;
const LONGEST_PAUSE: u32 = 4096;

/// One sequence's drafting state and counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Drafter {
    /// Most tokens the next draft may propose.
    k: usize,
    /// Drafted and accepted since the rate was last judged.
    window_drafted: u32,
    window_accepted: u32,
    /// No draft before this many tokens are generated; the next pause's length.
    paused_until: u32,
    pause: u32,
    /// Drafted and accepted over the sequence (llama-server's `draft_n`,
    /// `draft_n_accepted`).
    pub drafted: u32,
    pub accepted: u32,
    /// Per match bucket (then the draft model's): how often a drafted position is
    /// accepted.
    rates: [Rate; MATCH_BUCKETS.len() + 1],
    /// The bucket of the draft being verified.
    source: usize,
    /// Drafts dropped as not worth their rows since one was last tried.
    skipped: u32,
}

/// Recent drafted positions actually tested (the accepted ones and the first rejected
/// one) and those accepted, halved as they grow, over a prior: the chance that the next
/// drafted position is accepted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rate {
    prior: f64,
    tested: f64,
    passed: f64,
}

impl Rate {
    fn new(prior: f64) -> Self {
        Self {
            prior,
            tested: 0.0,
            passed: 0.0,
        }
    }

    fn of(&self) -> f64 {
        (self.passed + self.prior * PRIOR_WEIGHT) / (self.tested + PRIOR_WEIGHT)
    }

    fn observe(&mut self, drafted: usize, accepted: usize) {
        self.passed += accepted as f64;
        self.tested += accepted as f64 + if accepted < drafted { 1.0 } else { 0.0 };
        if self.tested > RATE_MEMORY {
            (self.tested, self.passed) = (self.tested / 2.0, self.passed / 2.0);
        }
    }
}

/// The bucket of a prompt-lookup match of `matched` tokens.
fn bucket(matched: usize) -> usize {
    MATCH_BUCKETS
        .iter()
        .rposition(|&(from, _)| matched >= from)
        .unwrap_or(0)
}

/// The draft model's bucket.
const MODEL_BUCKET: usize = MATCH_BUCKETS.len();

impl Default for Drafter {
    fn default() -> Self {
        Self {
            k: START_DRAFT,
            window_drafted: 0,
            window_accepted: 0,
            paused_until: 0,
            pause: FIRST_PAUSE,
            drafted: 0,
            accepted: 0,
            rates: std::array::from_fn(|i| {
                Rate::new(MATCH_BUCKETS.get(i).map_or(MODEL_PRIOR, |&(_, p)| p))
            }),
            source: MODEL_BUCKET,
            skipped: 0,
        }
    }
}

impl Drafter {
    /// Fills `out` with the draft for the token after `history` (prompt then output), at
    /// most `room` tokens; leaves it empty when there is none. `generated` counts the
    /// sequence's output so far.
    pub fn propose(&mut self, history: &[i32], generated: u32, room: usize, out: &mut Vec<i32>) {
        out.clear();
        let k = self.wants(generated, room);
        out.extend_from_slice(self.look_up(history, k));
    }

    /// The prompt-lookup draft of at most `k` tokens after `history`, its match length
    /// noted as the bucket its acceptance is judged in.
    pub fn look_up<'h>(&mut self, history: &'h [i32], k: usize) -> &'h [i32] {
        let found = lookup(history, k);
        self.drafting(Some(found.matched));
        found.draft
    }

    /// The next draft comes from a prompt-lookup match of `matched` tokens, or from the
    /// draft model (`None`): its acceptance is judged, and learnt, in that bucket.
    pub fn drafting(&mut self, matched: Option<usize>) {
        self.source = matched.map_or(MODEL_BUCKET, bucket);
    }

    /// How many tokens the next draft may propose at `generated` tokens with `room` left:
    /// none while paused, else the current length within the room.
    pub fn wants(&self, generated: u32, room: usize) -> usize {
        if self.paused(generated) {
            0
        } else {
            self.k.min(room)
        }
    }

    /// A verification fed `drafted` tokens, of which the first `accepted` were accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize, generated: u32) {
        let (d, a) = (drafted as u32, accepted as u32);
        self.drafted += d;
        self.accepted += a;
        self.rates[self.source].observe(drafted, accepted);
        self.k = if accepted == drafted {
            (self.k + 1).min(MAX_DRAFT as usize)
        } else {
            (accepted + 1).clamp(1, MAX_DRAFT as usize)
        };
        self.window_drafted += d;
        self.window_accepted += a;
        if self.window_drafted < WINDOW {
            return;
        }
        let rate = f64::from(self.window_accepted) / f64::from(self.window_drafted);
        (self.window_drafted, self.window_accepted) = (0, 0);
        if rate < LOW_RATE {
            self.paused_until = generated.saturating_add(self.pause);
            self.pause = (self.pause * 2).min(LONGEST_PAUSE);
            self.k = START_DRAFT;
        } else {
            self.pause = FIRST_PAUSE;
        }
    }

    /// The chance that a position of the next draft is accepted, from recent
    /// verifications of drafts like it (its bucket's prior before any).
    pub fn acceptance(&self) -> f64 {
        self.rates[self.source].of()
    }

    /// Of `drafted` tokens, how many to verify when [`worth_verifying`] says `k`: a
    /// sequence whose drafts are never worth it still tries a short one now and then
    /// ([`RETRY_EVERY`]), or its acceptance would never be learnt again.
    pub fn keep(&mut self, k: usize, drafted: usize) -> usize {
        if k > 0 {
            self.skipped = 0;
            return k;
        }
        self.skipped += 1;
        if self.skipped >= RETRY_EVERY {
            self.skipped = 0;
            return drafted.min(2);
        }
        0
    }

    /// Whether drafting is paused at `generated` tokens.
    pub fn paused(&self, generated: u32) -> bool {
        generated < self.paused_until
    }
}

/// Drafts dropped in a row before a short one is tried anyway.
pub const RETRY_EVERY: u32 = 16;

/// A prompt-lookup draft and the length of the match it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup<'h> {
    pub draft: &'h [i32],
    /// Tokens before the draft that equal `history`'s last ones (at most [`MATCH_CAP`]).
    pub matched: usize,
}

/// The tokens that followed an earlier occurrence of `history`'s last [`NGRAM_MIN`]
/// tokens, at most `k` of them: of all occurrences, the one whose match with `history`'s
/// end runs furthest back (up to [`MATCH_CAP`] tokens), the latest among equals.
pub fn lookup(history: &[i32], k: usize) -> Lookup<'_> {
    let none = Lookup {
        draft: &[],
        matched: 0,
    };
    let len = history.len();
    if k == 0 || len <= NGRAM_MIN {
        return none;
    }
    // How many tokens before `end` equal the tokens before `len`.
    let matched_before = |end: usize| {
        (1..=end.min(MATCH_CAP))
            .take_while(|&j| history[end - j] == history[len - j])
            .count()
    };
    let mut best = none;
    let mut best_end = 0;
    // Candidate ends of a match, the latest first; a draft needs a token after it.
    for end in (NGRAM_MIN..len).rev() {
        if history[end - NGRAM_MIN..end] != history[len - NGRAM_MIN..] {
            continue;
        }
        let matched = matched_before(end);
        if matched > best.matched {
            best.matched = matched;
            best_end = end;
            if matched == MATCH_CAP {
                break;
            }
        }
    }
    if best.matched == 0 {
        return none;
    }
    best.draft = &history[best_end..(best_end + k).min(len)];
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_proposes_what_followed_it() {
        // "1 2 3 4 5 … 1 2 3" → 4 5 6 follow the earlier "1 2 3".
        let h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 3).draft, &[4, 5, 6]);
        assert_eq!(lookup(&h, 1).draft, &[4]);
        assert_eq!(lookup(&h, 0).draft, &[] as &[i32]);
        // The latest occurrence wins: "2 3" was followed by 8 most recently.
        let h = [2, 3, 4, 0, 2, 3, 8, 0, 2, 3];
        assert_eq!(lookup(&h, 2).draft, &[8, 0]);
        // A match of three beats a later match of two.
        let h = [1, 2, 3, 7, 0, 2, 3, 8, 0, 1, 2, 3];
        assert_eq!(lookup(&h, 1).draft, &[7]);
        // The continuation stops at the end of the history.
        let h = [5, 6, 7, 5, 6];
        assert_eq!(lookup(&h, 8).draft, &[7, 5, 6]);
    }

    #[test]
    fn the_match_length_is_counted_up_to_its_cap() {
        // "9 1 2 3" earlier, "5 1 2 3" later, "9 1 2 3" at the end: the earlier match runs
        // four tokens back, the later one three.
        let h = [9, 1, 2, 3, 7, 5, 1, 2, 3, 8, 9, 1, 2, 3];
        assert_eq!(
            lookup(&h, 2),
            Lookup {
                draft: &[7, 5],
                matched: 4
            }
        );
        // A copy in progress: the match is counted to MATCH_CAP and no further.
        let text: Vec<i32> = (0..40).collect();
        let mut h = text.clone();
        h.extend_from_slice(&text[..30]);
        let found = lookup(&h, 3);
        assert_eq!(found.draft, &[30, 31, 32]);
        assert_eq!(found.matched, MATCH_CAP);
        assert_eq!(lookup(&[1, 2, 0, 1, 2], 1).matched, 2);
    }

    #[test]
    fn acceptance_is_learnt_per_match_length() {
        let mut d = Drafter::default();
        d.drafting(Some(2));
        let short = d.acceptance();
        d.drafting(Some(40));
        let copy = d.acceptance();
        assert!(
            short < copy,
            "a longer match starts more trusted: {short} {copy}"
        );
        // Short matches keep failing: their bucket drops, the copies' does not move.
        d.drafting(Some(2));
        for _ in 0..30 {
            d.observe(4, 0, 10);
        }
        assert!(d.acceptance() < 0.1, "{}", d.acceptance());
        d.drafting(Some(MATCH_CAP));
        assert_eq!(d.acceptance(), copy);
        // A draft model's drafts are judged apart from every lookup bucket.
        d.drafting(None);
        assert_eq!(d.acceptance(), MODEL_PRIOR);
        d.observe(4, 4, 20);
        assert!(d.acceptance() > MODEL_PRIOR);
        d.drafting(Some(2));
        assert!(d.acceptance() < 0.1);
        // Buckets: each length maps to the last bucket that starts at or below it.
        assert_eq!(bucket(2), 0);
        assert_eq!(bucket(5), 2);
        assert_eq!(bucket(9), 3);
        assert_eq!(bucket(MATCH_CAP), MATCH_BUCKETS.len() - 1);
    }

    #[test]
    fn no_match_or_a_single_token_proposes_nothing() {
        assert!(lookup(&[1, 2, 3, 4, 5], 4).draft.is_empty());
        // Only the last token recurs: too weak.
        assert!(lookup(&[7, 1, 8, 2, 7], 4).draft.is_empty());
        assert!(lookup(&[], 4).draft.is_empty());
        assert!(lookup(&[3, 3], 4).draft.is_empty());
        // A run repeats itself.
        assert_eq!(lookup(&[3, 3, 3], 4).draft, &[3]);
    }

    #[test]
    fn the_draft_length_follows_acceptance_within_bounds() {
        let mut d = Drafter::default();
        let mut out = Vec::new();
        let h: Vec<i32> = (0..40).chain(0..40).collect();
        d.propose(&h[..45], 5, 100, &mut out);
        assert_eq!(out, (5..9).collect::<Vec<_>>(), "starts at {START_DRAFT}");
        d.propose(&h[..45], 5, 2, &mut out);
        assert_eq!(out.len(), 2, "never more than the room left");
        for _ in 0..10 {
            let k = d.k;
            d.observe(k, k, 10);
        }
        assert_eq!(
            d.k, MAX_DRAFT as usize,
            "grows to the bound on full acceptance"
        );
        d.observe(8, 2, 10);
        assert_eq!(d.k, 3, "shrinks to what was accepted, plus one");
        d.observe(3, 0, 10);
        assert_eq!(d.k, 1);
        assert!(d.drafted > 0 && d.accepted > 0);
    }

    #[test]
    fn low_acceptance_pauses_drafting_for_longer_each_time() {
        let mut d = Drafter::default();
        let h: Vec<i32> = (0..40).chain(0..10).collect();
        let mut out = Vec::new();
        let mut generated = 0;
        let mut pauses = Vec::new();
        while pauses.len() < 3 {
            d.propose(&h, generated, 100, &mut out);
            if out.is_empty() {
                // Count the pause's length, then go on after it.
                let start = generated;
                while d.paused(generated) {
                    generated += 1;
                }
                pauses.push(generated - start);
                continue;
            }
            // The verification produced one token, the model's own.
            generated += 1;
            d.observe(out.len(), 0, generated);
        }
        assert_eq!(pauses, vec![FIRST_PAUSE, 2 * FIRST_PAUSE, 4 * FIRST_PAUSE]);
        // A good window resets the pause.
        d.observe(WINDOW as usize, WINDOW as usize, generated);
        assert_eq!(d.pause, FIRST_PAUSE);
    }
}
