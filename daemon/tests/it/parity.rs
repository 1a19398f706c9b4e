//! OpenAI parity: `logprobs` on both routes (whole and streamed), `logit_bias` banning and
//! forcing tokens, refusals of OpenAI fields this server does not implement, and
//! `/tokenize` + `/detokenize`.

use serde_json::{json, Value};

use crate::chat::EXPLAIN;
use crate::harness::{assert_error, chat_body, counting_body, shared, text_of};

/// Checks the chat `logprobs.content` entries of one answer; returns (token, logprob) pairs.
fn check_chat_entries(content: &[Value], top_n: usize) -> Vec<(String, f64)> {
    content
        .iter()
        .map(|e| {
            let token = e["token"].as_str().expect("token").to_string();
            let lp = e["logprob"].as_f64().expect("logprob");
            assert!(lp <= 0.0, "{e}");
            let bytes: Vec<u8> = e["bytes"]
                .as_array()
                .expect("bytes")
                .iter()
                .map(|b| b.as_u64().expect("byte") as u8)
                .collect();
            assert_eq!(String::from_utf8_lossy(&bytes), token, "{e}");
            let top = e["top_logprobs"].as_array().expect("top_logprobs");
            assert_eq!(top.len(), top_n, "{e}");
            let mass: f64 = top
                .iter()
                .map(|t| t["logprob"].as_f64().expect("logprob").exp())
                .sum();
            assert!(mass <= 1.0 + 1e-4, "{e}");
            // Temperature 0, no penalties: the sampled token is the most likely one.
            assert_eq!(top[0]["token"], e["token"], "{e}");
            assert!(
                (top[0]["logprob"].as_f64().unwrap_or(1.0) - lp).abs() < 1e-5,
                "{e}"
            );
            (token, lp)
        })
        .collect()
}

#[tokio::test]
async fn chat_logprobs_follow_the_greedy_tokens_whole_and_streamed() {
    let d = shared();
    let mut body = chat_body(EXPLAIN, 12);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let v = d.chat(&body).await;
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs.content: {v}"));
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        "{v}"
    );
    let whole = check_chat_entries(content, 3);
    let joined: String = whole.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(joined, text_of(&v));

    body["stream"] = json!(true);
    let chunks = d.stream("/v1/chat/completions", &body).await;
    let mut streamed = Vec::new();
    for c in &chunks {
        if let Some(content) = c["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(check_chat_entries(content, 3));
        }
    }
    assert_eq!(streamed.len(), whole.len(), "{chunks:?}");
    for (a, b) in streamed.iter().zip(&whole) {
        assert_eq!(a.0, b.0);
        assert!((a.1 - b.1).abs() < 1e-4, "{a:?} vs {b:?}");
    }
    // Not asked for: null, as before.
    let plain = d.chat(&chat_body(EXPLAIN, 2)).await;
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
}

#[tokio::test]
async fn completion_logprobs_have_the_legacy_shape_whole_and_streamed() {
    let d = shared();
    let mut body = counting_body(8, false);
    body["logprobs"] = json!(2);
    let v = d.complete(&body).await;
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs.tokens: {v}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tokens.len(), 8, "{v}");
    assert_eq!(tokens.concat(), text_of(&v));
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .expect("text_offset")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(offsets[0], 0, "{lp}");
    for (i, t) in tokens.iter().enumerate().skip(1) {
        assert_eq!(
            offsets[i],
            offsets[i - 1] + tokens[i - 1].chars().count() as u64,
            "{t:?}: {lp}"
        );
    }
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("a map");
        // The two most likely, and the sampled token (here the first of them).
        assert_eq!(top.len(), 2, "{lp}");
        let own = lp["token_logprobs"][i].as_f64().expect("token_logprob");
        assert!(own <= 0.0);
        assert_eq!(
            top.get(tokens[i]).and_then(Value::as_f64),
            Some(own),
            "{lp}"
        );
    }

    body["stream"] = json!(true);
    let chunks = d.stream("/v1/completions", &body).await;
    let mut streamed = Vec::new();
    let mut streamed_offsets = Vec::new();
    for c in &chunks {
        let lp = &c["choices"][0]["logprobs"];
        for t in lp["tokens"].as_array().into_iter().flatten() {
            streamed.push(t.as_str().unwrap_or_default().to_string());
        }
        for o in lp["text_offset"].as_array().into_iter().flatten() {
            streamed_offsets.push(o.as_u64().unwrap_or(u64::MAX));
        }
    }
    assert_eq!(streamed, tokens, "{chunks:?}");
    assert_eq!(streamed_offsets, offsets);
}

/// The first greedy token's id, through `/tokenize` of its text.
async fn first_token(body: &Value) -> (String, i64) {
    let d = shared();
    let mut b = body.clone();
    b["logprobs"] = json!(true);
    let v = d.chat(&b).await;
    let first = v["choices"][0]["logprobs"]["content"][0]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no first token: {v}"))
        .to_string();
    let t = d
        .post_ok(
            "/tokenize",
            &json!({"content": first, "parse_special": false}),
        )
        .await;
    let ids = t["tokens"].as_array().expect("tokens");
    assert_eq!(ids.len(), 1, "{first:?} is one token: {t}");
    (first, ids[0].as_i64().expect("id"))
}

