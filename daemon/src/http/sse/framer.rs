//! The OpenAI chunks of a stream, each framed as one `data:` event: role first, one constant
//! id, `finish_reason` on the final choice chunk, an optional usage chunk, then `[DONE]`.

use bytes::Bytes;
use serde::Serialize;

use crate::engine::{FinishReason, Timings, TokenLogprob, Usage};
use crate::http::error::ApiError;
use crate::http::wire::{
    ChatChunk, ChatLogprobs, ChunkChoice, CompletionChunk, CompletionChunkChoice,
    CompletionLogprobs, Delta, FunctionDelta, ToolCallDelta, FINGERPRINT,
};
use crate::tools::{Format, Out, ToolStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Completion,
}

impl Shape {
    /// The request field that holds the prompt, named by context errors.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Shape::Chat => "messages",
            Shape::Completion => "prompt",
        }
    }
}

/// Per-choice constants and frame builders (a request with `n` choices has `n`, their
/// chunks interleaved in one stream).
pub struct Framer {
    pub shape: Shape,
    /// The choice's `index` in every chunk.
    pub index: u32,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Completions `logprobs`: the character offset of the next token in the text.
    pub text_offset: usize,
    /// Chat with tools: the text is parsed for calls as it streams.
    pub tools: Option<ToolFramer>,
}

/// A chat stream's tool-call parser and how many calls it has sent.
#[derive(Debug)]
pub struct ToolFramer {
    stream: ToolStream,
    format: Format,
    calls: u32,
}

impl ToolFramer {
    pub fn new(format: Format) -> Self {
        Self {
            stream: ToolStream::new(format),
            format,
            calls: 0,
        }
    }
}

impl Framer {
    fn usage_field(&self, usage: Option<Usage>) -> Option<Option<Usage>> {
        self.include_usage.then_some(usage)
    }

    /// The first chunk: the assistant role (chat) or the echoed prompt (completions).
    pub fn opening(&self, echo: Option<&str>) -> Option<Bytes> {
        match self.shape {
            Shape::Chat => Some(self.chat_chunk(
                Delta {
                    role: Some("assistant"),
                    content: Some(""),
                    tool_calls: None,
                },
                None,
                None,
            )),
            Shape::Completion => echo.map(|text| self.completion_chunk(text, None, None)),
        }
    }

    /// A text chunk, with the log-probabilities of the tokens it begins when there are any.
    pub fn text(&mut self, text: &str, logprobs: &[TokenLogprob]) -> Bytes {
        if let Some(mut tools) = self.tools.take() {
            let outs = tools.stream.push(text);
            let bytes = self.tool_frames(&mut tools, outs, logprobs);
            self.tools = Some(tools);
            return bytes;
        }
        match self.shape {
            Shape::Chat => {
                let logprobs = (!logprobs.is_empty()).then(|| ChatLogprobs::of(logprobs));
                self.chat_chunk_with(
                    Delta {
                        content: Some(text),
                        ..Delta::default()
                    },
                    logprobs,
                    None,
                    None,
                )
            }
            Shape::Completion => {
                let logprobs = (!logprobs.is_empty()).then(|| {
                    let mut l = CompletionLogprobs::default();
                    l.extend(logprobs, &mut self.text_offset);
                    l
                });
                self.completion_chunk_with(text, logprobs, None, None)
            }
        }
    }

    /// Chunks for what the tool parser let out: text as content deltas; each call as a
    /// delta with its id, type and name (arguments empty), then deltas with its arguments
    /// as they come.
    fn tool_frames(
        &mut self,
        tools: &mut ToolFramer,
        outs: Vec<Out>,
        logprobs: &[TokenLogprob],
    ) -> Bytes {
        let mut bytes = Vec::new();
        for out in outs {
            match out {
                Out::Content(c) => {
                    let logprobs = (!logprobs.is_empty()).then(|| ChatLogprobs::of(logprobs));
                    let delta = Delta {
                        content: Some(&c),
                        ..Delta::default()
                    };
                    bytes.extend_from_slice(&self.chat_chunk_with(delta, logprobs, None, None));
                }
                Out::CallStart(name) => {
                    let id = tools.format.call_id();
                    bytes.extend_from_slice(&self.call_head(tools, &id, &name));
                }
                Out::CallArgs(args) => {
                    bytes.extend_from_slice(&self.call_args(tools, &args));
                }
                Out::Call(call) => {
                    let id = tools.format.call_id();
                    bytes.extend_from_slice(&self.call_head(tools, &id, &call.name));
                    bytes.extend_from_slice(&self.call_args(tools, &call.arguments));
                }
            }
        }
        Bytes::from(bytes)
    }

