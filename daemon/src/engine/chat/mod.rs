//! The chat path: from a loaded model and a request's messages (or raw text) to prompt
//! tokens, and the grammars that constrain what the model may write back.
//!
//! # Layout
//!
//! Each file imports only the ones listed above it, never this face:
//!
//! - `turn.rs`: [`ChatTurn`], one validated message.
//! - `error.rs`: [`PromptError`], why an input could not become a prompt.
//! - `strftime.rs`: the UTC `strftime` behind the templates' `strftime_now`.
//! - `sentinels.rs`: the per-request markers that stand in for each message's content.
//! - `template_json.rs`: the templates' `tojson`, as Python's `json.dumps` writes it.
//! - `template.rs`: [`ChatTemplate`], the model's Jinja template (minijinja) or llama.cpp's
//!   built-in matcher.
//! - `bounds.rs`: [`PromptBounds`] (what fits a context, measured at load) and [`Limit`].
//! - `tokens.rs`: [`Vocabulary`] and the tokenizer that keeps message text plain, giving a
//!   [`Prompt`].
//! - `prompt.rs`: [`prompt::chat`] and [`prompt::text`], a request's input to a [`Prompt`].
//! - `constraint.rs`: llguidance grammars compiled against the vocabulary.
//! - `model.rs`: [`LoadedModel`], the GGUF loaded once, holding all of the above.

mod bounds;
pub mod constraint;
mod error;
pub mod model;
pub mod prompt;
mod sentinels;
mod strftime;
pub mod template;
mod template_json;
mod tokens;
mod turn;

#[cfg(test)]
mod constraint_tests;
#[cfg(test)]
mod prompt_tests;
#[cfg(test)]
mod template_tests;

pub use bounds::{Limit, PromptBounds};
pub use constraint::{Constraint, Grammar};
pub use error::PromptError;
pub use model::{llama_system_info, LoadedModel, ModelInfo};
pub use prompt::Piece;
pub use template::{ChatTemplate, JinjaTemplate};
pub use tokens::{Prompt, Vocabulary};
pub use turn::ChatTurn;
