//! Calls as the parsers find them, and the pieces every form's parser shares: the output
//! events, the whitespace held around calls, and reading one call's JSON body.

use serde_json::Value;

use super::scan;

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
/// Content as it goes out around calls: whitespace is held until text follows, so the
/// whitespace around calls is not sent as content.
#[derive(Debug, Default)]
pub(super) struct Spacer {
    space: String,
}

impl Spacer {
    pub(super) fn content(&mut self, out: &mut Vec<Out>, text: String) {
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
    pub(super) fn call(&mut self) {
        self.space.clear();
    }
}

/// The body of one call (`{"name": …, "arguments"|"parameters": …}`) as a call, if it is
/// one. Arguments are the model's own text when the body is in the name-first form (what a
/// stream sends), else the JSON re-written.
pub(super) fn call_of(body: &str) -> Option<ToolCall> {
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

/// How many bytes at the end of `buf` could be the start of `marker` (held back).
pub(super) fn held_prefix(buf: &str, marker: &str) -> usize {
    (1..marker.len().min(buf.len() + 1))
        .rev()
        .find(|n| buf.is_char_boundary(buf.len() - n) && marker.starts_with(&buf[buf.len() - n..]))
        .unwrap_or(0)
}
