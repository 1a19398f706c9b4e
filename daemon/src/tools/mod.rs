//! Tool calls: what the client offered (`tools`, `tool_choice`, `parallel_tool_calls`), the
//! form the model family writes calls in, the grammar that forces a call, and the parser
//! that turns the model's text into OpenAI `tool_calls`, whole or as it streams.
//!
//! Three forms, chosen by the chat template (see [`Format::detect`]):
//! - **Hermes** (`<tool_call>{"name": …, "arguments": …}</tool_call>`), the documented
//!   default for ChatML-family models (Qwen, SmolLM2, Hermes) and any template without a
//!   form of its own: [`hermes`].
//! - **Llama 3.x**: a bare `{"name": …, "parameters": …}` as the whole reply, optionally
//!   after the `<|python_tag|>` token: [`json_form`].
//! - **Mistral**: `[TOOL_CALLS][{"name": …, "arguments": …, "id": …}, …]`: [`json_form`].
//!
//! # Layout
//! - [`offer`]: the tools a request offers and the Hermes system text.
//! - [`grammar`]: the grammar that forces a call.
//! - [`format`]: the forms, their markers, and earlier calls written back.
//! - [`stream`]: the parser face; [`call`] the pieces the forms' parsers share, [`scan`] the
//!   JSON scanning under them.

mod call;
mod format;
mod grammar;
mod hermes;
mod json_form;
mod offer;
mod scan;
mod stream;

pub use call::{Out, PastCall, ToolCall};
pub use format::{Format, MISTRAL_CALLS, PYTHON_TAG};
pub use hermes::OPEN as HERMES_OPEN;
pub use offer::{Tool, ToolChoice, ToolUse};
pub use stream::{parse, ToolStream};
