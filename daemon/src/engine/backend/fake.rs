//! A backend for the scheduler's tests: deterministic tokens, a step that takes virtual time
//! (it advances the test's [`ManualClock`], it never sleeps), injectable failures, and a log
//! of what the scheduler asked of it. No model needed.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::logprobs::TokenLogprobs;
use super::seam::{
    verify_rows, Backend, BackendError, Sampled, SeqId, SeqOutcome, StepPlan, Vocab, Work,
};
use crate::engine::clock::ManualClock;
use crate::engine::embed::{Pooled, Pooling};
use crate::engine::types::SamplingParams;

/// The token the fake vocabulary reads as end of generation.
pub const END: i32 = 2;
/// [`Control::odd_every`] puts token `ODD_BASE + p` after position `p`: a token that never
/// recurs, where the cycle of words would be.
pub const ODD_BASE: i32 = 1000;

/// What a test controls and observes, shared with the backend on the scheduler thread.
#[derive(Debug, Default)]
pub struct Control {
    /// How far each step moves the clock.
    pub step_time: Duration,
    /// How far each row (token) a step computes moves it further.
    pub row_time: Duration,
    /// Sequences whose next work fails with a sequence error (once each).
    pub fail_seqs: HashSet<SeqId>,
    /// The next step fails as a whole.
    pub fail_step: bool,
    /// `open` fails.
    pub fail_open: bool,
    /// `restore_prefix` refuses what it is given.
    pub fail_restore: bool,
    /// Emit [`END`] once a sequence has generated this many tokens.
    pub end_after: Option<u32>,
    /// The token after every position `p` with `(p + 1) % n == 0` is `ODD_BASE + p`
    /// instead of the usual word: a "model" that now and then departs from its cycle, so
    /// that drafts that follow the cycle are rejected there.
    pub odd_every: Option<u32>,
    /// The next step reports its start on the first and waits for the second.
    pub hold: Option<(Sender<()>, Receiver<()>)>,
    pub log: Log,
}

#[derive(Debug, Default, Clone)]
pub struct Log {
    pub steps: u64,
    /// (sequence, step count when it was opened).
    pub opened: Vec<(SeqId, u64)>,
    /// (sequence, step count when it was closed).
    pub freed: Vec<(SeqId, u64)>,
    /// (sequence, positions kept).
    pub truncated: Vec<(SeqId, u32)>,
    /// (source, destination, positions shared).
    pub shared: Vec<(SeqId, SeqId, u32)>,
    /// (sequence, positions) saved for the prompt cache, and restored.
    pub saved: Vec<(SeqId, u32)>,
    pub restored: Vec<(SeqId, u32)>,
    /// Most sequences fed in one step.
    pub widest: usize,
    /// Most prompt tokens fed in one step.
    pub most_prefill: usize,
    /// Steps that fed a prompt chunk and decoded a running stream together.
    pub mixed: u64,
    /// Verifications: (sequence, drafts fed, drafts accepted).
    pub verified: Vec<(SeqId, usize, usize)>,
    /// Steps that verified two sequences or more and fed a prompt chunk too.
    pub verified_mixed: u64,
    /// Drafts holding [`END`]: nothing a correct scheduler sends.
    pub drafted_end: u64,
    /// Works fed at a position other than the end of what their sequence held:
    /// (sequence, position fed, positions held). Nothing a correct scheduler does.
    pub misplaced: Vec<(SeqId, u32, u32)>,
}

#[derive(Clone)]
pub struct Fake {
    pub control: Arc<Mutex<Control>>,
    clock: ManualClock,
    generated: Vec<u32>,
    /// Per sequence, the positions its KV cells hold (`0..held`).
    held: Vec<u32>,
    /// Per sequence, the `logprobs` it was opened with.
    logprobs: Vec<Option<u8>>,
    /// Per sequence opened for an embedding: rows `[token, pos]` pooled so far.
    embeds: Vec<Option<Pooled>>,
}

