//! Speculative decoding by prompt lookup on the real model: at temperature 0 an answer that
//! quotes its prompt comes out as without speculation, in fewer steps (drafts accepted in
//! /metrics and in `timings`); a request can opt out. (`--spec draft`: `spec_draft.rs`.)

use serde_json::{json, Value};

use crate::harness::{metric, text_of, Daemon};

/// Texts the model is asked to repeat: what it quotes, prompt lookup drafts.
pub(crate) const QUOTES: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog, and the dog does not seem to mind at all.",
    "To reset the device, hold the power button for ten seconds until the LED blinks green, \
     then release it and wait for the fan to stop.",
    "fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 { a - b }",
];

pub(crate) fn repeat(text: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": format!("Repeat exactly: {text}")}],
        "max_tokens": 64,
        "temperature": 0,
    })
}

#[tokio::test]
async fn prompt_lookup_keeps_temperature_zero_text_and_accepts_drafts() {
    // One slot and no prompt reuse: each request's steps depend on nothing else.
    let args = ["--slots", "1", "--ctx", "1024", "--prefix-cache", "off"];
    let on = Daemon::start(&[&args[..], &["--spec", "ngram"]].concat());
    let off = Daemon::start(&[&args[..], &["--spec", "off"]].concat());
    let mut differ = Vec::new();
    for quote in QUOTES {
        let a = on.chat(&repeat(quote)).await;
        let b = off.chat(&repeat(quote)).await;
        if text_of(&a) != text_of(&b) {
            differ.push((text_of(&a), text_of(&b)));
        }
        let t = &a["timings"];
        let drafted = t["draft_n"].as_u64().unwrap_or(0);
        let accepted = t["draft_n_accepted"].as_u64().unwrap_or(0);
        assert!(accepted <= drafted, "{t}");
        assert!(
            b["timings"].get("draft_n").is_none(),
            "nothing drafted with --spec off: {}",
            b["timings"]
        );
    }
    // llama.cpp rounds a row differently by the batch it is computed in (a verification
    // computes several rows of one sequence at once), so text could in principle part
    // where two tokens' logits nearly tie; on these prompts it does not.
    assert!(
        differ.is_empty(),
        "texts differ with speculation: {differ:?}"
    );
    let m = on.metrics().await;
    let drafted = metric(&m, "inferloop_spec_drafted_tokens_total");
    let accepted = metric(&m, "inferloop_spec_accepted_tokens_total");
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
    let m = off.metrics().await;
    assert_eq!(metric(&m, "inferloop_spec_drafted_tokens_total"), 0.0);

    // Opting out: nothing drafted for this request.
    let before = metric(&on.metrics().await, "inferloop_spec_drafted_tokens_total");
    let mut body = repeat(QUOTES[0]);
    body["speculative"] = json!(false);
    let v = on.chat(&body).await;
    assert!(v["timings"].get("draft_n").is_none(), "{}", v["timings"]);
    let after = metric(&on.metrics().await, "inferloop_spec_drafted_tokens_total");
    assert_eq!(before, after);
    let status = on.status().await;
    let spec = &status["speculative"];
    assert_eq!(spec["mode"], "ngram", "{status}");
    assert_eq!(
        spec["accepted_tokens_total"].as_f64(),
        Some(accepted),
        "{spec}"
    );
    assert_eq!(off.status().await["speculative"]["mode"], "off");
}
