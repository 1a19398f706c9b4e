//! `response_format`: the JSON shape a chat answer must take, as a grammar.

use serde_json::Value;

use super::request::InvalidRequest;
use crate::engine::constraint::Grammar;

/// `response_format`: `text` (nothing), `json_object` (any JSON object) or `json_schema`
/// (`{"name", "schema", "strict"}`; the schema is always enforced, `strict` or not).
/// Whether llguidance can compile the schema is known once the model is (a 400 then too).
pub(super) fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, InvalidRequest> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| InvalidRequest::field("response_format.type", "is required"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonSchema(
            serde_json::json!({"type": "object"}),
        ))),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or_else(|| {
                    InvalidRequest::field("response_format.json_schema", "must be an object")
                })?;
            named_schema("response_format.json_schema", js)
        }
        other => Err(InvalidRequest::field(
            "response_format.type",
            format!("must be one of text, json_object, json_schema (got `{other}`)"),
        )),
    }
}

/// A named JSON schema (`name`, `schema`, `strict`) as a grammar; `at` is the path of the
/// object that holds them (`response_format.json_schema` in chat, `text.format` in the
/// Responses API). The schema is always enforced, `strict` or not.
pub(super) fn named_schema(at: &str, js: &Value) -> Result<Option<Grammar>, InvalidRequest> {
    match js.get("name") {
        Some(Value::String(n)) if valid_name(n) => {}
        _ => {
            return Err(InvalidRequest::field(
                &format!("{at}.name"),
                "is required: a-z, A-Z, 0-9, underscores and dashes, at most 64",
            ))
        }
    }
    if js
        .get("strict")
        .is_some_and(|s| !s.is_null() && !s.is_boolean())
    {
        return Err(InvalidRequest::field(
            &format!("{at}.strict"),
            "must be a boolean",
        ));
    }
    match js.get("schema") {
        None | Some(Value::Null) => Ok(Some(Grammar::JsonSchema(serde_json::json!({})))),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
            Ok(Some(Grammar::JsonSchema(schema.clone())))
        }
        Some(_) => Err(InvalidRequest::field(
            &format!("{at}.schema"),
            "must be a JSON schema object",
        )),
    }
}

/// OpenAI's rule for function and schema names.
pub(super) fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
