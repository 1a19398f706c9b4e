//! The SSE framing of a stream: engine text events (any text, and log-probabilities of
//! tokens that may be partial UTF-8) through the chat and completions `Framer` and the
//! Responses API's `ResponseFramer`, with and without tools, to the finish or a failure.
//! Every frame must be one well-formed SSE event carrying JSON (or `[DONE]`), and what a
//! client puts back together from the deltas must be what the engine produced: the text
//! itself, or with tools what the whole-text parser finds in it.
//!
//! Input: one flags byte, then the text events separated by 0xFF (never in UTF-8).

#![no_main]

use inferloopd::engine::{FinishReason, Timings, TokenLogprob, Usage};
use inferloopd::http::error::ApiError;
use inferloopd::http::responses::fuzzing::{Framer, Frames, ResponseFramer, Shape, ToolFramer};
use inferloopd::http::responses::wire::{Echo, ResponseObject};
use inferloopd::tools::{self, Format, ToolCall};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

#[derive(Clone, Copy, PartialEq)]
enum Route {
    Chat,
    Completion,
    Responses,
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let route = [
        Route::Chat,
        Route::Completion,
        Route::Responses,
        Route::Chat,
    ][flags as usize & 3];
    let tools = [
        None,
        Some(Format::Hermes),
        Some(Format::Llama3),
        Some(Format::Mistral),
    ][(flags as usize >> 2) & 3]
        .filter(|_| route != Route::Completion);
    let include_usage = flags & 0x10 != 0;
    let reason = if flags & 0x20 != 0 {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let fails = flags & 0x40 != 0;
    let logprobs = flags & 0x80 != 0;

    let mut framer: Box<dyn Frames> = match route {
        Route::Responses => Box::new(ResponseFramer::new(
            ResponseObject::new("resp_1".into(), 1, "m".into(), echo()),
            tools,
        )),
        Route::Chat | Route::Completion => Box::new(Framer {
            shape: if route == Route::Chat {
                Shape::Chat
            } else {
                Shape::Completion
            },
            index: 0,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            include_usage,
            text_offset: 0,
            tools: tools.map(ToolFramer::new),
        }),
    };
    let mut out = Vec::new();
    let mut text = String::new();
    for piece in rest.split(|b| *b == 0xFF) {
        // The engine sends whole characters; a token's bytes may be part of one.
        let t = String::from_utf8_lossy(piece);
        text.push_str(&t);
        let lp: Vec<TokenLogprob> = if logprobs {
            vec![TokenLogprob {
                token: piece.to_vec(),
                logprob: -(piece.len() as f32),
                top: vec![(piece.iter().rev().copied().collect(), f32::NEG_INFINITY)],
            }]
        } else {
            Vec::new()
        };
        out.extend_from_slice(&framer.text(&t, &lp));
    }
    if fails {
        out.extend_from_slice(&framer.failure(&ApiError::internal("the engine failed")));
    } else {
        out.extend_from_slice(&framer.closing(reason, Usage::default(), Timings::default()));
    }

    let frames = events(&out, route);
    let last = frames.last().expect("a stream ends with a frame");
    if fails {
        let failed = match route {
            Route::Responses => last["type"] == "response.failed",
            _ => last["error"]["message"].is_string(),
        };
        assert!(failed, "a failure ends with an error: {last}");
        return;
    }
    if route != Route::Responses {
        assert_eq!(last, &Value::Null, "the stream ends with [DONE]");
    }
    let got = reassemble(&frames, route);
    match tools {
        None => assert_eq!(got.0.unwrap_or_default(), text, "the text, delta by delta"),
        Some(format) => {
            let (content, calls) = tools::parse(&text, format);
            assert_eq!(got.1, calls, "the calls, delta by delta");
            let content_of = |c: Option<String>| c.filter(|c| !c.trim().is_empty());
            assert_eq!(
                content_of(got.0),
                content_of(content),
                "the content, delta by delta"
            );
        }
    }
});

fn echo() -> Echo {
    Echo {
        instructions: None,
        metadata: Map::new(),
        max_output_tokens: None,
        parallel_tool_calls: true,
        temperature: 1.0,
        top_p: 1.0,
        text: serde_json::json!({"format": {"type": "text"}}),
        tool_choice: Value::from("auto"),
        tools: Vec::new(),
    }
}

/// The stream cut into its events, each checked for its framing: `data: JSON` (`[DONE]`
/// as null), or for the Responses API `event: TYPE` then `data: JSON` of that type.
fn events(bytes: &[u8], route: Route) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("an SSE stream is UTF-8");
    let body = text
        .strip_suffix("\n\n")
        .expect("the last event is terminated");
    body.split("\n\n")
        .map(|frame| {
            let data = match route {
                Route::Responses => {
                    let (event, data) = frame.split_once('\n').expect("event then data");
                    let kind = event.strip_prefix("event: ").expect("an event line");
                    let data = data.strip_prefix("data: ").expect("a data line");
                    let v: Value = serde_json::from_str(data).expect("data is JSON");
                    assert_eq!(v["type"], kind, "the event names its data's type");
                    return v;
                }
                _ => frame.strip_prefix("data: ").expect("a data line"),
            };
            assert!(
                !data.contains('\n'),
                "one line of data per event: {frame:?}"
            );
            if data == "[DONE]" {
                return Value::Null;
            }
            serde_json::from_str(data).expect("data is JSON")
        })
        .collect()
}

/// The content and the calls a client rebuilds from the deltas.
fn reassemble(frames: &[Value], route: Route) -> (Option<String>, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let args = |calls: &mut Vec<ToolCall>, a: &str| match calls.last_mut() {
        Some(c) => c.arguments.push_str(a),
        None => panic!("arguments before a call: {a:?}"),
    };
    for f in frames {
        match route {
            Route::Chat => {
                let delta = &f["choices"][0]["delta"];
                if let Some(c) = delta["content"].as_str() {
                    content.push_str(c);
                }
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    let index = call["index"].as_u64().expect("a call index") as usize;
                    if let Some(name) = call["function"]["name"].as_str() {
                        assert_eq!(index, calls.len(), "calls are numbered in order");
                        calls.push(ToolCall {
                            name: name.into(),
                            arguments: String::new(),
                        });
                    }
                    assert_eq!(index + 1, calls.len(), "arguments of the last call");
                    args(
                        &mut calls,
                        call["function"]["arguments"].as_str().unwrap_or(""),
                    );
                }
            }
            Route::Completion => {
                if let Some(t) = f["choices"][0]["text"].as_str() {
                    content.push_str(t);
                }
            }
            Route::Responses => match f["type"].as_str() {
                Some("response.output_text.delta") => {
                    content.push_str(f["delta"].as_str().expect("a text delta"))
                }
                Some("response.output_item.added") if f["item"]["type"] == "function_call" => calls
                    .push(ToolCall {
                        name: f["item"]["name"].as_str().expect("a call's name").into(),
                        arguments: f["item"]["arguments"].as_str().unwrap_or("").into(),
                    }),
                Some("response.function_call_arguments.delta") => {
                    args(&mut calls, f["delta"].as_str().expect("an arguments delta"))
                }
                _ => {}
            },
        }
    }
    (Some(content), calls)
}
