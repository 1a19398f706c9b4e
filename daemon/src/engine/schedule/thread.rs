//! The scheduler's thread and its handle: requests go in as commands, the load comes out
//! through a shared cell, and the thread builds its backend itself.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::command::Command;
use super::scheduler::Scheduler;
use crate::engine::backend::seam::{Backend, Vocab};
use crate::engine::clock::Clock;
use crate::engine::plan::EnginePlan;
use crate::engine::prompt_cache::PromptStore;
use crate::engine::types::{EngineError, Event, GenerationRequest, Load};
use crate::metrics::Metrics;
use crate::thermal::ThermalGate;

/// The scheduler thread's handle: send work, read the load, stop it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Handle {
    tx: Sender<Command>,
    load: Arc<Mutex<Load>>,
    /// Set once the thread has returned (its backend dropped).
    stopped: Arc<(Mutex<bool>, Condvar)>,
    /// The scheduler's clock, which its heartbeat is read against.
    clock: Arc<dyn Clock>,
}

/// What the thread body gets: everything but the backend, which it builds itself (a
/// llama.cpp context borrows the model and must live on the thread that uses it).
pub(crate) struct Runner {
    rx: Receiver<Command>,
    ready: Sender<Result<(), EngineError>>,
    plan: EnginePlan,
    metrics: Arc<Metrics>,
    load: Arc<Mutex<Load>>,
    thermal: ThermalGate,
    clock: Arc<dyn Clock>,
    /// The weights' SHA-256 once known: the disk tier's key.
    weights_sha256: Arc<OnceLock<String>>,
}

impl Runner {
    /// Reports a backend that could not be built; `spawn` returns this error.
    pub fn fail(self, error: EngineError) {
        if self.ready.send(Err(error)).is_err() {
            tracing::debug!("start-up abandoned before its failure was reported");
        }
    }

    /// Serves with `backend` until shutdown, drafting with `draft` when given.
    pub fn run<'v, B: Backend>(
        self,
        backend: B,
        vocab: &'v dyn Vocab,
        draft: Option<Box<dyn Backend + 'v>>,
    ) {
        let store = PromptStore::start(
            &self.plan.prompt_cache,
            backend.kv_layout(),
            self.weights_sha256,
            &self.metrics,
        );
        let mut s = Scheduler::new(
            backend,
            vocab,
            self.plan,
            self.metrics,
            self.load,
            self.thermal,
            self.clock,
        )
        .with_store(store);
        if let Some(draft) = draft {
            s = s.with_draft(draft);
        }
        if self.ready.send(Ok(())).is_err() {
            return;
        }
        tracing::debug!(backend = s.name(), "scheduler started");
        s.run_loop(&self.rx);
        s.cancel_all();
        s.save_all_and_flush();
        tracing::debug!("scheduler stopped");
    }
}

/// Starts the scheduler thread; `body` builds the backend and calls [`Runner::run`].
/// Returns once the backend exists, so its failure is a start-up failure.
pub(crate) fn spawn(
    plan: EnginePlan,
    metrics: Arc<Metrics>,
    thermal: ThermalGate,
    clock: Arc<dyn Clock>,
    weights_sha256: Arc<OnceLock<String>>,
    body: impl FnOnce(Runner) + Send + 'static,
) -> Result<Handle, EngineError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready, ready_rx) = std::sync::mpsc::channel();
    let load = Arc::new(Mutex::new(Load {
        max_active: plan.slots,
        ..Load::default()
    }));
    let stopped = Arc::new((Mutex::new(false), Condvar::new()));
    let runner = Runner {
        rx,
        ready,
        plan,
        metrics,
        load: load.clone(),
        thermal,
        clock: clock.clone(),
        weights_sha256,
    };
    let thread_stopped = stopped.clone();
    std::thread::Builder::new()
        .name("inferloop-decode".into())
        .spawn(move || {
            body(runner);
            let (done, cv) = &*thread_stopped;
            if let Ok(mut d) = done.lock() {
                *d = true;
            }
            cv.notify_all();
        })
        .map_err(|e| EngineError::Context(format!("cannot spawn decode thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Handle {
            tx,
            load,
            stopped,
            clock,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(EngineError::Context(
            "decode thread exited during start-up".into(),
        )),
    }
}

impl Handle {
    pub fn load(&self) -> Load {
        self.load.lock().map(|l| *l).unwrap_or_default()
    }

    /// Now, on the scheduler's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Queues a request; resolves once the scheduler accepted or refused it.
    pub async fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<Event>, EngineError> {
        let mut receivers = self.submit_choices(vec![request]).await?;
        receivers
            .pop()
            .ok_or_else(|| EngineError::Context("no receiver for a submitted request".into()))
    }

    /// Queues sequences that start together (a request's choices); resolves once the
    /// scheduler accepted or refused them all. One receiver per request, in order.
    pub async fn submit_choices(
        &self,
        requests: Vec<GenerationRequest>,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, EngineError> {
        let (choices, receivers): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|r| {
                let (events, rx) = mpsc::unbounded_channel();
                ((r, events), rx)
            })
            .unzip();
        let (accepted, accepted_rx) = oneshot::channel();
        self.tx
            .send(Command::Submit { choices, accepted })
            .map_err(|_| EngineError::ShuttingDown)?;
        accepted_rx.await.map_err(|_| EngineError::ShuttingDown)??;
        Ok(receivers)
    }

    /// Publishes KV block events from now on (`--kv-events`).
    pub fn publish_kv_events(&self, outbox: crate::kv_events::Outbox) {
        if self.tx.send(Command::PublishKvEvents(outbox)).is_err() {
            tracing::debug!("decode thread already stopped");
        }
    }

    pub fn shutdown(&self) {
        // A send error means the thread is already gone, which is the goal.
        if self.tx.send(Command::Shutdown).is_err() {
            tracing::debug!("decode thread already stopped");
        }
    }

    pub fn wait_stopped(&self, timeout: Duration) -> bool {
        let (done, cv) = &*self.stopped;
        let Ok(guard) = done.lock() else {
            return false;
        };
        cv.wait_timeout_while(guard, timeout, |d| !*d)
            .map(|(d, _)| *d)
            .unwrap_or(false)
    }
}