    /// A call's first delta: a new index, its id, type and name, no arguments yet.
    fn call_head(&self, tools: &mut ToolFramer, id: &str, name: &str) -> Bytes {
        let index = tools.calls;
        tools.calls += 1;
        self.tool_delta(ToolCallDelta {
            index,
            id: Some(id),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(name),
                arguments: "",
            },
        })
    }

    /// More arguments of the call begun last.
    fn call_args(&self, tools: &ToolFramer, args: &str) -> Bytes {
        self.tool_delta(ToolCallDelta {
            index: tools.calls.saturating_sub(1),
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: args,
            },
        })
    }

    fn tool_delta(&self, d: ToolCallDelta<'_>) -> Bytes {
        let delta = Delta {
            tool_calls: Some(vec![d]),
            ..Delta::default()
        };
        self.chat_chunk(delta, None, None)
    }

    /// Finish chunk, usage chunk if asked for, and the `[DONE]` sentinel, as one write.
    pub fn closing(&mut self, reason: FinishReason, usage: Usage, timings: Timings) -> Bytes {
        let mut out = self.finish(reason, timings).to_vec();
        out.extend_from_slice(&self.end(usage));
        Bytes::from(out)
    }

    /// The choice's finish chunk. With tools, what the parser held back goes first, and a
    /// choice that sent calls and stopped on its own finishes with `tool_calls`.
    pub fn finish(&mut self, reason: FinishReason, timings: Timings) -> Bytes {
        let mut out = Vec::new();
        let mut reason = reason;
        if let Some(mut tools) = self.tools.take() {
            let outs = std::mem::replace(&mut tools.stream, ToolStream::new(tools.format)).finish();
            out.extend_from_slice(&self.tool_frames(&mut tools, outs, &[]));
            // A reply cut by `max_tokens` stays `length`, calls or not, as OpenAI has it.
            if tools.calls > 0 && reason == FinishReason::Stop {
                reason = FinishReason::ToolCalls;
            }
        }
        let finish = match self.shape {
            Shape::Chat => self.chat_chunk(Delta::default(), Some(reason), Some(timings)),
            Shape::Completion => self.completion_chunk("", Some(reason), Some(timings)),
        };
        out.extend_from_slice(&finish);
        Bytes::from(out)
    }

    /// The stream's end, once every choice finished: the usage chunk if asked for, then
    /// the `[DONE]` sentinel.
    pub fn end(&self, usage: Usage) -> Bytes {
        let mut out = Vec::new();
        if self.include_usage {
            let chunk = match self.shape {
                Shape::Chat => frame(&ChatChunk {
                    id: &self.id,
                    object: "chat.completion.chunk",
                    created: self.created,
                    model: &self.model,
                    system_fingerprint: FINGERPRINT,
                    choices: Vec::new(),
                    usage: Some(Some(usage)),
                    timings: None,
                }),
                Shape::Completion => frame(&CompletionChunk {
                    id: &self.id,
                    object: "text_completion",
                    created: self.created,
                    model: &self.model,
                    system_fingerprint: FINGERPRINT,
                    choices: Vec::new(),
                    usage: Some(Some(usage)),
                    timings: None,
                }),
            };
            out.extend_from_slice(&chunk);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }

    fn chat_chunk(
        &self,
        delta: Delta<'_>,
        finish_reason: Option<FinishReason>,
        timings: Option<Timings>,
    ) -> Bytes {
        self.chat_chunk_with(delta, None, finish_reason, timings)
    }

    fn chat_chunk_with(
        &self,
        delta: Delta<'_>,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<FinishReason>,
        timings: Option<Timings>,
    ) -> Bytes {
        frame(&ChatChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: FINGERPRINT,
            choices: vec![ChunkChoice {
                index: self.index,
                delta,
                logprobs,
                finish_reason,
            }],
            usage: self.usage_field(None),
            timings,
        })
    }

    fn completion_chunk(
        &self,
        text: &str,
        finish_reason: Option<FinishReason>,
        timings: Option<Timings>,
    ) -> Bytes {
        self.completion_chunk_with(text, None, finish_reason, timings)
    }

    fn completion_chunk_with(
        &self,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<FinishReason>,
        timings: Option<Timings>,
    ) -> Bytes {
        frame(&CompletionChunk {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            system_fingerprint: FINGERPRINT,
            choices: vec![CompletionChunkChoice {
                index: self.index,
                text,
                logprobs,
                finish_reason,
            }],
            usage: self.usage_field(None),
            timings,
        })
    }
}

