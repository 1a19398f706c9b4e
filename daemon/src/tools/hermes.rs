//! The Hermes form, `<tool_call>{"name": …, "arguments": …}</tool_call>`, the documented
//! default for ChatML-family models: the stream parser that finds calls in the text.

use serde_json::Value;

use super::call::{call_of, held_prefix, Out, Spacer};
use super::scan::{head, Head};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// A call body's arguments text: what follows `"arguments":` less the outer object's `}`.
fn args_text(rest: &str) -> &str {
    let t = rest.trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}

/// Where the parser is inside a `<tool_call>` block.
#[derive(Debug, Default)]
enum InCall {
    #[default]
    Outside,
    /// Reading the body's start (`{"name": "…", "arguments": `).
    Head,
    /// The name went out; the arguments stream. `sent`: bytes of them sent so far.
    Args { at: usize, sent: usize },
    /// Another form: the body goes out whole at the closing tag.
    Whole,
}

/// Parses the model's text as it arrives: text goes out at once, except what could be the
/// start of `<tool_call>` and whitespace (held until text follows, so the whitespace around
/// calls is not sent as content). Inside a call, the function name goes out as soon as it is
/// read and the arguments as they come, less what could be the end of the block (the
/// last `}` on); a body in another form goes out whole at its closing tag, and a block that
/// is not a call goes out as text.
#[derive(Debug, Default)]
pub struct HermesStream {
    buf: String,
    state: InCall,
    spacer: Spacer,
}

