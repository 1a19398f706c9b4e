//! A response's output items as the model's text arrives: text goes into a `message` item,
//! each tool call (parsed in the model family's form) into a `function_call` item. Every
//! change is also written down as the Responses API's typed event, so a stream and a whole
//! answer are built by the same code.

use rand::distributions::{Alphanumeric, DistString};
use serde_json::{json, Value};

use super::wire::{ItemStatus, OutputItem, OutputText};
use crate::tools::{Format, Out, ToolStream};

/// The item being written.
#[derive(Debug)]
enum Open {
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The output of one response, item by item, with the events that describe it.
#[derive(Debug)]
pub struct Output {
    tools: Option<(ToolStream, Format)>,
    items: Vec<OutputItem>,
    open: Option<Open>,
    /// Events not yet taken, without their `sequence_number`.
    events: Vec<Value>,
}

fn item_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 24)
    )
}

impl Output {
    /// `tools`: the form calls are written in, when the request offered tools.
    pub fn new(tools: Option<Format>) -> Self {
        Self {
            tools: tools.map(|f| (ToolStream::new(f), f)),
            items: Vec::new(),
            open: None,
            events: Vec::new(),
        }
    }

    /// More of the model's text.
    pub fn push(&mut self, text: &str) {
        let outs = match self.tools.as_mut() {
            Some((stream, _)) => stream.push(text),
            None => vec![Out::Content(text.to_string())],
        };
        self.apply(outs);
    }

    /// The end of the output: what the tool parser held back goes out, the last item is
    /// closed (`incomplete` when the output was cut), and a response with no item gets an
    /// empty message. Returns the items.
    pub fn finish(&mut self, incomplete: bool) -> Vec<OutputItem> {
        if let Some((stream, format)) = self.tools.take() {
            self.apply(stream.finish());
            self.tools = Some((ToolStream::new(format), format));
        }
        if self.open.is_none() && self.items.is_empty() {
            self.open_message();
        }
        let status = if incomplete {
            ItemStatus::Incomplete
        } else {
            ItemStatus::Completed
        };
        self.close(status);
        self.items.clone()
    }

    /// The items closed so far.
    pub fn items(&self) -> &[OutputItem] {
        &self.items
    }

    /// The events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    fn apply(&mut self, outs: Vec<Out>) {
        for out in outs {
            match out {
                Out::Content(c) => self.content(&c),
                Out::CallStart(name) => self.open_call(name),
                Out::CallArgs(a) => self.call_args(&a),
                Out::Call(call) => {
                    self.open_call(call.name);
                    self.call_args(&call.arguments);
                }
            }
        }
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(ItemStatus::Completed);
            self.open_message();
        }
        let output_index = self.index();
        if let Some(Open::Message { id, text: all }) = self.open.as_mut() {
            all.push_str(text);
            let id = id.clone();
            self.events.push(json!({
                "type": "response.output_text.delta",
                "item_id": id,
                "output_index": output_index,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }));
        }
    }

    fn open_message(&mut self) {
        let id = item_id("msg");
        let output_index = self.index();
        let item = OutputItem::Message {
            id: id.clone(),
            status: ItemStatus::InProgress,
            role: "assistant",
            content: Vec::new(),
        };
        self.events.push(json!({
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": item,
        }));
        self.events.push(json!({
            "type": "response.content_part.added",
            "item_id": id,
            "output_index": output_index,
            "content_index": 0,
            "part": OutputText::new(String::new()),
        }));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
    }

    fn open_call(&mut self, name: String) {
        self.close(ItemStatus::Completed);
        let call_id = self
            .tools
            .as_ref()
            .map_or(Format::Hermes, |t| t.1)
            .call_id();
        let id = item_id("fc");
        let item = OutputItem::FunctionCall {
            id: id.clone(),
            status: ItemStatus::InProgress,
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: String::new(),
        };
        self.events.push(json!({
            "type": "response.output_item.added",
            "output_index": self.index(),
            "item": item,
        }));
        self.open = Some(Open::Call {
            id,
            call_id,
            name,
            arguments: String::new(),
        });
    }

    fn call_args(&mut self, args: &str) {
        let output_index = self.index();
        if let Some(Open::Call { id, arguments, .. }) = self.open.as_mut() {
            arguments.push_str(args);
            let id = id.clone();
            self.events.push(json!({
                "type": "response.function_call_arguments.delta",
                "item_id": id,
                "output_index": output_index,
                "delta": args,
            }));
        }
    }

    /// Closes the open item, if any, with its `.done` events.
    fn close(&mut self, status: ItemStatus) {
        let output_index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text }) => {
                let part = OutputText::new(text.clone());
                self.events.push(json!({
                    "type": "response.output_text.done",
                    "item_id": id,
                    "output_index": output_index,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }));
                self.events.push(json!({
                    "type": "response.content_part.done",
                    "item_id": id,
                    "output_index": output_index,
                    "content_index": 0,
                    "part": part,
                }));
                OutputItem::Message {
                    id,
                    status,
                    role: "assistant",
                    content: vec![part],
                }
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                // A call with no arguments written still carries valid JSON.
                let arguments = if arguments.trim().is_empty() {
                    "{}".to_string()
                } else {
                    arguments
                };
                self.events.push(json!({
                    "type": "response.function_call_arguments.done",
                    "item_id": id,
                    "output_index": output_index,
                    "name": name,
                    "arguments": arguments,
                }));
                OutputItem::FunctionCall {
                    id,
                    status,
                    call_id,
                    name,
                    arguments,
                }
            }
        };
        self.events.push(json!({
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": item,
        }));
        self.items.push(item);
    }
}
