//! Speculative decoding by prompt lookup: a sequence's next tokens are guessed from its own
//! prompt and output, with no second model, and checked in one step ([`Work::Verify`]).
//!
//! Where the output quotes its input (answers grounded in a context, extraction, code
//! edits), the last few tokens generated usually appeared before, followed by what comes
//! next. The drafter finds the latest earlier occurrence of the last `n` tokens (`n` from
//! [`NGRAM_MAX`] down to [`NGRAM_MIN`]) and proposes the tokens that followed it. One step
//! then feeds them all and the backend keeps those the model itself would have sampled, so
//! the output is the model's own; only the steps it takes change. Weights are read once
//! per step whatever its width, so accepted drafts are nearly free tokens.
//!
//! The draft length adapts: one more after a fully accepted draft, down to what was
//! accepted after a rejection. A sequence whose drafts are rarely accepted (open chat)
//! pauses drafting for a while, each pause twice as long as the last, so it soon runs as
//! if speculation were off.
//!
//! [`Work::Verify`]: crate::engine::backend::seam::Work::Verify

use crate::engine::plan::MAX_DRAFT;

/// Longest and shortest n-gram looked up. A single token recurs too often by chance to
/// predict what follows it.
pub const NGRAM_MAX: usize = 3;
pub const NGRAM_MIN: usize = 2;
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

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
        }
    }
}

impl Drafter {
    /// Fills `out` with the draft for the token after `history` (prompt then output), at
    /// most `room` tokens; leaves it empty when there is none. `generated` counts the
    /// sequence's output so far.
    pub fn propose(&self, history: &[i32], generated: u32, room: usize, out: &mut Vec<i32>) {
        out.clear();
        if generated < self.paused_until {
            return;
        }
        out.extend_from_slice(lookup(history, self.k.min(room)));
    }

    /// A verification fed `drafted` tokens, of which the first `accepted` were accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize, generated: u32) {
        let (d, a) = (drafted as u32, accepted as u32);
        self.drafted += d;
        self.accepted += a;
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

    /// Most tokens the next draft may propose.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether drafting is paused at `generated` tokens.
    pub fn paused(&self, generated: u32) -> bool {
        generated < self.paused_until
    }
}

/// The tokens that followed the latest earlier occurrence of `history`'s last `n` tokens,
/// for the longest `n` in `NGRAM_MIN..=NGRAM_MAX` that occurs; at most `k` of them.
pub fn lookup(history: &[i32], k: usize) -> &[i32] {
    if k == 0 {
        return &[];
    }
    let len = history.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = &history[len - n..];
        // Windows starting before the tail's own start, the latest first.
        let found = history[..len - 1]
            .windows(n)
            .rposition(|w| w == tail)
            .filter(|&start| start + n < len);
        if let Some(start) = found {
            let from = start + n;
            return &history[from..(from + k).min(len)];
        }
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_longest_match_proposes_what_followed_it() {
        // "1 2 3 4 5 … 1 2 3" → 4 5 6 follow the earlier "1 2 3".
        let h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 3), &[4, 5, 6]);
        assert_eq!(lookup(&h, 1), &[4]);
        assert_eq!(lookup(&h, 0), &[] as &[i32]);
        // The latest occurrence wins: "2 3" was followed by 8 most recently.
        let h = [2, 3, 4, 0, 2, 3, 8, 0, 2, 3];
        assert_eq!(lookup(&h, 2), &[8, 0]);
        // A trigram match beats a later bigram one.
        let h = [1, 2, 3, 7, 0, 2, 3, 8, 0, 1, 2, 3];
        assert_eq!(lookup(&h, 1), &[7]);
        // The continuation stops at the end of the history.
        let h = [5, 6, 7, 5, 6];
        assert_eq!(lookup(&h, 8), &[7, 5, 6]);
    }

    #[test]
    fn no_match_or_a_single_token_proposes_nothing() {
        assert!(lookup(&[1, 2, 3, 4, 5], 4).is_empty());
        // Only the last token recurs: too weak.
        assert!(lookup(&[7, 1, 8, 2, 7], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
        assert!(lookup(&[3, 3], 4).is_empty());
        // A run repeats itself.
        assert_eq!(lookup(&[3, 3, 3], 4), &[3]);
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
