//! The scheduler's policies on the fake backend, driven one turn at a time on a manual clock:
//! no model, no thread, no sleep, the same result on a busy machine as on a quiet one. The
//! last tests run the real thread, kept in step by handshakes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use inferloop_thermal::ThermalState;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::oneshot;

use super::command::Command;
use super::scheduler::Scheduler;
use super::thread;
use crate::config::{PrefixCache, Spec};
use crate::engine::backend::fake::{Fake, FakeVocab};
use crate::engine::clock::{Clock, ManualClock};
use crate::engine::plan::{EnginePlan, STEP_TOKENS};
use crate::engine::prompt_cache::{PromptStore, TiersPlan};
use crate::engine::types::{
    EngineError, Event, FinishReason, GenerationRequest, Load, SamplingParams,
};
use crate::http::error::ApiError;
use crate::metrics::Metrics;
use crate::thermal::{GateFeed, ThermalGate};

/// Virtual time one fake step takes.
const STEP: Duration = Duration::from_millis(1);
/// Long enough that a request is still running when the test looks.
pub(super) const LONG: u32 = 4000;
/// Turns after which a test that waits for something has failed (no test needs near this).
const MAX_TURNS: usize = 20_000;

pub(super) fn plan(slots: usize, queue: usize) -> EnginePlan {
    EnginePlan {
        slots,
        queue,
        ctx: 4096,
        kv_cells: slots as u32 * 4096,
        shared_kv: false,
        kv_type: crate::config::KvTypes::F16,
        prefill_chunk: STEP_TOKENS,
        n_batch: STEP_TOKENS + slots as u32,
        n_ubatch: STEP_TOKENS,
        threads: 1,
        prefix_cache: PrefixCache::On,
        prefix_slots: 0,
        prompt_cache: TiersPlan::default(),
        // Speculation changes how many steps a request takes: its own tests turn it on.
        spec: Spec::Off,
        spec_gate: crate::config::SpecGate::Cost,
        queue_timeout: Duration::from_secs(10),
        step_time_limit: None,
        debug_stall_file: None,
    }
}

/// A scheduler with no thread around it: the test submits, turns and reads, in that order.
pub(super) struct Rig {
    pub(super) s: Scheduler<'static, Fake>,
    clock: ManualClock,
    pub(super) fake: Fake,
    feed: GateFeed,
    pub(super) metrics: Arc<Metrics>,
    load: Arc<Mutex<Load>>,
}

fn rig(plan: EnginePlan) -> Rig {
    rig_with(plan, |_| PromptStore::disabled())
}

/// A rig whose prompt cache `store` makes, given the rig's metrics.
pub(super) fn rig_with(plan: EnginePlan, store: impl FnOnce(&Arc<Metrics>) -> PromptStore) -> Rig {
    let clock = ManualClock::new();
    let fake = Fake::new(plan.sequences(), clock.clone(), STEP);
    let (feed, gate) = ThermalGate::test_feed(0.5, 90.0);
    let metrics = Arc::new(Metrics::default());
    let load = Arc::new(Mutex::new(Load::default()));
    let s = Scheduler::new(
        fake.clone(),
        &FakeVocab,
        plan,
        metrics.clone(),
        load.clone(),
        gate,
        Arc::new(clock.clone()),
    )
    .with_store(store(&metrics));
    Rig {
        s,
        clock,
        fake,
        feed,
        metrics,
        load,
    }
}

impl Rig {
    /// A request received now.
    pub(super) fn request(&self, prompt: usize, max_tokens: u32) -> GenerationRequest {
        GenerationRequest {
            prompt_tokens: vec![5; prompt],
            max_tokens,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            received_at: self.clock.now(),
            embed: None,
            speculative: true,
        }
    }

    /// Hands a request to the scheduler as its thread would; the reply comes at once.
    pub(super) fn submit(
        &mut self,
        request: GenerationRequest,
    ) -> Result<UnboundedReceiver<Event>, EngineError> {
        let mut rxs = self.submit_choices(vec![request])?;
        Ok(rxs.remove(0))
    }

    /// Hands a request's choices to the scheduler together, as `n` > 1 does.
    pub(super) fn submit_choices(
        &mut self,
        requests: Vec<GenerationRequest>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, EngineError> {
        let (choices, rxs): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|r| {
                let (events, rx) = mpsc::unbounded_channel();
                ((r, events), rx)
            })
            .unzip();
        let (accepted, mut reply) = oneshot::channel();
        assert!(self.s.handle(Command::Submit { choices, accepted }));
        reply.try_recv().expect("answered within `handle`")?;
        Ok(rxs)
    }

    pub(super) fn turn(&mut self) {
        self.s.turn();
    }

    fn load(&self) -> Load {
        *self.load.lock().expect("load lock")
    }

