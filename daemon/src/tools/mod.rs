//! Tool calls: what the client offered (`tools`, `tool_choice`, `parallel_tool_calls`), the
//! form the model family writes calls in, the grammar that forces a call, and the parser
//! that turns the model's text into OpenAI `tool_calls`, whole or as it streams.
//!
//! Three forms, chosen by the chat template (see [`Format::detect`]):
//! - **Hermes** (`<tool_call>{"name": …, "arguments": …}</tool_call>`), the documented
//!   default for ChatML-family models (Qwen, SmolLM2, Hermes) and any template without a
//!   form of its own: [`hermes`].
//! - **Llama 3.x**: a bare `{"name": …, "parameters": …}` as the whole reply, optionally
//!   after the `<|python_tag|>` token: [`json_form`].
//! - **Mistral**: `[TOOL_CALLS][{"name": …, "arguments": …, "id": …}, …]`: [`json_form`].

mod hermes;
mod json_form;
mod scan;

use serde::Serialize;
use serde_json::{json, Value};

pub use hermes::OPEN as HERMES_OPEN;

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

/// How a model family writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Hermes,
    Llama3,
    Mistral,
}

/// Llama 3.x's marker before a call (a control token).
pub const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's marker before the list of calls (a control token).
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

impl Format {
    /// The form a chat template's family writes: Mistral's when the template writes
    /// `[TOOL_CALLS]`, Llama 3's when it writes `<|python_tag|>` or asks for
    /// `"parameters"` in a Llama 3 header layout, Hermes otherwise.
    pub fn detect(template: &str) -> Self {
        if template.contains(MISTRAL_CALLS) {
            Self::Mistral
        } else if template.contains(PYTHON_TAG)
            || (template.contains("<|start_header_id|>") && template.contains("\"parameters\""))
        {
            Self::Llama3
        } else {
            Self::Hermes
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
        }
    }

