//! `tools`, `tool_choice` and `parallel_tool_calls`: the functions a chat answer may call.

use serde_json::Value;

use super::format::valid_name;
use super::request::InvalidRequest;
use crate::tools::{Tool, ToolChoice, ToolUse};

/// `tools`, `tool_choice` and `parallel_tool_calls`. `None` when no tool may be called
/// (no tools, or `tool_choice: "none"`): the tools are then not shown to the model.
pub(super) fn tool_use(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolUse>, InvalidRequest> {
    let list = match tools.filter(|t| !t.is_null()) {
        None => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err(InvalidRequest::field("tools", "must be an array")),
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        if kind != Some("function") {
            return Err(InvalidRequest::field(
                &format!("tools[{i}].type"),
                "must be `function` (the only tool type this server supports)",
            ));
        }
        let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
            InvalidRequest::field(&format!("tools[{i}].function"), "must be an object")
        })?;
        let tool = function(&format!("tools[{i}].function"), f)?;
        push_tool(&mut parsed, tool, &format!("tools[{i}].function.name"))?;
    }
    let choice = chat_choice(&parsed, choice)?;
    finish(parsed, choice, parallel)
}

/// One function's `name`, `description` and `parameters`; `at` is the path of the object
/// that holds them (`tools[0].function` in chat, `tools[0]` in the Responses API).
pub(super) fn function(at: &str, f: &Value) -> Result<Tool, InvalidRequest> {
    let name = match f.get("name") {
        Some(Value::String(n)) if valid_name(n) => n.clone(),
        _ => {
            return Err(InvalidRequest::field(
                &format!("{at}.name"),
                "is required: a-z, A-Z, 0-9, underscores and dashes, at most 64",
            ))
        }
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(InvalidRequest::field(
                &format!("{at}.description"),
                "must be a string",
            ))
        }
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(InvalidRequest::field(
                &format!("{at}.parameters"),
                "must be a JSON schema object",
            ))
        }
    };
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

/// Adds a tool unless its name is taken; `param` names its `name` field.
pub(super) fn push_tool(
    parsed: &mut Vec<Tool>,
    tool: Tool,
    param: &str,
) -> Result<(), InvalidRequest> {
    if parsed.iter().any(|p| p.name == tool.name) {
        return Err(InvalidRequest::field(
            param,
            format!("`{}` names two tools", tool.name),
        ));
    }
    parsed.push(tool);
    Ok(())
}

/// Chat's `tool_choice`: a mode, or `{"type": "function", "function": {"name": …}}`.
fn chat_choice(parsed: &[Tool], choice: Option<&Value>) -> Result<ToolChoice, InvalidRequest> {
    const FORM: &str = "{\"type\": \"function\", \"function\": {\"name\": …}}";
    Ok(match choice.filter(|c| !c.is_null()) {
        None => default_choice(parsed),
        Some(Value::String(s)) => choice_mode(s, FORM)?,
        Some(obj) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    InvalidRequest::field(
                        "tool_choice",
                        format!("must be none, auto, required or {FORM}"),
                    )
                })?;
            named_choice(parsed, name, "tool_choice.function.name")?
        }
    })
}

/// No `tool_choice`: `auto` when tools are offered, else `none` (OpenAI's default).
pub(super) fn default_choice(parsed: &[Tool]) -> ToolChoice {
    if parsed.is_empty() {
        ToolChoice::None
    } else {
        ToolChoice::Auto
    }
}

/// A `tool_choice` mode string; `form` is how this API spells a named choice, for the error.
pub(super) fn choice_mode(mode: &str, form: &str) -> Result<ToolChoice, InvalidRequest> {
    match mode {
        "none" => Ok(ToolChoice::None),
        "auto" => Ok(ToolChoice::Auto),
        "required" => Ok(ToolChoice::Required),
        other => Err(InvalidRequest::field(
            "tool_choice",
            format!("must be none, auto, required or {form} (got `{other}`)"),
        )),
    }
}

/// A choice naming one of the offered tools; `at` is the field that names it.
pub(super) fn named_choice(
    parsed: &[Tool],
    name: &str,
    at: &str,
) -> Result<ToolChoice, InvalidRequest> {
    if !parsed.iter().any(|t| t.name == name) {
        return Err(InvalidRequest::field(
            at,
            format!("`{name}` is not one of `tools`"),
        ));
    }
    Ok(ToolChoice::Named(name.to_string()))
}

/// The offer once its tools and choice are read: `None` when no tool may be called.
pub(super) fn finish(
    parsed: Vec<Tool>,
    choice: ToolChoice,
    parallel: Option<bool>,
) -> Result<Option<ToolUse>, InvalidRequest> {
    if parsed.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Auto) {
        return Err(InvalidRequest::field(
            "tool_choice",
            "needs `tools`: there is no tool to call",
        ));
    }
    Ok((choice != ToolChoice::None).then(|| ToolUse {
        tools: parsed,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}
