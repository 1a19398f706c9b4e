//! Unit tests of request validation: each refusal names its field.

use super::*;
use crate::engine::chat::ChatTurn;
use crate::engine::constraint::Grammar;
use crate::tools::{PastCall, ToolChoice};

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
            content: "hi".into(),
            ..ChatTurn::default()
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
fn unknown_fields_are_refused_by_name_on_every_route() {
    let (param, msg) = message_of(chat_json(&format!(
        r#"{{{HELLO},"logit_bias":{{}},"user":"u1","foo":1}}"#
    )));
    assert_eq!(param, "foo");
    assert!(msg.contains("not a field this server knows"), "{msg}");
    assert_eq!(
        param_of(completion_json(
            r#"{"prompt":"a","some_extension":{"x":1}}"#
        )),
        "some_extension"
    );
    use crate::http::{embeddings, responses, wire};
    assert_eq!(
        field_of::<responses::wire::ResponsesRequest>(br#"{"input":"a","bogus":true}"#),
        "bogus"
    );
    assert_eq!(
        field_of::<embeddings::wire::EmbeddingRequest>(br#"{"input":"a","embd_normalize":2}"#),
        "embd_normalize"
    );
    assert_eq!(
        field_of::<wire::TokenizeRequest>(br#"{"content":"a","n_probs":1}"#),
        "n_probs"
    );
    assert_eq!(
        field_of::<wire::DetokenizeRequest>(br#"{"tokens":[1],"foo":1}"#),
        "foo"
    );
    // A nested object keeps OpenAI's leniency: only request-level fields are judged here.
    chat_json(r#"{"messages":[{"role":"user","content":"hi","name":"ann"}]}"#)
        .expect("a message's `name`");
}

/// The field a body of type `T` is refused for.
fn field_of<T: serde::de::DeserializeOwned + std::fmt::Debug>(body: &[u8]) -> String {
    match parse_json::<T>(body) {
        Err(InvalidRequest::Field { param, .. }) => param,
        other => panic!("expected a field error, got {other:?}"),
    }
}

/// Each llama-server field: a value that asks for nothing, and one that asks for more.
const LLAMA_FIELDS: &[(&str, &str, &str)] = &[
    ("cache_prompt", "true", "false"),
    ("n_probs", "0", "5"),
    ("id_slot", "-1", "0"),
    ("samplers", "null", r#"["top_k","temperature"]"#),
    ("typical_p", "1.0", "0.9"),
    ("penalize_nl", "false", "true"),
    ("dry_multiplier", "0", "0.8"),
    ("dry_base", "1.75", "null"),
    ("dry_allowed_length", "2", "null"),
    ("dry_penalty_last_n", "-1", "null"),
    ("dry_sequence_breakers", r#"["\n"]"#, "null"),
    ("xtc_probability", "0", "0.5"),
    ("xtc_threshold", "0.1", "null"),
    ("mirostat", "0", "2"),
    ("mirostat_tau", "5.0", "null"),
    ("mirostat_eta", "0.1", "null"),
    ("dynatemp_range", "0", "0.5"),
    ("dynatemp_exponent", "1", "null"),
    ("top_n_sigma", "-1", "1.5"),
    ("min_keep", "0", "5"),
    ("adaptive_target", "-1", "0.5"),
    ("adaptive_decay", "0.9", "null"),
    ("ignore_eos", "false", "true"),
    ("t_max_predict_ms", "-1", "500"),
    ("t_max_prompt_ms", "-1", "500"),
    ("n_keep", "-1", "null"),
    ("n_discard", "0", "null"),
    ("n_indent", "0", "4"),
    ("n_cmpl", "1", "2"),
    ("n_cache_reuse", "0", "256"),
    ("return_tokens", "false", "true"),
    ("post_sampling_probs", "false", "true"),
    ("timings_per_token", "false", "true"),
    ("return_progress", "false", "true"),
    ("verbose", "false", "true"),
    ("lora", "[]", r#"[{"id":0,"scale":1.0}]"#),
    ("image_data", "[]", r#"[{"data":"AAAA","id":1}]"#),
    ("response_fields", "null", r#"["content"]"#),
    ("grammar_lazy", "false", "true"),
    ("grammar_triggers", "[]", r#"[{"type":0,"value":"<tool>"}]"#),
    ("grammar_type", "null", r#""tool_calls""#),
    ("preserved_tokens", "[]", r#"["<tool>"]"#),
    ("backend_sampling", "false", "true"),
    ("sse_ping_interval", "null", "5"),
    ("chat_format", "null", "1"),
    ("chat_parser", "null", r#""x""#),
    ("generation_prompt", "null", r#""<|im_start|>assistant\n""#),
    ("parse_tool_calls", "true", "false"),
    ("reasoning_format", r#""none""#, r#""deepseek""#),
    ("reasoning_budget_tokens", "-1", "100"),
    ("reasoning_budget_message", r#""stop""#, "null"),
    ("thinking_budget_tokens", "-1", "100"),
    ("reasoning_control", "null", r#"{"enabled":false}"#),
    ("chat_template_kwargs", "{}", r#"{"enable_thinking":false}"#),
    ("add_generation_prompt", "true", "false"),
    ("continue_final_message", "false", "true"),
    ("no_stop_trim", "false", "true"),
    ("skip_special_tokens", "true", "false"),
    ("separate_reasoning", "true", "null"),
    ("stream_reasoning", "true", "null"),
    ("include_reasoning", "true", "false"),
    ("return_hidden_states", "false", "true"),
];

#[test]
fn llama_server_fields_that_ask_for_nothing_are_accepted_and_the_rest_refused_by_name() {
    for &(field, neutral, other) in LLAMA_FIELDS {
        chat_json(&format!(r#"{{{HELLO},"{field}":{neutral}}}"#))
            .unwrap_or_else(|e| panic!("chat {field}: {neutral}: {e}"));
        completion_json(&format!(r#"{{"prompt":"a","{field}":{neutral}}}"#))
            .unwrap_or_else(|e| panic!("completion {field}: {neutral}: {e}"));
        // `null` marks a field that is a no-op at any value (it tunes a stage whose switch
        // is refused unless off, or the context never shifts).
        if other != "null" {
            let (param, msg) = message_of(chat_json(&format!(r#"{{{HELLO},"{field}":{other}}}"#)));
            assert_eq!(param, field, "{field}: {other}");
            assert!(
                msg.contains("extension field (llama-server, SGLang)"),
                "{msg}"
            );
            assert_eq!(
                param_of(completion_json(&format!(
                    r#"{{"prompt":"a","{field}":{other}}}"#
                ))),
                field
            );
        }
    }
    // The table covers every field the wire reads.
    let mut listed: Vec<&str> = LLAMA_FIELDS.iter().map(|f| f.0).collect();
    listed.sort_unstable();
    let mut read = crate::http::wire::ChatCompletionRequest::LLAMA_EXTENSIONS.to_vec();
    read.sort_unstable();
    assert_eq!(listed, read);
}

#[test]
fn repeat_penalty_and_repeat_last_n_reach_the_sampler() {
    let r = chat_json(&format!(
        r#"{{{HELLO},"repeat_penalty":1.1,"repeat_last_n":128}}"#
    ))
    .expect("valid");
    assert_eq!(r.sampling.repeat_penalty, 1.1);
    assert_eq!(r.sampling.penalty_last_n, 128);
    let r = completion_json(r#"{"prompt":"a","repeat_last_n":0}"#).expect("valid");
    assert_eq!(r.sampling.penalty_last_n, 0, "0 turns the penalties off");
    let d = chat_json(&format!("{{{HELLO}}}")).expect("defaults");
    assert_eq!(
        (d.sampling.repeat_penalty, d.sampling.penalty_last_n),
        (1.0, 64)
    );
    for (field, value) in [
        ("repeat_penalty", "0"),
        ("repeat_penalty", "-1"),
        ("repeat_penalty", "2.5"),
        ("repeat_last_n", "-1"),
        ("repeat_last_n", "40000"),
    ] {
        assert_eq!(
            param_of(chat_json(&format!(r#"{{{HELLO},"{field}":{value}}}"#))),
            field,
            "{value}"
        );
        assert_eq!(
            param_of(completion_json(&format!(
                r#"{{"prompt":"a","{field}":{value}}}"#
            ))),
            field,
            "{value}"
        );
    }
}

#[test]
fn n_predict_is_max_tokens_by_another_name() {
    let r = chat_json(&format!(r#"{{{HELLO},"n_predict":7}}"#)).expect("valid");
    assert_eq!(r.max_tokens, Some(7));
    let r = chat_json(&format!(r#"{{{HELLO},"n_predict":-1}}"#)).expect("valid");
    assert_eq!(r.max_tokens, None);
    let r = chat_json(&format!(r#"{{{HELLO},"n_predict":9,"max_tokens":9}}"#)).expect("same");
    assert_eq!(r.max_tokens, Some(9));
    let r = completion_json(r#"{"prompt":"a","n_predict":40}"#).expect("valid");
    assert_eq!(r.max_tokens, Some(40));
    let r = completion_json(r#"{"prompt":"a","n_predict":-1}"#).expect("valid");
    assert_eq!(r.max_tokens, None, "-1: up to the context's end");
    for body in [
        format!(r#"{{{HELLO},"n_predict":0}}"#),
        format!(r#"{{{HELLO},"n_predict":-2}}"#),
        format!(r#"{{{HELLO},"n_predict":5,"max_tokens":6}}"#),
        format!(r#"{{{HELLO},"n_predict":5,"max_completion_tokens":6}}"#),
    ] {
        assert_eq!(param_of(chat_json(&body)), "n_predict", "{body}");
    }
    assert_eq!(
        param_of(completion_json(
            r#"{"prompt":"a","n_predict":3,"max_tokens":4}"#
        )),
        "n_predict"
    );
}

#[test]
fn top_level_json_schema_is_the_same_grammar_as_response_format() {
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#;
    let expected = Grammar::JsonSchema(serde_json::from_str(schema).expect("schema"));
    let chat = chat_json(&format!(r#"{{{HELLO},"json_schema":{schema}}}"#)).expect("chat");
    assert_eq!(chat.grammar, Some(expected.clone()));
    assert_eq!(
        chat.grammar_from,
        Some(GrammarFrom {
            field: "json_schema",
            schema: "json_schema"
        })
    );
    let text = completion_json(&format!(r#"{{"prompt":"a","json_schema":{schema}}}"#))
        .expect("completion");
    assert_eq!(text.grammar, Some(expected));
    // `{}` is any object, as llama-server reads it.
    let any = chat_json(&format!(r#"{{{HELLO},"json_schema":{{}}}}"#)).expect("any");
    assert_eq!(
        any.grammar,
        Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
    );
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"json_schema":"x"}}"#))),
        "json_schema"
    );
    assert_eq!(
        param_of(chat_json(&format!(
            r#"{{{HELLO},"json_schema":{schema},"response_format":{{"type":"json_object"}}}}"#
        ))),
        "json_schema"
    );
}

#[test]
fn response_format_takes_llama_servers_bare_schema() {
    let schema = serde_json::json!({"type": "array", "items": {"type": "integer"}});
    for format in [
        format!(r#"{{"type":"json_object","schema":{schema}}}"#),
        format!(r#"{{"type":"json_schema","schema":{schema}}}"#),
    ] {
        let r = chat_json(&format!(r#"{{{HELLO},"response_format":{format}}}"#))
            .unwrap_or_else(|e| panic!("{format}: {e}"));
        assert_eq!(
            r.grammar,
            Some(Grammar::JsonSchema(schema.clone())),
            "{format}"
        );
        assert_eq!(
            r.grammar_from.map(|f| f.schema),
            Some("response_format.schema")
        );
    }
    for (format, param) in [
        (
            r#"{"type":"json_schema","schema":{},"json_schema":{"name":"a","schema":{}}}"#,
            "response_format.schema",
        ),
        (
            r#"{"type":"json_object","schema":5}"#,
            "response_format.schema",
        ),
        (
            r#"{"type":"json_object","strict":true}"#,
            "response_format.strict",
        ),
        (r#"{"type":"text","schema":{}}"#, "response_format.schema"),
        (r#""json_object""#, "response_format"),
    ] {
        let body = format!(r#"{{{HELLO},"response_format":{format}}}"#);
        assert_eq!(param_of(chat_json(&body)), param, "{body}");
    }
}

#[test]
fn grammar_is_llguidance_lark_or_refused_as_gbnf() {
    // As JSON text: the grammar's newline and quotes escaped.
    let lark = r#"%llguidance {}\nstart: \"yes\" | \"no\""#;
    let r = chat_json(&format!(r#"{{{HELLO},"grammar":"{lark}"}}"#)).expect("lark");
    assert_eq!(
        r.grammar,
        Some(Grammar::Lark(
            "%llguidance {}\nstart: \"yes\" | \"no\"".into()
        ))
    );
    assert_eq!(r.grammar_from.map(|f| f.field), Some("grammar"));
    let r = completion_json(&format!(r#"{{"prompt":"a","grammar":"{lark}"}}"#)).expect("lark");
    assert!(matches!(r.grammar, Some(Grammar::Lark(_))));
    // An empty grammar is none, as in llama-server.
    let r = chat_json(&format!(r#"{{{HELLO},"grammar":""}}"#)).expect("empty");
    assert_eq!(r.grammar, None);
    let (param, msg) = message_of(chat_json(&format!(
        r#"{{{HELLO},"grammar":"root ::= \"yes\" | \"no\""}}"#
    )));
    assert_eq!(param, "grammar");
    assert!(msg.contains("GBNF") && msg.contains("%llguidance"), "{msg}");
    assert_eq!(
        param_of(completion_json(
            r#"{"prompt":"a","grammar":"root ::= [a-z]+"}"#
        )),
        "grammar"
    );
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"grammar":5}}"#))),
        "grammar"
    );
    assert_eq!(
        param_of(chat_json(&format!(
            r#"{{{HELLO},"json_schema":{{}},"grammar":"{lark}"}}"#
        ))),
        "grammar"
    );
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
        ("n", "0"),
        ("n", "129"),
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
            content: "ab".into(),
            ..ChatTurn::default()
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
fn speculative_defaults_to_allowed_opts_out_on_every_route_and_is_typed() {
    assert!(
        chat_json(&format!("{{{HELLO}}}"))
            .expect("valid")
            .speculative
    );
    let off = chat_json(&format!(r#"{{{HELLO},"speculative":false}}"#)).expect("valid");
    assert!(!off.speculative);
    let on = chat_json(&format!(r#"{{{HELLO},"speculative":true}}"#)).expect("valid");
    assert!(on.speculative);
    let completion_off =
        completion(parse_json(br#"{"prompt":"a","speculative":false}"#).expect("json"))
            .expect("valid");
    assert!(!completion_off.speculative);
    assert!(
        completion(parse_json(br#"{"prompt":"a"}"#).expect("json"))
            .expect("valid")
            .speculative
    );
    // Not a boolean: refused by name, never read as a default.
    assert_eq!(
        param_of(chat_json(&format!(r#"{{{HELLO},"speculative":"no"}}"#))),
        "speculative"
    );
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

fn completion_json(body: &str) -> Result<ValidRequest, InvalidRequest> {
    completion(parse_json(body.as_bytes())?)
}

fn message_of(r: Result<ValidRequest, InvalidRequest>) -> (String, String) {
    match r {
        Err(e) => match &e {
            InvalidRequest::Field { param, .. } => (param.clone(), e.to_string()),
            InvalidRequest::Json(_) => panic!("expected a field error, got {e:?}"),
        },
        Ok(v) => panic!("expected a field error, got {v:?}"),
    }
}

#[test]
fn logit_bias_becomes_sorted_pairs() {
    let r = chat_json(&format!(
        r#"{{{HELLO},"logit_bias":{{"50":-100,"7":2.5,"0":100}}}}"#
    ))
    .expect("valid");
    assert_eq!(
        r.sampling.logit_bias,
        vec![(0, 100.0), (7, 2.5), (50, -100.0)]
    );
    let none = chat_json(&format!(r#"{{{HELLO},"logit_bias":{{}}}}"#)).expect("valid");
    assert!(none.sampling.logit_bias.is_empty());
}

#[test]
fn bad_logit_bias_keys_and_values_name_the_key() {
    for (bias, key) in [
        (r#"{"abc":1}"#, "`abc`"),
        (r#"{"-3":1}"#, "`-3`"),
        (r#"{"1.5":1}"#, "`1.5`"),
        (r#"{"99999999999":1}"#, "`99999999999`"),
        (r#"{"5":"high"}"#, "`5`"),
        (r#"{"5":100.5}"#, "`5`"),
        (r#"{"5":-101}"#, "`5`"),
        (r#"{"5":null}"#, "`5`"),
    ] {
        let (param, msg) = message_of(chat_json(&format!(r#"{{{HELLO},"logit_bias":{bias}}}"#)));
        assert_eq!(param, "logit_bias", "{bias}");
        assert!(msg.contains(key), "{bias}: {msg}");
    }
    let (param, msg) = message_of(completion_json(
        r#"{"prompt":"a","logit_bias":{"01":1,"1":2}}"#,
    ));
    assert_eq!(param, "logit_bias");
    assert!(msg.contains("more than once"), "{msg}");
}

#[test]
fn logit_bias_ids_beyond_the_vocabulary_are_refused() {
    let r = chat_json(&format!(r#"{{{HELLO},"logit_bias":{{"9":1,"10":1}}}}"#)).expect("valid");
    assert_eq!(check_vocab(&r.sampling, 11), Ok(()));
    match check_vocab(&r.sampling, 10) {
        Err(e @ InvalidRequest::Field { .. }) => {
            assert!(e.to_string().contains("`10`"), "{e}")
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn chat_logprobs_and_top_logprobs() {
    let off = chat_json(&format!("{{{HELLO}}}")).expect("valid");
    assert_eq!(off.sampling.logprobs, None);
    let plain = chat_json(&format!(r#"{{{HELLO},"logprobs":true}}"#)).expect("valid");
    assert_eq!(plain.sampling.logprobs, Some(0));
    let top = chat_json(&format!(r#"{{{HELLO},"logprobs":true,"top_logprobs":20}}"#));
    assert_eq!(top.expect("valid").sampling.logprobs, Some(20));
    let no = chat_json(&format!(r#"{{{HELLO},"logprobs":false}}"#)).expect("valid");
    assert_eq!(no.sampling.logprobs, None);
    for body in [
        r#""logprobs":true,"top_logprobs":21"#,
        r#""top_logprobs":3"#,
        r#""logprobs":false,"top_logprobs":3"#,
        r#""logprobs":true,"top_logprobs":-1"#,
    ] {
        assert_eq!(
            param_of(chat_json(&format!("{{{HELLO},{body}}}"))),
            "top_logprobs",
            "{body}"
        );
    }
}

#[test]
fn completion_logprobs_is_an_int_up_to_five_and_not_with_echo() {
    let r = completion_json(r#"{"prompt":"a","logprobs":5}"#).expect("valid");
    assert_eq!(r.sampling.logprobs, Some(5));
    let zero = completion_json(r#"{"prompt":"a","logprobs":0}"#).expect("valid");
    assert_eq!(zero.sampling.logprobs, Some(0));
    for body in [
        r#"{"prompt":"a","logprobs":6}"#,
        r#"{"prompt":"a","logprobs":true}"#,
        r#"{"prompt":"a","logprobs":2,"echo":true}"#,
    ] {
        assert_eq!(param_of(completion_json(body)), "logprobs", "{body}");
    }
}

#[test]
fn unsupported_openai_chat_fields_are_refused_by_name() {
    for (field, value) in [
        ("audio", r#"{"voice":"alloy","format":"wav"}"#),
        ("modalities", r#"["text","audio"]"#),
        ("modalities", r#""text""#),
        ("prediction", r#"{"type":"content","content":"x"}"#),
        ("web_search_options", "{}"),
        ("service_tier", r#""flex""#),
        ("service_tier", r#""priority""#),
        ("store", "true"),
        ("reasoning_effort", r#""low""#),
        ("verbosity", r#""low""#),
        ("functions", r#"[{"name":"f"}]"#),
        ("function_call", r#""auto""#),
    ] {
        let (param, msg) = message_of(chat_json(&format!(r#"{{{HELLO},"{field}":{value}}}"#)));
        assert_eq!(param, field, "{field}: {value}");
        assert!(msg.starts_with(&format!("`{field}`")), "{msg}");
    }
}

#[test]
fn openai_chat_fields_that_ask_for_nothing_are_accepted() {
    for body in [
        r#""modalities":["text"]"#,
        r#""service_tier":"auto""#,
        r#""service_tier":"default""#,
        r#""store":false"#,
        r#""metadata":{"k":"v"}"#,
        r#""user":"u-1""#,
        r#""safety_identifier":"s""#,
        r#""prompt_cache_key":"k""#,
        r#""prompt_cache_retention":"24h""#,
        r#""audio":null,"prediction":null,"web_search_options":null,"functions":null"#,
        r#""n":1,"seed":3,"stream":true,"stream_options":{"include_usage":true}"#,
        r#""n":8"#,
    ] {
        chat_json(&format!("{{{HELLO},{body}}}")).unwrap_or_else(|e| panic!("{body}: {e}"));
    }
}

#[test]
fn unsupported_completion_fields_are_refused_by_name() {
    for (body, field) in [
        (r#"{"prompt":"a","best_of":2}"#, "best_of"),
        (r#"{"prompt":"a","best_of":0}"#, "best_of"),
        (r#"{"prompt":"a","suffix":"end"}"#, "suffix"),
        (r#"{"prompt":"a","n":0}"#, "n"),
    ] {
        assert_eq!(param_of(completion_json(body)), field, "{body}");
    }
    for body in [
        r#"{"prompt":"a","best_of":1}"#,
        r#"{"prompt":"a","suffix":""}"#,
        r#"{"prompt":"a","suffix":null,"user":"u"}"#,
    ] {
        completion_json(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    }
}

#[test]
fn detokenize_ids_must_be_in_the_vocabulary() {
    assert_eq!(token_ids(&[0, 5, 9], 10), Ok(vec![0, 5, 9]));
    for (ids, param) in [(&[1, 10][..], "tokens[1]"), (&[-1][..], "tokens[0]")] {
        match token_ids(ids, 10) {
            Err(InvalidRequest::Field { param: p, .. }) => assert_eq!(p, param),
            other => panic!("expected a field error, got {other:?}"),
        }
    }
}

const TOOL: &str = r#""tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#;

#[test]
fn response_format_json_schema_becomes_its_schema() {
    let r = chat_json(&format!(
        r#"{{{HELLO},"response_format":{{"type":"json_schema","json_schema":{{"name":"p","strict":true,"schema":{{"type":"object"}}}}}}}}"#
    ))
    .expect("valid");
    assert_eq!(
        r.grammar,
        Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
    );
    let r = chat_json(&format!(
        r#"{{{HELLO},"response_format":{{"type":"json_object"}}}}"#
    ))
    .expect("valid");
    assert_eq!(
        r.grammar,
        Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
    );
    let r = chat_json(&format!(
        r#"{{{HELLO},"response_format":{{"type":"text"}}}}"#
    ))
    .expect("valid");
    assert_eq!(r.grammar, None);
}

#[test]
fn bad_response_formats_name_the_field() {
    for (format, param) in [
        (r#"{"type":"yaml"}"#, "response_format.type"),
        (r#"{}"#, "response_format.type"),
        (r#"{"type":"json_schema"}"#, "response_format.json_schema"),
        (
            r#"{"type":"json_schema","json_schema":{"schema":{}}}"#,
            "response_format.json_schema.name",
        ),
        (
            r#"{"type":"json_schema","json_schema":{"name":"a b"}}"#,
            "response_format.json_schema.name",
        ),
        (
            r#"{"type":"json_schema","json_schema":{"name":"a","strict":"yes"}}"#,
            "response_format.json_schema.strict",
        ),
        (
            r#"{"type":"json_schema","json_schema":{"name":"a","schema":[1]}}"#,
            "response_format.json_schema.schema",
        ),
    ] {
        let body = format!(r#"{{{HELLO},"response_format":{format}}}"#);
        assert_eq!(param_of(chat_json(&body)), param, "{body}");
    }
}

#[test]
fn tools_default_to_auto_and_are_not_forced() {
    let r = chat_json(&format!("{{{HELLO},{TOOL}}}")).expect("valid");
    let tools = r.tools.expect("tools kept");
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert!(tools.parallel);
    assert_eq!(tools.tools[0].name, "get_weather");
    assert_eq!(r.grammar, None);
}

#[test]
fn tool_choice_none_hides_the_tools() {
    let r = chat_json(&format!(r#"{{{HELLO},{TOOL},"tool_choice":"none"}}"#)).expect("valid");
    assert_eq!(r.tools, None);
    assert_eq!(r.grammar, None);
}

#[test]
fn required_and_named_tool_choices_force_a_call() {
    for (choice, forced) in [
        (r#""required""#, true),
        (
            r#"{"type":"function","function":{"name":"get_weather"}}"#,
            true,
        ),
        (r#""auto""#, false),
    ] {
        let body =
            format!(r#"{{{HELLO},{TOOL},"tool_choice":{choice},"parallel_tool_calls":false}}"#);
        let r = chat_json(&body).expect("valid");
        let tools = r.tools.expect("tools");
        assert_eq!(tools.forces(), forced, "{body}");
        assert!(!tools.parallel);
        // The grammar is the model family's: built when the request meets the model.
        assert_eq!(r.grammar, None);
        let json = format!(
            r#"{{{HELLO},{TOOL},"tool_choice":{choice},"response_format":{{"type":"json_object"}}}}"#
        );
        if forced {
            assert_eq!(param_of(chat_json(&json)), "response_format");
        } else {
            assert!(chat_json(&json).is_ok(), "{json}");
        }
    }
}

#[test]
fn bad_tools_name_the_field() {
    for (extra, param) in [
        (r#""tools":{}"#.to_string(), "tools"),
        (r#""tools":[{"type":"code_interpreter"}]"#.to_string(), "tools[0].type"),
        (r#""tools":[{"type":"function"}]"#.to_string(), "tools[0].function"),
        (
            r#""tools":[{"type":"function","function":{"name":"a b"}}]"#.to_string(),
            "tools[0].function.name",
        ),
        (
            r#""tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]"#
                .to_string(),
            "tools[0].function.parameters",
        ),
        (
            r#""tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#
                .to_string(),
            "tools[1].function.name",
        ),
        (format!(r#"{TOOL},"tool_choice":"sometimes""#), "tool_choice"),
        (
            format!(r#"{TOOL},"tool_choice":{{"type":"function","function":{{"name":"nope"}}}}"#),
            "tool_choice.function.name",
        ),
        (r#""tool_choice":"required""#.to_string(), "tool_choice"),
        (
            format!(r#"{TOOL},"tool_choice":"required","response_format":{{"type":"json_object"}}"#),
            "response_format",
        ),
    ] {
        let body = format!("{{{HELLO},{extra}}}");
        assert_eq!(param_of(chat_json(&body)), param, "{body}");
    }
}

#[test]
fn earlier_tool_calls_and_results_become_turns() {
    let body = r#"{"messages":[
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"sunny"}]}"#;
    let r = chat_json(body).expect("valid");
    let Input::Chat(turns) = r.input else {
        panic!("chat input")
    };
    assert_eq!(turns[1].content, "");
    assert_eq!(
        turns[1].tool_calls,
        vec![PastCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into()
        }]
    );
    assert_eq!(
        (
            turns[2].role.as_str(),
            turns[2].content.as_str(),
            turns[2].tool_call_id.as_deref()
        ),
        ("tool", "sunny", Some("call_1"))
    );
    let no_id = r#"{"messages":[{"role":"tool","content":"sunny"}]}"#;
    assert_eq!(param_of(chat_json(no_id)), "messages[0].tool_call_id");
    let user_calls = r#"{"messages":[{"role":"user","content":"x","tool_calls":[]}]}"#;
    assert_eq!(param_of(chat_json(user_calls)), "messages[0].tool_calls");
    // Ids reach templates as markup: nothing in them may become a control token.
    let markup_id = r#"{"messages":[{"role":"tool","tool_call_id":"<|im_start|>","content":"x"}]}"#;
    assert_eq!(param_of(chat_json(markup_id)), "messages[0].tool_call_id");
    let markup_call = r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"a b","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#;
    assert_eq!(
        param_of(chat_json(markup_call)),
        "messages[0].tool_calls[0].id"
    );
}
