//! Speculative decoding with a draft model (`--spec draft`): a smaller model with the same
//! vocabulary proposes each sequence's next tokens, and the serving model verifies them in
//! one step ([`Work::Verify`]), exactly as it verifies prompt-lookup drafts.
//!
//! The draft model runs greedily, so a draft is a deterministic function of the sequence's
//! tokens: the verification rule for a deterministic draft (see `verify_rows`) keeps the
//! serving model's distribution at any temperature, and at temperature 0 its own argmax.
//!
//! Each sequence has its own cells in the draft model's context. Before drafting, they are
//! cut back to the longest prefix they share with the sequence's tokens (a rejected draft
//! leaves rows that no longer belong) and the rest is fed: the whole prompt the first time
//! (a chunk per step, drafting once it is in), afterwards the tokens the last verification
//! produced. Then one draft-model step per
//! drafted token, every drafting sequence in the same step. A failure in the draft model
//! never fails a request: that sequence only drafts nothing this step.
//!
//! [`Work::Verify`]: crate::engine::backend::seam::Work::Verify

use crate::engine::backend::seam::{Backend, SeqId, SeqOutcome, StepPlan, Work};
use crate::engine::types::SamplingParams;

/// One sequence's request for a draft: its tokens so far (prompt, then output, the last
/// one sampled but not yet fed to the serving model) and the most tokens to propose.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub seq: SeqId,
    pub history: &'a [i32],
    pub k: usize,
}

/// The draft model's backend and what each sequence's cells in it hold.
pub struct DraftModel<'m> {
    backend: Box<dyn Backend + 'm>,
    /// Per sequence: the tokens in its draft cells, from position 0.
    held: Vec<Vec<i32>>,
    /// Per sequence: its greedy sampler is open.
    open: Vec<bool>,
    /// Most tokens one draft step feeds (the draft context's batch).
    n_batch: usize,
}

impl<'m> DraftModel<'m> {
    pub fn new(backend: Box<dyn Backend + 'm>, sequences: usize, n_batch: usize) -> Self {
        Self {
            backend,
            held: vec![Vec::new(); sequences],
            open: vec![false; sequences],
            n_batch: n_batch.max(1),
        }
    }

    /// The sequence left its slot: its draft cells go, so that the draft context's pool
    /// (one context's worth per slot) always has room for the sequences that run.
    pub fn forget(&mut self, seq: SeqId) {
        if self.open.get(seq) == Some(&true) || self.held.get(seq).is_some_and(|h| !h.is_empty()) {
            self.backend.free(seq);
        }
        if let Some(h) = self.held.get_mut(seq) {
            h.clear();
        }
        if let Some(o) = self.open.get_mut(seq) {
            *o = false;
        }
    }

    /// Drafts for every ask, in order: at most `k` tokens each, ending early after a token
    /// `is_end` names (the caller drops it and what follows).
    pub fn propose(&mut self, asks: &[Ask<'_>], is_end: &dyn Fn(i32) -> bool) -> Vec<Vec<i32>> {
        let mut drafts = vec![Vec::new(); asks.len()];
        let mut live: Vec<usize> = Vec::new();
        for (i, ask) in asks.iter().enumerate() {
            if ask.k > 0 && !ask.history.is_empty() && self.align(ask) {
                live.push(i);
            }
        }
        self.catch_up(asks, &mut live, &mut drafts);
        while self.extend(asks, &mut live, &mut drafts, is_end) {}
        drafts
    }

    /// Opens the sequence's sampler if needed and cuts its cells back to what it shares
    /// with `ask.history`, always leaving at least the last token to feed (its row samples
    /// the first draft). False when the draft model cannot take it.
    fn align(&mut self, ask: &Ask<'_>) -> bool {
        let seq = ask.seq;
        if seq >= self.held.len() {
            return false;
        }
        if !self.open[seq] {
            let greedy = SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            };
            if let Err(e) = self.backend.open(seq, &greedy) {
                tracing::warn!(seq, error = %e, "draft model cannot open a sequence");
                return false;
            }
            self.open[seq] = true;
        }
        let held = &mut self.held[seq];
        let shared = held
            .iter()
            .zip(ask.history)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = shared.min(ask.history.len() - 1);
        if keep < held.len() {
            self.backend.truncate(seq, keep as u32);
            held.truncate(keep);
        }
        true
    }

