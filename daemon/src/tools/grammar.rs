//! The Lark grammar that forces a reply to be calls in the model family's form.

use serde_json::json;

use super::format::Format;
use super::hermes;
use super::offer::{Tool, ToolChoice, ToolUse};

impl ToolUse {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::offer::tests::weather;

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
}
