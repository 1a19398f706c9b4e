//! Server-sent events in the OpenAI shape: [`framer`] builds the chunks, [`body`] streams
//! them as the response.

mod body;
mod framer;

pub use body::{choices_to_body, events_to_body, response, Frames, KEEPALIVE_EVERY};
pub use framer::{Framer, Shape, ToolFramer};
