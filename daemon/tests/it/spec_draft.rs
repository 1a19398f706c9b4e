//! Speculative decoding with a draft model on the real weights: the Q4_1 default model
//! drafts for its Q8_0 copy (`make model-q8`). At temperature 0 the text is the Q8_0
//! model's own; the draft model's lines are in the ledger; a draft model with another
//! vocabulary is refused at load (exit 2), and so is one a manifest does not pin (exit 3).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::golden::q8_model;
use crate::harness::{find_model, text_of, Daemon};
use crate::memory::sha256_of;
use crate::spec::{assert_drafts_accepted, repeat, QUOTES};

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn term(status: &Value, name: &str) -> u64 {
    status["memory"]["terms"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == name))
        .and_then(|t| t["bytes"].as_u64())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_draft_model_drafts_for_the_q8_0_copy_keeping_temperature_zero_text() {
    let (q8, small) = (q8_model(), find_model().unwrap_or_else(|e| panic!("{e}")));
    let args = [
        "--model",
        path_str(&q8),
        "--slots",
        "2",
        "--ctx",
        "1024",
        "--prefix-cache",
        "off",
    ];
    // A draft model alone makes `draft` the mode.
    let on = Daemon::start(
        &[
            &args[..],
            &["--draft-model", path_str(&small), "--spec-gate", "always"],
        ]
        .concat(),
    );
    let off = Daemon::start(&[&args[..], &["--spec", "off"]].concat());
    let open = json!({
        "messages": [{"role": "user", "content": "Write two sentences about the sea."}],
        "max_tokens": 48,
        "temperature": 0,
    });
    let bodies: Vec<Value> = QUOTES.iter().map(|q| repeat(q)).chain([open]).collect();
    let mut differ = Vec::new();
    for body in &bodies {
        let (a, b) = (on.chat(body).await, off.chat(body).await);
        if text_of(&a) != text_of(&b) {
            differ.push((text_of(&a), text_of(&b)));
        }
        let t = &a["timings"];
        assert!(
            t["draft_n_accepted"].as_u64() <= t["draft_n"].as_u64(),
            "{t}"
        );
    }
    // Both models are quantized from the same weights, so the greedy drafts mostly hold;
    // the verification keeps the Q8_0 model's own argmax either way.
    assert!(
        differ.is_empty(),
        "texts differ with a draft model: {differ:?}"
    );
    assert_drafts_accepted(&on).await;
    let status = on.status().await;
    assert_eq!(status["speculative"]["mode"], "draft", "{status}");
    assert_eq!(status["speculative"]["draft_model"], path_str(&small));
    // The ledger counts the draft model: its tensors and its own context.
    assert!(term(&status, "draft_weights") > 50 << 20, "{status}");
    assert!(term(&status, "draft_context") > 0, "{status}");
    assert_eq!(term(&off.status().await, "draft_weights"), 0);
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused_at_load() {
    let small = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other-vocab.gguf");
    let mut bytes = std::fs::read(&small).expect("read model");
    // Token text is stored length-prefixed: rename one token, same length.
    let token = b"\x0c\0\0\0\0\0\0\0<|im_start|>";
    let at = bytes
        .windows(token.len())
        .position(|w| w == token)
        .expect("the model's vocabulary holds <|im_start|>");
    bytes[at + 8..at + token.len()].copy_from_slice(b"<|im_stXrt|>");
    std::fs::write(&other, &bytes).expect("write");
    let (status, log) = Daemon::run_to_exit(
        &["--draft-model", path_str(&other)],
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("cannot draft for") && log.contains("<|im_stXrt|>"),
        "{log}"
    );
    assert!(!log.contains("listening on"), "{log}");
}

#[tokio::test]
async fn a_manifest_must_pin_the_draft_model_too() {
    let small = find_model().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("manifest.json");
    let pin = json!({
        "path": path_str(&small),
        "sha256": sha256_of(&small),
        "size": std::fs::metadata(&small).expect("stat").len(),
    });
    let write = |doc: Value| {
        std::fs::write(&manifest, serde_json::to_vec_pretty(&doc).expect("json"))
            .expect("write manifest")
    };
    let args = [
        "--manifest",
        path_str(&manifest),
        "--draft-model",
        path_str(&small),
        "--slots",
        "1",
        "--ctx",
        "512",
    ];
    write(json!({"schema": 1, "model": pin}));
    let (status, log) = Daemon::run_to_exit(&args, Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("pins no draft model"), "{log}");
    // A wrong pin is a mismatch like the model's own.
    let mut wrong = pin.clone();
    wrong["sha256"] = json!("0".repeat(64));
    write(json!({"schema": 1, "model": pin, "draft_model": wrong}));
    let (status, log) = Daemon::run_to_exit(&args, Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("wrong SHA-256"), "{log}");
    // Pinned, it serves; without --draft-model the manifest's pin is the draft model.
    write(json!({"schema": 1, "model": pin, "draft_model": pin}));
    let daemon = Daemon::start(&[&args[..2], &args[4..]].concat());
    let status = daemon.status().await;
    assert_eq!(status["speculative"]["mode"], "draft", "{status}");
    assert_eq!(status["speculative"]["draft_model"], path_str(&small));
}