    /// Feeds each live sequence's tokens its cells lack, in one draft step of at most
    /// `n_batch` tokens; the chunk that ends a sequence's tokens samples its first draft.
    /// A sequence with more to feed than this step holds (a long prompt, the first time)
    /// drafts nothing now and goes on next step: the serving step never waits on more
    /// than one chunk of draft prefill, as it never waits on more than one of its own.
    fn catch_up(&mut self, asks: &[Ask<'_>], live: &mut Vec<usize>, drafts: &mut [Vec<i32>]) {
        let mut budget = self.n_batch;
        let mut fed: Vec<(usize, usize)> = Vec::new();
        for &i in live.iter() {
            let ask = &asks[i];
            let from = self.held[ask.seq].len();
            let n = (ask.history.len() - from).min(budget);
            if n == 0 {
                break;
            }
            fed.push((i, n));
            budget -= n;
        }
        let mut work: Vec<Work<'_>> = fed
            .iter()
            .map(|&(i, n)| {
                let ask = &asks[i];
                let from = self.held[ask.seq].len();
                Work::Prefill {
                    seq: ask.seq,
                    tokens: &ask.history[from..from + n],
                    pos: from as u32,
                    sample: from + n == ask.history.len(),
                }
            })
            .collect();
        work.sort_by_key(Work::seq);
        let outcomes = if work.is_empty() {
            Vec::new()
        } else {
            self.backend.step(&StepPlan { work })
        };
        for (i, n) in fed {
            let ask = &asks[i];
            let from = self.held[ask.seq].len();
            match outcome(&outcomes, ask.seq) {
                Some(Ok(token)) => {
                    self.held[ask.seq].extend_from_slice(&ask.history[from..from + n]);
                    if let Some(t) = token {
                        drafts[i].push(t);
                    }
                }
                _ => self.lost(ask.seq, i, live),
            }
        }
        live.retain(|&i| !drafts[i].is_empty());
    }

    /// One draft step: every live sequence that wants more feeds its last draft and
    /// samples the next. False once no sequence wants more.
    fn extend(
        &mut self,
        asks: &[Ask<'_>],
        live: &mut Vec<usize>,
        drafts: &mut [Vec<i32>],
        is_end: &dyn Fn(i32) -> bool,
    ) -> bool {
        live.retain(|&i| {
            let last = drafts[i].last().copied();
            drafts[i].len() < asks[i].k && last.is_some_and(|t| !is_end(t))
        });
        if live.is_empty() {
            return false;
        }
        let mut work: Vec<Work<'_>> = live
            .iter()
            .filter_map(|&i| {
                let seq = asks[i].seq;
                Some(Work::Decode {
                    seq,
                    token: *drafts[i].last()?,
                    pos: self.held[seq].len() as u32,
                })
            })
            .collect();
        work.sort_by_key(Work::seq);
        let outcomes = self.backend.step(&StepPlan { work });
        for i in live.clone() {
            let seq = asks[i].seq;
            match outcome(&outcomes, seq) {
                Some(Ok(Some(token))) => {
                    if let Some(&fed) = drafts[i].last() {
                        self.held[seq].push(fed);
                    }
                    drafts[i].push(token);
                }
                _ => self.lost(seq, i, live),
            }
        }
        true
    }

    /// The draft model failed this sequence: its cells are in doubt, so they go, and it
    /// drafts what it has so far (verification checks every token anyway).
    fn lost(&mut self, seq: SeqId, i: usize, live: &mut Vec<usize>) {
        tracing::debug!(
            seq,
            "draft model step failed for a sequence; dropping its cells"
        );
        self.forget(seq);
        live.retain(|&j| j != i);
    }
}

/// The outcome for `seq`: the sampled token (if any), or `Err` when it failed.
fn outcome(outcomes: &[SeqOutcome], seq: SeqId) -> Option<Result<Option<i32>, ()>> {
    let o = outcomes.iter().find(|o| o.seq == seq)?;
    Some(o.result.clone().map_err(|_| ()))
}
