//! [`Engine`], the handle the HTTP layer holds: submit requests, read the load, stop the
//! scheduler thread. One constructor for every backend.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::backend::open;
use super::backend::seam::Capabilities;
use super::backend::select::Selection;
use super::chat::model::LoadedModel;
use super::clock;
use super::plan::EnginePlan;
use super::schedule::thread;
use super::types::{EngineError, Event, GenerationRequest, Load};
use crate::metrics::Metrics;
use crate::thermal::ThermalGate;

/// Handle to the scheduler thread and the model it serves. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    core: thread::Handle,
    model: Arc<LoadedModel>,
    plan: EnginePlan,
    selection: Selection,
}

impl Engine {
    /// Starts the scheduler on the backend `selection` names, around an already loaded
    /// `model` (its weights, or only its vocabulary when the backend maps the weights
    /// itself: [`Capabilities::own_weights`]). Returns once the backend exists, so a failure
    /// here is a start-up failure, not a request failure. `thermal` lowers the admission cap
    /// while the board is hot and refuses new work when critical. `weights_sha256`, once
    /// set, keys the prompt cache's disk tier. `draft`, with `--spec draft`, is the model
    /// that drafts; it runs on llama.cpp in a context of its own.
    pub fn start(
        model: Arc<LoadedModel>,
        draft: Option<Arc<LoadedModel>>,
        selection: Selection,
        plan: EnginePlan,
        metrics: Arc<Metrics>,
        thermal: ThermalGate,
        weights_sha256: Arc<std::sync::OnceLock<String>>,
    ) -> Result<Self, EngineError> {
        let thread_model = model.clone();
        let thread_selection = selection.clone();
        let thread_plan = plan.clone();
        let clock = Arc::new(clock::SystemClock);
        let core = thread::spawn(
            plan.clone(),
            metrics,
            thermal,
            clock,
            weights_sha256,
            move |runner| {
                let model = thread_model;
                let backend = match open::open(&thread_selection, &thread_plan, &model) {
                    Ok(backend) => backend,
                    Err(e) => return runner.fail(e),
                };
                let drafter = match draft.as_deref().map(|d| open::open_draft(d, &thread_plan)) {
                    None => None,
                    Some(Ok(drafter)) => Some(drafter),
                    Some(Err(e)) => return runner.fail(e),
                };
                runner.run(backend, &*model, drafter);
            },
        )?;
        Ok(Self {
            core,
            model,
            plan,
            selection,
        })
    }

    /// Publishes the slots' KV blocks to `outbox` from now on (`--kv-events`).
    pub fn publish_kv_events(&self, outbox: crate::kv_events::Outbox) {
        self.core.publish_kv_events(outbox);
    }

    /// What the serving backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.selection.capabilities()
    }

    /// The serving backend's name, for messages.
    pub fn backend_name(&self) -> &'static str {
        self.selection.name()
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    pub fn plan(&self) -> &EnginePlan {
        &self.plan
    }

    /// How long since the decode loop last went round (`None` before its first turn).
    pub fn since_heartbeat(&self) -> Option<Duration> {
        let now = self.core.now();
        self.load().beat.map(|t| now.saturating_duration_since(t))
    }

    pub fn load(&self) -> Load {
        self.core.load()
    }

    /// Queues a request. Resolves once the scheduler accepted it (or refused it, e.g.
    /// because the queue is full); events then arrive on the returned receiver.
    /// Dropping the receiver cancels the request.
    pub async fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<Event>, EngineError> {
        self.core.submit(request).await
    }

    /// Queues a request's `n` choices, one sequence each, that start together: admitted
    /// when there are slots and KV cells for all of them (they then share the prompt's
    /// prefill through prefix reuse), refused together when the queue is full. One
    /// receiver per choice, in order; dropping them all cancels every choice.
    pub async fn submit_choices(
        &self,
        choices: Vec<GenerationRequest>,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, EngineError> {
        self.core.submit_choices(choices).await
    }

    /// Cancels everything still running or waiting; the scheduler thread then exits.
    pub fn shutdown(&self) {
        self.core.shutdown();
    }

    /// Blocks until the scheduler thread has returned, up to `timeout`; true if it did.
    /// The process must not exit while llama.cpp still runs a step on that thread: exit
    /// handlers would free what the step is using.
    pub fn wait_stopped(&self, timeout: Duration) -> bool {
        self.core.wait_stopped(timeout)
    }
}
