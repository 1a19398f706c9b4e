//! What the output must match, as a grammar: `response_format` (OpenAI's, with
//! llama-server's `schema` beside `type`), and llama-server's top-level `json_schema` and
//! `grammar`. All of them go through the same constrained decoding (llguidance).

use serde_json::Value;

use super::request::{GrammarFrom, InvalidRequest};
use crate::engine::constraint::Grammar;

/// The grammar of a generation request, from whichever of `response_format`,
/// `json_schema` and `grammar` it set (`None` for a route without that field); two of
/// them at once are ambiguous, and refused.
pub(super) fn output_grammar(
    response_format: Option<&Value>,
    json_schema: Option<&Value>,
    grammar: Option<&Value>,
) -> Result<Option<(Grammar, GrammarFrom)>, InvalidRequest> {
    let mut found: Option<(Grammar, GrammarFrom)> = None;
    let candidates = [
        (self::response_format(response_format)?, "response_format"),
        (top_level_schema(json_schema)?, "json_schema"),
        (self::grammar(grammar)?, "grammar"),
    ];
    for (g, field) in candidates {
        let Some(g) = g else { continue };
        if let Some((_, first)) = &found {
            return Err(InvalidRequest::field(
                field,
                format!(
                    "cannot be combined with `{}`: send one of them",
                    first.field
                ),
            ));
        }
        found = Some(g);
    }
    Ok(found)
}

/// `response_format`: `text` (nothing), `json_object` (any JSON object, or llama-server's
/// `schema` beside `type`) or `json_schema` (`{"name", "schema", "strict"}`, or
/// llama-server's bare `schema` beside `type`; the schema is always enforced, `strict` or
/// not). Whether llguidance can compile the schema is known once the model is (a 400 then
/// too).
pub(super) fn response_format(
    v: Option<&Value>,
) -> Result<Option<(Grammar, GrammarFrom)>, InvalidRequest> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(obj) = v.as_object() else {
        return Err(InvalidRequest::field(
            "response_format",
            "must be an object",
        ));
    };
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| InvalidRequest::field("response_format.type", "is required"))?;
    let allowed: &[&str] = match kind {
        "text" => &["type"],
        "json_object" => &["type", "schema"],
        "json_schema" => &["type", "json_schema", "schema"],
        other => {
            return Err(InvalidRequest::field(
                "response_format.type",
                format!("must be one of text, json_object, json_schema (got `{other}`)"),
            ))
        }
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(InvalidRequest::field(
            &format!("response_format.{k}"),
            format!("is not a field of a `{kind}` response format"),
        ));
    }
    let bare = |schema: &Value| -> Result<Option<(Grammar, GrammarFrom)>, InvalidRequest> {
        match schema {
            Value::Object(_) | Value::Bool(_) => Ok(Some((
                Grammar::JsonSchema(schema.clone()),
                GrammarFrom::same("response_format", "response_format.schema"),
            ))),
            _ => Err(InvalidRequest::field(
                "response_format.schema",
                "must be a JSON schema object",
            )),
        }
    };
    match (
        kind,
        v.get("json_schema").filter(|j| !j.is_null()),
        v.get("schema").filter(|s| !s.is_null()),
    ) {
        ("text", _, _) => Ok(None),
        ("json_object", _, None) => Ok(Some((
            Grammar::JsonSchema(serde_json::json!({"type": "object"})),
            GrammarFrom::same("response_format", "response_format"),
        ))),
        ("json_object", _, Some(schema)) => bare(schema),
        (_, Some(_), Some(_)) => Err(InvalidRequest::field(
            "response_format.schema",
            "cannot be combined with `response_format.json_schema`: send one of them",
        )),
        (_, None, Some(schema)) => bare(schema),
        (_, js, None) => {
            let js = js.filter(|j| j.is_object()).ok_or_else(|| {
                InvalidRequest::field("response_format.json_schema", "must be an object")
            })?;
            Ok(named_schema("response_format.json_schema", js)?.map(|g| {
                (
                    g,
                    GrammarFrom::same("response_format", "response_format.json_schema.schema"),
                )
            }))
        }
    }
}

/// llama-server's top-level `json_schema`: a bare schema; `{}` is any JSON object, as
/// llama-server reads it.
fn top_level_schema(v: Option<&Value>) -> Result<Option<(Grammar, GrammarFrom)>, InvalidRequest> {
    let from = GrammarFrom::same("json_schema", "json_schema");
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) if o.is_empty() => Ok(Some((
            Grammar::JsonSchema(serde_json::json!({"type": "object"})),
            from,
        ))),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
            Ok(Some((Grammar::JsonSchema(schema.clone()), from)))
        }
        Some(_) => Err(InvalidRequest::field(
            "json_schema",
            "must be a JSON schema object",
        )),
    }
}

/// The prefix that marks a `grammar` as llguidance's Lark syntax, as llama.cpp built with
/// LLGuidance reads it.
const LLGUIDANCE_PREFIX: &str = "%llguidance";

/// llama-server's `grammar`. A grammar that starts with `%llguidance` is llguidance's
/// Lark syntax and is enforced as given, as llama-server built with LLGuidance does. A GBNF
/// grammar is refused: llguidance splits a grammar into greedy lexemes and a parser, so a
/// GBNF grammar rewritten literally can refuse texts GBNF accepts (in `"a" "bc" | "ab"
/// "d"` the lexer takes `ab` whole and `abc` is lost). Only a rewrite with one lexeme per
/// character would be exact, and llguidance's own guide warns that such grammars slow its
/// parser to its limits; until one is written and measured, GBNF is a 400, never a
/// grammar enforced approximately. `""` is no grammar, as in llama-server.
fn grammar(v: Option<&Value>) -> Result<Option<(Grammar, GrammarFrom)>, InvalidRequest> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s.starts_with(LLGUIDANCE_PREFIX) => Ok(Some((
            Grammar::Lark(s.clone()),
            GrammarFrom::same("grammar", "grammar"),
        ))),
        Some(Value::String(_)) => Err(InvalidRequest::field(
            "grammar",
            format!(
                "is a GBNF grammar, which this server cannot enforce exactly: its constrained \
                 decoding is llguidance's. Send an llguidance (Lark) grammar that starts with \
                 `{LLGUIDANCE_PREFIX} {{}}`, or a JSON schema in `json_schema` or \
                 `response_format`"
            ),
        )),
        Some(_) => Err(InvalidRequest::field("grammar", "must be a string")),
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