#[tokio::test]
async fn logit_bias_minus_100_bans_the_greedy_token_and_plus_100_forces_one() {
    let d = shared();
    let body = chat_body("Name a color.", 12);
    let (first, id) = first_token(&body).await;
    let mut banned = body.clone();
    banned["logprobs"] = json!(true);
    banned["logit_bias"] = json!({ id.to_string(): -100 });
    for stream in [false, true] {
        banned["stream"] = json!(stream);
        let tokens: Vec<String> = if stream {
            let chunks = d.stream("/v1/chat/completions", &banned).await;
            chunks
                .iter()
                .flat_map(|c| {
                    c["choices"][0]["logprobs"]["content"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .map(|e| e["token"].as_str().unwrap_or_default().to_string())
                .collect()
        } else {
            let v = d.chat(&banned).await;
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .expect("content")
                .iter()
                .map(|e| e["token"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        assert!(!tokens.is_empty());
        assert!(!tokens.contains(&first), "banned {first:?} in {tokens:?}");
    }

    let forced_text = " banana";
    let t = d
        .post_ok("/tokenize", &json!({"content": forced_text}))
        .await;
    let forced = t["tokens"][0].as_i64().expect("id");
    let mut body = chat_body("Name a color.", 4);
    body["logit_bias"] = json!({ forced.to_string(): 100 });
    body["logprobs"] = json!(true);
    let v = d.chat(&body).await;
    for e in v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content")
    {
        let piece = d.post_ok("/detokenize", &json!({"tokens": [forced]})).await;
        assert_eq!(e["token"], piece["content"], "{v}");
        assert!(e["logprob"].as_f64().unwrap_or(-1.0) > -1e-3, "{v}");
    }
}

#[tokio::test]
async fn bad_logit_bias_and_logprobs_are_400s_naming_the_field() {
    let d = shared();
    for (field, value, param) in [
        ("logit_bias", json!({"abc": 1}), "logit_bias"),
        ("logit_bias", json!({"10": 101}), "logit_bias"),
        ("logit_bias", json!({"999999": 1}), "logit_bias"),
        ("top_logprobs", json!(21), "top_logprobs"),
    ] {
        let mut body = chat_body("Hi", 2);
        body[field] = value.clone();
        if field == "top_logprobs" {
            body["logprobs"] = json!(true);
        }
        let resp = d.post("/v1/chat/completions", &body).await;
        let err = assert_error(resp, 400, Some(param), None).await;
        if let Some(key) = value.as_object().and_then(|o| o.keys().next()) {
            let msg = err["message"].as_str().unwrap_or_default();
            assert!(msg.contains(&format!("`{key}`")), "{msg}");
        }
    }
}

#[tokio::test]
async fn unsupported_openai_fields_are_400s_naming_the_field() {
    let d = shared();
    for (field, value) in [
        ("audio", json!({"voice": "alloy", "format": "wav"})),
        ("modalities", json!(["text", "audio"])),
        ("prediction", json!({"type": "content", "content": "x"})),
        ("web_search_options", json!({})),
        ("service_tier", json!("flex")),
        ("store", json!(true)),
        ("reasoning_effort", json!("low")),
        ("functions", json!([{"name": "f", "parameters": {}}])),
    ] {
        let mut body = chat_body("Hi", 2);
        body[field] = value;
        let resp = d.post("/v1/chat/completions", &body).await;
        assert_error(resp, 400, Some(field), None).await;
    }
    for (field, value) in [("best_of", json!(2)), ("suffix", json!("The end."))] {
        let mut body = counting_body(2, false);
        body[field] = value;
        let resp = d.post("/v1/completions", &body).await;
        assert_error(resp, 400, Some(field), None).await;
    }
    // What asks for nothing is served.
    let mut body = chat_body("Hi", 2);
    body["store"] = json!(false);
    body["service_tier"] = json!("auto");
    body["modalities"] = json!(["text"]);
    body["metadata"] = json!({"k": "v"});
    body["user"] = json!("u-1");
    d.chat(&body).await;
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let d = shared();
    let text = "Hello, world! Ünïcödé 🤗";
    let t = d.post_ok("/tokenize", &json!({"content": text})).await;
    let ids: Vec<i64> = t["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    assert!(ids.len() > 5, "{t}");
    let back = d.post_ok("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(back["content"], text);

    let p = d
        .post_ok("/tokenize", &json!({"content": text, "with_pieces": true}))
        .await;
    let pieces = p["tokens"].as_array().expect("tokens");
    assert_eq!(pieces.len(), ids.len());
    let mut bytes = Vec::new();
    for (piece, id) in pieces.iter().zip(&ids) {
        assert_eq!(piece["id"].as_i64(), Some(*id), "{piece}");
        match &piece["piece"] {
            Value::String(s) => bytes.extend(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().unwrap_or(0) as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&bytes), text);

    // Template markers are parsed by default, kept as text when asked.
    let marker = d
        .post_ok("/tokenize", &json!({"content": "<|im_start|>"}))
        .await;
    assert_eq!(
        marker["tokens"].as_array().map(Vec::len),
        Some(1),
        "{marker}"
    );
    let plain = d
        .post_ok(
            "/tokenize",
            &json!({"content": "<|im_start|>", "parse_special": false}),
        )
        .await;
    assert!(
        plain["tokens"].as_array().map_or(0, Vec::len) > 1,
        "{plain}"
    );
    let rendered = d
        .post_ok("/detokenize", &json!({"tokens": marker["tokens"]}))
        .await;
    assert_eq!(rendered["content"], "<|im_start|>");

    for (body, param) in [
        (json!({"tokens": [1, 99999999]}), "tokens[1]"),
        (json!({"tokens": [-1]}), "tokens[0]"),
        (json!({"tokens": ["a"]}), "tokens[0]"),
        (json!({"tokens": [1.5]}), "tokens[0]"),
    ] {
        let resp = d.post("/detokenize", &body).await;
        assert_error(resp, 400, Some(param), None).await;
    }
    let resp = d.post("/tokenize", &json!({"content": 5})).await;
    assert_error(resp, 400, Some("content"), None).await;
}
