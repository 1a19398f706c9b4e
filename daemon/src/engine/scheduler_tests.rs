//! The scheduler's policies on the fake backend: no model, milliseconds per test.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use inferloop_thermal::ThermalState;
use tokio::sync::mpsc::UnboundedReceiver;

use super::fake::{Fake, FakeVocab};
use super::plan::{EnginePlan, STEP_TOKENS};
use super::thread::{spawn, Handle};
use super::{EngineError, Event, FinishReason, GenerationRequest, SamplingParams};
use crate::config::PrefixCache;
use crate::http::error::ApiError;
use crate::metrics::Metrics;
use crate::thermal::{GateFeed, ThermalGate};

const STEP: Duration = Duration::from_millis(1);
/// Long enough that a request is still running when the test looks.
const LONG: u32 = 4000;
const WAIT: Duration = Duration::from_secs(5);

fn plan(slots: usize, queue: usize) -> EnginePlan {
    EnginePlan {
        slots,
        queue,
        ctx: 4096,
        kv_cells: slots as u32 * 4096,
        shared_kv: false,
        prefill_chunk: STEP_TOKENS,
        n_batch: STEP_TOKENS + slots as u32,
        n_ubatch: STEP_TOKENS,
        threads: 1,
        prefix_cache: PrefixCache::On,
        prefix_slots: 0,
        queue_timeout: Duration::from_secs(10),
    }
}

struct Rig {
    engine: Handle,
    fake: Fake,
    feed: GateFeed,
    metrics: Arc<Metrics>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.engine.shutdown();
        self.engine.wait_stopped(WAIT);
    }
}

fn rig(plan: EnginePlan) -> Rig {
    let fake = Fake::new(plan.sequences(), STEP);
    let backend = fake.clone();
    let (feed, gate) = ThermalGate::test_feed(0.5, 90.0);
    let metrics = Arc::new(Metrics::default());
    let engine = spawn(plan, metrics.clone(), gate, move |runner| {
        runner.run(backend, &FakeVocab)
    })
    .expect("fake backend starts");
    Rig {
        engine,
        fake,
        feed,
        metrics,
    }
}

fn request(prompt: usize, max_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt_tokens: vec![5; prompt],
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams::default(),
        received_at: Instant::now(),
    }
}

async fn next(rx: &mut UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("an event in time")
        .expect("the scheduler keeps the channel until the last event")
}

/// Reads events up to the last one; returns the text and the last event.
async fn last(rx: &mut UnboundedReceiver<Event>) -> (String, Event) {
    let mut text = String::new();
    loop {
        match next(rx).await {
            Event::Text { text: t, .. } => text.push_str(&t),
            Event::Admitted { .. } => {}
            end => return (text, end),
        }
    }
}

