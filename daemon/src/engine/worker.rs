//! The decode thread: continuous batching over one llama.cpp context.
//!
//! Each step batches the next token of every decoding sequence plus a bounded chunk of pending
//! prompt tokens, runs one `llama_decode`, samples, and streams text out. New work is admitted
//! between steps; a sequence whose client left is dropped after the step that noticed it, its
//! KV cells removed and its slot given to the next waiter.

use std::num::NonZeroU32;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inferloop_thermal::ThermalState;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc::UnboundedSender;

use super::state::{State, Waiter};
use super::text::TextStream;
use super::{
    Command, EngineConfig, EngineError, Event, FinishReason, GenerationRequest, Load, LoadedModel,
    SamplingParams, Timings, Usage,
};
use crate::metrics::Metrics;
use crate::thermal::ThermalGate;

/// How long the idle loop sleeps between checks of the queue's timeouts.
const IDLE_TICK: Duration = Duration::from_millis(50);

struct Job {
    request: GenerationRequest,
    events: UnboundedSender<Event>,
}

impl Waiter for Job {
    fn is_gone(&self) -> bool {
        self.events.is_closed()
    }
    fn kv_cells(&self) -> u64 {
        self.request.prompt_tokens.len() as u64 + u64::from(self.request.max_tokens)
    }
}

/// One admitted request occupying a slot (= llama.cpp sequence id).
struct Sequence {
    slot: usize,
    events: UnboundedSender<Event>,
    sampler: LlamaSampler,
    prompt: Vec<LlamaToken>,
    prefilled: usize,
    n_past: i32,
    /// The sampled token to feed in the next step.
    next: Option<LlamaToken>,
    generated: u32,
    max_tokens: u32,
    text: TextStream,
    received_at: Instant,
    admitted_at: Instant,
    queue_ms: f64,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// Index of this sequence's logits in the current batch.
    logits_at: Option<i32>,
}

enum Outcome {
    Continue,
    Finished(FinishReason),
    ClientGone,
}

struct Worker<'m> {
    model: &'m LoadedModel,
    ctx: LlamaContext<'m>,
    config: EngineConfig,
    state: State<Job>,
    seqs: Vec<Option<Sequence>>,
    batch: LlamaBatch<'static>,
    metrics: Arc<Metrics>,
    load: Arc<Mutex<Load>>,
    thermal: ThermalGate,
    /// The thermal state the admission cap was last set for.
    thermal_state: ThermalState,
}