impl HermesStream {
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                InCall::Outside => {
                    if let Some(start) = self.buf.find(OPEN) {
                        let text: String = self.buf.drain(..start + OPEN.len()).collect();
                        self.content(&mut out, text[..start].to_string());
                        self.state = InCall::Head;
                        continue;
                    }
                    // Keep the longest tail that could begin `<tool_call>`.
                    let keep = held_prefix(&self.buf, OPEN);
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.content(&mut out, text);
                    break;
                }
                InCall::Head => {
                    let end = self.buf.find(CLOSE);
                    // Before the closing tag is whole, its possible start at the end is no
                    // part of the body: the whole text would not show it to `head` either.
                    let upto = end.unwrap_or(self.buf.len() - held_prefix(&self.buf, CLOSE));
                    match head(&self.buf[..upto], "arguments") {
                        // Arguments sent as a JSON string are decoded at the end.
                        Head::Args { at, .. } if self.buf[at..].starts_with('"') => {
                            self.state = InCall::Whole;
                        }
                        Head::Args { name, at } => {
                            self.spacer.call();
                            out.push(Out::CallStart(name));
                            self.state = InCall::Args { at, sent: 0 };
                        }
                        Head::More if end.is_none() => break,
                        Head::More | Head::No => self.state = InCall::Whole,
                    }
                }
                InCall::Args { at, sent } => {
                    let Some(end) = self.buf.find(CLOSE) else {
                        // Held back: what may still be the block's end (the start of
                        // `</tool_call>`, and a last `}` before it), and trailing whitespace,
                        // which may come before either: what is sent must stay a prefix of
                        // the arguments the closed block gives (`args_text`).
                        let t = &self.buf[at..];
                        let t = t[..t.len() - held_prefix(t, CLOSE)].trim_end();
                        let ready = t.strip_suffix('}').map_or(t, str::trim_end);
                        if ready.len() > sent {
                            out.push(Out::CallArgs(ready[sent..].to_string()));
                            self.state = InCall::Args {
                                at,
                                sent: ready.len(),
                            };
                        }
                        break;
                    };
                    let rest = args_text(&self.buf[at..end]);
                    if let Some(more) = rest.get(sent..).filter(|m| !m.is_empty()) {
                        out.push(Out::CallArgs(more.to_string()));
                    }
                    self.buf.drain(..end + CLOSE.len());
                    self.state = InCall::Outside;
                }
                InCall::Whole => {
                    let Some(end) = self.buf.find(CLOSE) else {
                        break;
                    };
                    let body: String = self.buf.drain(..end + CLOSE.len()).collect();
                    let body = &body[..end];
                    self.state = InCall::Outside;
                    match call_of(body) {
                        Some(call) => {
                            self.spacer.call();
                            out.push(Out::Call(call));
                        }
                        None => self.content(&mut out, format!("{OPEN}{body}{CLOSE}")),
                    }
                }
            }
        }
        out
    }

    /// The end of the output: what was held back goes out. An unclosed call still counts
    /// when its body is complete JSON; a streaming one sends the rest of its arguments.
    pub fn finish(mut self) -> Vec<Out> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            InCall::Outside => self.content(&mut out, rest),
            InCall::Head | InCall::Whole => match call_of(&rest) {
                Some(call) => out.push(Out::Call(call)),
                None => self.content(&mut out, format!("{OPEN}{rest}")),
            },
            InCall::Args { at, sent } => {
                let complete = serde_json::from_str::<Value>(rest.trim()).is_ok();
                let args = if complete {
                    args_text(&rest[at..])
                } else {
                    rest[at..].trim_end()
                };
                if let Some(more) = args.get(sent..).filter(|m| !m.is_empty()) {
                    out.push(Out::CallArgs(more.to_string()));
                }
            }
        }
        out
    }

    fn content(&mut self, out: &mut Vec<Out>, text: String) {
        self.spacer.content(out, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{Format, ToolCall};

    fn parse(text: &str) -> (Option<String>, Vec<ToolCall>) {
        crate::tools::parse(text, Format::Hermes)
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_calls_are_parsed_out_of_the_text() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \
                    \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(text);
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(
            calls,
            vec![
                call("get_weather", r#"{"city": "Paris"}"#),
                call("now", "{}")
            ]
        );
    }

    #[test]
    fn plain_text_is_content_and_no_calls() {
        assert_eq!(parse("Hello <tool"), (Some("Hello <tool".into()), vec![]));
        assert_eq!(parse(""), (None, vec![]));
    }

    #[test]
    fn a_block_that_is_not_a_call_stays_text() {
        let text = "<tool_call>not json</tool_call>";
        assert_eq!(parse(text), (Some(text.into()), vec![]));
    }

    #[test]
    fn string_arguments_are_kept_as_given() {
        let (_, calls) = parse(r#"<tool_call>{"name":"f","arguments":"{\"a\":1}"}</tool_call>"#);
        assert_eq!(calls, vec![call("f", r#"{"a":1}"#)]);
    }

    #[test]
    fn an_unclosed_complete_call_still_counts_at_the_end() {
        let (content, calls) = parse("<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n");
        assert_eq!((content, calls), (None, vec![call("f", "{}")]));
    }

    #[test]
    fn streamed_text_holds_back_only_a_possible_tag() {
        let mut s = HermesStream::default();
        assert_eq!(s.push("Hi <to"), vec![Out::Content("Hi".into())]);
        assert_eq!(s.push("ol_call>{\"name\":\"f\","), vec![]);
        assert_eq!(
            s.push("\"arguments\":{\"x\":1}}</tool_call>\n"),
            vec![
                Out::CallStart("f".into()),
                Out::CallArgs(r#"{"x":1}"#.into())
            ]
        );
        assert_eq!(s.push("bye"), vec![Out::Content("\nbye".into())]);
        assert_eq!(s.finish(), vec![]);
    }

    /// Feeds `text` one character at a time; returns what came out.
    fn trickle(text: &str) -> Vec<Out> {
        let mut s = HermesStream::default();
        let mut outs = Vec::new();
        for ch in text.chars() {
            outs.extend(s.push(&ch.to_string()));
        }
        outs.extend(s.finish());
        outs
    }

    #[test]
    fn streamed_arguments_go_out_as_they_come_and_add_up_to_the_whole() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"é\": \"<\", \"n\": {\"m\": [1, 2]}}}\n</tool_call>\n\
                    <tool_call>\n{\"name\":\"b\",\"arguments\":{}}\n</tool_call>";
        let outs = trickle(text);
        assert_eq!(outs[0], Out::CallStart("a".into()));
        let pieces = outs
            .iter()
            .take_while(|o| !matches!(o, Out::CallStart(n) if n == "b"))
            .filter(|o| matches!(o, Out::CallArgs(_)))
            .count();
        assert!(pieces > 3, "arguments streamed in pieces: {outs:?}");
        let mut args = String::new();
        for o in &outs[1..] {
            match o {
                Out::CallArgs(a) => args.push_str(a),
                Out::CallStart(n) => {
                    assert_eq!(n, "b");
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(args, r#"{"é": "<", "n": {"m": [1, 2]}}"#);
        assert_eq!(
            parse(text).1,
            vec![
                call("a", r#"{"é": "<", "n": {"m": [1, 2]}}"#),
                call("b", "{}")
            ]
        );
    }

    /// Found by the `tool_calls` fuzz target: arguments that do not end in `}` before the
    /// closing tag streamed the tag's start (`\n</tool_call`) as arguments, so the streamed
    /// call differed from the whole one.
    #[test]
    fn a_partial_closing_tag_is_never_streamed_as_arguments() {
        for text in [
            "<tool_call>{\"name\":\"f\",\"arguments\":{}x\n</tool_call>",
            "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1} <</tool_call>",
        ] {
            let mut args = String::new();
            for o in trickle(text) {
                match o {
                    Out::CallArgs(a) => args.push_str(&a),
                    Out::CallStart(n) => assert_eq!(n, "f"),
                    other => panic!("{other:?}"),
                }
            }
            let whole = parse(text).1;
            assert_eq!(whole.len(), 1, "{text}");
            assert_eq!(args, whole[0].arguments, "{text}");
            assert!(!args.contains("</"), "{args:?}");
        }
    }

    /// Found by the `tool_calls` fuzz target: a body that closed right after
    /// `"arguments":` was text when answered whole, but streamed as a call, the `<` of
    /// `</tool_call>` taken for the start of its arguments.
    #[test]
    fn the_closing_tags_start_is_not_taken_for_arguments() {
        let text = "<tool_call>\n{\"name\": \"now\", \"arguments\":\n</tool_call>";
        assert_eq!(parse(text), (Some(text.into()), vec![]));
        assert_eq!(trickle(text), vec![Out::Content(text.into())]);
    }

    #[test]
    fn a_body_with_the_arguments_first_goes_out_whole() {
        let text = r#"<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>"#;
        assert_eq!(trickle(text), vec![Out::Call(call("f", r#"{"x":1}"#))]);
    }
}
