//! The scheduler: one thread that owns every request's lifecycle and every policy (intake,
//! thermal cap, queue expiry, admission, cancellation, finishing, load publishing), driving
//! a [`Backend`] that only computes.
//!
//! Each turn: take new requests, follow the thermal state, expire and admit waiters, then
//! run one step: the next token of every decoding sequence plus a bounded chunk of pending
//! prompt. A sequence whose client left is dropped right after the step that noticed it, its
//! KV cells freed and its slot given to the next waiter.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inferloop_thermal::ThermalState;

use super::command::Command;
use super::draft::{Ask, DraftModel};
use super::prefix::PrefixIndex;
use super::sequence::{End, Phase, Sequence};
use super::state::State;
use super::step_cost::{worth_verifying, StepCost};
use super::step_plan::plan_step;
use crate::config::SpecGate;
use crate::engine::backend::seam::{Backend, SeqOutcome, Vocab, Work};
use crate::engine::clock::Clock;
use crate::engine::plan::EnginePlan;
use crate::engine::prompt_cache::PromptStore;
use crate::engine::types::{EngineError, Load};
use crate::metrics::Metrics;
use crate::thermal::ThermalGate;

/// How long the idle loop sleeps between checks of the queue's timeouts.
const IDLE_TICK: Duration = Duration::from_millis(50);
/// Steps feeding at least this many prompt tokens teach the prompt cache what prefill costs.
const PREFILL_SAMPLE: usize = 64;
/// Under a step time limit, the prompt tokens of the first prompt step, which measures the
/// prefill rate the later steps' budgets follow (a timed step of [`PREFILL_SAMPLE`]).
const PROBE_TOKENS: usize = PREFILL_SAMPLE;
/// Under a step time limit, the fewest prompt tokens a step feeds, however slow the box.
const MIN_STEP_PROMPT: usize = 8;

pub(super) struct Scheduler<'v, B> {
    pub(super) backend: B,
    pub(super) vocab: &'v dyn Vocab,
    pub(super) plan: EnginePlan,
    pub(super) state: State<Sequence>,
    /// The sequence in each slot; the slot index is its backend sequence id.
    pub(super) seqs: Vec<Option<Sequence>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) load: Arc<Mutex<Load>>,
    pub(super) thermal: ThermalGate,
    /// The thermal state the admission cap was last set for.
    pub(super) thermal_state: ThermalState,
    /// What each slot's KV cells hold, for prompt reuse.
    pub(super) prefix: PrefixIndex,
    /// The prompt cache's RAM and disk tiers: prefixes beyond the slots' cells.
    pub(super) store: PromptStore,
    /// Every idle slot's prefix is in the tiers that want it (reset by each step).
    idle_saved: bool,
    /// Every "now" the scheduler reads: queue waits, timeouts, token times, the heartbeat.
    pub(super) clock: Arc<dyn Clock>,
    /// The draft model, with `--spec draft`; without it drafts come from prompt lookup.
    draft: Option<DraftModel<'v>>,
    /// What a step costs by its rows and sequences: whether a draft's rows are worth
    /// computing.
    step_cost: StepCost,
}

