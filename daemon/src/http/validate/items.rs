//! The Responses API's `input` and `instructions` as chat turns: a string is one user
//! message; items are `message` (text parts only), `function_call` and
//! `function_call_output`. Anything that needs stored state or another modality is refused
//! by its path.

use serde_json::Value;

use super::chat::check_call_id;
use super::request::{unsupported, InvalidRequest};
use crate::engine::chat::ChatTurn;
use crate::tools::PastCall;

/// `instructions` and `input` as the turns of one chat: instructions and leading
/// system/developer messages become one system turn, as templates expect a single one.
pub(super) fn turns(
    instructions: Option<&str>,
    input: Option<&Value>,
) -> Result<Vec<ChatTurn>, InvalidRequest> {
    let mut turns: Vec<ChatTurn> = Vec::new();
    if let Some(i) = instructions {
        push_system(&mut turns, checked_text("instructions", i.to_string())?);
    }
    match input {
        None | Some(Value::Null) => return Err(InvalidRequest::field("input", "is required")),
        Some(Value::String(s)) => turns.push(turn("user", checked_text("input", s.clone())?)),
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err(InvalidRequest::field(
                    "input",
                    "must contain at least one item",
                ));
            }
            for (i, item) in items.iter().enumerate() {
                add_item(&mut turns, &format!("input[{i}]"), item)?;
            }
        }
        Some(_) => {
            return Err(InvalidRequest::field(
                "input",
                "must be a string or an array of input items",
            ))
        }
    }
    if !turns.iter().any(|t| t.role != "system") {
        return Err(InvalidRequest::field(
            "input",
            "must contain a user message or a function call output",
        ));
    }
    Ok(turns)
}

fn turn(role: &str, content: String) -> ChatTurn {
    ChatTurn {
        role: role.to_string(),
        content,
        tool_calls: Vec::new(),
        tool_call_id: None,
    }
}

/// A system turn joins the one it follows when nothing else came between.
fn push_system(turns: &mut Vec<ChatTurn>, text: String) {
    let only_system = turns.len() == 1 && turns[0].role == "system";
    match turns.last_mut() {
        Some(last) if only_system => {
            last.content.push_str("\n\n");
            last.content.push_str(&text);
        }
        _ => turns.push(turn("system", text)),
    }
}

fn add_item(turns: &mut Vec<ChatTurn>, at: &str, item: &Value) -> Result<(), InvalidRequest> {
    if !item.is_object() {
        return Err(InvalidRequest::field(at, "must be an input item object"));
    }
    let kind = match item.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(k)) => k.as_str(),
        Some(_) => {
            return Err(InvalidRequest::field(
                &format!("{at}.type"),
                "must be a string",
            ))
        }
    };
    match kind {
        "message" => message(turns, at, item),
        "function_call" => {
            let call = PastCall {
                id: check_call_id(&format!("{at}.call_id"), string(item, at, "call_id")?)?,
                name: string(item, at, "name")?,
                arguments: string(item, at, "arguments")?,
            };
            // Calls made together are one assistant turn, after its text if it had any.
            match turns.last_mut() {
                Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                _ => turns.push(ChatTurn {
                    tool_calls: vec![call],
                    ..turn("assistant", String::new())
                }),
            }
            Ok(())
        }
        "function_call_output" => {
            let id = check_call_id(&format!("{at}.call_id"), string(item, at, "call_id")?)?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_parts(&format!("{at}.output"), parts)?,
                _ => {
                    return Err(InvalidRequest::field(
                        &format!("{at}.output"),
                        "is required: a string or an array of input_text parts",
                    ))
                }
            };
            turns.push(ChatTurn {
                tool_call_id: Some(id),
                ..turn("tool", checked_text(&format!("{at}.output"), output)?)
            });
            Ok(())
        }
        // This model writes no reasoning items; one sent back (from another server) has
        // nothing a template can show.
        "reasoning" => Ok(()),
        "item_reference" => Err(unsupported(
            &format!("{at}.type"),
            "`item_reference` needs stored responses; this server is stateless, send the \
             items themselves",
        )),
        other => Err(InvalidRequest::field(
            &format!("{at}.type"),
            format!(
                "`{other}` is not supported; input items are `message`, `function_call` and \
                 `function_call_output`"
            ),
        )),
    }
}

fn message(turns: &mut Vec<ChatTurn>, at: &str, item: &Value) -> Result<(), InvalidRequest> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some(other) => {
            return Err(InvalidRequest::field(
                &format!("{at}.role"),
                format!("must be one of user, assistant, system, developer (got `{other}`)"),
            ))
        }
        None => return Err(InvalidRequest::field(&format!("{at}.role"), "is required")),
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&format!("{at}.content"), parts)?,
        _ => {
            return Err(InvalidRequest::field(
                &format!("{at}.content"),
                "is required: a string or an array of content parts",
            ))
        }
    };
    let content = checked_text(&format!("{at}.content"), content)?;
    if role == "system" && turns.iter().all(|t| t.role == "system") {
        push_system(turns, content);
    } else {
        turns.push(turn(role, content));
    }
    Ok(())
}

/// Text content parts joined; any other part (image, file, audio) is refused by its path.
fn text_parts(at: &str, parts: &[Value]) -> Result<String, InvalidRequest> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "input_text" | "output_text" | "text" => match p.get("text") {
                Some(Value::String(t)) => text.push_str(t),
                _ => {
                    return Err(InvalidRequest::field(
                        &format!("{at}[{j}].text"),
                        "is required",
                    ))
                }
            },
            "refusal" => {}
            other => {
                return Err(unsupported(
                    &format!("{at}[{j}].type"),
                    &format!("`{other}`: only text input is, this model reads no other"),
                ))
            }
        }
    }
    Ok(text)
}

fn string(item: &Value, at: &str, key: &str) -> Result<String, InvalidRequest> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(InvalidRequest::field(
            &format!("{at}.{key}"),
            "is required and must be a string",
        )),
    }
}

fn checked_text(param: &str, text: String) -> Result<String, InvalidRequest> {
    if text.contains('\0') {
        return Err(InvalidRequest::field(
            param,
            "must not contain NUL characters",
        ));
    }
    Ok(text)
}
