//! The scheduler thread: continuous batching over a backend, stepped one turn at a time on a
//! clock.
//!
//! # Layout
//! - [`thread`]: the thread and its handle; requests in as [`command`]s, the load out.
//! - [`scheduler`]: one turn: take commands, admit, plan a step, run it, deliver (with
//!   `reuse`: a new request starting on a resident prompt prefix).
//! - [`state`]: the queue and the slots, admission by slots and KV cells.
//! - `step_plan`: what one step computes; prompt chunks shortest-rest first.
//! - [`sequence`]: one request's life in a slot, phase by phase.
//! - [`prefix`]: the index of resident prompt prefixes.
//! - [`speculate`]: prompt-lookup drafts, checked by a verifying step, and the drafting
//!   state (adaptive length, pauses) every draft source shares.
//! - [`draft`]: drafts from a second, smaller model (`--spec draft`).
//! - [`step_cost`]: what a step costs by rows and sequences, and how much of a draft is
//!   worth verifying at that cost.
//! - [`text`]: sampled tokens to UTF-8 text, held back at a possible stop string.

pub mod command;
pub mod draft;
#[cfg(test)]
mod draft_tests;
pub mod prefix;
mod reuse;
pub mod scheduler;
#[cfg(test)]
mod scheduler_tests;
pub mod sequence;
pub mod speculate;
#[cfg(test)]
mod speculate_tests;
pub mod state;
#[cfg(test)]
mod state_tests;
pub mod step_cost;
mod step_plan;
pub mod text;
pub mod thread;
#[cfg(test)]
mod tiers_tests;
