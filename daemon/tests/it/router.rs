//! What a router in front of several boxes reads from each one (vllm-router, sglang-router;
//! docs/lan.md): `/health` as readiness, `/get_load` for `power_of_two`, the render routes
//! for `cache_aware` and `kv_aware`, and the SGLang fields it writes into every request.

use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, counting_body, shared};

#[tokio::test]
async fn health_is_readiness_without_a_key() {
    let r = shared().get("/health").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v, json!({"status": "ready"}));
}

#[tokio::test]
async fn get_load_counts_running_and_queued_requests() {
    let d = shared();
    let idle = d.get_ok("/get_load").await;
    for key in [
        "load",
        "running",
        "queued",
        "max_running",
        "kv_cells",
        "kv_free_cells",
    ] {
        assert!(idle[key].is_u64(), "{key}: {idle}");
    }
    assert_eq!(idle["max_running"], 4, "{idle}");
    assert_eq!(idle["kv_cells"], 4 * 1024, "{idle}");
    // A long stream is running while its response is unread. The figures are the decode
    // thread's, published once a step: poll until its admission shows.
    let running = d.post("/v1/completions", &counting_body(600, true)).await;
    assert_eq!(running.status(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let busy = loop {
        let v = d.get_ok("/get_load").await;
        if v["load"].as_u64() >= Some(1) || std::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(busy["load"].as_u64() >= Some(1), "{busy}");
    // The stream reserved its prompt and its 600 tokens.
    assert!(
        busy["kv_free_cells"].as_u64() <= Some(4 * 1024 - 600),
        "{busy}"
    );
    assert_eq!(
        busy["load"].as_u64(),
        Some(busy["running"].as_u64().unwrap_or(0) + busy["queued"].as_u64().unwrap_or(0)),
        "{busy}"
    );
    drop(running);
}

#[tokio::test]
async fn render_gives_the_prompt_tokens_a_generation_feeds() {
    let d = shared();
    let body = json!({
        "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a colour."}
        ],
        "max_tokens": 1,
        "temperature": 0,
    });
    let rendered = d.post_ok("/v1/chat/completions/render", &body).await;
    let ids = rendered["token_ids"].as_array().expect("token_ids");
    assert!(ids.iter().all(Value::is_i64), "{rendered}");
    let answer = d.chat(&body).await;
    assert_eq!(
        answer["usage"]["prompt_tokens"].as_u64(),
        Some(ids.len() as u64),
        "{answer}"
    );
    // The same prompt through /v1/completions: the rendered ids are the tokenizer's.
    let text = json!({"prompt": "Name a colour.", "max_tokens": 1});
    let rendered = d.post_ok("/v1/completions/render", &text).await;
    let tokenized = d
        .post_ok(
            "/tokenize",
            &json!({"content": "Name a colour.", "add_special": false}),
        )
        .await;
    assert_eq!(rendered["token_ids"], tokenized["tokens"]);

    // Requests a generation would refuse are refused the same way.
    let wrong_model = d
        .post(
            "/v1/chat/completions/render",
            &json!({"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_error(wrong_model, 404, Some("model"), Some("model_not_found")).await;
    let bad = d
        .post(
            "/v1/completions/render",
            &json!({"prompt": "hi", "bogus": 1}),
        )
        .await;
    assert_error(bad, 400, Some("bogus"), None).await;
}

#[tokio::test]
async fn the_fields_vllm_router_adds_are_accepted_at_their_defaults() {
    let d = shared();
    // What vllm-router 0.1.17 forwarded for `{"messages":[…],"max_tokens":8}` and
    // `{"prompt":…,"max_tokens":8}` (captured with a worker that logs its bodies).
    let mut chat = chat_body("Say hi", 4);
    for (k, v) in [
        ("stream", json!(false)),
        ("logprobs", json!(false)),
        ("no_stop_trim", json!(false)),
        ("ignore_eos", json!(false)),
        ("continue_final_message", json!(false)),
        ("skip_special_tokens", json!(true)),
        ("separate_reasoning", json!(true)),
        ("stream_reasoning", json!(true)),
        ("return_hidden_states", json!(false)),
        ("include_reasoning", json!(true)),
    ] {
        chat[k] = v;
    }
    let answer = d.chat(&chat).await;
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    let mut completion = counting_body(4, false);
    for (k, v) in [
        ("echo", json!(false)),
        ("no_stop_trim", json!(false)),
        ("ignore_eos", json!(false)),
        ("skip_special_tokens", json!(true)),
        ("return_hidden_states", json!(false)),
    ] {
        completion[k] = v;
    }
    let answer = d.complete(&completion).await;
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    // A value that asks for something this server does not do is refused by name.
    chat["no_stop_trim"] = json!(true);
    let refused = d.post("/v1/chat/completions", &chat).await;
    assert_error(refused, 400, Some("no_stop_trim"), None).await;
}
