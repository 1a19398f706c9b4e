//! The sampler task: reads a source every interval, keeps the latest reading and a bounded history.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::MissedTickBehavior;

use crate::admission::{Admission, AdmissionConfig, ThermalState};
use crate::reading::Reading;
use crate::source::Source;
use crate::throttle::{self, ThrottleTracker};
use crate::ThermalError;

/// How often to sample and how much to keep.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Default 1 s.
    pub interval: Duration,
    /// Snapshots kept; default 600 (10 minutes at 1 Hz).
    pub history: usize,
    /// When set, every reading carries the admission state after its snapshot.
    pub admission: Option<AdmissionConfig>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            interval: Duration::from_secs(1),
            history: 600,
            admission: None,
        }
    }
}

impl SamplerConfig {
    /// Checks the values; names the field.
    pub fn validate(&self) -> Result<(), ThermalError> {
        if self.interval.is_zero() {
            return Err(ThermalError::InvalidConfig {
                field: "interval",
                message: "must be more than 0".into(),
            });
        }
        if self.history == 0 {
            return Err(ThermalError::InvalidConfig {
                field: "history",
                message: "must keep at least 1 snapshot".into(),
            });
        }
        if let Some(admission) = &self.admission {
            admission.validate()?;
        }
        Ok(())
    }
}

type History = Arc<Mutex<VecDeque<Reading>>>;

// A std mutex, not tokio's: the lock is held for a push or a clone of up to `history`
// readings (an `Arc` each), never across an await, and readers (HTTP handlers, the decode
// thread) may be sync.
fn lock(history: &Mutex<VecDeque<Reading>>) -> MutexGuard<'_, VecDeque<Reading>> {
    // A panic while holding the lock leaves a deque that is still a valid history.
    history
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running sampler. Dropping it stops the task (after a sample already in flight).
pub struct Sampler {
    latest: watch::Receiver<Option<Reading>>,
    history: History,
    stop: Option<oneshot::Sender<()>>,
    /// Closed when the task ends; `Ok` when it ended by itself, not in a panic.
    finished: oneshot::Receiver<()>,
}

impl Sampler {
    /// Starts the task on the current tokio runtime; the first sample is taken at once.
    pub fn spawn(source: Box<dyn Source>, config: SamplerConfig) -> Result<Self, ThermalError> {
        let (sampler, task) = Self::prepare(source, config)?;
        tokio::spawn(task);
        Ok(sampler)
    }

    /// Starts the task on a thread and a runtime of its own, whose blocking pool only it
    /// uses. A daemon wants this: a sample every second on the daemon's shared blocking
    /// pool wakes that pool's idle threads in turn, so none of them ever sits out its
    /// keep-alive, and every thread a burst added (tokenizing, compiling grammars) stayed
    /// for good (a 2-hour soak ended with 5 more threads than at idle).
    pub fn spawn_on_own_thread(
        source: Box<dyn Source>,
        config: SamplerConfig,
    ) -> Result<Self, ThermalError> {
        let cannot = |e: std::io::Error| ThermalError::SourceFailed {
            source_name: "sampler thread".into(),
            message: format!("cannot start it: {e}"),
        };
        let (sampler, task) = Self::prepare(source, config)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .thread_name("inferloop-thermal")
            .max_blocking_threads(1)
            .build()
            .map_err(cannot)?;
        std::thread::Builder::new()
            .name("inferloop-thermal".into())
            .spawn(move || runtime.block_on(task))
            .map_err(cannot)?;
        Ok(sampler)
    }

    /// The handle and the task that samples; the task signals `finished` as it ends.
    fn prepare(
        source: Box<dyn Source>,
        config: SamplerConfig,
    ) -> Result<(Self, impl std::future::Future<Output = ()> + Send + 'static), ThermalError> {
        config.validate()?;
        let admission = config.admission.clone().map(Admission::new).transpose()?;
        let (latest_tx, latest) = watch::channel(None);
        let history: History = Arc::new(Mutex::new(VecDeque::with_capacity(config.history)));
        let (stop, stopped) = oneshot::channel();
        let (done, finished) = oneshot::channel();
        let task = {
            let history = Arc::clone(&history);
            async move {
                run(source, config, admission, latest_tx, history, stopped).await;
                // A panic in `run` drops `done` unsent instead.
                let _ = done.send(());
            }
        };
        let sampler = Sampler {
            latest,
            history,
            stop: Some(stop),
            finished,
        };
        Ok((sampler, task))
    }

    /// The newest reading, `None` before the first successful sample.
    pub fn latest(&self) -> Option<Reading> {
        self.latest.borrow().clone()
    }

    /// A receiver that sees every new reading; `borrow()` on it is a cheap sync read, fit
    /// for the decode thread.
    pub fn subscribe(&self) -> watch::Receiver<Option<Reading>> {
        self.latest.clone()
    }

    /// The kept readings, oldest first.
    pub fn history(&self) -> Vec<Reading> {
        lock(&self.history).iter().cloned().collect()
    }

    /// The admission state of the newest reading; `normal` before the first one or when
    /// the sampler runs no admission.
    pub fn thermal_state(&self) -> ThermalState {
        self.latest
            .borrow()
            .as_ref()
            .map_or(ThermalState::Normal, Reading::state_or_normal)
    }

    /// Stops the task and waits for it to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The task may already have ended (a panicked source); nothing else to tell it.
            let _ = stop.send(());
        }
        if (&mut self.finished).await.is_err() {
            tracing::warn!("thermal sampler task ended abnormally");
        }
    }
}

async fn run(
    source: Box<dyn Source>,
    config: SamplerConfig,
    mut admission: Option<Admission>,
    latest: watch::Sender<Option<Reading>>,
    history: History,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut ticker = tokio::time::interval(config.interval);
    // A slow sample (nvpmodel, an I2C read) should not be followed by a burst to catch up.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut tracker = ThrottleTracker::new();
    let mut failing_since: Option<u64> = None;
    let mut source = Some(source);
    tracing::debug!(
        interval_ms = config.interval.as_millis() as u64,
        "thermal sampler started"
    );
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = ticker.tick() => {}
        }
        let Some(mut src) = source.take() else { break };
        // Sources do blocking file I/O and may run nvpmodel: keep it off the async workers.
        let joined = tokio::task::spawn_blocking(move || {
            let result = src.sample();
            (src, result)
        })
        .await;
        let (src, result) = match joined {
            Ok(pair) => pair,
            Err(e) => {
                tracing::error!(error = %e, "thermal source panicked; sampler stopped");
                break;
            }
        };
        source = Some(src);
        let mut snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(e) => {
                let failures = failing_since.get_or_insert(0);
                if *failures == 0 {
                    tracing::warn!(error = %e, kind = e.kind(), "thermal sample failed");
                }
                *failures += 1;
                continue;
            }
        };
        if let Some(failures) = failing_since.take() {
            tracing::info!(failures, "thermal samples recovered");
        }
        snapshot.throttle = throttle::detect(&snapshot);
        tracker.update(&snapshot.throttle);
        let state = admission.as_mut().map(|admission| {
            admission.observe_snapshot(&snapshot);
            admission.state()
        });
        let reading = Reading::new(snapshot, state);
        {
            let mut kept = lock(&history);
            if kept.len() >= config.history {
                kept.pop_front();
            }
            kept.push_back(reading.clone());
        }
        latest.send_replace(Some(reading));
    }
    tracing::debug!("thermal sampler stopped");
}
