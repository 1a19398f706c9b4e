//! One request as the scheduler sees it, from the queue to its last event, and the explicit
//! phase it is in.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::backend::Vocab;
use super::state::Waiter;
use super::text::TextStream;
use super::{
    EngineError, Event, FinishReason, GenerationRequest, PromptTokensDetails, SamplingParams,
    Timings, Usage,
};
use crate::metrics::Metrics;

/// Where a sequence is in its life. Transitions only go forward:
/// `Waiting → Prefill → Decoding → Finishing`, or straight to `Finishing` from any phase.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// In the queue, without a slot.
    Waiting,
    /// Holding a slot; `fed` prompt tokens are in its KV cells.
    Prefill { fed: usize },
    /// The prompt is in; `next` was sampled last step and is fed in the next one.
    Decoding { next: i32 },
    /// Done; its last event goes out and its slot is freed before the next step.
    Finishing(End),
}

/// Why a sequence ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    Finished(FinishReason),
    /// The client left: no final event, counted as a cancellation.
    ClientGone,
    Failed(EngineError),
}

pub struct Sequence {
    pub phase: Phase,
    pub prompt: Vec<i32>,
    pub sampling: SamplingParams,
    max_tokens: u32,
    text: TextStream,
    pub events: UnboundedSender<Event>,
    /// Next KV position to feed.
    pub pos: u32,
    /// Prompt tokens reused from another request's KV cells.
    cached: u32,
    /// (slot, tokens): another request is prefilling this many tokens of the same prompt;
    /// this one feeds nothing until it can reuse them.
    pub awaiting: Option<(usize, usize)>,
    generated: u32,
    received_at: Instant,
    admitted_at: Option<Instant>,
    queue_ms: f64,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

impl Waiter for Sequence {
    fn is_gone(&self) -> bool {
        self.events.is_closed()
    }
    fn kv_cells(&self) -> u64 {
        self.prompt.len() as u64 + u64::from(self.max_tokens)
    }
}

impl Sequence {
    pub fn waiting(request: GenerationRequest, events: UnboundedSender<Event>) -> Self {
        Self {
            phase: Phase::Waiting,
            prompt: request.prompt_tokens,
            sampling: request.sampling,
            max_tokens: request.max_tokens,
            text: TextStream::new(request.stop),
            events,
            pos: 0,
            cached: 0,
            awaiting: None,
            generated: 0,
            received_at: request.received_at,
            admitted_at: None,
            queue_ms: 0.0,
            first_token_at: None,
            last_token_at: None,
        }
    }

    pub fn received_at(&self) -> Instant {
        self.received_at
    }

    /// Took a slot after waiting `waited`. False when the client already left.
    pub fn admit(&mut self, now: Instant, waited: Duration) -> bool {
        self.admitted_at = Some(now);
        self.queue_ms = ms(waited);
        self.phase = Phase::Prefill { fed: 0 };
        self.events
            .send(Event::Admitted {
                queue_ms: self.queue_ms,
            })
            .is_ok()
    }

    /// The first `cached` prompt tokens are already in the slot's KV cells: feeding starts
    /// after them.
    pub fn reuse(&mut self, cached: usize) {
        self.cached = cached as u32;
        self.pos = cached as u32;
        self.phase = Phase::Prefill { fed: cached };
    }

    pub fn end(&mut self, end: End) {
        self.phase = Phase::Finishing(end);
    }

    /// Records that `n` more prompt tokens (or the last sampled token) were fed.
    pub fn fed(&mut self, n: usize) {
        self.pos += n as u32;
        if let Phase::Prefill { fed } = &mut self.phase {
            *fed += n;
        }
    }

    /// Applies one sampled token: text out, then the stop, end and length checks.
    pub fn sampled(&mut self, token: i32, vocab: &dyn Vocab, metrics: &Metrics, now: Instant) {
        match self.last_token_at {
            None => {
                self.first_token_at = Some(now);
                metrics
                    .ttft_seconds
                    .observe(now.duration_since(self.received_at).as_secs_f64());
            }
            Some(prev) => metrics
                .inter_token_seconds
                .observe(now.duration_since(prev).as_secs_f64()),
        }
        self.last_token_at = Some(now);
        if vocab.is_end(token) {
            return self.end(End::Finished(FinishReason::Stop));
        }
        self.generated += 1;
        metrics.generated_tokens_total.inc();
        let piece = self.text.push(&vocab.piece(token));
        if !piece.text.is_empty() && self.events.send(Event::Text(piece.text)).is_err() {
            return self.end(End::ClientGone);
        }
        if piece.stopped {
            return self.end(End::Finished(FinishReason::Stop));
        }
        if self.generated >= self.max_tokens {
            return self.end(End::Finished(FinishReason::Length));
        }
        self.phase = Phase::Decoding { next: token };
    }

    /// Sends the last event of a finished sequence: the held-back text, usage and timings.
    pub fn send_finished(&mut self, reason: FinishReason, metrics: &Metrics) {
        let tail = self.text.finish();
        if !tail.text.is_empty() {
            send_or_log(&self.events, Event::Text(tail.text));
        }
        let prompt_tokens = self.prompt.len() as u32;
        let usage = Usage {
            prompt_tokens,
            completion_tokens: self.generated,
            total_tokens: prompt_tokens + self.generated,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: self.cached,
            },
        };
        metrics
            .request_seconds
            .observe(self.received_at.elapsed().as_secs_f64());
        send_or_log(
            &self.events,
            Event::Finished {
                reason,
                usage,
                timings: self.timings(),
            },
        );
    }

    pub fn send_failed(&self, error: EngineError) {
        send_or_log(&self.events, Event::Failed(error));
    }

    fn timings(&self) -> Timings {
        let admitted = self.admitted_at.unwrap_or(self.received_at);
        let first = self.first_token_at.unwrap_or(admitted);
        let last = self.last_token_at.unwrap_or(first);
        let prompt_ms = ms(first.duration_since(admitted));
        let predicted_ms = ms(last.duration_since(first));
        let prompt_n = self.prompt.len() as u32 - self.cached;
        Timings {
            queue_ms: self.queue_ms,
            cache_n: self.cached,
            prompt_n,
            prompt_ms,
            prompt_per_second: per_second(prompt_n as f64, prompt_ms),
            predicted_n: self.generated,
            predicted_ms,
            // The first token is sampled at the end of prompt eval, so the decode rate counts
            // the tokens after it over the time after it.
            predicted_per_second: per_second(self.generated.saturating_sub(1) as f64, predicted_ms),
            ttft_ms: ms(first.duration_since(self.received_at)),
        }
    }
}

pub fn send_or_log(events: &UnboundedSender<Event>, event: Event) {
    if events.send(event).is_err() {
        tracing::debug!("client left before the final event");
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn per_second(n: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        n * 1000.0 / ms
    } else {
        0.0
    }
}
