//! Tool calls in the Hermes form (`<tool_call>{"name": …, "arguments": …}</tool_call>`), the
//! documented default for ChatML-family models: the system text that tells a model without
//! a tool-aware template which tools it has, the Lark grammar that forces a call
//! (`tool_choice` `required` or a named function), and the parser that turns the model's
//! text into OpenAI `tool_calls`, whole or as it streams.

use serde_json::{json, Value};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// One function the client offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Its arguments' JSON schema (`{"type": "object"}` when the client gave none).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tools of a request that may call them (`tool_choice` other than `none`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolUse {
    /// The tools as OpenAI sends them, for a template's `tools` variable.
    pub fn template_value(&self) -> Value {
        Value::Array(self.tools.iter().map(openai_tool).collect())
    }

    /// The Hermes system text for a template that knows nothing of tools.
    pub fn system_text(&self) -> String {
        let mut out = String::from(
            "You are a function calling AI model. You are provided with function signatures \
             within <tools></tools> XML tags. You may call one or more functions to assist \
             with the user query. Don't make assumptions about what values to plug into \
             functions. Here are the available tools: <tools>\n",
        );
        for t in &self.tools {
            out.push_str(&openai_tool(t).to_string());
            out.push('\n');
        }
        out.push_str(
            "</tools>\nFor each function call return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n\
             {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        out
    }

    /// The grammar that forces the output to be calls: `None` unless `tool_choice` is
    /// `required` or names a function.
    pub fn grammar(&self) -> Option<String> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
        };
        let call = json!({
            "anyOf": allowed.iter().map(|t| json!({
                "type": "object",
                "properties": {
                    "name": { "const": t.name },
                    "arguments": t.parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })).collect::<Vec<_>>(),
            "x-guidance": { "whitespace_flexible": false },
        });
        let start = if self.parallel {
            "start: call (\"\\n\" call)*"
        } else {
            "start: call"
        };
        Some(format!(
            "{start}\ncall: \"{OPEN}\\n\" %json {call} \"\\n{CLOSE}\"\n"
        ))
    }
}

fn openai_tool(t: &Tool) -> Value {
    let mut function = json!({ "name": t.name, "parameters": t.parameters });
    if let Some(d) = &t.description {
        function["description"] = Value::String(d.clone());
    }
    json!({ "type": "function", "function": function })
}