    /// Turns until `rx` holds an event.
    pub(super) fn next(&mut self, rx: &mut UnboundedReceiver<Event>) -> Event {
        for _ in 0..MAX_TURNS {
            if let Ok(event) = rx.try_recv() {
                return event;
            }
            self.turn();
        }
        panic!("no event after {MAX_TURNS} turns; load {:?}", self.load());
    }

    /// Reads events up to the last one; returns the text and the last event.
    pub(super) fn last(&mut self, rx: &mut UnboundedReceiver<Event>) -> (String, Event) {
        let mut text = String::new();
        loop {
            match self.next(rx) {
                Event::Text { text: t, .. } => text.push_str(&t),
                Event::Admitted { .. } => {}
                end => return (text, end),
            }
        }
    }

    /// Reads events up to the last one; returns each text event's text and its tokens.
    fn chunks(&mut self, rx: &mut UnboundedReceiver<Event>) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        loop {
            match self.next(rx) {
                Event::Text { text, logprobs } => out.push((
                    text,
                    logprobs
                        .iter()
                        .map(|t| String::from_utf8_lossy(&t.token).into_owned())
                        .collect(),
                )),
                Event::Admitted { .. } => {}
                Event::Finished { .. } => return out,
                other => panic!("expected text or the end, got {other:?}"),
            }
        }
    }

    /// Turns until the published load satisfies `f` (checked before each turn).
    fn until(&mut self, what: &str, f: impl Fn(&Load) -> bool) {
        for _ in 0..MAX_TURNS {
            if f(&self.load()) {
                return;
            }
            self.turn();
        }
        panic!("never reached {what}: {:?}", self.load());
    }
}

