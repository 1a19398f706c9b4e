//! The forms that write calls as bare JSON objects:
//! - Llama 3.x: the reply *is* the call, `{"name": …, "parameters": …}`, optionally after
//!   `<|python_tag|>`; several are separated by `;`. A reply that begins otherwise is text.
//! - Mistral: text, then `[TOOL_CALLS]` and a JSON list of `{"name": …, "arguments": …,
//!   "id": …}`.
//!
//! A forced reply (see [`ToolUse::grammar`](super::ToolUse::grammar)) has no marker: a
//! Mistral reply that opens with a list of objects is taken as that list.

use super::call::{call_of, held_prefix, Out, Spacer};
use super::format::{MISTRAL_CALLS, PYTHON_TAG};
use super::scan::{head, value_end, Head};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Llama3,
    Mistral,
}

impl Form {
    fn args_key(self) -> &'static str {
        match self {
            Self::Llama3 => "parameters",
            Self::Mistral => "arguments",
        }
    }
}

/// Where the parser is. In the call states the buffer begins at the call's `{`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The reply's start: is it a call?
    Lead,
    /// Llama 3: the reply is text; no call follows.
    Text,
    /// Mistral: text, until `[TOOL_CALLS]`.
    Outside,
    /// Mistral: after `[TOOL_CALLS]`, before the list's `[`.
    Open,
    /// Between calls: separators, the next call, or (Mistral) the list's end.
    List,
    /// Reading the call's start (`{"name": "…", "<args key>": `).
    Head,
    /// The name went out; the arguments stream. `sent`: bytes of them sent so far.
    Args { at: usize, sent: usize },
    /// The arguments went out; the rest of the call's object is skipped.
    Tail,
    /// Another form: the call goes out whole when its object is complete.
    Whole,
}

/// Parses a reply in the Llama 3 or Mistral form as it arrives: the name of each call goes
/// out as soon as it is read, its arguments as they come (a JSON value is delimited
/// exactly, so nothing after it is sent), text as content.
#[derive(Debug)]
pub struct JsonStream {
    form: Form,
    buf: String,
    state: State,
    spacer: Spacer,
}

impl JsonStream {
    pub fn llama3() -> Self {
        Self::new(Form::Llama3)
    }

    pub fn mistral() -> Self {
        Self::new(Form::Mistral)
    }

