//! `n` > 1: a request's choices start together or wait together, share one evaluation of
//! the prompt, finish on their own, and are all cancelled when the client leaves.

use futures::StreamExt;
use serde_json::{json, Value};

use crate::harness::{assert_error, choice_chunks, counting_body, metric, Daemon, SETTLE};

fn two_slots() -> Daemon {
    Daemon::start(&["--slots", "2", "--ctx", "2048"])
}

fn sampled(n: u32, max_tokens: u32) -> Value {
    json!({
        // Past the 32 tokens below which a choice computes the prompt itself rather than
        // copy another's rows.
        "prompt": "Once upon a time, in a small village by the sea, there lived an old \
                   fisherman who rose before dawn every day, mended his nets by the light of \
                   a lantern, and rowed out past the rocks where",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": 42,
        "n": n,
        "logprobs": 1,
    })
}

#[tokio::test]
async fn each_choice_has_its_index_text_logprobs_and_finish_reason() {
    let d = two_slots();
    let v = d.complete(&sampled(2, 8)).await;
    let choices = v["choices"].as_array().cloned().unwrap_or_default();
    assert_eq!(choices.len(), 2, "{v}");
    let mut completion = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        let tokens = c["logprobs"]["tokens"].as_array().map_or(0, Vec::len);
        assert!(tokens > 0, "{c}");
        assert_eq!(
            c["logprobs"]["tokens"]
                .as_array()
                .map(|t| t.iter().filter_map(Value::as_str).collect::<String>()),
            c["text"].as_str().map(str::to_string),
            "the logprobs spell the choice's own text"
        );
        assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap_or("")));
        completion += tokens;
    }
    assert_ne!(choices[0]["text"], choices[1]["text"], "{v}");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], completion, "{u}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap_or(0) + completion as u64)
    );
    // The prompt went through the model once: the second choice reused all of it but the
    // token it feeds itself.
    let (prompt, t) = (u["prompt_tokens"].as_u64().unwrap_or(0), &v["timings"]);
    assert_eq!(t["prompt_n"].as_u64(), Some(prompt + 1), "{t}");
    assert_eq!(t["cache_n"].as_u64(), Some(prompt - 1), "{t}");

    // A seed makes every choice reproducible.
    let again = d.complete(&sampled(2, 8)).await;
    let texts = |v: &Value| {
        v["choices"]
            .as_array()
            .map(|c| c.iter().map(|c| c["text"].clone()).collect::<Vec<_>>())
    };
    assert_eq!(texts(&again), texts(&v));
}

#[tokio::test]
async fn choices_wait_for_slots_together_and_start_together() {
    let d = two_slots();
    let running = d.post("/v1/completions", &counting_body(1500, true)).await;
    assert_eq!(running.status(), 200);
    let url = d.url("/v1/completions");
    let both = tokio::spawn(async move {
        let resp = crate::harness::http()
            .post(url)
            .json(&sampled(2, 6))
            .send()
            .await;
        match resp {
            Ok(r) => r.json::<Value>().await.ok(),
            Err(_) => None,
        }
    });
    // One slot is free, but the request needs two: neither choice starts.
    let s = d
        .wait_status(SETTLE, "both choices queued", |s| s["queue"]["depth"] == 2)
        .await;
    assert_eq!(s["slots"]["active"], 1, "{s}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let s = d.status().await;
    assert_eq!(
        (s["slots"]["active"].clone(), s["queue"]["depth"].clone()),
        (json!(1), json!(2)),
        "no partial start: {s}"
    );
    drop(running);
    let v = both
        .await
        .ok()
        .flatten()
        .expect("the choices were answered");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
}

#[tokio::test]
async fn a_client_that_leaves_cancels_every_choice() {
    let d = two_slots();
    let before = metric(&d.metrics().await, "inferloop_cancelled_total");
    let mut body = counting_body(1500, true);
    body["n"] = json!(2);
    let resp = d.post("/v1/completions", &body).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut seen = Vec::new();
    while seen.windows(6).filter(|w| w == b"data: ").count() < 6 {
        seen.extend_from_slice(&stream.next().await.expect("open").expect("chunk"));
    }
    assert_eq!(d.status().await["slots"]["active"], 2);
    drop(stream);
    let m = d
        .wait_metrics(SETTLE, "both choices cancelled", |m| {
            metric(m, "inferloop_active_slots") == 0.0
        })
        .await;
    assert_eq!(metric(&m, "inferloop_cancelled_total"), before + 2.0, "{m}");
}

#[tokio::test]
async fn streamed_choices_carry_their_index_and_one_usage_chunk() {
    let d = two_slots();
    let mut body = sampled(2, 6);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = d.stream("/v1/completions", &body).await;
    let whole = d.complete(&sampled(2, 6)).await;
    for i in 0..2 {
        let text: String = choice_chunks(&chunks)
            .iter()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["index"] == i)
            .filter_map(|c| c["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(json!(text), whole["choices"][i]["text"], "choice {i}");
    }
    let usage: Vec<&Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1, "{chunks:?}");
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[0]["usage"][field], whole["usage"][field], "{field}");
    }
}

#[tokio::test]
async fn too_many_choices_for_the_slots_is_400_and_a_max_n_above_them_exits_2() {
    let d = two_slots();
    assert_error(
        d.post("/v1/completions", &sampled(3, 2)).await,
        400,
        Some("n"),
        None,
    )
    .await;
    let (status, log) = Daemon::run_to_exit(
        &["--slots", "2", "--max-n", "3"],
        std::time::Duration::from_secs(20),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("max_n"), "{log}");
}