fn frame(v: &impl Serialize) -> Bytes {
    match serde_json::to_vec(v) {
        Ok(json) => {
            let mut out = Vec::with_capacity(json.len() + 8);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&json);
            out.extend_from_slice(b"\n\n");
            Bytes::from(out)
        }
        Err(e) => error_frame(&ApiError::internal(format!("serialization failed: {e}"))),
    }
}

pub(super) fn error_frame(e: &ApiError) -> Bytes {
    Bytes::from(format!("data: {}\n\n", e.to_json()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framer(include_usage: bool) -> Framer {
        Framer {
            shape: Shape::Chat,
            index: 0,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            include_usage,
            text_offset: 0,
            tools: None,
        }
    }

    fn json_of(frame: &[u8]) -> serde_json::Value {
        let text = std::str::from_utf8(frame).expect("utf8");
        let body = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .expect("one SSE frame");
        serde_json::from_str(body).expect("json")
    }

    #[test]
    fn opening_chunk_carries_the_role() {
        let f = framer(false);
        let v = json_of(&f.opening(None).expect("chat always opens"));
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v["object"], "chat.completion.chunk");
        assert!(v.get("usage").is_none());
    }

    fn frames_of(bytes: &[u8]) -> Vec<serde_json::Value> {
        std::str::from_utf8(bytes)
            .expect("utf8")
            .split("\n\n")
            .filter(|f| f.starts_with("data: {"))
            .map(|f| serde_json::from_str(&f["data: ".len()..]).expect("json"))
            .collect()
    }

    #[test]
    fn a_streamed_call_is_a_named_delta_then_argument_deltas_then_tool_calls() {
        let mut f = framer(false);
        f.tools = Some(ToolFramer::new(Format::Hermes));
        let mut frames = Vec::new();
        for piece in [
            "<tool_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": ",
            "\"Paris\"}}\n</tool_call>",
        ] {
            frames.extend(frames_of(&f.text(piece, &[])));
        }
        frames.extend(frames_of(&f.closing(
            FinishReason::Stop,
            Usage::default(),
            Timings::default(),
        )));
        let calls: Vec<&serde_json::Value> = frames
            .iter()
            .filter_map(|v| v["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        assert_eq!(calls[0]["index"], 0);
        assert!(calls[0]["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("call_")));
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], "");
        assert!(
            calls.len() > 2,
            "arguments in more than one delta: {frames:?}"
        );
        let args: String = calls[1..]
            .iter()
            .map(|c| {
                assert!(c.get("id").is_none() && c["function"].get("name").is_none());
                c["function"]["arguments"].as_str().unwrap_or_default()
            })
            .collect();
        assert_eq!(args, r#"{"city": "Paris"}"#);
        let last = frames.last().expect("a closing chunk");
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_call_cut_by_max_tokens_finishes_with_length() {
        let mut f = framer(false);
        f.tools = Some(ToolFramer::new(Format::Hermes));
        f.text(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
            &[],
        );
        let closing =
            frames_of(&f.closing(FinishReason::Length, Usage::default(), Timings::default()));
        assert_eq!(
            closing.last().expect("closing")["choices"][0]["finish_reason"],
            "length"
        );
    }

    #[test]
    fn usage_is_null_on_chunks_until_the_last_when_requested() {
        let mut f = framer(true);
        let v = json_of(&f.text("hi", &[]));
        assert!(v["usage"].is_null() && v.as_object().is_some_and(|o| o.contains_key("usage")));
        let closing = f.closing(FinishReason::Stop, Usage::default(), Timings::default());
        let text = std::str::from_utf8(&closing).expect("utf8");
        let frames: Vec<&str> = text.split("\n\n").filter(|s| !s.is_empty()).collect();
        assert_eq!(frames.len(), 3, "{text}");
        assert!(frames[1].contains("\"choices\":[]"));
        assert_eq!(frames[2], "data: [DONE]");
    }
}