impl<'v, B: Backend> Scheduler<'v, B> {
    pub(super) fn new(
        backend: B,
        vocab: &'v dyn Vocab,
        plan: EnginePlan,
        metrics: Arc<Metrics>,
        load: Arc<Mutex<Load>>,
        thermal: ThermalGate,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            state: State::new(
                plan.slots,
                plan.queue,
                plan.queue_timeout,
                u64::from(plan.kv_cells),
            )
            .with_prefix_slots(plan.prefix_slots),
            seqs: (0..plan.sequences()).map(|_| None).collect(),
            backend,
            vocab,
            metrics,
            load,
            thermal,
            thermal_state: ThermalState::Normal,
            prefix: PrefixIndex::new(plan.sequences(), plan.prefix_cache),
            store: PromptStore::disabled(),
            idle_saved: false,
            plan,
            clock,
            draft: None,
            step_cost: StepCost::default(),
        }
    }

    /// Drafting with a draft model's backend (`--spec draft`) instead of prompt lookup.
    pub(super) fn with_draft(mut self, backend: Box<dyn Backend + 'v>) -> Self {
        let (sequences, n_batch) = (self.plan.sequences(), self.plan.n_batch as usize);
        self.draft = Some(DraftModel::new(backend, sequences, n_batch));
        self
    }

    /// With the prompt cache's tiers.
    pub(super) fn with_store(mut self, store: PromptStore) -> Self {
        self.store = store;
        self
    }

    pub(super) fn name(&self) -> &'static str {
        self.backend.name()
    }

    pub(super) fn run_loop(&mut self, rx: &Receiver<Command>) {
        loop {
            self.plan.debug_stall_decode();
            if self.state.active() == 0 {
                // Nothing to decode: save an idle slot's prefix to the prompt cache's tiers
                // (one per turn, so a new request waits for one save at most), else wait
                // for work, waking to expire queue timeouts.
                let wait = if self.save_idle_turn() {
                    Duration::ZERO
                } else {
                    IDLE_TICK
                };
                match rx.recv_timeout(wait) {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.turn();
        }
    }

    /// One turn of the loop once the new commands are in: follow the thermal state, expire
    /// and admit waiters, then one step when anything runs. Tests drive the scheduler
    /// through this and [`handle`](Self::handle), with no thread.
    pub(super) fn turn(&mut self) {
        self.follow_thermal();
        self.expire_waiters();
        self.admit_waiters();
        self.publish_load();
        if self.state.active() > 0 {
            self.step();
            self.drop_departed();
            self.publish_load();
        }
    }

    /// One idle save, unless every idle prefix is already saved; returns whether it saved.
    fn save_idle_turn(&mut self) -> bool {
        if self.idle_saved || self.state.queued() > 0 {
            return false;
        }
        let saved = self.save_idle();
        self.idle_saved = !saved;
        saved
    }

    /// At shutdown, once nothing runs: every idle prefix into the tiers, then the disk
    /// tier's queued writes out.
    pub(super) fn save_all_and_flush(&mut self) {
        while self.save_idle() {}
        self.store.flush();
    }

    /// Returns false when the loop must stop.
    pub(super) fn handle(&mut self, cmd: Command) -> bool {
        let (choices, accepted) = match cmd {
            Command::Submit { choices, accepted } => (choices, accepted),
            Command::PublishKvEvents(outbox) => {
                let slots = self.seqs.len();
                self.store
                    .publish(crate::kv_events::TierEvents::new(outbox.clone()));
                self.prefix
                    .publish(crate::kv_events::KvEvents::new(slots, outbox));
                return true;
            }
            Command::Shutdown => return false,
        };
        // Critical: refuse new work here, at submit; queued and running work goes on.
        let reply = match self.thermal.refusal() {
            Some(overheat) => Err(EngineError::from(overheat)),
            None => match self.state.offer_group(
                choices
                    .into_iter()
                    .map(|(request, events)| Sequence::waiting(request, events))
                    .collect(),
                self.clock.now(),
            ) {
                Ok(()) => Ok(()),
                Err(_) => Err(EngineError::QueueFull {
                    slots: self.state.slots(),
                    capacity: self.state.queue_capacity(),
                }),
            },
        };
        // If the submitter is gone, its event channel is closed too and the queue
        // discards the sequence at dequeue.
        if accepted.send(reply).is_err() {
            tracing::debug!("submitter left before admission reply");
        }
        true
    }

    /// Follows the sampler's thermal state. Running sequences are never preempted; a lower
    /// cap only holds back the next admissions.
    fn follow_thermal(&mut self) {
        let now = self.thermal.state();
        if now == self.thermal_state {
            return;
        }
        let slots = self.state.slots();
        let cap = self.thermal.max_active(now, slots);
        self.state.set_max_active(cap);
        tracing::info!(from = %self.thermal_state, to = %now, max_active = cap, slots,
            "thermal admission cap");
        self.thermal_state = now;
    }

    fn expire_waiters(&mut self) {
        let now = self.clock.now();
        self.state.drop_gone();
        for seq in self.state.expire(now) {
            let waited = now.saturating_duration_since(seq.received_at());
            seq.send_failed(EngineError::QueueTimeout {
                waited_ms: waited.as_millis() as u64,
                timeout_ms: self.plan.queue_timeout.as_millis() as u64,
            });
        }
    }

    fn admit_waiters(&mut self) {
        let now = self.clock.now();
        loop {
            let prefix = &self.prefix;
            let Some(admitted) = self
                .state
                .admit_to(now, |seq, free| prefix.choose(&seq.prompt, free))
            else {
                break;
            };
            let (slot, mut seq) = (admitted.slot, admitted.job);
            seq.sibling = admitted.follows;
            if !seq.admit(now, admitted.waited) {
                self.metrics.cancelled_total.inc();
                self.state.release(slot);
                continue;
            }
            // Validation never lets one through; a sequence with nothing to feed would
            // never leave its slot.
            let opened = match (seq.prompt.is_empty(), seq.embed) {
                (true, _) => Err(crate::engine::backend::seam::BackendError::Sequence(
                    "empty prompt".into(),
                )),
                (false, Some(pooling)) => self.backend.open_embedding(slot, pooling),
                (false, None) => self.backend.open(slot, &seq.sampling),
            };
            if let Err(e) = opened {
                seq.send_failed(EngineError::Decode(e.to_string()));
                self.backend.free(slot);
                self.prefix.clear(slot);
                self.state.release(slot);
                continue;
            }
            if self.plan.spec.enabled() {
                seq.speculate();
            }
            self.metrics
                .prompt_tokens_total
                .inc_by(seq.prompt.len() as u64);
            if seq.embed.is_some() {
                self.place_embedding(slot);
            } else {
                self.place_prompt(slot, &mut seq);
            }
            self.seqs[slot] = Some(seq);
            self.evict_for_pool();
        }
    }

    /// Prompt tokens one step may feed: the prefill chunk, or under a step time limit what
    /// the measured prefill rate says fits in it (a probe of [`PROBE_TOKENS`] measures the
    /// rate first), so that no step outlasts the watchdog's ping interval.
    fn prompt_budget(&self) -> usize {
        let chunk = self.plan.prefill_chunk as usize;
        let Some(limit) = self.plan.step_time_limit else {
            return chunk;
        };
        match self.store.costs.measured_prefill_ns_per_token() {
            None => PROBE_TOKENS.min(chunk),
            Some(ns) => {
                let fits = limit.as_nanos() as f64 / ns.max(1.0);
                (fits as usize).clamp(MIN_STEP_PROMPT.min(chunk), chunk)
            }
        }
    }

    /// One step over every active sequence, then its outcomes applied in plan order.
    fn step(&mut self) {
        self.resolve_awaiting();
        self.draft_all();
        let budget = self.prompt_budget();
        let plan = plan_step(
            &self.seqs,
            self.plan.prefill_chunk as usize,
            budget,
            self.prefix.aligned_runs(),
        );
        if plan.is_empty() {
            return;
        }
        let fed: Vec<(usize, usize)> = plan.work.iter().map(|w| (w.seq(), w.n_tokens())).collect();
        let prompt_tokens: usize = plan
            .work
            .iter()
            .filter(|w| matches!(w, Work::Prefill { .. }))
            .map(Work::n_tokens)
            .sum();
        let started = self.clock.now();
        let outcomes = self.backend.step(&plan);
        // What prefilling costs here, against which a restore from the tiers is weighed.
        let took = self.clock.now().saturating_duration_since(started);
        if prompt_tokens >= PREFILL_SAMPLE.min(budget) {
            self.store.costs.observe_prefill(plan.tokens(), took);
        }
        if prompt_tokens == 0 {
            self.step_cost
                .observe(plan.tokens(), fed.len(), took.as_secs_f64());
        }
        // Per step, for profiling (`RUST_LOG=inferloopd::step=trace`): what a step fed and
        // what the backend took; the events' timestamps give the time between steps.
        tracing::trace!(
            target: "inferloopd::step",
            rows = plan.tokens(),
            prompt_tokens,
            sequences = fed.len(),
            backend_us = took.as_micros() as u64,
        );
        self.idle_saved = false;
        drop(plan);
        if outcomes.len() != fed.len() {
            tracing::error!(
                expected = fed.len(),
                got = outcomes.len(),
                "backend broke the step contract; failing the step"
            );
        }
        let now = self.clock.now();
        for (i, (slot, n)) in fed.into_iter().enumerate() {
            let Some(seq) = self.seqs[slot].as_mut() else {
                continue;
            };
            let outcome = outcomes.get(i).filter(|o| o.seq == slot);
            let result = outcome.map(|o| &o.result);
            let logprobs = outcome.and_then(|o| o.logprobs.as_ref());
            // A verification keeps the rows of the tokens it produced (the last sampled
            // token and the accepted drafts); anything else keeps what it fed.
            let verified = matches!(
                (result, &seq.phase),
                (Some(Ok(Some(_))), Phase::Decoding { .. }) if !seq.verify.is_empty()
            );
            let kept = if verified {
                outcome.map_or(1, SeqOutcome::n_tokens).clamp(1, n)
            } else {
                n
            };
            // An embedding pass's cells are not indexed: llama.cpp computes it in its own
            // context, so the slot's cells never hold it.
            if let (Some(Ok(_)), None) = (result, seq.embed) {
                match seq.phase {
                    Phase::Decoding { next } if seq.verify.is_empty() => {
                        self.prefix.fed(slot, &[next], false)
                    }
                    Phase::Decoding { .. } => self.prefix.fed(slot, &seq.verify[..kept], false),
                    Phase::Prefill { fed } => {
                        self.prefix.fed(slot, &seq.prompt[fed..fed + n], true)
                    }
                    _ => {}
                }
            }
            seq.fed(kept);
            if verified {
                seq.verified(n - 1, kept - 1, &self.metrics);
            }
            seq.verify.clear();
            let embedding = outcome.and_then(|o| o.embedding.clone());
            let prompt_done =
                matches!(seq.phase, Phase::Prefill { fed } if fed == seq.prompt.len());
            match result {
                Some(Ok(None)) if seq.embed.is_some() && prompt_done => match embedding {
                    Some(v) => seq.embedded(v, now),
                    None => seq.end(End::Failed(EngineError::Decode(
                        "the backend returned no embedding for this sequence".into(),
                    ))),
                },
                Some(Ok(None)) => {}
                Some(Ok(Some(token))) => {
                    seq.sampled(*token, logprobs, self.vocab, &self.metrics, now);
                    // A verification's further tokens, one at a time as if decoded one per
                    // step: the text, stop, end and length checks see each; those after
                    // the sequence finished are dropped.
                    let more = match outcome {
                        Some(o) if verified => &o.more[..kept - 1],
                        _ => &[],
                    };
                    for (token, logprobs) in more {
                        if matches!(seq.phase, Phase::Finishing(_)) {
                            break;
                        }
                        seq.sampled(*token, logprobs.as_ref(), self.vocab, &self.metrics, now);
                    }
                }
                Some(Err(e)) => {
                    tracing::error!(slot, error = %e, "backend failed a sequence");
                    seq.end(End::Failed(EngineError::Decode(e.to_string())));
                }
                None => seq.end(End::Failed(EngineError::Decode(
                    "backend returned no outcome for this sequence".into(),
                ))),
            }
        }
        self.retire_finished();
    }

    /// Every decoding sequence that speculates gets its draft for this step: from the draft
    /// model, every drafting sequence in the same draft steps, or by prompt lookup.
    fn draft_all(&mut self) {
        self.propose_drafts();
        self.keep_drafts_worth_their_rows();
    }

    /// Cuts each draft to the length that raises the step's throughput most, none where
    /// its rows would cost more than they are likely to yield ([`worth_verifying`]), once
    /// the step cost is known.
    fn keep_drafts_worth_their_rows(&mut self) {
        if self.plan.spec_gate == SpecGate::Always {
            return;
        }
        let Some(cost) = self.step_cost.fit() else {
            return;
        };
        let decoding = || self.seqs.iter().flatten().filter(|s| s.decoding());
        let streams = decoding().count();
        let mut rows = streams;
        for seq in self.seqs.iter_mut().flatten() {
            let (Some(drafter), false) = (seq.drafter.as_mut(), seq.verify.is_empty()) else {
                continue;
            };
            let drafted = seq.verify.len() - 1;
            let best = worth_verifying(cost, drafter.acceptance(), drafted, rows, streams);
            let k = drafter.keep(best, drafted);
            if k == 0 {
                seq.verify.clear();
            } else {
                seq.verify.truncate(k + 1);
            }
            rows += k;
        }
    }

    /// Every speculating sequence's draft: from the draft model, or by prompt lookup.
    fn propose_drafts(&mut self) {
        let vocab = self.vocab;
        let Some(draft) = self.draft.as_mut() else {
            for seq in self.seqs.iter_mut().flatten() {
                seq.draft(vocab);
            }
            return;
        };
        let asks: Vec<Ask<'_>> = (self.seqs.iter().enumerate())
            .filter_map(|(seq, s)| {
                let s = s.as_ref()?;
                let k = s.draft_room();
                (k > 0).then(|| Ask {
                    seq,
                    history: s.history(),
                    k,
                })
            })
            .collect();
        if asks.is_empty() {
            return;
        }
        let slots: Vec<usize> = asks.iter().map(|a| a.seq).collect();
        let drafts = draft.propose(&asks, &|t| vocab.is_end(t));
        drop(asks);
        for (slot, d) in slots.into_iter().zip(drafts) {
            if let Some(seq) = self.seqs[slot].as_mut() {
                seq.set_draft(vocab, &d);
            }
        }
    }

    /// Sends the last event of every finishing sequence and frees its slot.
    fn retire_finished(&mut self) {
        for slot in 0..self.seqs.len() {
            let Some(mut seq) = self.seqs[slot].take_if(|s| matches!(s.phase, Phase::Finishing(_)))
            else {
                continue;
            };
            let (why, cells_valid) = match std::mem::replace(&mut seq.phase, Phase::Waiting) {
                Phase::Finishing(End::Finished(reason)) => {
                    seq.send_finished(reason, &self.metrics, self.clock.now());
                    ("finished", true)
                }
                Phase::Finishing(End::Failed(e)) => {
                    // A failed step may have left the cells half written.
                    let valid = !matches!(e, EngineError::Decode(_));
                    seq.send_failed(e);
                    ("failed", valid)
                }
                _ => {
                    self.metrics.cancelled_total.inc();
                    ("client disconnected", true)
                }
            };
            // An embedding pass leaves nothing the prefix index knows of to keep.
            self.release(slot, why, cells_valid && seq.embed.is_none());
        }
    }

    /// Gives a slot back. Its KV cells stay for prompt reuse when the prefix cache is on and
    /// they hold what the index says; otherwise they are freed.
    fn release(&mut self, slot: usize, why: &str, cells_valid: bool) {
        self.seqs[slot] = None;
        if let Some(draft) = self.draft.as_mut() {
            draft.forget(slot);
        }
        if self.prefix.enabled() && cells_valid {
            self.backend.close(slot);
            self.prefix.touch(slot);
        } else {
            self.backend.free(slot);
            self.prefix.clear(slot);
        }
        self.state.release(slot);
        tracing::debug!(slot, why, "slot released");
    }

    fn drop_departed(&mut self) {
        for seq in self.seqs.iter_mut().flatten() {
            if seq.events.is_closed() && !matches!(seq.phase, Phase::Finishing(_)) {
                seq.end(End::ClientGone);
            }
        }
        self.retire_finished();
    }

    pub(super) fn cancel_all(&mut self) {
        for seq in self.state.drain_queue() {
            seq.send_failed(EngineError::ShuttingDown);
        }
        for seq in self.seqs.iter_mut().flatten() {
            seq.end(End::Failed(EngineError::ShuttingDown));
        }
        self.retire_finished();
        self.publish_load();
    }

    fn publish_load(&mut self) {
        // Queued clients that left are cancellations too (dropped inside `State`).
        let departed = self.state.take_departed();
        if departed > 0 {
            self.metrics.cancelled_total.inc_by(departed);
        }
        let active = self.state.active();
        let queued = self.state.queued();
        let kv_reserved = self.state.kv_reserved();
        self.metrics.active_slots.set(active as i64);
        self.metrics.queue_depth.set(queued as i64);
        self.metrics.kv_reserved_cells.set(kv_reserved as i64);
        let seqs = &self.seqs;
        let retained = self.prefix.retained(|s| seqs[s].is_none());
        self.metrics.prefix_retained_cells.set(retained as i64);
        let max_active = self
            .thermal
            .max_active(self.thermal_state, self.state.slots());
        if let Ok(mut l) = self.load.lock() {
            *l = Load {
                active,
                queued,
                kv_reserved,
                max_active,
                beat: Some(self.clock.now()),
            };
        }
    }
}
