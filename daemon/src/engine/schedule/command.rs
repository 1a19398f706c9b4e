//! What the handle sends the scheduler thread: a request (one sequence per choice, each
//! with the channel its events go to), or the order to stop.

use tokio::sync::{mpsc, oneshot};

use crate::engine::types::{EngineError, Event, GenerationRequest};

pub(crate) enum Command {
    /// Sequences that start together or not at all: a request's `n` choices.
    Submit {
        choices: Vec<(GenerationRequest, mpsc::UnboundedSender<Event>)>,
        accepted: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Publish KV block events from now on (`--kv-events`).
    PublishKvEvents(crate::kv_events::Outbox),
    Shutdown,
}
