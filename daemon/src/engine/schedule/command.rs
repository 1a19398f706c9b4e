//! What the handle sends the scheduler thread: a request with the channel its events go
//! to, or the order to stop.

use tokio::sync::{mpsc, oneshot};

use crate::engine::types::{EngineError, Event, GenerationRequest};

pub(crate) enum Command {
    Submit {
        request: GenerationRequest,
        events: mpsc::UnboundedSender<Event>,
        accepted: oneshot::Sender<Result<(), EngineError>>,
    },
    Shutdown,
}
