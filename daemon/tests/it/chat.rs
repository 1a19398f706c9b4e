//! Non-streamed generation: response shape, usage and timings, seeds, stop sequences and the
//! length limit, on both generation routes.

use serde_json::{json, Value};

use crate::harness::{chat_body, counting_body, model_id, shared, text_of, usage_adds_up};

/// A prompt whose temperature-0 answer is a few plain English sentences.
pub const EXPLAIN: &str = "Explain in three sentences why the sky is blue.";

#[tokio::test]
async fn chat_completion_has_the_openai_shape_and_usage() {
    let v = shared().chat(&chat_body(EXPLAIN, 16)).await;
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")),
        "{v}"
    );
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], model_id().as_str());
    assert!(
        v["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
        "{v}"
    );
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 1, "{v}");
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[0]["message"]["role"], "assistant");
    assert!(!text_of(&v).is_empty(), "{v}");
    assert!(
        ["stop", "length"].contains(&choices[0]["finish_reason"].as_str().unwrap_or_default()),
        "{v}"
    );
    usage_adds_up(&v, 16);
}

#[tokio::test]
async fn chat_completion_reports_timings() {
    let v = shared().chat(&chat_body(EXPLAIN, 16)).await;
    let t = &v["timings"];
    // The shared daemon may have seen this prompt: prompt_n counts only what was evaluated.
    let cached = t["cache_n"].as_u64().expect("timings.cache_n");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(cached),
        "{v}"
    );
    assert_eq!(
        t["prompt_n"].as_u64().map(|n| n + cached),
        v["usage"]["prompt_tokens"].as_u64(),
        "{v}"
    );
    assert_eq!(t["predicted_n"], v["usage"]["completion_tokens"], "{v}");
    let num = |k: &str| {
        t[k].as_f64()
            .unwrap_or_else(|| panic!("timings.{k} missing: {t}"))
    };
    assert!(num("prompt_ms") > 0.0, "{t}");
    assert!(num("queue_ms") >= 0.0, "{t}");
    assert!(num("predicted_ms") >= 0.0, "{t}");
    if num("predicted_n") >= 2.0 {
        assert!(num("predicted_ms") > 0.0, "{t}");
        assert!(num("predicted_per_second") > 0.0, "{t}");
    }
}

#[tokio::test]
async fn text_completion_has_the_openai_shape_usage_and_timings() {
    let v = shared().complete(&counting_body(8, false)).await;
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")),
        "{v}"
    );
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], model_id().as_str());
    assert_eq!(v["choices"][0]["index"], 0);
    assert!(!text_of(&v).is_empty(), "{v}");
    usage_adds_up(&v, 8);
    assert_eq!(v["timings"]["predicted_n"], 8, "{v}");
    assert!(
        v["timings"]["predicted_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{v}"
    );
}

#[tokio::test]
async fn reaching_max_tokens_finishes_with_length() {
    let v = shared().complete(&counting_body(12, false)).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");

    let v = shared()
        .chat(&chat_body("Write a long story about a dragon.", 5))
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
}

fn sampled(seed: i64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a short story about a cat."}],
        "max_tokens": 24,
        "temperature": 0.9,
        "seed": seed,
    })
}

#[tokio::test]
async fn same_seed_reproduces_sampled_text() {
    let d = shared();
    let a = text_of(&d.chat(&sampled(42)).await);
    let b = text_of(&d.chat(&sampled(42)).await);
    assert_eq!(a, b);
}

#[tokio::test]
async fn different_seeds_sample_different_texts() {
    let d = shared();
    let mut texts = Vec::new();
    for seed in [1, 2, 3, 4] {
        texts.push(text_of(&d.chat(&sampled(seed)).await));
    }
    assert!(
        texts.iter().any(|t| *t != texts[0]),
        "four seeds at temperature 0.9 gave the same text: {texts:?}"
    );
}

/// A stop string taken from the middle of `text` (a whole word, with its leading space),
/// and the part of `text` before its first occurrence.
pub fn pick_stop(text: &str) -> (String, String) {
    let word = text
        .split_whitespace()
        .skip(3)
        .find(|w| w.len() >= 4 && w.chars().all(char::is_alphabetic))
        .unwrap_or_else(|| panic!("no word to stop on in {text:?}"));
    let stop = format!(" {word}");
    let at = text
        .find(&stop)
        .unwrap_or_else(|| panic!("{stop:?} not in {text:?}"));
    (stop, text[..at].to_string())
}

#[tokio::test]
async fn stop_sequence_ends_the_output_just_before_it() {
    let d = shared();
    let free = text_of(&d.chat(&chat_body(EXPLAIN, 32)).await);
    let (stop, before) = pick_stop(&free);

    let mut body = chat_body(EXPLAIN, 32);
    body["stop"] = json!([stop]);
    let v = d.chat(&body).await;
    let text = text_of(&v);
    assert_eq!(text, before, "stop {stop:?}; unstopped output {free:?}");
    assert!(!text.contains(&stop));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

#[tokio::test]
async fn repeat_penalty_changes_greedy_text_within_its_window_only() {
    let d = shared();
    let body = |extra: Value| {
        let mut b = chat_body("List the numbers from one to twenty, in words.", 48);
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    let plain = text_of(&d.chat(&body(json!({}))).await);
    let penalized = text_of(&d.chat(&body(json!({"repeat_penalty": 1.8}))).await);
    // A zero window turns every penalty off: the text is the unpenalized one exactly.
    let windowless = text_of(
        &d.chat(&body(json!({"repeat_penalty": 1.8, "repeat_last_n": 0})))
            .await,
    );
    assert_ne!(penalized, plain, "the penalty acted");
    assert_eq!(windowless, plain);
    let text = text_of(
        &d.complete(
            &json!({"prompt": "one, two, three, four, five,", "max_tokens": 24,
                            "temperature": 0, "repeat_penalty": 1.8}),
        )
        .await,
    );
    let plain = text_of(
        &d.complete(
            &json!({"prompt": "one, two, three, four, five,", "max_tokens": 24,
                            "temperature": 0}),
        )
        .await,
    );
    assert_ne!(text, plain, "the penalty acted on completions");
}