impl Event {
    fn failed(self) -> Option<EngineError> {
        match self {
            Event::Failed(e) => Some(e),
            _ => None,
        }
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn logprobs_travel_with_their_text_and_never_with_a_stop_sequence() {
    let mut r = rig(plan(1, 1));
    let mut req = r.request(3, 4);
    req.sampling.logprobs = Some(2);
    let mut rx = r.submit(req).expect("accepted");
    let got = r.chunks(&mut rx);
    let tokens: Vec<&str> = got
        .iter()
        .flat_map(|c| c.1.iter().map(String::as_str))
        .collect();
    assert_eq!(tokens, ["13 ", "14 ", "15 ", "16 "]);
    assert!(got.iter().all(|(text, lp)| lp.concat() == *text), "{got:?}");
    // "15 " is held back as a possible stop ("15 9"), then released with its token; the stop
    // "16" is cut, and so is its token's entry.
    let mut req = r.request(3, 10);
    req.sampling.logprobs = Some(0);
    req.stop = vec!["15 9".into(), "16".into()];
    let mut rx = r.submit(req).expect("accepted");
    let got = r.chunks(&mut rx);
    let text: String = got.iter().map(|c| c.0.as_str()).collect();
    let tokens: Vec<&str> = got
        .iter()
        .flat_map(|c| c.1.iter().map(String::as_str))
        .collect();
    assert_eq!(text, "13 14 15 ");
    assert_eq!(tokens, ["13 ", "14 ", "15 "]);
    // Not asked for: no entries at all.
    let req = r.request(3, 2);
    let mut rx = r.submit(req).expect("accepted");
    assert!(r.chunks(&mut rx).iter().all(|c| c.1.is_empty()));
}

#[test]
fn tokens_become_text_usage_and_a_length_finish() {
    let mut r = rig(plan(1, 1));
    let req = r.request(3, 4);
    let mut rx = r.submit(req).expect("accepted");
    let (text, end) = r.last(&mut rx);
    // Fake token ids follow the position: prompt positions 0..3, so 13, 14, 15, 16.
    assert_eq!(text, "13 14 15 16 ");
    match end {
        Event::Finished { reason, usage, .. } => {
            assert_eq!(reason, FinishReason::Length);
            assert_eq!(
                (
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.total_tokens
                ),
                (3, 4, 7)
            );
        }
        other => panic!("expected Finished, got {other:?}"),
    }
    r.fake.with(|c| c.end_after = Some(2));
    let req = r.request(3, 10);
    let mut rx = r.submit(req).expect("accepted");
    match r.last(&mut rx) {
        (text, Event::Finished { reason, .. }) => {
            assert_eq!((text.as_str(), reason), ("13 14 ", FinishReason::Stop));
        }
        other => panic!("expected an end-of-generation stop, got {other:?}"),
    }
}

#[test]
fn timings_count_virtual_time_from_receipt_to_the_last_token() {
    let mut r = rig(plan(1, 1));
    let req = r.request(3, 4);
    // Tokenizing and queueing took 5 ms before the scheduler saw it.
    r.clock.advance(Duration::from_millis(5));
    let mut rx = r.submit(req).expect("accepted");
    match r.last(&mut rx).1 {
        Event::Finished { timings, .. } => {
            // One step for the prompt and its first token, one per token after it.
            assert!(close(timings.ttft_ms, 6.0), "{timings:?}");
            assert!(close(timings.prompt_ms, 1.0), "{timings:?}");
            assert!(close(timings.predicted_ms, 3.0), "{timings:?}");
            assert!(close(timings.predicted_per_second, 1000.0), "{timings:?}");
        }
        other => panic!("expected Finished, got {other:?}"),
    }
}

#[test]
fn each_turn_publishes_a_heartbeat_on_the_schedulers_clock() {
    let mut r = rig(plan(1, 1));
    assert_eq!(r.load().beat, None);
    r.turn();
    assert_eq!(r.load().beat, Some(r.clock.now()));
    r.clock.advance(Duration::from_secs(3));
    assert_eq!(r.load().beat, Some(r.clock.now() - Duration::from_secs(3)));
    r.turn();
    assert_eq!(r.load().beat, Some(r.clock.now()));
}

#[test]
fn waiters_are_admitted_in_arrival_order() {
    let mut r = rig(plan(1, 8));
    let mut streams = Vec::new();
    for _ in 0..5 {
        let req = r.request(2, 3);
        streams.push(r.submit(req).expect("accepted"));
    }
    let mut order = Vec::new();
    let mut finished = 0;
    for _ in 0..MAX_TURNS {
        r.turn();
        for (id, rx) in streams.iter_mut().enumerate() {
            while let Ok(event) = rx.try_recv() {
                match event {
                    Event::Admitted { .. } => order.push(id),
                    Event::Finished { .. } => finished += 1,
                    Event::Text { .. } | Event::Embedding(_) => {}
                    Event::Failed(e) => panic!("request {id} failed: {e}"),
                }
            }
        }
        if finished == streams.len() {
            break;
        }
    }
    assert_eq!(finished, 5);
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
}

#[test]
fn a_full_queue_is_a_429_with_retry_after() {
    let mut r = rig(plan(1, 1));
    let _running = r.submit(r.request(2, LONG)).expect("slot");
    r.turn();
    let _queued = r.submit(r.request(2, LONG)).expect("queue");
    let err = r
        .submit(r.request(2, LONG))
        .expect_err("slot and queue are full");
    assert_eq!(
        err,
        EngineError::QueueFull {
            slots: 1,
            capacity: 1
        }
    );
    let api = ApiError::from(err);
    assert_eq!(api.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(api.retry_after_secs, Some(1));
}

#[test]
fn a_wait_past_the_queue_timeout_is_a_503() {
    let mut p = plan(1, 4);
    p.queue_timeout = Duration::from_millis(100);
    let mut r = rig(p);
    // Steps take no time here: only the test moves the clock.
    r.fake.with(|c| c.step_time = Duration::ZERO);
    let _running = r.submit(r.request(2, LONG)).expect("slot");
    r.turn();
    let mut waiter = r.submit(r.request(2, 4)).expect("queued");
    r.clock.advance(Duration::from_millis(99));
    r.turn();
    assert!(waiter.try_recv().is_err(), "99 ms is within the timeout");
    r.clock.advance(Duration::from_millis(1));
    r.turn();
    let err = match waiter.try_recv() {
        Ok(Event::Failed(e)) => e,
        other => panic!("expected a queue timeout, got {other:?}"),
    };
    assert_eq!(
        err,
        EngineError::QueueTimeout {
            waited_ms: 100,
            timeout_ms: 100
        }
    );
    let api = ApiError::from(err);
    assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(api.retry_after_secs, Some(1));
}

#[test]
fn a_client_that_leaves_frees_its_slot_within_one_step_every_time() {
    let mut r = rig(plan(1, 1));
    for trial in 0..100 {
        let mut rx = r.submit(r.request(2, LONG)).expect("slot");
        while !matches!(r.next(&mut rx), Event::Text { .. }) {}
        let left_at = r.fake.log().steps;
        drop(rx);
        r.turn();
        let freed = r.fake.log().freed.get(trial).copied();
        assert_eq!(
            freed,
            Some((0, left_at + 1)),
            "trial {trial}: left after step {left_at}"
        );
    }
    r.until("the last slot to be free", |l| l.active == 0);
    assert_eq!(r.metrics.cancelled_total.get(), 100);
}

#[test]
fn a_waiter_that_leaves_gives_its_place_to_the_next() {
    let mut r = rig(plan(1, 1));
    let mut running = r.submit(r.request(2, 20)).expect("slot");
    r.turn();
    let leaver = r.submit(r.request(2, 5)).expect("queued");
    drop(leaver);
    let mut next_one = r.submit(r.request(2, 5)).expect("the leaver's place");
    assert!(matches!(r.last(&mut running).1, Event::Finished { .. }));
    assert!(matches!(r.last(&mut next_one).1, Event::Finished { .. }));
    assert_eq!(r.metrics.cancelled_total.get(), 1);
}

#[test]
fn hot_caps_new_admissions_and_critical_refuses_new_requests() {
    let mut r = rig(plan(4, 8));
    r.feed.publish(ThermalState::Hot, 80.0);
    r.turn();
    assert_eq!(r.load().max_active, 2, "the hot cap");
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(r.submit(r.request(2, LONG)).expect("accepted"));
    }
    r.turn();
    let load = r.load();
    assert_eq!((load.active, load.queued), (2, 2), "{load:?}");
    r.feed.publish(ThermalState::Critical, 95.5);
    let err = r
        .submit(r.request(2, 4))
        .expect_err("critical refuses new work");
    assert_eq!(
        err,
        EngineError::Overheated {
            celsius: 95.5,
            critical: 90.0
        }
    );
    let api = ApiError::from(err);
    assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(api.retry_after_secs.is_some());
    r.turn();
    assert_eq!(r.load().active, 2, "running work is never preempted");
    r.feed.publish(ThermalState::Normal, 50.0);
    r.turn();
    let load = r.load();
    assert_eq!((load.active, load.max_active), (4, 4), "all four once cool");
    assert!(r.submit(r.request(2, 4)).is_ok());
}

#[test]
fn a_waiter_short_of_kv_cells_waits_for_them_and_blocks_those_behind() {
    let mut p = plan(4, 8);
    p.kv_cells = 100;
    p.shared_kv = true;
    let mut r = rig(p);
    let mut big = r.submit(r.request(10, 60)).expect("70 cells");
    let mut second = r.submit(r.request(10, 40)).expect("queued");
    let mut small = r.submit(r.request(1, 1)).expect("queued");
    r.turn();
    let load = r.load();
    assert_eq!(
        (load.active, load.kv_reserved, load.queued),
        (1, 70, 2),
        "the first reserved its cells: {load:?}"
    );
    assert!(matches!(r.last(&mut big).1, Event::Finished { .. }));
    assert!(matches!(r.last(&mut second).1, Event::Finished { .. }));
    assert!(matches!(r.last(&mut small).1, Event::Finished { .. }));
    let opened: Vec<u64> = r.fake.log().opened.iter().map(|o| o.1).collect();
    assert!(
        opened[1] >= opened[0] + 60,
        "the second started only after the first's 60 steps: {opened:?}"
    );
}

#[test]
fn shutdown_fails_running_and_queued_work_and_frees_every_slot() {
    let mut r = rig(plan(2, 4));
    let mut streams: Vec<_> = (0..3)
        .map(|_| r.submit(r.request(2, LONG)).expect("accepted"))
        .collect();
    r.turn();
    let load = r.load();
    assert_eq!((load.active, load.queued), (2, 1), "{load:?}");
    r.s.cancel_all();
    for rx in &mut streams {
        let mut last = None;
        while let Ok(event) = rx.try_recv() {
            last = Some(event);
        }
        assert_eq!(
            last.and_then(Event::failed),
            Some(EngineError::ShuttingDown),
            "every request hears why"
        );
    }
    let mut freed: Vec<usize> = r.fake.log().freed.iter().map(|f| f.0).collect();
    freed.sort_unstable();
    assert_eq!(freed, vec![0, 1]);
    let load = r.load();
    assert_eq!((load.active, load.queued), (0, 0), "{load:?}");
}

#[test]
fn a_backend_error_fails_only_its_own_request() {
    let mut r = rig(plan(2, 4));
    let mut doomed = r.submit(r.request(2, LONG)).expect("slot 0");
    let mut fine = r.submit(r.request(2, 30)).expect("slot 1");
    r.turn();
    assert_eq!(r.load().active, 2, "both running");
    r.fake.with(|c| c.fail_seqs.insert(0));
    match r.last(&mut doomed).1.failed() {
        Some(EngineError::Decode(m)) => assert!(m.contains("injected"), "{m}"),
        other => panic!("expected a decode failure, got {other:?}"),
    }
    match r.last(&mut fine) {
        (text, Event::Finished { usage, .. }) => {
            assert_eq!(usage.completion_tokens, 30);
            assert_eq!(text.split_whitespace().count(), 30);
        }
        other => panic!("the other request must finish, got {other:?}"),
    }
    // A step that fails as a whole fails what was in it, and nothing after it.
    let mut in_step = r.submit(r.request(2, LONG)).expect("slot");
    while !matches!(r.next(&mut in_step), Event::Text { .. }) {}
    r.fake.with(|c| c.fail_step = true);
    assert!(matches!(
        r.last(&mut in_step).1.failed(),
        Some(EngineError::Decode(_))
    ));
    let mut after = r.submit(r.request(2, 3)).expect("slot");
    assert!(matches!(r.last(&mut after).1, Event::Finished { .. }));
}

#[test]
fn a_failed_open_fails_the_request_and_frees_the_slot() {
    let mut r = rig(plan(1, 1));
    r.fake.with(|c| c.fail_open = true);
    let mut rx = r.submit(r.request(2, 4)).expect("accepted");
    assert!(matches!(
        r.last(&mut rx).1.failed(),
        Some(EngineError::Decode(_))
    ));
    r.fake.with(|c| c.fail_open = false);
    let mut rx = r.submit(r.request(2, 4)).expect("the slot is free again");
    assert!(matches!(r.last(&mut rx).1, Event::Finished { .. }));
}

/// Under a step time limit (systemd's watchdog) the first prompt step is a probe that
/// measures the prefill rate; later steps feed what fits in the limit, so no step outlasts
/// it on a slow box, and a fast box still gets whole chunks.
#[test]
fn a_step_time_limit_cuts_prompt_chunks_to_the_measured_prefill_rate() {
    // A 1500-token prompt under a 100 ms step limit, each row taking `row_time`.
    let feed = |row_time: Duration| {
        let mut r = rig(EnginePlan {
            step_time_limit: Some(Duration::from_millis(100)),
            ..plan(1, 1)
        });
        r.fake.with(|c| c.row_time = row_time);
        let mut rx = r.submit(r.request(1500, 2)).expect("slot");
        assert!(matches!(r.last(&mut rx).1, Event::Finished { .. }));
        r.fake.log()
    };
    let slow = feed(Duration::from_millis(1));
    // 1 ms a row plus 1 ms a step: ~98 rows fit in 100 ms.
    assert!(
        (90..=100).contains(&slow.most_prefill),
        "the widest prompt step fits the limit: {slow:?}"
    );
    assert!(slow.steps >= 1500 / 100, "{slow:?}");
    assert_eq!(
        feed(Duration::from_micros(10)).most_prefill,
        STEP_TOKENS as usize,
        "after the probe a fast box feeds whole chunks"
    );
}

#[test]
fn long_prompts_are_fed_in_chunks_while_streams_keep_decoding() {
    let mut r = rig(plan(2, 2));
    let mut stream = r.submit(r.request(2, 40)).expect("slot");
    while !matches!(r.next(&mut stream), Event::Text { .. }) {}
    let mut long = r.submit(r.request(1500, 2)).expect("slot");
    assert!(matches!(r.last(&mut long).1, Event::Finished { .. }));
    let log = r.fake.log();
    assert_eq!(log.most_prefill, STEP_TOKENS as usize, "one chunk per step");
    assert!(
        log.mixed >= 3,
        "the stream decoded in each of the three chunks' steps: {log:?}"
    );
    assert!(matches!(r.last(&mut stream).1, Event::Finished { .. }));
}

/// A request received now whose prompt is `len` copies of `token` (a prompt no other
/// request's prefix shares, given its own token).
fn prompt_of(r: &Rig, token: i32, len: usize, max_tokens: u32) -> GenerationRequest {
    let mut req = r.request(len, max_tokens);
    req.prompt_tokens = vec![token; len];
    req
}

#[test]
fn a_short_prompt_overtakes_a_long_one_being_fed() {
    let mut r = rig(plan(2, 2));
    let mut long = r.submit(prompt_of(&r, 6, 3000, 1)).expect("slot");
    r.turn();
    assert_eq!(r.fake.log().steps, 1, "the long prompt's first chunk");
    let mut short = r.submit(prompt_of(&r, 7, 100, 1)).expect("slot");
    assert!(matches!(r.last(&mut short).1, Event::Finished { .. }));
    assert_eq!(
        r.fake.log().steps,
        2,
        "the short prompt was fed in the next step, not after the long one's five chunks"
    );
    assert!(matches!(r.last(&mut long).1, Event::Finished { .. }));
    let log = r.fake.log();
    assert_eq!(
        log.steps, 7,
        "3100 prompt tokens in 7 steps of 512: no budget was lost"
    );
    assert_eq!(log.most_prefill, STEP_TOKENS as usize);
}

#[test]
fn a_long_prompt_advances_while_shorter_ones_keep_overtaking_it() {
    // Three slots keep taking fresh 600-token prompts, more than a step's budget between
    // them, all shorter than the long prompt: it still gets its quarter of every step.
    let mut r = rig(plan(4, 4));
    let mut long = r.submit(prompt_of(&r, 6, 3000, 1)).expect("slot");
    let mut next_token = 10;
    let mut shorts: Vec<_> = (0..3)
        .map(|_| {
            next_token += 1;
            r.submit(prompt_of(&r, next_token, 600, 1)).expect("slot")
        })
        .collect();
    let mut overtook = 0;
    let mut long_done = false;
    for _ in 0..40 {
        r.turn();
        while let Ok(event) = long.try_recv() {
            long_done |= !matches!(event, Event::Admitted { .. });
        }
        if long_done {
            break;
        }
        for rx in &mut shorts {
            if let Ok(Event::Finished { .. }) = rx.try_recv() {
                overtook += 1;
                next_token += 1;
                *rx = r.submit(prompt_of(&r, next_token, 600, 1)).expect("slot");
            }
        }
    }
    assert!(long_done, "the long prompt never got its first token");
    let steps = r.fake.log().steps;
    assert!(
        steps <= 24,
        "3000 tokens at a quarter of 512 per step or more: done by step 24, took {steps}"
    );
    assert!(
        overtook >= 6,
        "shorter prompts overtook it meanwhile: {overtook}"
    );
}

/// `plan` with the given prompt-reuse mode.
fn with_mode(mut p: EnginePlan, mode: PrefixCache) -> EnginePlan {
    p.prefix_cache = mode;
    p
}

#[test]
fn a_finished_prompt_is_reused_in_place_and_a_running_one_is_copied() {
    // On: all but the prompt's last token; exact: all but its last run of 16.
    for (mode, reused) in [(PrefixCache::On, 299), (PrefixCache::Exact, 284)] {
        let mut r = rig(with_mode(plan(2, 2), mode));
        let mut first = r.submit(r.request(300, 2)).expect("slot");
        assert!(matches!(r.last(&mut first).1, Event::Finished { usage, .. }
            if usage.prompt_tokens_details.cached_tokens == 0));
        // Same prompt again: the idle slot that holds it takes it.
        let mut again = r.submit(r.request(300, LONG)).expect("slot");
        while !matches!(r.next(&mut again), Event::Text { .. }) {}
        // While that one runs, a third copies the prefix from its slot into the other.
        let mut third = r.submit(r.request(300, 2)).expect("slot");
        match r.last(&mut third).1 {
            Event::Finished { usage, timings, .. } => {
                assert_eq!(
                    usage.prompt_tokens_details.cached_tokens, reused,
                    "{mode:?}"
                );
                assert_eq!((timings.cache_n, timings.prompt_n), (reused, 300 - reused));
            }
            other => panic!("expected Finished, got {other:?}"),
        }
        let log = r.fake.log();
        assert!(log.truncated.contains(&(0, reused)), "{log:?}");
        assert_eq!(log.shared, vec![(0, 1, reused)], "{mode:?}");
    }
}

#[test]
fn a_resent_chat_reuses_the_decoded_answer_only_in_on_mode() {
    for mode in [PrefixCache::On, PrefixCache::Exact] {
        let mut r = rig(with_mode(plan(1, 1), mode));
        let mut first = r.submit(r.request(300, 4)).expect("slot");
        assert!(matches!(r.last(&mut first).1, Event::Finished { .. }));
        // The fake samples `10 + position % 50`: the answer was 10, 11, 12, 13, and all but
        // the last went into the KV cells. The chat comes back with it and a new turn.
        let mut req = r.request(300, 2);
        req.prompt_tokens.extend([10, 11, 12, 13]);
        req.prompt_tokens.extend([7; 20]);
        let mut rx = r.submit(req).expect("slot");
        let cached = match r.last(&mut rx).1 {
            Event::Finished { usage, .. } => usage.prompt_tokens_details.cached_tokens,
            other => panic!("expected Finished, got {other:?}"),
        };
        match mode {
            PrefixCache::On => assert_eq!(cached, 303, "the prompt and three decoded rows"),
            _ => assert!(
                cached < 300,
                "exact: decoded rows are recomputed ({cached})"
            ),
        }
    }
}

#[test]
fn prompt_runs_end_at_chunk_boundaries_only_in_exact_mode() {
    // A 300-token prefix is reused, then 700 new tokens are fed: exact mode ends the first
    // run at 512 and feeds the last 16 on their own; on mode feeds a full chunk, then the
    // rest.
    for (mode, most, steps) in [(PrefixCache::On, 512, 2), (PrefixCache::Exact, 472, 3)] {
        let mut r = rig(with_mode(plan(1, 1), mode));
        let mut first = r.submit(r.request(300, 1)).expect("slot");
        assert!(matches!(r.last(&mut first).1, Event::Finished { .. }));
        let before = r.fake.log().steps;
        let mut req = r.request(300, 1);
        req.prompt_tokens.extend([7; 700]);
        let mut rx = r.submit(req).expect("slot");
        assert!(matches!(r.last(&mut rx).1, Event::Finished { .. }));
        let log = r.fake.log();
        assert_eq!(log.most_prefill, most, "{mode:?}");
        assert_eq!(log.steps - before, steps, "{mode:?}: prefill steps");
    }
}

#[test]
fn requests_arriving_together_with_one_prompt_compute_it_once() {
    // Regression: on a busy machine the fourth request could reach the thread after the
    // first chunk was in, and this test failed. Here all four arrive before the first turn.
    for (mode, least) in [(PrefixCache::On, 599), (PrefixCache::Exact, 512)] {
        let mut r = rig(with_mode(plan(4, 4), mode));
        let mut streams: Vec<_> = (0..4)
            .map(|_| r.submit(r.request(600, 2)).expect("slot"))
            .collect();
        let mut cached = Vec::new();
        for rx in &mut streams {
            match r.last(rx).1 {
                Event::Finished { usage, .. } => {
                    cached.push(usage.prompt_tokens_details.cached_tokens)
                }
                other => panic!("expected Finished, got {other:?}"),
            }
        }
        assert_eq!(cached[0], 0, "the first computes the prompt");
        assert!(
            cached[1..].iter().all(|&c| c >= least),
            "{mode:?}: three reuse it: {cached:?}"
        );
        assert_eq!(r.fake.log().shared.len(), 3);
    }
}

#[test]
fn prefix_slots_keep_more_prompts_reusable_than_there_are_slots() {
    for (mode, reused) in [(PrefixCache::On, 299), (PrefixCache::Exact, 284)] {
        let mut p = with_mode(plan(1, 1), mode);
        p.prefix_slots = 2;
        let mut r = rig(p);
        let mut cached = Vec::new();
        // Three prompts through one slot, then the first again.
        for token in [1, 2, 3, 1] {
            let mut req = r.request(300, 2);
            req.prompt_tokens = vec![token; 300];
            let mut rx = r.submit(req).expect("slot");
            match r.last(&mut rx).1 {
                Event::Finished { usage, .. } => {
                    cached.push(usage.prompt_tokens_details.cached_tokens)
                }
                other => panic!("expected Finished, got {other:?}"),
            }
        }
        assert_eq!(cached, vec![0, 0, 0, reused], "the first prompt was kept");
        let log = r.fake.log();
        // Each prompt took an empty sequence; the first ran again where it was kept.
        assert!(log.shared.is_empty(), "{log:?}");
        assert!(log.truncated.contains(&(0, reused)), "{log:?}");
        // The slot is released right after the last event went out.
        assert_eq!(r.load().active, 0);
    }
}

#[test]
fn with_the_prefix_cache_off_nothing_is_reused_and_cells_are_freed() {
    let mut p = plan(1, 1);
    p.prefix_cache = PrefixCache::Off;
    let mut r = rig(p);
    for _ in 0..2 {
        let mut rx = r.submit(r.request(300, 2)).expect("slot");
        assert!(matches!(r.last(&mut rx).1, Event::Finished { usage, .. }
            if usage.prompt_tokens_details.cached_tokens == 0));
    }
    // The slot is released right after the last event went out.
    assert_eq!(r.load().active, 0);
    let log = r.fake.log();
    assert!(log.shared.is_empty());
    assert_eq!(
        log.truncated,
        vec![(0, 0), (0, 0)],
        "freed after each request"
    );
}

// The actor on its thread: only what the channel and the thread add, in step by handshakes.

/// Generous bound for a handshake that happens at once; never what a test measures.
const HANDSHAKE: Duration = Duration::from_secs(30);

fn spawn_fake(plan: EnginePlan) -> (thread::Handle, Fake) {
    let clock = ManualClock::new();
    let fake = Fake::new(plan.sequences(), clock.clone(), STEP);
    let backend = fake.clone();
    let (_feed, gate) = ThermalGate::test_feed(0.5, 90.0);
    let handle = thread::spawn(
        plan,
        Arc::new(Metrics::default()),
        gate,
        Arc::new(clock),
        Arc::default(),
        move |runner| runner.run(backend, &FakeVocab, None),
    )
    .expect("fake backend starts");
    (handle, fake)
}

fn request(prompt: usize, max_tokens: u32, clock: &thread::Handle) -> GenerationRequest {
    GenerationRequest {
        prompt_tokens: vec![5; prompt],
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams::default(),
        received_at: clock.now(),
        embed: None,
        speculative: true,
    }
}

async fn last_on_thread(rx: &mut UnboundedReceiver<Event>) -> Event {
    loop {
        let event = tokio::time::timeout(HANDSHAKE, rx.recv())
            .await
            .expect("an event")
            .expect("the scheduler keeps the channel until the last event");
        if matches!(event, Event::Finished { .. } | Event::Failed(_)) {
            return event;
        }
    }
}

#[tokio::test]
async fn the_thread_serves_through_its_handle_and_refuses_work_once_stopped() {
    let (engine, _fake) = spawn_fake(plan(1, 1));
    let mut rx = engine
        .submit(request(3, 4, &engine))
        .await
        .expect("accepted");
    assert!(matches!(
        last_on_thread(&mut rx).await,
        Event::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    engine.shutdown();
    assert!(engine.wait_stopped(HANDSHAKE), "the thread exits");
    let late = engine
        .submit(request(2, 4, &engine))
        .await
        .expect_err("stopped");
    assert_eq!(late, EngineError::ShuttingDown);
}

#[tokio::test]
async fn shutdown_reaches_a_request_running_on_the_thread() {
    let (engine, fake) = spawn_fake(plan(1, 1));
    let (entered, release) = fake.hold_next_step();
    let mut rx = engine
        .submit(request(2, LONG, &engine))
        .await
        .expect("accepted");
    // The thread is inside its first step: the shutdown is read right after it.
    entered.recv_timeout(HANDSHAKE).expect("the step began");
    engine.shutdown();
    release.send(()).expect("the step waits for its release");
    assert_eq!(
        last_on_thread(&mut rx).await.failed(),
        Some(EngineError::ShuttingDown)
    );
    assert!(engine.wait_stopped(HANDSHAKE), "the thread exits");
    assert_eq!(fake.log().freed.len(), 1, "its slot was freed");
}

#[tokio::test]
async fn the_plans_stall_file_holds_the_loop_until_it_is_removed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let stall = dir.path().join("stall");
    std::fs::write(&stall, b"").expect("stall file");
    let mut p = plan(1, 1);
    p.debug_stall_file = Some(stall.clone());
    let (engine, _fake) = spawn_fake(p);
    let submitted = tokio::spawn({
        let engine = engine.clone();
        let req = request(2, 2, &engine);
        async move { engine.submit(req).await }
    });
    // Stalled before its first turn: no heartbeat, whatever the time it is given.
    assert_eq!(engine.load().beat, None);
    std::fs::remove_file(&stall).expect("remove the stall file");
    let mut rx = tokio::time::timeout(HANDSHAKE, submitted)
        .await
        .expect("the loop resumed")
        .expect("task")
        .expect("accepted");
    assert!(matches!(
        last_on_thread(&mut rx).await,
        Event::Finished { .. }
    ));
    assert!(engine.load().beat.is_some());
    engine.shutdown();
    assert!(engine.wait_stopped(HANDSHAKE));
}

#[test]
fn an_embedding_pass_spans_prompt_chunks_answers_its_vector_and_leaves_no_prefix() {
    let mut r = rig(plan(1, 1));
    let n = STEP_TOKENS as usize * 2 + 3;
    let mut req = r.request(n, 0);
    req.embed = Some(crate::engine::embed::Pooling::Mean);
    let mut rx = r.submit(req).expect("accepted");
    assert!(matches!(r.next(&mut rx), Event::Admitted { .. }));
    // The fake pools rows [token, pos]: every token is 5, positions 0..n.
    let Event::Embedding(v) = r.next(&mut rx) else {
        panic!("expected the embedding");
    };
    let expected = crate::engine::embed::normalize(&[5.0, (n - 1) as f64 / 2.0]);
    assert_eq!(v, expected);
    let Event::Finished { usage, .. } = r.next(&mut rx) else {
        panic!("expected the end");
    };
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens),
        (n as u32, 0)
    );
    assert_eq!(r.metrics.prompt_tokens_total.get(), n as u64);
    r.turn();
    assert_eq!(r.load().active, 0);
    // Its cells are dropped, not kept as a prefix: a chat with the same prompt reuses none.
    assert!(r.fake.log().truncated.contains(&(0, 0)));
    let mut chat = r.submit(r.request(n, 2)).expect("accepted");
    let (_, end) = r.last(&mut chat);
    let Event::Finished { usage, .. } = end else {
        panic!("expected the chat to finish: {end:?}");
    };
    assert_eq!(usage.prompt_tokens_details.cached_tokens, 0);
}

#[test]
fn embedding_passes_wait_in_the_queue_like_generation() {
    let mut r = rig(plan(1, 1));
    let _running = r.submit(r.request(4, LONG)).expect("runs");
    let mut req = r.request(4, 0);
    req.embed = Some(crate::engine::embed::Pooling::Last);
    let _queued = r.submit(req).expect("queued");
    let mut full = r.request(4, 0);
    full.embed = Some(crate::engine::embed::Pooling::Mean);
    let refused = r.submit(full).expect_err("queue full");
    assert_eq!(refused.kind(), "queue_full");
}
