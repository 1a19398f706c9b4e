//! Validation: turns a wire request into a [`ValidRequest`], one module per request kind
//! and per group of shared fields. An invalid request never reaches the scheduler, and
//! every message names the field at fault.

mod chat;
mod completions;
mod embeddings;
mod extensions;
mod format;
mod items;
mod json;
mod output;
mod request;
mod responses;
mod sampling;
mod tokens;
mod tools;

pub use chat::chat;
pub use completions::completion;
pub use embeddings::{
    check_dimensions, check_token_ids, embeddings, EmbedInputs, ValidEmbeddings, MAX_INPUTS,
};
pub use json::parse_json;
pub use request::{GrammarFrom, Input, InvalidRequest, ValidRequest};
pub use responses::{responses, ValidResponses};
pub use sampling::check_vocab;
pub use tokens::token_ids;

#[cfg(test)]
mod tests;