pub(super) fn run(
    model: Arc<LoadedModel>,
    config: EngineConfig,
    rx: Receiver<Command>,
    ready: Sender<Result<(), EngineError>>,
    metrics: Arc<Metrics>,
    load: Arc<Mutex<Load>>,
    thermal: ThermalGate,
) {
    let slots = config.slots;
    let full = config.ctx.saturating_mul(slots as u32);
    // By default each of the `slots` sequences gets its own `ctx` cells (non-unified KV), so
    // one long request cannot starve the others. With fewer cells the slots share one pool
    // and the scheduler admits a request only when its cells are free.
    let shared = config.kv_cells < full;
    let n_ctx = if shared { config.kv_cells } else { full };
    let batch_capacity = config.prefill_chunk + slots;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_seq_max(slots as u32)
        .with_kv_unified(shared)
        .with_n_batch(batch_capacity as u32)
        .with_n_ubatch(batch_capacity.min(crate::boot::N_UBATCH as usize) as u32)
        .with_n_threads(config.threads)
        .with_n_threads_batch(config.threads);
    let ctx = match model.llama().new_context(model.backend(), params) {
        Ok(ctx) => ctx,
        Err(e) => {
            // The receiver only goes away if start-up was abandoned; nothing to report to.
            if ready
                .send(Err(EngineError::Context(e.to_string())))
                .is_err()
            {
                tracing::debug!("start-up abandoned before context failure was reported");
            }
            return;
        }
    };
    let mut worker = Worker {
        model: &model,
        ctx,
        state: State::new(
            slots,
            config.queue,
            config.queue_timeout,
            u64::from(config.kv_cells),
        ),
        seqs: (0..slots).map(|_| None).collect(),
        batch: LlamaBatch::new(batch_capacity, 1),
        config,
        metrics,
        load,
        thermal,
        thermal_state: ThermalState::Normal,
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    worker.run_loop(&rx);
    worker.cancel_all();
    tracing::debug!("decode thread stopped");
}

impl Worker<'_> {
    fn run_loop(&mut self, rx: &Receiver<Command>) {
        loop {
            if self.state.active() == 0 {
                // Nothing to decode: wait for work, waking to expire queue timeouts.
                match rx.recv_timeout(IDLE_TICK) {
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
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
                }
            }
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
    }

    /// Returns false when the loop must stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit {
                request,
                events,
                accepted,
            } => {
                let job = Job { request, events };
                // Critical: refuse new work here, at submit; queued and running work goes on.
                let reply = match self.thermal.refusal() {
                    Some(refused) => Err(refused),
                    None => match self.state.offer(job, Instant::now()) {
                        Ok(()) => Ok(()),
                        Err((_, _job)) => Err(EngineError::QueueFull {
                            slots: self.state.slots(),
                            capacity: self.state.queue_capacity(),
                        }),
                    },
                };
                // If the handler is gone, the job's event channel is closed too and the
                // queue will discard it at dequeue.
                if accepted.send(reply).is_err() {
                    tracing::debug!("submitter left before admission reply");
                }
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Follows the sampler's thermal state: a `watch` borrow per iteration, and on a change
    /// a new admission cap. Running sequences are never preempted; a lower cap only holds
    /// back the next admissions.
    fn follow_thermal(&mut self) {
        let now = self.thermal.state();
        if now == self.thermal_state {
            return;
        }
        let slots = self.state.slots();
        let cap = self.thermal.max_active(now, slots);
        self.state.set_max_active(cap);
        tracing::info!(
            from = %self.thermal_state,
            to = %now,
            max_active = cap,
            slots,
            "thermal admission cap"
        );
        self.thermal_state = now;
    }

    fn expire_waiters(&mut self) {
        let now = Instant::now();
        self.state.drop_gone();
        for job in self.state.expire(now) {
            let waited = now.saturating_duration_since(job.request.received_at);
            send_or_log(
                &job.events,
                Event::Failed(EngineError::QueueTimeout {
                    waited_ms: waited.as_millis() as u64,
                    timeout_ms: self.config.queue_timeout.as_millis() as u64,
                }),
            );
        }
    }

    fn admit_waiters(&mut self) {
        let now = Instant::now();
        while let Some(admitted) = self.state.admit(now) {
            let Job { request, events } = admitted.job;
            let queue_ms = ms(admitted.waited);
            if events.send(Event::Admitted { queue_ms }).is_err() {
                self.metrics.cancelled_total.inc();
                self.state.release(admitted.slot);
                continue;
            }
            self.metrics
                .prompt_tokens_total
                .inc_by(request.prompt_tokens.len() as u64);
            let sampler = build_sampler(&request.sampling, self.model.info().n_vocab);
            self.seqs[admitted.slot] = Some(Sequence {
                slot: admitted.slot,
                events,
                sampler,
                prompt: request
                    .prompt_tokens
                    .iter()
                    .map(|t| LlamaToken(*t))
                    .collect(),
                prefilled: 0,
                n_past: 0,
                next: None,
                generated: 0,
                max_tokens: request.max_tokens,
                text: TextStream::new(request.stop),
                received_at: request.received_at,
                admitted_at: now,
                queue_ms,
                first_token_at: None,
                last_token_at: None,
                logits_at: None,
            });
        }
    }

    /// One batched decode over every active sequence.
    fn step(&mut self) {
        self.batch.clear();
        if let Err(e) = self.fill_batch() {
            self.fail_batch(&format!("batch assembly: {e}"));
            return;
        }
        if self.batch.n_tokens() == 0 {
            return;
        }
        if let Err(e) = self.ctx.decode(&mut self.batch) {
            self.fail_batch(&e.to_string());
            return;
        }
        let now = Instant::now();
        for slot in 0..self.seqs.len() {
            let Some(seq) = self.seqs[slot].as_mut() else {
                continue;
            };
            let Some(idx) = seq.logits_at.take() else {
                continue;
            };
            let token = seq.sampler.sample(&self.ctx, idx);
            let outcome = advance(seq, token, self.model, &self.metrics, now);
            match outcome {
                Outcome::Continue => {}
                Outcome::Finished(reason) => self.finish(slot, reason),
                Outcome::ClientGone => self.cancel(slot),
            }
        }
    }

    /// Decoding sequences go first so running streams never wait behind a long prefill;
    /// prompt tokens then fill the rest of the step's budget.
    fn fill_batch(&mut self) -> Result<(), llama_cpp_2::llama_batch::BatchAddError> {
        for seq in self.seqs.iter_mut().flatten() {
            seq.logits_at = None;
            if let Some(token) = seq.next.take() {
                self.batch
                    .add(token, seq.n_past, &[seq.slot as i32], true)?;
                seq.n_past += 1;
                seq.logits_at = Some(self.batch.n_tokens() - 1);
            }
        }
        let mut budget = self.config.prefill_chunk;
        for seq in self.seqs.iter_mut().flatten() {
            let remaining = seq.prompt.len() - seq.prefilled;
            if remaining == 0 || seq.logits_at.is_some() || budget == 0 {
                continue;
            }
            let n = remaining.min(budget);
            for i in 0..n {
                let last = seq.prefilled + i + 1 == seq.prompt.len();
                self.batch.add(
                    seq.prompt[seq.prefilled + i],
                    seq.n_past,
                    &[seq.slot as i32],
                    last,
                )?;
                seq.n_past += 1;
            }
            seq.prefilled += n;
            budget -= n;
            if seq.prefilled == seq.prompt.len() {
                seq.logits_at = Some(self.batch.n_tokens() - 1);
            }
        }
        Ok(())
    }

    /// A failed decode poisons every sequence in the batch: tell each, free their slots.
    fn fail_batch(&mut self, reason: &str) {
        tracing::error!(
            reason,
            "llama_decode failed; failing the sequences in this batch"
        );
        for slot in 0..self.seqs.len() {
            if let Some(seq) = self.seqs[slot].as_ref() {
                send_or_log(
                    &seq.events,
                    Event::Failed(EngineError::Decode(reason.to_string())),
                );
                self.free(slot, "decode failed");
            }
        }
    }

    fn finish(&mut self, slot: usize, reason: FinishReason) {
        let Some(seq) = self.seqs[slot].as_mut() else {
            return;
        };
        let tail = seq.text.finish();
        if !tail.text.is_empty() {
            send_or_log(&seq.events, Event::Text(tail.text));
        }
        let timings = timings_of(seq);
        let prompt_tokens = seq.prompt.len() as u32;
        let usage = Usage {
            prompt_tokens,
            completion_tokens: seq.generated,
            total_tokens: prompt_tokens + seq.generated,
        };
        self.metrics
            .request_seconds
            .observe(seq.received_at.elapsed().as_secs_f64());
        send_or_log(
            &seq.events,
            Event::Finished {
                reason,
                usage,
                timings,
            },
        );
        self.free(slot, "finished");
    }

    /// Removes a sequence's KV cells and gives its slot back.
    fn free(&mut self, slot: usize, why: &str) {
        if self.seqs[slot].take().is_none() {
            return;
        }
        if let Err(e) = self.ctx.clear_kv_cache_seq(Some(slot as u32), None, None) {
            tracing::warn!(slot, error = %e, "could not clear KV cells of slot");
        }
        self.state.release(slot);
        tracing::debug!(slot, why, "slot freed");
    }

    fn drop_departed(&mut self) {
        for slot in 0..self.seqs.len() {
            let gone = self.seqs[slot]
                .as_ref()
                .is_some_and(|s| s.events.is_closed());
            if gone {
                self.cancel(slot);
            }
        }
    }

    /// The client left: stop decoding for it right away.
    fn cancel(&mut self, slot: usize) {
        self.metrics.cancelled_total.inc();
        self.free(slot, "client disconnected");
    }

    fn cancel_all(&mut self) {
        for job in self.state.drain_queue() {
            send_or_log(&job.events, Event::Failed(EngineError::ShuttingDown));
        }
        for slot in 0..self.seqs.len() {
            if let Some(seq) = self.seqs[slot].as_ref() {
                send_or_log(&seq.events, Event::Failed(EngineError::ShuttingDown));
                self.free(slot, "shutdown");
            }
        }
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
        let max_active = self
            .thermal
            .max_active(self.thermal_state, self.state.slots());
        if let Ok(mut l) = self.load.lock() {
            *l = Load {
                active,
                queued,
                kv_reserved,
                max_active,
                beat: Some(Instant::now()),
            };
        }
    }
}

/// Applies one sampled token to a sequence: text out, stop/length checks.
fn advance(
    seq: &mut Sequence,
    token: LlamaToken,
    model: &LoadedModel,
    metrics: &Metrics,
    now: Instant,
) -> Outcome {
    match seq.last_token_at {
        None => {
            seq.first_token_at = Some(now);
            metrics
                .ttft_seconds
                .observe(now.duration_since(seq.received_at).as_secs_f64());
        }
        Some(prev) => metrics
            .inter_token_seconds
            .observe(now.duration_since(prev).as_secs_f64()),
    }
    seq.last_token_at = Some(now);
    let vocab = model.llama().vocab();
    if vocab.is_eog(token) {
        return Outcome::Finished(FinishReason::Stop);
    }
    seq.generated += 1;
    metrics.generated_tokens_total.inc();
    let bytes = vocab.token_to_piece(token, false, None);
    let piece = seq.text.push(&bytes);
    if !piece.text.is_empty() && seq.events.send(Event::Text(piece.text)).is_err() {
        return Outcome::ClientGone;
    }
    if piece.stopped {
        return Outcome::Finished(FinishReason::Stop);
    }
    if seq.generated >= seq.max_tokens {
        return Outcome::Finished(FinishReason::Length);
    }
    seq.next = Some(token);
    Outcome::Continue
}

fn timings_of(seq: &Sequence) -> Timings {
    let first = seq.first_token_at.unwrap_or(seq.admitted_at);
    let last = seq.last_token_at.unwrap_or(first);
    let prompt_ms = ms(first.duration_since(seq.admitted_at));
    let predicted_ms = ms(last.duration_since(first));
    let prompt_n = seq.prompt.len() as u32;
    Timings {
        queue_ms: seq.queue_ms,
        prompt_n,
        prompt_ms,
        prompt_per_second: per_second(prompt_n as f64, prompt_ms),
        predicted_n: seq.generated,
        predicted_ms,
        // The first token is sampled at the end of prompt eval, so the decode rate counts the
        // tokens after it over the time after it.
        predicted_per_second: per_second(seq.generated.saturating_sub(1) as f64, predicted_ms),
        ttft_ms: ms(first.duration_since(seq.received_at)),
    }
}

fn build_sampler(p: &SamplingParams, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::new();
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            64,
            1.0,
            p.frequency_penalty,
            p.presence_penalty,
        ));
    }
    if p.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        if p.top_k > 0 {
            chain.push(LlamaSampler::top_k(p.top_k));
        }
        if p.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(p.top_p, 1));
        }
        if p.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(p.min_p, 1));
        }
        chain.push(LlamaSampler::temp(p.temperature));
        chain.push(LlamaSampler::dist(p.seed));
    }
    LlamaSampler::chain_simple(chain)
}

fn send_or_log(events: &UnboundedSender<Event>, event: Event) {
    if events.send(event).is_err() {
        tracing::debug!("client left before the final event");
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn per_second(n: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        n * 1000.0 / ms
    } else {
        0.0
    }
}
