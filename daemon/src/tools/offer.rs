//! What the client offered (`tools`, `tool_choice`, `parallel_tool_calls`) and how it is put
//! before the model: the template's `tools` value, or the Hermes system text.

use serde_json::{json, Value};

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

    /// Whether `tool_choice` forces a call (`required` or a named function).
    pub fn forces(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }
}

fn openai_tool(t: &Tool) -> Value {
    let mut function = json!({ "name": t.name, "parameters": t.parameters });
    if let Some(d) = &t.description {
        function["description"] = Value::String(d.clone());
    }
    json!({ "type": "function", "function": function })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// One forced function, `get_weather(city)`.
    pub(in crate::tools) fn weather() -> ToolUse {
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
    fn the_system_text_lists_every_tool() {
        let s = weather().system_text();
        assert!(s.contains(r#""name":"get_weather""#), "{s}");
        assert!(s.contains("<tool_call>"), "{s}");
    }
}
