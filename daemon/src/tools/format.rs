//! The forms model families write tool calls in: which one a chat template wants, its
//! control-token markers, earlier calls written back for the prompt, and fresh call ids.

use serde::Serialize;
use serde_json::Value;

use super::call::PastCall;
use super::hermes;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::call::ToolCall;
    use crate::tools::parse;

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
}
