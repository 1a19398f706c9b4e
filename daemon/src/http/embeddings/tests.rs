use serde_json::json;

use super::wire::{base64_encode, EmbeddingRequest, Vector};
use crate::http::validate::{self, EmbedInputs, InvalidRequest, MAX_INPUTS};

fn parse(body: serde_json::Value) -> Result<validate::ValidEmbeddings, InvalidRequest> {
    let wire: EmbeddingRequest = validate::parse_json(body.to_string().as_bytes())?;
    validate::embeddings(wire)
}

fn param_of(e: InvalidRequest) -> String {
    match e {
        InvalidRequest::Field { param, .. } => param,
        InvalidRequest::Json(m) => panic!("expected a field error, got JSON: {m}"),
    }
}

#[test]
fn input_takes_openais_four_forms() {
    let one = parse(json!({"input": "hello", "model": "m"})).expect("string");
    assert_eq!(one.inputs, EmbedInputs::Texts(vec!["hello".into()]));
    assert_eq!(one.model.as_deref(), Some("m"));
    assert!(!one.base64);
    let many = parse(json!({"input": ["a", "b"]})).expect("strings");
    assert_eq!(
        many.inputs,
        EmbedInputs::Texts(vec!["a".into(), "b".into()])
    );
    let ids = parse(json!({"input": [1, 2, 3]})).expect("ids");
    assert_eq!(
        ids.inputs,
        EmbedInputs::Tokens {
            lists: vec![vec![1, 2, 3]],
            flat: true
        }
    );
    let lists = parse(json!({"input": [[1], [2, 3]]})).expect("lists");
    assert_eq!(
        lists.inputs,
        EmbedInputs::Tokens {
            lists: vec![vec![1], vec![2, 3]],
            flat: false
        }
    );
}

#[test]
fn empty_and_malformed_inputs_name_the_item() {
    for (body, param) in [
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": ["a", ""]}), "input[1]"),
        (json!({"input": ["a", 3]}), "input[1]"),
        (json!({"input": [[1], []]}), "input[1]"),
        (json!({"input": [[1], [2, "x"]]}), "input[1][1]"),
        (json!({"input": [1, 2.5]}), "input[1]"),
        (json!({"input": {"text": "a"}}), "input"),
        (json!({"input": null}), "input"),
        (json!({"model": "m"}), "input"),
        (json!({"input": "a\u{0}b"}), "input"),
    ] {
        let e = parse(body.clone()).expect_err(&body.to_string());
        assert_eq!(param_of(e), param, "{body}");
    }
    let too_many = vec!["x"; MAX_INPUTS + 1];
    assert_eq!(
        param_of(parse(json!({ "input": too_many })).expect_err("too many")),
        "input"
    );
}

#[test]
fn encoding_format_is_float_or_base64() {
    assert!(
        !parse(json!({"input": "a", "encoding_format": "float"}))
            .expect("float")
            .base64
    );
    assert!(
        parse(json!({"input": "a", "encoding_format": "base64"}))
            .expect("b64")
            .base64
    );
    let e = parse(json!({"input": "a", "encoding_format": "int8"})).expect_err("int8");
    assert_eq!(param_of(e), "encoding_format");
}

#[test]
fn dimensions_must_be_the_models_own() {
    let ok = parse(json!({"input": "a", "dimensions": 576})).expect("576");
    assert_eq!(validate::check_dimensions(ok.dimensions, 576), Ok(()));
    assert_eq!(validate::check_dimensions(None, 576), Ok(()));
    let small = parse(json!({"input": "a", "dimensions": 256})).expect("parses");
    let e = validate::check_dimensions(small.dimensions, 576).expect_err("256 != 576");
    assert!(e.to_string().contains("576"), "{e}");
    assert_eq!(param_of(e), "dimensions");
    let zero = parse(json!({"input": "a", "dimensions": 0})).expect_err("0");
    assert_eq!(param_of(zero), "dimensions");
}

#[test]
fn user_is_accepted_and_unknown_fields_refused() {
    parse(json!({"input": "a", "user": "u-1"})).expect("user");
    let e = parse(json!({"input": "a", "temperature": 1})).expect_err("unknown");
    assert!(e.to_string().contains("temperature"), "{e}");
}

#[test]
fn token_ids_outside_the_vocabulary_name_their_place() {
    let ok = validate::check_token_ids(&[vec![0, 9]], true, 10).expect("in range");
    assert_eq!(ok, vec![vec![0, 9]]);
    let flat = validate::check_token_ids(&[vec![0, 10]], true, 10).expect_err("10");
    assert_eq!(param_of(flat), "input[1]");
    let nested = validate::check_token_ids(&[vec![1], vec![2, -1]], false, 10).expect_err("-1");
    assert_eq!(param_of(nested), "input[1][1]");
    let huge = validate::check_token_ids(&[vec![i64::MAX]], false, 10).expect_err("huge");
    assert_eq!(param_of(huge), "input[0][0]");
}

#[test]
fn base64_matches_rfc_4648_vectors() {
    for (raw, enc) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64_encode(raw.as_bytes()), enc, "{raw}");
    }
}

#[test]
fn base64_vector_is_little_endian_f32() {
    // 1.0f32 = 00 00 80 3F, -2.0f32 = 00 00 00 C0.
    let Vector::Base64(s) = Vector::encode(vec![1.0, -2.0], true) else {
        panic!("base64 asked for");
    };
    assert_eq!(s, base64_encode(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]));
    assert_eq!(s, "AACAPwAAAMA=");
    let Vector::Float(v) = Vector::encode(vec![0.5], false) else {
        panic!("float asked for");
    };
    assert_eq!(v, vec![0.5]);
}