    /// Control tokens of this form that must reach the parser spelled out (a control
    /// token's text is otherwise left out of the output).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes => &[],
            Self::Llama3 => &[PYTHON_TAG],
            Self::Mistral => &[MISTRAL_CALLS],
        }
    }

    /// An assistant message's earlier calls, written as this family's model writes them,
    /// for its turn in the prompt.
    pub fn calls_text(self, calls: &[PastCall]) -> String {
        let args = |c: &PastCall| {
            serde_json::from_str::<Value>(&c.arguments)
                .unwrap_or_else(|_| Value::String(c.arguments.clone()))
        };
        let name = |c: &PastCall| Value::from(c.name.as_str());
        // Written by hand: the name first, whatever the JSON map's key order.
        match self {
            Self::Hermes => calls
                .iter()
                .map(|c| {
                    format!(
                        "{}\n{{\"name\":{},\"arguments\":{}}}\n{}",
                        hermes::OPEN,
                        name(c),
                        args(c),
                        hermes::CLOSE
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Self::Llama3 => calls
                .iter()
                .map(|c| format!("{{\"name\": {}, \"parameters\": {}}}", name(c), args(c)))
                .collect::<Vec<_>>()
                .join("; "),
            Self::Mistral => {
                let list = calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{{\"name\": {}, \"arguments\": {}, \"id\": {}}}",
                            name(c),
                            args(c),
                            Value::from(c.id.as_str())
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("{MISTRAL_CALLS}[{list}]")
            }
        }
    }

    /// A fresh call id: OpenAI's shape, except Mistral's 9 alphanumerics, which its
    /// template requires of the `tool_call_id` that comes back with the result.
    pub fn call_id(self) -> String {
        use rand::distributions::{Alphanumeric, DistString};
        let mut rng = rand::thread_rng();
        match self {
            Self::Mistral => Alphanumeric.sample_string(&mut rng, 9),
            _ => format!("call_{}", Alphanumeric.sample_string(&mut rng, 24)),
        }
    }
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

    /// Whether `tool_choice` forces a call (`required` or a named function).
    pub fn forces(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The Lark grammar that forces the output to be calls in `format`: `None` unless
    /// `tool_choice` is `required` or names a function. The forms' control-token markers
    /// are left out (the parser takes a forced reply without them): the grammar is plain
    /// text, the same for every vocabulary.
    pub fn grammar(&self, format: Format) -> Option<String> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
        };
        let args_key = match format {
            Format::Llama3 => "parameters",
            Format::Hermes | Format::Mistral => "arguments",
        };
        let call = json!({
            "anyOf": allowed.iter().map(|t| json!({
                "type": "object",
                "properties": {
                    "name": { "const": t.name },
                    args_key: t.parameters,
                },
                "required": ["name", args_key],
                "additionalProperties": false,
            })).collect::<Vec<_>>(),
            "x-guidance": { "whitespace_flexible": false },
        });
        let (start, more) = match format {
            Format::Hermes => ("start: call", "(\"\\n\" call)*"),
            Format::Llama3 => ("start: call", "(\"; \" call)*"),
            Format::Mistral => ("start: \"[\" call", "(\", \" call)* \"]\""),
        };
        let end = match format {
            Format::Mistral => " \"]\"",
            _ => "",
        };
        let start = if self.parallel {
            format!("{start} {more}")
        } else {
            format!("{start}{end}")
        };
        let call = match format {
            Format::Hermes => format!(
                "\"{}\\n\" %json {call} \"\\n{}\"",
                hermes::OPEN,
                hermes::CLOSE
            ),
            Format::Llama3 | Format::Mistral => format!("%json {call}"),
        };
        Some(format!("{start}\ncall: {call}\n"))
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

/// A call from an earlier assistant message, as the client sent it back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PastCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
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

/// Content as it goes out around calls: whitespace is held until text follows, so the
/// whitespace around calls is not sent as content.
#[derive(Debug, Default)]
struct Spacer {
    space: String,
}

impl Spacer {
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

    /// A call went out: the whitespace before it was not content.
    fn call(&mut self) {
        self.space.clear();
    }
}

/// The body of one call (`{"name": …, "arguments"|"parameters": …}`) as a call, if it is
/// one. Arguments are the model's own text when the body is in the name-first form (what a
/// stream sends), else the JSON re-written.
fn call_of(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    for key in ["arguments", "parameters"] {
        if let scan::Head::Args { name: n, at } = scan::head(body, key) {
            let raw = scan::value_end(&body[at..]).map(|e| &body[at..at + e]);
            if let Some(raw) = raw.filter(|r| n == name && !r.starts_with('"')) {
                return Some(ToolCall {
                    name,
                    arguments: raw.to_string(),
                });
            }
        }
    }
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn past(name: &str, arguments: &str) -> PastCall {
        PastCall {
            id: "abcDEF123".into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn the_form_follows_the_template_family() {
        let fixture = |f: &str| {
            let path = format!(
                "{}/tests/fixtures/chat_templates/{f}.jinja",
                env!("CARGO_MANIFEST_DIR")
            );
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        assert_eq!(Format::detect(&fixture("llama3.2")), Format::Llama3);
        assert_eq!(Format::detect(&fixture("mistral-nemo")), Format::Mistral);
        for hermes in ["qwen2.5", "smollm2", "gemma2", "gemma3", "phi3.5"] {
            assert_eq!(Format::detect(&fixture(hermes)), Format::Hermes, "{hermes}");
        }
    }

    #[test]
    fn earlier_calls_are_written_back_in_each_family_form() {
        let calls = [past("f", r#"{"a": 1}"#)];
        let hermes = Format::Hermes.calls_text(&calls);
        assert_eq!(
            hermes,
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>"
        );
        let llama = Format::Llama3.calls_text(&calls);
        assert_eq!(llama, r#"{"name": "f", "parameters": {"a":1}}"#);
        let mistral = Format::Mistral.calls_text(&calls);
        assert_eq!(
            mistral,
            r#"[TOOL_CALLS][{"name": "f", "arguments": {"a":1}, "id": "abcDEF123"}]"#
        );
        // Each parses back to the call it came from.
        for (format, text) in [
            (Format::Hermes, hermes),
            (Format::Llama3, llama),
            (Format::Mistral, mistral),
        ] {
            let (content, parsed) = parse(&text, format);
            assert_eq!(content, None, "{format:?}");
            assert_eq!(
                parsed,
                vec![ToolCall {
                    name: "f".into(),
                    arguments: r#"{"a":1}"#.into()
                }],
                "{format:?}"
            );
        }
    }

    #[test]
    fn mistral_ids_are_nine_alphanumerics_and_others_are_openai_shaped() {
        let id = Format::Mistral.call_id();
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert!(Format::Hermes.call_id().starts_with("call_"));
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
        let g = weather()
            .grammar(Format::Hermes)
            .expect("required forces a call");
        assert!(g.starts_with("start: call\n"), "{g}");
        assert!(g.contains(r#"call: "<tool_call>\n" %json {"#), "{g}");
        assert!(g.contains(r#""const":"get_weather""#), "{g}");
        assert!(g.trim_end().ends_with(r#""\n</tool_call>""#), "{g}");
        let mut auto = weather();
        auto.choice = ToolChoice::Auto;
        assert_eq!(auto.grammar(Format::Hermes), None);
        assert!(!auto.forces());
        auto.choice = ToolChoice::Required;
        auto.parallel = true;
        assert!(auto
            .grammar(Format::Hermes)
            .unwrap()
            .starts_with("start: call (\"\\n\" call)*"));
    }

    #[test]
    fn forced_calls_in_the_json_forms_use_their_keys_and_lists() {
        let llama = weather().grammar(Format::Llama3).unwrap();
        assert!(llama.starts_with("start: call\ncall: %json {"), "{llama}");
        assert!(
            llama.contains(r#""parameters":{"type":"object""#),
            "{llama}"
        );
        assert!(!llama.contains(r#""arguments""#), "{llama}");
        let mistral = weather().grammar(Format::Mistral).unwrap();
        assert!(
            mistral.starts_with("start: \"[\" call \"]\"\n"),
            "{mistral}"
        );
        assert!(
            mistral.contains(r#""arguments":{"type":"object""#),
            "{mistral}"
        );
        let mut parallel = weather();
        parallel.parallel = true;
        let g = parallel.grammar(Format::Mistral).unwrap();
        assert!(
            g.starts_with("start: \"[\" call (\", \" call)* \"]\"\n"),
            "{g}"
        );
    }

    #[test]
    fn the_system_text_lists_every_tool() {
        let s = weather().system_text();
        assert!(s.contains(r#""name":"get_weather""#), "{s}");
        assert!(s.contains("<tool_call>"), "{s}");
    }
}
