//! Incremental reading of a call's JSON as the model writes it: whether its start is the
//! name-first form (so the name can go out before the arguments), and where a JSON value
//! ends (so the arguments stream without what follows them).

/// How far the start of a call's body matches `{"name": "…", "<key>": `.
#[derive(Debug, PartialEq)]
pub enum Head {
    /// It may still: more text is needed.
    More,
    /// It cannot (another key order, or not JSON): the call is parsed whole at its end.
    No,
    /// It does: the function's name, and where its arguments begin.
    Args { name: String, at: usize },
}

pub fn head(body: &str, key: &str) -> Head {
    let b = body.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Matches `lit` at `i`: Some(true) matched, Some(false) cannot, None needs more.
    let lit = |i: &mut usize, lit: &str| -> Option<bool> {
        let rest = &b[*i..];
        let n = rest.len().min(lit.len());
        if rest[..n] != lit.as_bytes()[..n] {
            return Some(false);
        }
        if n < lit.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    macro_rules! expect {
        ($l:expr) => {
            ws(&mut i);
            match lit(&mut i, $l) {
                Some(true) => {}
                Some(false) => return Head::No,
                None => return Head::More,
            }
        };
    }
    expect!("{");
    expect!("\"name\"");
    expect!(":");
    ws(&mut i);
    if i == b.len() {
        return Head::More;
    }
    if b[i] != b'"' {
        return Head::No;
    }
    let Some(len) = string_end(&b[i..]) else {
        return Head::More;
    };
    let j = i + len;
    let Ok(name) = serde_json::from_str::<String>(&body[i..j]) else {
        return Head::No;
    };
    i = j;
    expect!(",");
    expect!(&format!("\"{key}\""));
    expect!(":");
    ws(&mut i);
    if i == b.len() {
        return Head::More;
    }
    Head::Args { name, at: i }
}

/// The length of the JSON string that `b` begins with (its quotes included), if it is
/// complete.
fn string_end(b: &[u8]) -> Option<usize> {
    let mut j = 1;
    loop {
        match b.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// The length of the JSON value `s` begins with, once it is complete: an object or array
/// at its closing bracket, a string at its closing quote, a number or literal when a
/// delimiter follows it. `None` while more text is needed. The value is not validated,
/// only delimited: the parser checks the whole call.
pub fn value_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    match b.first()? {
        b'"' => string_end(b),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = 0;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j += string_end(&b[j..])?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => b
            .iter()
            .position(|c| matches!(c, b',' | b'}' | b']' | b';') || c.is_ascii_whitespace()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_of_a_call_is_recognised_as_soon_as_it_is_complete() {
        assert_eq!(head(" {\"na", "arguments"), Head::More);
        assert_eq!(
            head("{\"name\": \"f\\\"g\", \"arguments\"", "arguments"),
            Head::More
        );
        assert_eq!(
            head("{\"name\": \"f\\\"g\", \"arguments\": {", "arguments"),
            Head::Args {
                name: "f\"g".into(),
                at: 30
            }
        );
        assert_eq!(
            head("{\"name\": \"f\", \"parameters\": [", "parameters"),
            Head::Args {
                name: "f".into(),
                at: 28
            }
        );
        assert_eq!(
            head("{\"name\": \"f\", \"parameters\": {", "arguments"),
            Head::No
        );
        assert_eq!(head("{\"arguments\": {}", "arguments"), Head::No);
        assert_eq!(head("hello", "arguments"), Head::No);
    }

    #[test]
    fn a_value_ends_at_its_own_closing_bracket_not_at_brackets_in_strings() {
        let v = r#"{"a": "}]\"{", "b": [1, {"c": null}]} trailing"#;
        assert_eq!(value_end(v), Some(v.len() - " trailing".len()));
        assert_eq!(value_end(r#"{"a": [1, 2"#), None);
        assert_eq!(value_end(r#"{"a": "}"#), None);
        assert_eq!(value_end(r#""x\"y" rest"#), Some(6));
        assert_eq!(value_end("12}"), Some(2));
        assert_eq!(value_end("12"), None);
        assert_eq!(value_end(""), None);
    }
}
