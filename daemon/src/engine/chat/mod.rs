//! The chat path: the loaded model, its chat template, prompt assembly and constrained
//! decoding.

pub mod constraint;
pub mod model;
pub mod prompt;
pub mod template;
