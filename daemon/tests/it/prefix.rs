//! Prompt reuse on the real model: in exact mode temperature-0 text is the same as with the
//! cache off; in the default mode (`on`, llama-server's semantics) nearly every shared token
//! is reused, decoded answers included; reuse is visible in usage, timings and metrics.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{metric, stream_text, text_of, Daemon};

/// A long, fixed system prompt: what appliances resend with every request.
fn system_prompt() -> String {
    let rules = [
        "Answer in one short sentence.",
        "Prefer plain words over jargon.",
        "Never invent facts about the device.",
        "When unsure, say so and suggest a check.",
        "Quote numbers with their units.",
    ];
    let mut s = String::from("You are the assistant of a field appliance. ");
    for i in 0..30 {
        s.push_str(&format!("Rule {}: {} ", i + 1, rules[i % rules.len()]));
    }
    s
}

fn chat(question: &str, stream: bool) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": question},
        ],
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

fn completion(prompt: &str, stream: bool) -> Value {
    json!({
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

/// Text and cached prompt tokens of one request, streamed or not.
async fn ask(d: &Daemon, path: &str, body: &Value) -> (String, u64) {
    if body["stream"] == true {
        let chunks = d.stream(path, body).await;
        let usage = chunks
            .iter()
            .rev()
            .find(|c| c["usage"].is_object())
            .map(|c| c["usage"].clone())
            .unwrap_or_else(|| panic!("no usage chunk in {chunks:?}"));
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens");
        (stream_text(&chunks), cached)
    } else {
        let v = d.post_ok(path, body).await;
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens");
        assert_eq!(
            v["timings"]["cache_n"].as_u64(),
            Some(cached),
            "timings.cache_n agrees with usage: {v}"
        );
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
        assert_eq!(
            v["timings"]["prompt_n"].as_u64(),
            Some(prompt_tokens - cached),
            "prompt_n counts only evaluated tokens: {v}"
        );
        (text_of(&v), cached)
    }
}

/// The requests of the exactness check, in order: shared prefixes, prefixes that diverge
/// mid-way, streamed and not, chat and completions.
fn workload() -> Vec<(&'static str, Value)> {
    let long = format!("{} The device reports", system_prompt());
    vec![
        ("/v1/chat/completions", chat("What does the fan do?", false)),
        ("/v1/chat/completions", chat("What does the fan do?", true)),
        ("/v1/chat/completions", chat("Why is the LED blue?", false)),
        ("/v1/chat/completions", chat("Why is the LED blue?", true)),
        (
            "/v1/completions",
            completion(&format!("{long} a temperature of"), false),
        ),
        (
            "/v1/completions",
            completion(&format!("{long} a voltage of"), true),
        ),
        (
            "/v1/completions",
            completion(&format!("{long} a temperature of"), true),
        ),
        (
            "/v1/completions",
            completion("Something else entirely:", false),
        ),
        // Longer than one 512-token chunk, diverging after it.
        (
            "/v1/completions",
            completion(&format!("{long} {long} a fan speed of"), false),
        ),
        (
            "/v1/completions",
            completion(&format!("{long} {long} a fan noise of"), true),
        ),
        // A chat resent with its history, as chat clients do.
        (
            "/v1/chat/completions",
            turn(&["What does the fan do?"], false),
        ),
        (
            "/v1/chat/completions",
            turn(&["What does the fan do?", "And the LED?"], true),
        ),
        (
            "/v1/chat/completions",
            turn(&["What does the fan do?", "And the LED?", "Thanks."], false),
        ),
    ]
}

/// A chat whose earlier answers are fixed text, so both daemons see the same history.
fn turn(questions: &[&str], stream: bool) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system_prompt()})];
    for (i, q) in questions.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": format!("Answer number {i}.")}));
        }
        messages.push(json!({"role": "user", "content": q}));
    }
    let mut body = chat("", stream);
    body["messages"] = json!(messages);
    body
}

#[tokio::test]
async fn reuse_exact_gives_the_same_text_as_reuse_off_and_reports_the_cached_tokens() {
    let args = ["--slots", "2", "--ctx", "1024"];
    let on = Daemon::start(&[&args[..], &["--prefix-cache", "exact"]].concat());
    let off = Daemon::start(&[&args[..], &["--prefix-cache", "off"]].concat());
    let mut hits = 0;
    for (i, (path, body)) in workload().iter().enumerate() {
        let (text_on, cached_on) = ask(&on, path, body).await;
        let (text_off, cached_off) = ask(&off, path, body).await;
        assert_eq!(
            text_on, text_off,
            "request {i} ({path}) differs with exact reuse"
        );
        assert_eq!(
            cached_off, 0,
            "request {i}: nothing is reused with the cache off"
        );
        if i > 0 && cached_on > 0 {
            hits += 1;
        }
    }
    assert!(
        hits >= 9,
        "most requests after the first reuse a prefix ({hits})"
    );
    let status = on.status().await;
    let cache = &status["prefix_cache"];
    assert_eq!(cache["enabled"], true);
    assert_eq!(cache["mode"], "exact");
    assert!(cache["hit_rate"].as_f64().unwrap_or(0.0) > 0.5, "{cache}");
    let metrics = on.metrics().await;
    assert!(metric(&metrics, "inferloop_prefix_cache_hit_tokens_total") > 0.0);
    on.wait_metrics(
        Duration::from_secs(5),
        "cells retained after the last answer",
        |m| metric(m, "inferloop_prefix_cache_retained_cells") > 0.0,
    )
    .await;
    assert_eq!(off.status().await["prefix_cache"]["enabled"], false);
}

