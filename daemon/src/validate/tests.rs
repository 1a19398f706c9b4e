//! Unit tests of request validation: each refusal names its field.

use super::*;

fn chat_json(body: &str) -> Result<ValidRequest, InvalidRequest> {
    chat(parse_json(body.as_bytes())?)
}

fn param_of(r: Result<ValidRequest, InvalidRequest>) -> String {
    match r {
        Err(InvalidRequest::Field { param, .. }) => param,
        other => panic!("expected a field error, got {other:?}"),
    }
}

const HELLO: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

#[test]
fn minimal_chat_is_valid_with_openai_defaults() {
    let r = chat_json(&format!("{{{HELLO}}}")).expect("valid");
    assert_eq!(r.max_tokens, None);
    assert_eq!(r.sampling.temperature, 1.0);
    assert!(!r.stream);
    assert_eq!(
        r.input,
        Input::Chat(vec![ChatTurn {
            role: "user".into(),
            content: "hi".into()
        }])
    );
}

#[test]
fn duplicate_key_is_named_not_called_a_non_object() {
    let root = chat_json(&format!(r#"{{"model":"a","model":"b",{HELLO}}}"#));
    match &root {
        Err(e @ InvalidRequest::Field { param, .. }) => {
            assert_eq!(param, "model");
            assert!(e.to_string().contains("more than once"), "{e}");
        }
        other => panic!("expected a duplicate-key error, got {other:?}"),
    }
    let nested = chat_json(r#"{"messages":[{"role":"user","role":"system","content":"hi"}]}"#);
    assert_eq!(param_of(nested), "messages[0].role");
}

#[test]
fn malformed_json_is_a_json_error() {
    assert!(matches!(
        chat_json("{\"messages\":"),
        Err(InvalidRequest::Json(_))
    ));
}

#[test]
fn wrong_type_names_the_field() {
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"max_tokens":"ten"}}"#))),
        "max_tokens"
    );
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"temperature":"hot"}}"#))),
        "temperature"
    );
    assert_eq!(
        param_of(chat_json(r#"{"messages":[{"role":"user","content":5}]}"#)),
        "messages[0].content"
    );
}

#[test]
fn missing_messages_names_the_field() {
    assert_eq!(param_of(chat_json("{}")), "messages");
}

#[test]
fn empty_messages_are_rejected() {
    assert_eq!(param_of(chat_json(r#"{"messages":[]}"#)), "messages");
}

#[test]
fn unknown_fields_are_ignored() {
    assert!(chat_json(&format!(
        r#"{{{HELLO},"logit_bias":{{}},"user":"u1","foo":1}}"#
    ))
    .is_ok());
}

#[test]
fn out_of_range_values_are_rejected() {
    for (field, value) in [
        ("temperature", "2.5"),
        ("top_p", "0"),
        ("top_p", "1.5"),
        ("top_k", "-1"),
        ("min_p", "1.5"),
        ("presence_penalty", "3"),
        ("frequency_penalty", "-3"),
        ("max_tokens", "0"),
        ("n", "2"),
    ] {
        let body = format!(r#"{{{HELLO},"{field}":{value}}}"#);
        assert_eq!(param_of(chat_json(&body)), field, "{body}");
    }
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let r = chat_json(&format!(
        r#"{{{HELLO},"max_tokens":5,"max_completion_tokens":9}}"#
    ))
    .expect("valid");
    assert_eq!(r.max_tokens, Some(9));
}

#[test]
fn stop_accepts_a_string_or_a_list() {
    let one = chat_json(&format!(r#"{{{HELLO},"stop":"x"}}"#)).expect("valid");
    assert_eq!(one.stop, vec!["x"]);
    let many = chat_json(&format!(r#"{{{HELLO},"stop":["a","b"]}}"#)).expect("valid");
    assert_eq!(many.stop, vec!["a", "b"]);
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"stop":[""]}}"#))),
        "stop"
    );
}

#[test]
fn stream_options_need_stream() {
    assert_eq!(
        param_of(chat_json(&format!(
            r#"{{{HELLO},"stream_options":{{"include_usage":true}}}}"#
        ))),
        "stream_options"
    );
    let r = chat_json(&format!(
        r#"{{{HELLO},"stream":true,"stream_options":{{"include_usage":true}}}}"#
    ))
    .expect("valid");
    assert!(r.include_usage);
}

#[test]
fn unknown_role_is_rejected() {
    assert_eq!(
        param_of(chat_json(
            r#"{"messages":[{"role":"wizard","content":"hi"}]}"#
        )),
        "messages[0].role"
    );
}

#[test]
fn developer_role_maps_to_system_and_text_parts_are_joined() {
    let r = chat_json(
        r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
    )
    .expect("valid");
    assert_eq!(
        r.input,
        Input::Chat(vec![ChatTurn {
            role: "system".into(),
            content: "ab".into()
        }])
    );
}

#[test]
fn image_parts_are_refused() {
    assert_eq!(
        param_of(chat_json(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#
        )),
        "messages[0].content[0].type"
    );
}

#[test]
fn seed_is_reproducible_and_absent_seed_is_random() {
    let a = chat_json(&format!(r#"{{{HELLO},"seed":42}}"#)).expect("valid");
    let b = chat_json(&format!(r#"{{{HELLO},"seed":42}}"#)).expect("valid");
    assert_eq!(a.sampling.seed, b.sampling.seed);
    let seeds: std::collections::HashSet<u32> = (0..8)
        .map(|_| {
            chat_json(&format!("{{{HELLO}}}"))
                .expect("valid")
                .sampling
                .seed
        })
        .collect();
    assert!(seeds.len() > 1);
}

#[test]
fn completion_defaults_to_sixteen_tokens_and_accepts_a_one_item_list() {
    let r = completion(parse_json(br#"{"prompt":["Once"]}"#).expect("json")).expect("valid");
    assert_eq!(r.max_tokens, Some(16));
    assert_eq!(r.input, Input::Text("Once".into()));
    let two = completion(parse_json(br#"{"prompt":["a","b"]}"#).expect("json"));
    assert_eq!(param_of(two), "prompt");
    let empty = completion(parse_json(br#"{"prompt":""}"#).expect("json"));
    assert_eq!(param_of(empty), "prompt");
}

#[test]
fn trailing_garbage_after_the_object_is_a_json_error() {
    assert!(matches!(
        chat_json(&format!("{{{HELLO}}} trailing")),
        Err(InvalidRequest::Json(_))
    ));
    assert!(
        chat_json(&format!("{{{HELLO}}}\n")).is_ok(),
        "whitespace is fine"
    );
}

#[test]
fn non_object_body_is_a_json_error() {
    assert!(matches!(chat_json("[1,2]"), Err(InvalidRequest::Json(_))));
}