/// A call the model made: `arguments` is JSON text, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// An assistant message's earlier calls written back in the Hermes form, for its turn.
pub fn hermes_text(calls: &[(String, String)]) -> String {
    calls
        .iter()
        .map(|(name, arguments)| {
            let args: Value = serde_json::from_str(arguments)
                .unwrap_or_else(|_| Value::String(arguments.clone()));
            // Written by hand: the name first, whatever the JSON map's key order.
            format!(
                "{OPEN}\n{{\"name\":{},\"arguments\":{args}}}\n{CLOSE}",
                Value::from(name.as_str())
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The body of one `<tool_call>…</tool_call>` as a call, if it is one. Arguments are the
/// model's own text when the body has the `{"name": …, "arguments": …}` form (what a
/// stream sends), else the JSON re-written.
fn call_of(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    if let Head::Args { name: n, at } = head(body) {
        let raw = args_text(&body[at..]);
        let parsed = serde_json::from_str::<Value>(raw);
        if n == name && parsed.is_ok_and(|v| !v.is_string()) {
            return Some(ToolCall {
                name,
                arguments: raw.to_string(),
            });
        }
    }
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// How far the start of a call's body matches `{"name": "…", "arguments": `.
#[derive(Debug, PartialEq)]
enum Head {
    /// It may still: more text is needed.
    More,
    /// It cannot (another key order, or not JSON): the call is parsed whole at its end.
    No,
    /// It does: the function's name, and where its arguments begin.
    Args { name: String, at: usize },
}

fn head(body: &str) -> Head {
    let b = body.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Matches `lit` at `i`: Some(true) matched, Some(false) cannot, None needs more.
    let lit = |i: &mut usize, lit: &str| -> Option<bool> {
        let rest = &b[*i..];
        let n = rest.len().min(lit.len());
        if rest[..n] != lit.as_bytes()[..n] {
            return Some(false);
        }
        if n < lit.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    macro_rules! expect {
        ($l:expr) => {
            ws(&mut i);
            match lit(&mut i, $l) {
                Some(true) => {}
                Some(false) => return Head::No,
                None => return Head::More,
            }
        };
    }
    expect!("{");
    expect!("\"name\"");
    expect!(":");
    ws(&mut i);
    if i == b.len() {
        return Head::More;
    }
    if b[i] != b'"' {
        return Head::No;
    }
    // The name string, escapes and all.
    let mut j = i + 1;
    loop {
        match b.get(j) {
            None => return Head::More,
            Some(b'\\') => j += 2,
            Some(b'"') => break,
            Some(_) => j += 1,
        }
    }
    let Ok(name) = serde_json::from_str::<String>(&body[i..=j]) else {
        return Head::No;
    };
    i = j + 1;
    expect!(",");
    expect!("\"arguments\"");
    expect!(":");
    ws(&mut i);
    if i == b.len() {
        return Head::More;
    }
    Head::Args { name, at: i }
}

/// A call body's arguments text: what follows `"arguments":` less the outer object's `}`.
fn args_text(rest: &str) -> &str {
    let t = rest.trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}

/// What the model wrote, split into text and calls, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Content(String),
    /// A call begins: its function's name is known.
    CallStart(String),
    /// More of the arguments of the call begun last.
    CallArgs(String),
    /// A whole call (its body did not begin in the `name`-first form).
    Call(ToolCall),
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
pub struct ToolStream {
    buf: String,
    state: InCall,
    /// Whitespace held back (it goes out before the next text).
    space: String,
}

impl ToolStream {
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
                    let keep = (1..OPEN.len().min(self.buf.len() + 1))
                        .rev()
                        .find(|n| {
                            self.buf.is_char_boundary(self.buf.len() - n)
                                && OPEN.starts_with(&self.buf[self.buf.len() - n..])
                        })
                        .unwrap_or(0);
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.content(&mut out, text);
                    break;
                }
                InCall::Head => {
                    let end = self.buf.find(CLOSE);
                    let upto = end.unwrap_or(self.buf.len());
                    match head(&self.buf[..upto]) {
                        // Arguments sent as a JSON string are decoded at the end.
                        Head::Args { at, .. } if self.buf[at..].starts_with('"') => {
                            self.state = InCall::Whole;
                        }
                        Head::Args { name, at } => {
                            self.space.clear();
                            out.push(Out::CallStart(name));
                            self.state = InCall::Args { at, sent: 0 };
                        }
                        Head::More if end.is_none() => break,
                        Head::More | Head::No => self.state = InCall::Whole,
                    }
                }
                InCall::Args { at, sent } => {
                    let Some(end) = self.buf.find(CLOSE) else {
                        // Held back: what may still be the block's end (a last `}` followed
                        // only by whitespace and the start of `</tool_call>`), and trailing
                        // whitespace, which may come before that `}`.
                        let t = &self.buf[at..];
                        let tail_is_end = |after: &str| CLOSE.starts_with(after.trim_start());
                        let ready = match t.rfind('}') {
                            Some(b) if tail_is_end(&t[b + 1..]) => t[..b].trim_end(),
                            _ => t.trim_end(),
                        };
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
                            self.space.clear();
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
        if text.trim().is_empty() {
            self.space.push_str(&text);
            return;
        }
        let mut s = std::mem::take(&mut self.space);
        s.push_str(&text);
        // Trailing whitespace waits too: it may only separate two calls.
        let trimmed = s.trim_end().len();
        self.space = s[trimmed..].to_string();
        s.truncate(trimmed);
        out.push(Out::Content(s));
    }
}

/// A whole output: its text (calls removed, `None` when only whitespace is left) and calls.
pub fn parse(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = ToolStream::default();
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut s = ToolStream::default();
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
        let mut s = ToolStream::default();
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

    #[test]
    fn a_body_with_the_arguments_first_goes_out_whole() {
        let text = r#"<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>"#;
        assert_eq!(trickle(text), vec![Out::Call(call("f", r#"{"x":1}"#))]);
    }

    #[test]
    fn the_head_of_a_call_is_recognised_as_soon_as_it_is_complete() {
        assert_eq!(head(" {\"na"), Head::More);
        assert_eq!(head("{\"name\": \"f\\\"g\", \"arguments\""), Head::More);
        assert_eq!(
            head("{\"name\": \"f\\\"g\", \"arguments\": {"),
            Head::Args {
                name: "f\"g".into(),
                at: 30
            }
        );
        assert_eq!(head("{\"arguments\": {}"), Head::No);
        assert_eq!(head("hello"), Head::No);
    }

    fn weather() -> ToolUse {
        ToolUse {
            tools: vec![Tool {
                name: "get_weather".into(),
                description: Some("Weather in a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}),
            }],
            choice: ToolChoice::Required,
            parallel: false,
        }
    }

    #[test]
    fn a_forced_call_is_a_grammar_of_the_tag_and_the_functions_schema() {
        let g = weather().grammar().expect("required forces a call");
        assert!(g.starts_with("start: call\n"), "{g}");
        assert!(g.contains(r#"call: "<tool_call>\n" %json {"#), "{g}");
        assert!(g.contains(r#""const":"get_weather""#), "{g}");
        assert!(g.trim_end().ends_with(r#""\n</tool_call>""#), "{g}");
        let mut auto = weather();
        auto.choice = ToolChoice::Auto;
        assert_eq!(auto.grammar(), None);
        auto.choice = ToolChoice::Required;
        auto.parallel = true;
        assert!(auto
            .grammar()
            .unwrap()
            .starts_with("start: call (\"\\n\" call)*"));
    }

    #[test]
    fn earlier_calls_are_written_back_in_the_hermes_form() {
        let text = hermes_text(&[("f".into(), r#"{"a": 1}"#.into())]);
        assert_eq!(
            text,
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>"
        );
        assert_eq!(parse(&text).1, vec![call("f", r#"{"a":1}"#)]);
    }

    #[test]
    fn the_system_text_lists_every_tool() {
        let s = weather().system_text();
        assert!(s.contains(r#""name":"get_weather""#), "{s}");
        assert!(s.contains("<tool_call>"), "{s}");
    }
}
