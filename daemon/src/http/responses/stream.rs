//! A streamed response: OpenAI's typed events, each with its `sequence_number`, framed as
//! `event: TYPE` / `data: JSON`. `response.created` and `response.in_progress` open it;
//! the [`Output`] events follow as text arrives; `response.completed` (or
//! `response.incomplete` when the output was cut) closes it, and a failure sends `error`
//! then `response.failed`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::output::Output;
use super::wire::{IncompleteDetails, ResponseError, ResponseObject, Status};
use crate::engine::{FinishReason, Timings, TokenLogprob, Usage};
use crate::http::error::ApiError;
use crate::http::sse::Frames;
use crate::tools::Format;

/// Finishes `response` with its output items and usage: `completed`, or `incomplete`
/// with the reason when the token limit cut it.
pub fn complete(
    response: &mut ResponseObject,
    output: &mut Output,
    reason: FinishReason,
    usage: Usage,
    now: u64,
) {
    let cut = reason == FinishReason::Length;
    response.output = output.finish(cut);
    response.usage = Some(usage.into());
    if cut {
        response.status = Status::Incomplete;
        response.incomplete_details = Some(IncompleteDetails {
            reason: "max_output_tokens",
        });
    } else {
        response.status = Status::Completed;
        response.completed_at = Some(now);
    }
}

/// The per-stream state: the response so far, its output, the next sequence number.
pub struct ResponseFramer {
    response: ResponseObject,
    output: Output,
    sequence: u64,
}

impl ResponseFramer {
    pub fn new(response: ResponseObject, tools: Option<Format>) -> Self {
        Self {
            response,
            output: Output::new(tools),
            sequence: 0,
        }
    }

    /// `response.created` then `response.in_progress`, as one write.
    pub fn opening(&mut self) -> Bytes {
        let created = json!({"type": "response.created", "response": self.response});
        let progress = json!({"type": "response.in_progress", "response": self.response});
        self.frames([created, progress])
    }

    fn frames(&mut self, events: impl IntoIterator<Item = Value>) -> Bytes {
        let mut out = Vec::new();
        for mut e in events {
            let kind = e["type"].as_str().unwrap_or("message").to_string();
            e["sequence_number"] = json!(self.sequence);
            self.sequence += 1;
            out.extend_from_slice(format!("event: {kind}\ndata: {e}\n\n").as_bytes());
        }
        Bytes::from(out)
    }

    fn pending(&mut self) -> Vec<Value> {
        self.output.take_events()
    }
}

impl Frames for ResponseFramer {
    fn text(&mut self, text: &str, _logprobs: &[TokenLogprob]) -> Bytes {
        self.output.push(text);
        let events = self.pending();
        self.frames(events)
    }

    fn closing(&mut self, reason: FinishReason, usage: Usage, _timings: Timings) -> Bytes {
        complete(
            &mut self.response,
            &mut self.output,
            reason,
            usage,
            crate::http::generate::unix_now(),
        );
        let mut events = self.pending();
        let kind = match self.response.status {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        events.push(json!({"type": kind, "response": self.response}));
        self.frames(events)
    }

    fn failure(&mut self, e: &ApiError) -> Bytes {
        self.response.status = Status::Failed;
        self.response.output = self.output.items().to_vec();
        self.response.error = Some(ResponseError {
            code: if e.status.as_u16() == 429 {
                "rate_limit_exceeded"
            } else {
                "server_error"
            },
            message: e.message.clone(),
        });
        let error = json!({
            "type": "error",
            "code": e.code,
            "message": e.message,
            "param": e.param,
        });
        let failed = json!({"type": "response.failed", "response": self.response});
        self.frames([error, failed])
    }
}
