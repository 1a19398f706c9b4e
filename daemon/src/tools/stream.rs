//! The parser face: a model's text turned into content and calls, as it streams or whole.

use super::call::{Out, ToolCall};
use super::format::Format;
use super::{hermes, json_form};

/// The model's text parsed for calls as it arrives, in its family's form.
#[derive(Debug)]
pub enum ToolStream {
    Hermes(hermes::HermesStream),
    Json(json_form::JsonStream),
}

impl ToolStream {
    pub fn new(format: Format) -> Self {
        match format {
            Format::Hermes => Self::Hermes(hermes::HermesStream::default()),
            Format::Llama3 => Self::Json(json_form::JsonStream::llama3()),
            Format::Mistral => Self::Json(json_form::JsonStream::mistral()),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Out> {
        match self {
            Self::Hermes(s) => s.push(text),
            Self::Json(s) => s.push(text),
        }
    }

    /// The end of the output: what was held back goes out.
    pub fn finish(self) -> Vec<Out> {
        match self {
            Self::Hermes(s) => s.finish(),
            Self::Json(s) => s.finish(),
        }
    }
}

/// A whole output: its text (calls removed, `None` when only whitespace is left) and calls.
pub fn parse(text: &str, format: Format) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = ToolStream::new(format);
    let mut outs = stream.push(text);
    outs.extend(stream.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for o in outs {
        match o {
            Out::Content(c) => content.push_str(&c),
            Out::CallStart(name) => calls.push(ToolCall {
                name,
                arguments: String::new(),
            }),
            Out::CallArgs(a) => {
                if let Some(last) = calls.last_mut() {
                    last.arguments.push_str(&a);
                }
            }
            Out::Call(c) => calls.push(c),
        }
    }
    let content = (!content.trim().is_empty()).then_some(content);
    (content, calls)
}
