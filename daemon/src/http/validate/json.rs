//! The JSON body of any request, read strictly: an object, no trailing bytes, no duplicate
//! keys, no unknown field, a type error naming the field.

use serde::de::DeserializeOwned;

use super::request::InvalidRequest;

/// Parses a JSON body, naming the offending field on a type error.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, InvalidRequest> {
    // serde would happily read a struct from a JSON array; requests are objects.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(InvalidRequest::Json(
            "the body must be a JSON object".to_string(),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut *de);
    let err = match result {
        // Anything after the object (`{...} garbage`) makes the body malformed.
        Ok(v) => {
            return de
                .end()
                .map(|()| v)
                .map_err(|e| InvalidRequest::Json(e.to_string()))
        }
        Err(e) => e,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    // serde reports `{"model":"a","model":"b"}` at the object holding the key, naming the
    // key only in its message; name the key itself.
    if let Some(key) = strip_position(&inner)
        .strip_prefix("duplicate field `")
        .and_then(|r| r.split('`').next())
    {
        let param = match path.as_str() {
            "." => key.to_string(),
            object => format!("{object}.{key}"),
        };
        return Err(InvalidRequest::field(
            &param,
            "appears more than once: duplicate keys are ambiguous",
        ));
    }
    // A field the request type does not define: named, as OpenAI names an unrecognised
    // argument, so that no client believes it acted.
    if let Some(key) = strip_position(&inner)
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
    {
        // The path already ends with the key.
        let param = match path.as_str() {
            "." => key.to_string(),
            path => path.to_string(),
        };
        return Err(InvalidRequest::field(
            &param,
            "is not a field this server knows on this endpoint; see docs/api.md for the \
             fields each route takes",
        ));
    }
    match inner.classify() {
        serde_json::error::Category::Data if path != "." => Err(InvalidRequest::field(
            &path,
            format!("has the wrong type or value: {}", strip_position(&inner)),
        )),
        serde_json::error::Category::Data => {
            let msg = strip_position(&inner);
            // serde reports a missing field at the root path; name the field itself.
            match msg
                .strip_prefix("missing field `")
                .and_then(|r| r.split('`').next())
            {
                Some(field) => Err(InvalidRequest::field(field, "is required")),
                None => Err(InvalidRequest::Json(format!(
                    "the body must be a JSON object ({msg})"
                ))),
            }
        }
        _ => Err(InvalidRequest::Json(inner.to_string())),
    }
}

fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}