/// Waits until the scheduler's published load satisfies `f`.
async fn until(engine: &Handle, what: &str, f: impl Fn(&super::Load) -> bool) {
    let t0 = Instant::now();
    while !f(&engine.load()) {
        assert!(
            t0.elapsed() < WAIT,
            "timed out waiting for {what}: {:?}",
            engine.load()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Reads events up to the last one; returns each text event's text and its tokens.
async fn chunks(rx: &mut UnboundedReceiver<Event>) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    loop {
        match next(rx).await {
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

#[tokio::test]
async fn logprobs_travel_with_their_text_and_never_with_a_stop_sequence() {
    let r = rig(plan(1, 1));
    let mut req = request(3, 4);
    req.sampling.logprobs = Some(2);
    let mut rx = r.engine.submit(req).await.expect("accepted");
    let got = chunks(&mut rx).await;
    let tokens: Vec<&str> = got
        .iter()
        .flat_map(|c| c.1.iter().map(String::as_str))
        .collect();
    assert_eq!(tokens, ["13 ", "14 ", "15 ", "16 "]);
    assert!(got.iter().all(|(text, lp)| lp.concat() == *text), "{got:?}");
    // "15 " is held back as a possible stop ("15 9"), then released with its token; the stop
    // "16" is cut, and so is its token's entry.
    let mut req = request(3, 10);
    req.sampling.logprobs = Some(0);
    req.stop = vec!["15 9".into(), "16".into()];
    let mut rx = r.engine.submit(req).await.expect("accepted");
    let got = chunks(&mut rx).await;
    let text: String = got.iter().map(|c| c.0.as_str()).collect();
    let tokens: Vec<&str> = got
        .iter()
        .flat_map(|c| c.1.iter().map(String::as_str))
        .collect();
    assert_eq!(text, "13 14 15 ");
    assert_eq!(tokens, ["13 ", "14 ", "15 "]);
    // Not asked for: no entries at all.
    let mut rx = r.engine.submit(request(3, 2)).await.expect("accepted");
    assert!(chunks(&mut rx).await.iter().all(|c| c.1.is_empty()));
}

#[tokio::test]
async fn tokens_become_text_usage_and_a_length_finish() {
    let r = rig(plan(1, 1));
    let mut rx = r.engine.submit(request(3, 4)).await.expect("accepted");
    let (text, end) = last(&mut rx).await;
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
    let mut rx = r.engine.submit(request(3, 10)).await.expect("accepted");
    match last(&mut rx).await {
        (text, Event::Finished { reason, .. }) => {
            assert_eq!((text.as_str(), reason), ("13 14 ", FinishReason::Stop));
        }
        other => panic!("expected an end-of-generation stop, got {other:?}"),
    }
}

#[tokio::test]
async fn waiters_are_admitted_in_arrival_order() {
    let r = rig(plan(1, 8));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..5 {
        let mut rx = r.engine.submit(request(2, 3)).await.expect("accepted");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            if let Event::Admitted { .. } = next(&mut rx).await {
                order.lock().expect("lock").push(id);
            }
            last(&mut rx).await
        }));
    }
    for t in tasks {
        assert!(matches!(t.await.expect("task").1, Event::Finished { .. }));
    }
    assert_eq!(*order.lock().expect("lock"), vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_full_queue_is_a_429_with_retry_after() {
    let r = rig(plan(1, 1));
    let _running = r.engine.submit(request(2, LONG)).await.expect("slot");
    let _queued = r.engine.submit(request(2, LONG)).await.expect("queue");
    let err = r
        .engine
        .submit(request(2, LONG))
        .await
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

#[tokio::test]
async fn a_wait_past_the_queue_timeout_is_a_503() {
    let mut p = plan(1, 4);
    p.queue_timeout = Duration::from_millis(100);
    let r = rig(p);
    let _running = r.engine.submit(request(2, LONG)).await.expect("slot");
    let t0 = Instant::now();
    let mut waiter = r.engine.submit(request(2, 4)).await.expect("queued");
    let err = match next(&mut waiter).await {
        Event::Failed(e) => e,
        other => panic!("expected a queue timeout, got {other:?}"),
    };
    assert!(t0.elapsed() >= Duration::from_millis(100));
    assert!(
        matches!(err, EngineError::QueueTimeout { timeout_ms: 100, waited_ms } if waited_ms >= 100),
        "{err:?}"
    );
    let api = ApiError::from(err);
    assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(api.retry_after_secs, Some(1));
}

#[tokio::test]
async fn a_client_that_leaves_frees_its_slot_within_one_step_every_time() {
    let r = rig(plan(1, 1));
    for trial in 0..100 {
        let mut rx = r.engine.submit(request(2, LONG)).await.expect("slot");
        while !matches!(next(&mut rx).await, Event::Text { .. }) {}
        let left_at = r.fake.log().steps;
        drop(rx);
        let t0 = Instant::now();
        let freed_at = loop {
            if let Some(&(_, step)) = r.fake.log().freed.get(trial) {
                break step;
            }
            assert!(t0.elapsed() < WAIT, "trial {trial}: slot never freed");
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        assert!(
            freed_at <= left_at + 1,
            "trial {trial}: left after step {left_at}, freed after step {freed_at}"
        );
    }
    until(&r.engine, "the last slot to be free", |l| l.active == 0).await;
    assert_eq!(r.metrics.cancelled_total.get(), 100);
}

#[tokio::test]
async fn a_waiter_that_leaves_gives_its_place_to_the_next() {
    let r = rig(plan(1, 1));
    let mut running = r.engine.submit(request(2, 20)).await.expect("slot");
    let leaver = r.engine.submit(request(2, 5)).await.expect("queued");
    drop(leaver);
    let mut next_one = r
        .engine
        .submit(request(2, 5))
        .await
        .expect("the leaver's place");
    assert!(matches!(last(&mut running).await.1, Event::Finished { .. }));
    assert!(matches!(
        last(&mut next_one).await.1,
        Event::Finished { .. }
    ));
    assert_eq!(r.metrics.cancelled_total.get(), 1);
}

#[tokio::test]
async fn hot_caps_new_admissions_and_critical_refuses_new_requests() {
    let r = rig(plan(4, 8));
    r.feed.publish(ThermalState::Hot, 80.0);
    until(&r.engine, "the hot cap", |l| l.max_active == 2).await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(r.engine.submit(request(2, LONG)).await.expect("accepted"));
    }
    until(&r.engine, "two running, two queued", |l| {
        l.active == 2 && l.queued == 2
    })
    .await;
    r.feed.publish(ThermalState::Critical, 95.5);
    let err = r
        .engine
        .submit(request(2, 4))
        .await
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
    assert_eq!(r.engine.load().active, 2, "running work is never preempted");
    r.feed.publish(ThermalState::Normal, 50.0);
    until(&r.engine, "all four running once cool", |l| {
        l.active == 4 && l.max_active == 4
    })
    .await;
    assert!(r.engine.submit(request(2, 4)).await.is_ok());
}

#[tokio::test]
async fn a_waiter_short_of_kv_cells_waits_for_them_and_blocks_those_behind() {
    let mut p = plan(4, 8);
    p.kv_cells = 100;
    p.shared_kv = true;
    let r = rig(p);
    let mut big = r.engine.submit(request(10, 60)).await.expect("70 cells");
    let mut second = r.engine.submit(request(10, 40)).await.expect("queued");
    let mut small = r.engine.submit(request(1, 1)).await.expect("queued");
    until(&r.engine, "the first to reserve its cells", |l| {
        l.active == 1 && l.kv_reserved == 70 && l.queued == 2
    })
    .await;
    assert!(matches!(last(&mut big).await.1, Event::Finished { .. }));
    assert!(matches!(last(&mut second).await.1, Event::Finished { .. }));
    assert!(matches!(last(&mut small).await.1, Event::Finished { .. }));
    let opened: Vec<u64> = r.fake.log().opened.iter().map(|o| o.1).collect();
    assert!(
        opened[1] >= opened[0] + 60,
        "the second started only after the first's 60 steps: {opened:?}"
    );
}

#[tokio::test]
async fn shutdown_fails_running_and_queued_work_and_frees_every_slot() {
    let r = rig(plan(2, 4));
    let mut running: Vec<_> = Vec::new();
    for _ in 0..3 {
        running.push(r.engine.submit(request(2, LONG)).await.expect("accepted"));
    }
    until(&r.engine, "two running", |l| l.active == 2 && l.queued == 1).await;
    r.engine.shutdown();
    for rx in &mut running {
        assert_eq!(
            last(rx).await.1.failed(),
            Some(EngineError::ShuttingDown),
            "every request hears why"
        );
    }
    assert!(r.engine.wait_stopped(WAIT), "the thread exits");
    let mut freed: Vec<usize> = r.fake.log().freed.iter().map(|f| f.0).collect();
    freed.sort_unstable();
    assert_eq!(freed, vec![0, 1]);
    let late = r.engine.submit(request(2, 4)).await.expect_err("stopped");
    assert_eq!(late, EngineError::ShuttingDown);
}

#[tokio::test]
async fn a_backend_error_fails_only_its_own_request() {
    let r = rig(plan(2, 4));
    let mut doomed = r.engine.submit(request(2, LONG)).await.expect("slot 0");
    let mut fine = r.engine.submit(request(2, 30)).await.expect("slot 1");
    until(&r.engine, "both running", |l| l.active == 2).await;
    r.fake.with(|c| c.fail_seqs.insert(0));
    match last(&mut doomed).await.1.failed() {
        Some(EngineError::Decode(m)) => assert!(m.contains("injected"), "{m}"),
        other => panic!("expected a decode failure, got {other:?}"),
    }
    match last(&mut fine).await {
        (text, Event::Finished { usage, .. }) => {
            assert_eq!(usage.completion_tokens, 30);
            assert_eq!(text.split_whitespace().count(), 30);
        }
        other => panic!("the other request must finish, got {other:?}"),
    }
    // A step that fails as a whole fails what was in it, and nothing after it.
    let mut in_step = r.engine.submit(request(2, LONG)).await.expect("slot");
    while !matches!(next(&mut in_step).await, Event::Text { .. }) {}
    r.fake.with(|c| c.fail_step = true);
    assert!(matches!(
        last(&mut in_step).await.1.failed(),
        Some(EngineError::Decode(_))
    ));
    let mut after = r.engine.submit(request(2, 3)).await.expect("slot");
    assert!(matches!(last(&mut after).await.1, Event::Finished { .. }));
}

#[tokio::test]
async fn a_failed_open_fails_the_request_and_frees_the_slot() {
    let r = rig(plan(1, 1));
    r.fake.with(|c| c.fail_open = true);
    let mut rx = r.engine.submit(request(2, 4)).await.expect("accepted");
    assert!(matches!(
        last(&mut rx).await.1.failed(),
        Some(EngineError::Decode(_))
    ));
    r.fake.with(|c| c.fail_open = false);
    let mut rx = r
        .engine
        .submit(request(2, 4))
        .await
        .expect("the slot is free again");
    assert!(matches!(last(&mut rx).await.1, Event::Finished { .. }));
}

#[tokio::test]
async fn long_prompts_are_fed_in_chunks_while_streams_keep_decoding() {
    let r = rig(plan(2, 2));
    let mut stream = r.engine.submit(request(2, 40)).await.expect("slot");
    while !matches!(next(&mut stream).await, Event::Text { .. }) {}
    let mut long = r.engine.submit(request(1500, 2)).await.expect("slot");
    assert!(matches!(last(&mut long).await.1, Event::Finished { .. }));
    let log = r.fake.log();
    assert_eq!(log.most_prefill, STEP_TOKENS as usize, "one chunk per step");
    assert!(
        log.mixed >= 3,
        "the stream decoded in each of the three chunks' steps: {log:?}"
    );
    assert!(matches!(last(&mut stream).await.1, Event::Finished { .. }));
}

impl Event {
    fn failed(self) -> Option<EngineError> {
        match self {
            Event::Failed(e) => Some(e),
            _ => None,
        }
    }
}

#[tokio::test]
async fn a_finished_prompt_is_reused_in_place_and_a_running_one_is_copied() {
    let r = rig(plan(2, 2));
    let mut first = r.engine.submit(request(300, 2)).await.expect("slot");
    assert!(
        matches!(last(&mut first).await.1, Event::Finished { usage, .. }
        if usage.prompt_tokens_details.cached_tokens == 0)
    );
    // Same prompt again: the idle slot that holds it takes it, all but the last tile reused.
    let mut again = r.engine.submit(request(300, LONG)).await.expect("slot");
    while !matches!(next(&mut again).await, Event::Text { .. }) {}
    // While that one runs, a third copies the prefix from its slot into the other.
    let mut third = r.engine.submit(request(300, 2)).await.expect("slot");
    match last(&mut third).await.1 {
        Event::Finished { usage, timings, .. } => {
            assert_eq!(usage.prompt_tokens_details.cached_tokens, 284);
            assert_eq!((timings.cache_n, timings.prompt_n), (284, 16));
        }
        other => panic!("expected Finished, got {other:?}"),
    }
    let log = r.fake.log();
    assert!(log.truncated.contains(&(0, 284)), "{log:?}");
    assert_eq!(log.shared, vec![(0, 1, 284)]);
}

#[tokio::test]
async fn requests_arriving_together_with_one_prompt_compute_it_once() {
    let r = rig(plan(4, 4));
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(r.engine.submit(request(600, 2)).await.expect("slot"));
    }
    let mut cached = Vec::new();
    for rx in &mut streams {
        match last(rx).await.1 {
            Event::Finished { usage, .. } => cached.push(usage.prompt_tokens_details.cached_tokens),
            other => panic!("expected Finished, got {other:?}"),
        }
    }
    cached.sort_unstable();
    assert_eq!(cached[0], 0, "one computes the prompt");
    assert!(
        cached[1..].iter().all(|&c| c >= 512),
        "three reuse it (all but the last tile, or the first chunk if they arrived after it): {cached:?}"
    );
    assert_eq!(r.fake.log().shared.len(), 3);
}

#[tokio::test]
async fn prefix_slots_keep_more_prompts_reusable_than_there_are_slots() {
    let mut p = plan(1, 1);
    p.prefix_slots = 2;
    let r = rig(p);
    let ask = |token: i32| {
        let mut req = request(300, 2);
        req.prompt_tokens = vec![token; 300];
        r.engine.submit(req)
    };
    let mut cached = Vec::new();
    // Three prompts through one slot, then the first again.
    for token in [1, 2, 3, 1] {
        let mut rx = ask(token).await.expect("slot");
        match last(&mut rx).await.1 {
            Event::Finished { usage, .. } => cached.push(usage.prompt_tokens_details.cached_tokens),
            other => panic!("expected Finished, got {other:?}"),
        }
    }
    assert_eq!(cached, vec![0, 0, 0, 284], "the first prompt was kept");
    let log = r.fake.log();
    // Each prompt took an empty sequence; the first ran again where it was kept.
    assert!(log.shared.is_empty(), "{log:?}");
    assert!(log.truncated.contains(&(0, 284)), "{log:?}");
    // The slot is released right after the last event went out.
    until(&r.engine, "the slot released", |l| l.active == 0).await;
}

#[tokio::test]
async fn with_the_prefix_cache_off_nothing_is_reused_and_cells_are_freed() {
    let mut p = plan(1, 1);
    p.prefix_cache = PrefixCache::Off;
    let r = rig(p);
    for _ in 0..2 {
        let mut rx = r.engine.submit(request(300, 2)).await.expect("slot");
        assert!(
            matches!(last(&mut rx).await.1, Event::Finished { usage, .. }
            if usage.prompt_tokens_details.cached_tokens == 0)
        );
    }
    // The slot is released right after the last event went out.
    until(&r.engine, "the slot released", |l| l.active == 0).await;
    let log = r.fake.log();
    assert!(log.shared.is_empty());
    assert_eq!(
        log.truncated,
        vec![(0, 0), (0, 0)],
        "freed after each request"
    );
}