impl Fake {
    pub fn new(slots: usize, clock: ManualClock, step_time: Duration) -> Self {
        let fake = Self {
            control: Arc::default(),
            clock,
            generated: vec![0; slots],
            held: vec![0; slots],
            logprobs: vec![None; slots],
            embeds: vec![None; slots],
        };
        fake.with(|c| c.step_time = step_time);
        fake
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut Control) -> T) -> T {
        let mut c = self.control.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c)
    }

    pub fn log(&self) -> Log {
        self.with(|c| c.log.clone())
    }

    /// Holds the next step on the scheduler's thread: the first receiver hears when it
    /// begins, and it goes on once the sender sends (or is dropped).
    pub fn hold_next_step(&self) -> (Receiver<()>, Sender<()>) {
        let (entered_tx, entered) = channel();
        let (release, release_rx) = channel();
        self.with(|c| c.hold = Some((entered_tx, release_rx)));
        (entered, release)
    }
}

impl Fake {
    /// The token sampled from the row fed at position `at`: a word that the position alone
    /// decides (so each run's text is the same), an odd one where `odd_every` says, [`END`]
    /// past `end_after`.
    fn sample(&mut self, c: &Control, seq: SeqId, at: u32) -> Sampled {
        self.generated[seq] += 1;
        let ended = c.end_after.is_some_and(|n| self.generated[seq] > n);
        let next = at as i32 + 1;
        let token = if ended {
            END
        } else if c.odd_every.is_some_and(|n| n > 0 && (at + 1) % n == 0) {
            ODD_BASE + at as i32
        } else {
            10 + next % 50
        };
        // Asked for: the sampled token at -0.5, then the next ids at -1, -2, …
        let logprobs = self.logprobs[seq].map(|n| TokenLogprobs {
            logprob: -0.5,
            top: (0..i32::from(n))
                .map(|i| (token + i, -(i as f32) - 0.5))
                .collect(),
        });
        (token, logprobs)
    }
}