    fn new(form: Form) -> Self {
        Self {
            form,
            buf: String::new(),
            state: State::Lead,
            spacer: Spacer::default(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// One move of the state machine; `false` when it needs more text.
    fn step(&mut self, out: &mut Vec<Out>) -> bool {
        match self.state {
            State::Lead => self.lead(),
            State::Text => {
                let text = std::mem::take(&mut self.buf);
                self.spacer.content(out, text);
                false
            }
            State::Outside => {
                if let Some(start) = self.buf.find(MISTRAL_CALLS) {
                    let text: String = self.buf.drain(..start + MISTRAL_CALLS.len()).collect();
                    self.spacer.content(out, text[..start].to_string());
                    self.state = State::Open;
                    return true;
                }
                let keep = held_prefix(&self.buf, MISTRAL_CALLS);
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.spacer.content(out, text);
                false
            }
            State::Open => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                if t.starts_with('[') {
                    let skip = self.buf.len() - t.len() + 1;
                    self.buf.drain(..skip);
                    self.state = State::List;
                } else {
                    // A marker without a list: what follows is text.
                    self.state = State::Outside;
                }
                true
            }
            State::List => self.list(),
            State::Head => match head(&self.buf, self.form.args_key()) {
                // Arguments sent as a JSON string are decoded when the call is whole.
                Head::Args { at, .. } if self.buf[at..].starts_with('"') => {
                    self.state = State::Whole;
                    true
                }
                Head::Args { name, at } => {
                    self.spacer.call();
                    out.push(Out::CallStart(name));
                    self.state = State::Args { at, sent: 0 };
                    true
                }
                Head::More => false,
                Head::No => {
                    self.state = State::Whole;
                    true
                }
            },
            State::Args { at, sent } => {
                let value = &self.buf[at..];
                let (ready, done) = match value_end(value) {
                    Some(end) => (&value[..end], true),
                    None => (value, false),
                };
                if ready.len() > sent {
                    out.push(Out::CallArgs(ready[sent..].to_string()));
                }
                self.state = if done {
                    State::Tail
                } else {
                    State::Args {
                        at,
                        sent: ready.len(),
                    }
                };
                done
            }
            State::Tail => match value_end(&self.buf) {
                Some(end) => {
                    self.buf.drain(..end);
                    self.state = State::List;
                    true
                }
                None => false,
            },
            State::Whole => match value_end(&self.buf) {
                Some(end) => {
                    let body: String = self.buf.drain(..end).collect();
                    match call_of(&body) {
                        Some(call) => {
                            self.spacer.call();
                            out.push(Out::Call(call));
                        }
                        None => self.spacer.content(out, body),
                    }
                    self.state = State::List;
                    true
                }
                None => false,
            },
        }
    }

    /// The reply's start: a call (Llama 3: `{` or `<|python_tag|>`; Mistral: a list of
    /// objects, with or without its marker), or text.
    fn lead(&mut self) -> bool {
        let t = self.buf.trim_start();
        if t.is_empty() {
            return false;
        }
        let lead = self.buf.len() - t.len();
        match self.form {
            Form::Llama3 => {
                if t.starts_with(PYTHON_TAG) || t.starts_with('{') {
                    // Whitespace before a call is not content.
                    self.buf.drain(..lead);
                    self.state = State::List;
                } else if PYTHON_TAG.starts_with(t) {
                    return false;
                } else {
                    self.state = State::Text;
                }
            }
            Form::Mistral => {
                let after = t.strip_prefix('[').map(str::trim_start);
                match after {
                    Some(a) if a.starts_with('{') => {
                        self.buf.drain(..lead + 1);
                        self.state = State::List;
                    }
                    Some(a) if a.is_empty() || MISTRAL_CALLS.starts_with(t) => return false,
                    _ => self.state = State::Outside,
                }
            }
        }
        true
    }

    /// Between calls: drops separators, then finds what comes next.
    fn list(&mut self) -> bool {
        let skip = self
            .buf
            .find(|c: char| !(c.is_whitespace() || c == ';' || c == ','))
            .unwrap_or(self.buf.len());
        let t = &self.buf[skip..];
        if t.is_empty() {
            return false;
        }
        match self.form {
            _ if t.starts_with('{') => {
                self.buf.drain(..skip);
                self.state = State::Head;
            }
            Form::Llama3 if t.starts_with(PYTHON_TAG) => {
                self.buf.drain(..skip + PYTHON_TAG.len());
            }
            Form::Llama3 if PYTHON_TAG.starts_with(t) => return false,
            Form::Llama3 => {
                // Text after the calls (or a built-in tool's `name.call(…)` form).
                self.buf.drain(..skip);
                self.state = State::Text;
            }
            Form::Mistral if t.starts_with(']') => {
                self.buf.drain(..skip + 1);
                self.state = State::Outside;
            }
            Form::Mistral => {
                self.buf.drain(..skip);
                self.state = State::Outside;
            }
        }
        true
    }

    /// The end of the output: what was held back goes out. An unfinished call still counts
    /// when what was read of it is a whole call; a streaming one sends the rest of what
    /// its arguments got to.
    pub fn finish(mut self) -> Vec<Out> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Lead | State::Text | State::Outside | State::List | State::Open => {
                self.spacer.content(&mut out, rest)
            }
            State::Head | State::Whole => match call_of(&rest) {
                Some(call) => out.push(Out::Call(call)),
                None => self.spacer.content(&mut out, rest),
            },
            State::Args { at, sent } => {
                let args = rest[at..].trim_end();
                if let Some(more) = args.get(sent..).filter(|m| !m.is_empty()) {
                    out.push(Out::CallArgs(more.to_string()));
                }
            }
            State::Tail => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{parse, Format, ToolCall};

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Feeds `text` one character at a time; returns what came out.
    fn trickle(mut s: JsonStream, text: &str) -> Vec<Out> {
        let mut outs = Vec::new();
        for ch in text.chars() {
            outs.extend(s.push(&ch.to_string()));
        }
        outs.extend(s.finish());
        outs
    }

    /// The calls a stream of outs adds up to, and its text.
    fn gather(outs: &[Out]) -> (String, Vec<ToolCall>) {
        let mut text = String::new();
        let mut calls: Vec<ToolCall> = Vec::new();
        for o in outs {
            match o {
                Out::Content(c) => text.push_str(c),
                Out::CallStart(n) => calls.push(call(n, "")),
                Out::CallArgs(a) => calls.last_mut().expect("a call began").arguments += a,
                Out::Call(c) => calls.push(c.clone()),
            }
        }
        (text, calls)
    }

    #[test]
    fn a_llama3_reply_that_is_a_call_is_the_call() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris }\"}}";
        assert_eq!(
            parse(text, Format::Llama3),
            (None, vec![call("get_weather", r#"{"city": "Paris }"}"#)])
        );
        let tagged = format!("<|python_tag|>{text}");
        assert_eq!(
            parse(&tagged, Format::Llama3).1,
            vec![call("get_weather", r#"{"city": "Paris }"}"#)]
        );
    }

    #[test]
    fn a_llama3_call_streams_its_name_then_its_arguments_in_pieces() {
        let text = "\n{\"name\": \"f\", \"parameters\": {\"a\": [1, 2], \"b\": \"x\"}}; \
                    {\"name\": \"g\", \"parameters\": {}}";
        let outs = trickle(JsonStream::llama3(), text);
        assert_eq!(outs[0], Out::CallStart("f".into()));
        let pieces = outs
            .iter()
            .filter(|o| matches!(o, Out::CallArgs(_)))
            .count();
        assert!(pieces > 5, "{outs:?}");
        assert_eq!(
            gather(&outs),
            (
                String::new(),
                vec![call("f", r#"{"a": [1, 2], "b": "x"}"#), call("g", "{}")]
            )
        );
    }

    #[test]
    fn a_llama3_reply_in_words_is_text_even_with_json_later() {
        let text = "The weather: {\"name\": \"f\", \"parameters\": {}}";
        assert_eq!(parse(text, Format::Llama3), (Some(text.into()), vec![]));
        assert_eq!(
            gather(&trickle(JsonStream::llama3(), text)),
            (text.into(), vec![])
        );
    }

    #[test]
    fn a_llama3_json_reply_that_is_not_a_call_stays_text() {
        let text = r#"{"answer": 42}"#;
        assert_eq!(parse(text, Format::Llama3), (Some(text.into()), vec![]));
    }

    #[test]
    fn an_unfinished_llama3_call_sends_what_it_got() {
        let (_, calls) = gather(&trickle(
            JsonStream::llama3(),
            "{\"name\": \"f\", \"parameters\": {\"a\": 1",
        ));
        assert_eq!(calls, vec![call("f", r#"{"a": 1"#)]);
    }

    #[test]
    fn mistral_calls_follow_their_marker_after_text() {
        let text = "Let me check. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"]\"}, \
                    \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}}]";
        let expected = (
            "Let me check.".to_string(),
            vec![call("f", r#"{"q": "]"}"#), call("g", "{}")],
        );
        assert_eq!(gather(&trickle(JsonStream::mistral(), text)), expected);
        let (content, calls) = parse(text, Format::Mistral);
        assert_eq!((content.unwrap_or_default(), calls), expected);
    }

    #[test]
    fn a_forced_mistral_list_needs_no_marker() {
        let text = r#"[{"name":"f","arguments":{"x":1}}]"#;
        assert_eq!(
            gather(&trickle(JsonStream::mistral(), text)),
            (String::new(), vec![call("f", r#"{"x":1}"#)])
        );
    }

    #[test]
    fn mistral_text_with_brackets_or_a_partial_marker_is_text() {
        for text in ["[1, 2] are numbers", "[TOOL", "a [TOOL_CALL list"] {
            assert_eq!(parse(text, Format::Mistral), (Some(text.into()), vec![]));
            assert_eq!(
                gather(&trickle(JsonStream::mistral(), text)),
                (text.into(), vec![]),
                "{text}"
            );
        }
    }

    #[test]
    fn a_call_with_another_key_order_goes_out_whole() {
        let text = r#"[TOOL_CALLS][{"arguments": {"x": 1}, "name": "f"}]"#;
        assert_eq!(
            trickle(JsonStream::mistral(), text),
            vec![Out::Call(call("f", r#"{"x":1}"#))]
        );
    }
}