/// Turn two of a chat whose first answer is the model's own: prompt tokens of turn one, its
/// completion tokens, and the tokens turn two found cached.
async fn resent_chat(d: &Daemon) -> (u64, u64, u64) {
    let first = chat("What does the fan do?", false);
    let v = d.chat(&first).await;
    let usage = &v["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        usage["completion_tokens"]
            .as_u64()
            .expect("completion_tokens"),
    );
    let mut second = first.clone();
    let messages = second["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": text_of(&v)}));
    messages.push(json!({"role": "user", "content": "And when does it stop?"}));
    let (text, cached) = ask(d, "/v1/chat/completions", &second).await;
    assert!(!text.is_empty(), "turn two answered");
    (prompt, completion, cached)
}

#[tokio::test]
async fn reuse_on_takes_the_decoded_answer_of_a_resent_chat() {
    let args = ["--slots", "1", "--ctx", "1024"];
    // The default, and `relaxed`, its deprecated name.
    for extra in [&[][..], &["--prefix-cache", "relaxed"][..]] {
        let on = Daemon::start(&[&args[..], extra].concat());
        let (prompt, completion, cached) = resent_chat(&on).await;
        assert!(
            cached > prompt + completion / 2,
            "{extra:?}: turn two reuses turn one's prompt ({prompt}) and most of its \
             {completion} decoded tokens, got {cached}"
        );
        assert_eq!(on.status().await["prefix_cache"]["mode"], "on");
    }
    let exact = Daemon::start(&[&args[..], &["--prefix-cache", "exact"]].concat());
    let (prompt, _, cached) = resent_chat(&exact).await;
    assert!(
        cached <= prompt,
        "exact: decoded rows are never reused ({cached} of {prompt})"
    );
    assert_eq!(exact.status().await["prefix_cache"]["mode"], "exact");
}

/// Two chats with the system prompt and different questions: (prompt tokens, cached tokens)
/// of the second.
async fn second_question(d: &Daemon) -> (u64, u64) {
    let (text, _) = ask(
        d,
        "/v1/chat/completions",
        &chat("What does the fan do?", false),
    )
    .await;
    assert!(!text.is_empty());
    let v = d
        .post_ok("/v1/chat/completions", &chat("Why is the LED blue?", false))
        .await;
    assert!(!text_of(&v).trim().is_empty(), "an answer: {v}");
    let usage = &v["usage"];
    (
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens"),
    )
}

#[tokio::test]
async fn reuse_on_takes_nearly_the_whole_shared_system_prompt() {
    // A stream per slot, and one shared pool.
    for args in [
        &["--slots", "2", "--ctx", "1024"][..],
        &["--slots", "2", "--ctx", "1024", "--kv-cells", "1536"][..],
    ] {
        let on = Daemon::start(args);
        let (prompt, cached) = second_question(&on).await;
        // The questions' tokens and the template's after them are all that differ.
        assert!(
            cached + 16 >= prompt && cached < prompt,
            "{args:?}: {cached} of {prompt} prompt tokens reused"
        );
        let exact = Daemon::start(&[args, &["--prefix-cache", "exact"][..]].concat());
        let (_, cached_exact) = second_question(&exact).await;
        assert!(
            cached_exact < cached,
            "{args:?}: exact reuses less ({cached_exact} vs {cached})"
        );
    }
}