impl Backend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn open(&mut self, seq: SeqId, sampling: &SamplingParams) -> Result<(), BackendError> {
        self.with(|c| {
            if c.fail_open {
                return Err(BackendError::Sequence("injected open failure".into()));
            }
            c.log.opened.push((seq, c.log.steps));
            Ok(())
        })?;
        self.generated[seq] = 0;
        self.logprobs[seq] = sampling.logprobs;
        self.embeds[seq] = None;
        Ok(())
    }

    fn open_embedding(&mut self, seq: SeqId, pooling: Pooling) -> Result<(), BackendError> {
        self.open(seq, &SamplingParams::default())?;
        self.embeds[seq] = Some(Pooled::new(pooling));
        Ok(())
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Vec<SeqOutcome> {
        let (step_time, row_time, hold) = self.with(|c| (c.step_time, c.row_time, c.hold.take()));
        if let Some((entered, release)) = hold {
            if entered.send(()).is_ok() {
                // Released or abandoned by the test: either way the step goes on.
                release.recv().ok();
            }
        }
        let rows = u32::try_from(plan.tokens()).unwrap_or(u32::MAX);
        self.clock.advance(step_time + row_time * rows);
        let control = self.control.clone();
        let mut c = control.lock().unwrap_or_else(|e| e.into_inner());
        c.log.steps += 1;
        c.log.widest = c.log.widest.max(plan.work.len());
        let prefill: usize = plan
            .work
            .iter()
            .filter(|w| matches!(w, Work::Prefill { .. }))
            .map(Work::n_tokens)
            .sum();
        c.log.most_prefill = c.log.most_prefill.max(prefill);
        if prefill > 0
            && (plan.work.iter()).any(|w| matches!(w, Work::Decode { .. } | Work::Verify { .. }))
        {
            c.log.mixed += 1;
        }
        let verifying = (plan.work.iter())
            .filter(|w| matches!(w, Work::Verify { .. }))
            .count();
        if prefill > 0 && verifying >= 2 {
            c.log.verified_mixed += 1;
        }
        let whole = std::mem::take(&mut c.fail_step);
        let mut out = Vec::with_capacity(plan.work.len());
        for w in &plan.work {
            let seq = w.seq();
            if let (Some(pooled), Work::Prefill { tokens, pos, .. }, false) =
                (self.embeds[seq].as_mut(), w, whole)
            {
                for (i, &t) in tokens.iter().enumerate() {
                    pooled.push(&[t as f32, (*pos as usize + i) as f32]);
                }
                let embedding = w.samples().then(|| pooled.finish()).flatten();
                out.push(SeqOutcome {
                    embedding,
                    ..SeqOutcome::new(seq, Ok(None))
                });
                continue;
            }
            if whole {
                out.push(SeqOutcome::new(
                    seq,
                    Err(BackendError::Step("injected step failure".into())),
                ));
                continue;
            }
            if c.fail_seqs.remove(&seq) {
                out.push(SeqOutcome::new(
                    seq,
                    Err(BackendError::Sequence("injected sequence failure".into())),
                ));
                continue;
            }
            let (pos, n) = match *w {
                Work::Decode { pos, .. } => (pos, 1),
                Work::Prefill { pos, tokens, .. } | Work::Verify { pos, tokens, .. } => {
                    (pos, tokens.len() as u32)
                }
            };
            if pos != self.held[seq] {
                c.log.misplaced.push((seq, pos, self.held[seq]));
            }
            self.held[seq] = pos + n;
            let outcome = match *w {
                Work::Prefill { sample: false, .. } => SeqOutcome::new(seq, Ok(None)),
                Work::Verify { tokens, pos, .. } => {
                    if tokens[1..].contains(&END) {
                        c.log.drafted_end += 1;
                    }
                    let Ok(produced) = verify_rows::<Infallible>(&tokens[1..], |i| {
                        Ok(self.sample(&c, seq, pos + i as u32))
                    });
                    let accepted = produced.len() - 1;
                    c.log.verified.push((seq, tokens.len() - 1, accepted));
                    // The rejected drafts' rows go.
                    self.held[seq] = pos + produced.len() as u32;
                    SeqOutcome::produced(seq, produced)
                }
                _ => SeqOutcome::sampled(seq, self.sample(&c, seq, pos + n - 1)),
            };
            out.push(outcome);
        }
        out
    }

    fn close(&mut self, seq: SeqId) {
        self.with(|c| {
            let at = c.log.steps;
            c.log.freed.push((seq, at));
        });
    }

    fn truncate(&mut self, seq: SeqId, len: u32) {
        self.held[seq] = self.held[seq].min(len);
        self.with(|c| c.log.truncated.push((seq, len)));
    }

    fn share_prefix(&mut self, src: SeqId, dst: SeqId, len: u32) -> Result<(), BackendError> {
        self.held[dst] = len.min(self.held[src]);
        self.with(|c| c.log.shared.push((src, dst, len)));
        Ok(())
    }

    fn kv_layout(&self) -> Option<String> {
        Some("fake".into())
    }

    /// The saved bytes are the position count: enough to check what comes back.
    fn save_prefix(&mut self, seq: SeqId, len: u32) -> Result<Vec<u8>, BackendError> {
        self.truncate(seq, len);
        self.with(|c| c.log.saved.push((seq, len)));
        Ok(len.to_le_bytes().to_vec())
    }

    fn restore_prefix(&mut self, seq: SeqId, saved: &[u8]) -> Result<u32, BackendError> {
        self.truncate(seq, 0);
        let len = <[u8; 4]>::try_from(saved)
            .map(u32::from_le_bytes)
            .map_err(|_| BackendError::Sequence("not a fake save".into()))?;
        self.with(|c| {
            if c.fail_restore {
                return Err(BackendError::Sequence("injected restore failure".into()));
            }
            c.log.restored.push((seq, len));
            Ok(len)
        })
        .inspect(|&len| self.held[seq] = len)
    }
}

/// Token `t` reads as `"<t> "`.
pub struct FakeVocab;

impl Vocab for FakeVocab {
    fn is_end(&self, token: i32) -> bool {
        token == END
    }

    fn piece(&self, token: i32) -> Vec<u8> {
        format!("{token} ").into_bytes()
    }
}