#[tokio::test]
async fn a_prefix_held_by_a_running_request_is_copied_into_another_slot() {
    // A stream per slot. At ctx 640 the busy slot holds over half a stream (its prompt is
    // ~400 tokens), so the whole stream is copied; at 2048 only the cells it holds are (the
    // sequence-state path), and in exact mode the answer must still be the uncached one.
    for (mode, ctx) in [("exact", "640"), ("exact", "2048"), ("on", "2048")] {
        let off = Daemon::start(&["--slots", "2", "--ctx", ctx, "--prefix-cache", "off"]);
        let on = Daemon::try_start_with_env(
            &["--slots", "2", "--ctx", ctx, "--prefix-cache", mode],
            &[("RUST_LOG", "info,inferloopd::engine::backend::llama=debug")],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // The first request keeps its slot busy while the second arrives with the same
        // system prompt: the second lands in the other slot and copies the prefix from the
        // first.
        let long = {
            let mut b = chat("Tell me a long story about the fan.", true);
            b["max_tokens"] = json!(240);
            b
        };
        let busy = tokio::spawn({
            let url = on.url("/v1/chat/completions");
            let body = long.clone();
            async move {
                crate::harness::http()
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .map(|r| r.status())
            }
        });
        on.wait_status(Duration::from_secs(60), "the long request running", |s| {
            s["slots"]["active"] == 1 && s["kv"]["reserved"].as_u64().unwrap_or(0) > 0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let body = chat("What does the fan do?", false);
        let (text_on, cached) = ask(&on, "/v1/chat/completions", &body).await;
        let (text_off, _) = ask(&off, "/v1/chat/completions", &body).await;
        if mode == "exact" {
            assert_eq!(text_on, text_off, "ctx {ctx}");
        } else {
            // Rows computed in another batch shape may round differently, but the copied
            // cells must be the prompt's: the answer starts as the uncached one does.
            let first = |t: &str| t.split_whitespace().next().map(str::to_owned);
            assert!(first(&text_on).is_some(), "an answer");
            assert_eq!(
                first(&text_on),
                first(&text_off),
                "{text_on:?} / {text_off:?}"
            );
        }
        assert!(
            cached >= 100,
            "{mode} {ctx}: the system prompt came from the busy slot: {cached} cached tokens"
        );
        let how = if ctx == "640" { "stream" } else { "cells" };
        assert!(
            on.log().contains(&format!("how=\"{how}\"")),
            "{mode} {ctx}: copied by {how}: {}",
            on.log_tail()
        );
        busy.abort();
    }
}

#[tokio::test]
async fn a_full_shared_pool_with_retained_prefixes_admits_new_work_at_once() {
    // 2 slots share 900 cells: after the first request its ~400 cells stay retained, and
    // a second request reserving ~530 cells must still start at once, evicting them.
    let args = ["--slots", "2", "--ctx", "640", "--kv-cells", "900"];
    // Exact, so that the answer can be compared with the cache off.
    let on = Daemon::start(&[&args[..], &["--prefix-cache", "exact"]].concat());
    let off = Daemon::start(&[&args[..], &["--prefix-cache", "off"]].concat());
    let first = completion(&format!("{} The device reports", system_prompt()), false);
    let (_, _) = ask(&on, "/v1/completions", &first).await;
    // The gauge is published when the scheduler turns after the answer went out.
    on.wait_metrics(Duration::from_secs(5), "the first prompt retained", |m| {
        metric(m, "inferloop_prefix_cache_retained_cells") > 200.0
    })
    .await;
    let mut second = completion(&format!("Unrelated. {}", system_prompt()), false);
    second["max_tokens"] = json!(150);
    let v = on.post_ok("/v1/completions", &second).await;
    let queue_ms = v["timings"]["queue_ms"].as_f64().expect("queue_ms");
    assert!(
        queue_ms < 100.0,
        "waited {queue_ms} ms behind a retained prefix"
    );
    let off_v = off.post_ok("/v1/completions", &second).await;
    assert_eq!(text_of(&v), text_of(&off_v));
    let after = metric(&on.metrics().await, "inferloop_prefix_cache_retained_cells");
    assert!(
        after <= 900.0,
        "retained cells stay within the pool ({after})"
    );
}

#[tokio::test]
async fn prefix_slots_keep_more_prompts_reusable_than_there_are_slots() {
    // Four applications' prompts, then the first two again: more distinct prompts than
    // slots. With a stream per slot the prefix slots are streams of their own; in a shared
    // pool they hold cells of the pool (and default to one per slot).
    let apps: Vec<Value> = (1..=4)
        .map(|app| completion(&format!("Application {app}. {}", system_prompt()), false))
        .collect();
    let off = Daemon::start(&["--slots", "1", "--ctx", "1024", "--prefix-cache", "off"]);
    // The answers without the cache, once: both layouts below are compared with them.
    let mut want = Vec::new();
    for body in apps.iter().chain(&apps[..2]) {
        want.push(ask(&off, "/v1/completions", body).await.0);
    }
    for args in [
        &["--slots", "1", "--ctx", "1024", "--prefix-slots", "3"][..],
        &["--slots", "2", "--ctx", "1024", "--kv-cells", "2000"][..],
    ] {
        // Exact, so that the answers can be compared with the cache off.
        let on = Daemon::start(&[args, &["--prefix-cache", "exact"][..]].concat());
        assert!(on.status().await["prefix_cache"]["prefix_slots"].as_u64() >= Some(2));
        for (i, (body, text_off)) in apps.iter().chain(&apps[..2]).zip(&want).enumerate() {
            let (text_on, cached) = ask(&on, "/v1/completions", body).await;
            assert_eq!(
                &text_on, text_off,
                "{args:?}: request {i} differs with reuse on"
            );
            if i >= 4 {
                assert!(
                    cached >= 100,
                    "{args:?}: request {i} found its prompt kept ({cached} cached tokens)"
                );
            }
        }
    }
}
