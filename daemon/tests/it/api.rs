//! Every route answers with its documented shape; `/v1` routes require the API key when one
//! is set, the operational routes and the page at `/` never do.

use std::sync::LazyLock;

use serde_json::{json, Value};

use crate::harness::{
    assert_error, counting_body, header, http, metric, model_id, shared, start_for_run, started,
    Daemon,
};

#[tokio::test]
async fn models_lists_the_loaded_model() {
    let list = shared().get_ok("/v1/models").await;
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().expect("data is an array");
    assert_eq!(data.len(), 1, "{list}");
    assert_eq!(data[0]["id"], model_id().as_str());
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "inferloop");
    assert!(data[0]["created"].as_u64().is_some_and(|t| t > 0), "{list}");
}

#[tokio::test]
async fn model_by_id_returns_its_card() {
    let id = model_id();
    let card = shared().get_ok(&format!("/v1/models/{id}")).await;
    assert_eq!(card["id"], id.as_str());
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "inferloop");
}

#[tokio::test]
async fn unknown_model_id_is_404_model_not_found() {
    let resp = shared().get("/v1/models/gpt-4").await;
    let err = assert_error(resp, 404, Some("model"), Some("model_not_found")).await;
    assert!(
        err["message"].as_str().is_some_and(|m| m.contains("gpt-4")),
        "{err}"
    );
}

/// `%ff%fe` decodes to bytes that are not UTF-8; axum's rejection answered in plain text.
#[tokio::test]
async fn undecodable_model_id_is_400_in_the_openai_shape() {
    let resp = shared().get("/v1/models/%ff%fe").await;
    assert_error(resp, 400, None, Some("invalid_path")).await;
}

#[tokio::test]
async fn generation_for_another_model_is_404_model_not_found() {
    let mut body = crate::harness::chat_body("Hi", 4);
    body["model"] = json!("gpt-4");
    let resp = shared().post("/v1/chat/completions", &body).await;
    assert_error(resp, 404, Some("model"), Some("model_not_found")).await;
}

#[tokio::test]
async fn generation_naming_the_loaded_model_is_served() {
    let mut body = crate::harness::chat_body("Hi", 4);
    body["model"] = json!(model_id());
    let v = shared().chat(&body).await;
    assert_eq!(v["model"], model_id().as_str());
}

#[tokio::test]
async fn healthz_answers_ok() {
    let v = shared().get_ok("/healthz").await;
    assert_eq!(v, json!({"status": "ok"}));
}

#[tokio::test]
async fn readyz_answers_ready_once_the_model_is_loaded() {
    let v = shared().get_ok("/readyz").await;
    assert_eq!(v, json!({"status": "ready"}));
}

#[tokio::test]
async fn metrics_expose_every_series() {
    let d = shared();
    // Generate first so every counter and histogram has at least one observation.
    let v = d.complete(&counting_body(8, false)).await;
    assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
    d.get_ok("/v1/models").await;

    let resp = d.get("/metrics").await;
    assert_eq!(resp.status(), 200);
    assert!(
        header(&resp, "content-type").starts_with("text/plain"),
        "{:?}",
        resp.headers()
    );
    let text = resp.text().await.expect("metrics body");

    let ok = |route: &str| format!("inferloop_requests_total{{route=\"{route}\",code=\"200\"}}");
    assert!(metric(&text, &ok("/v1/completions")) >= 1.0, "{text}");
    assert!(metric(&text, &ok("/v1/models")) >= 1.0, "{text}");
    assert!(
        text.contains("# TYPE inferloop_requests_total counter"),
        "{text}"
    );
    for gauge in ["inferloop_active_slots", "inferloop_queue_depth"] {
        assert!(text.contains(&format!("# TYPE {gauge} gauge")), "{text}");
    }
    let active = metric(&text, "inferloop_active_slots");
    assert!((0.0..=4.0).contains(&active), "active slots {active}");
    assert!(metric(&text, "inferloop_queue_depth") >= 0.0);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_f64().expect("prompt_tokens");
    assert!(metric(&text, "inferloop_prompt_tokens_total") >= prompt_tokens);
    assert!(metric(&text, "inferloop_generated_tokens_total") >= 8.0);
    for hist in [
        "inferloop_ttft_seconds",
        "inferloop_inter_token_seconds",
        "inferloop_request_seconds",
    ] {
        assert!(text.contains(&format!("# TYPE {hist} histogram")), "{text}");
        let count = metric(&text, &format!("{hist}_count"));
        assert!(count >= 1.0, "{hist}_count {count}");
        assert_eq!(
            metric(&text, &format!("{hist}_bucket{{le=\"+Inf\"}}")),
            count,
            "{hist}: +Inf bucket must equal the count"
        );
        assert!(metric(&text, &format!("{hist}_sum")) > 0.0, "{hist}_sum");
    }
}

#[tokio::test]
async fn status_reports_slots_queue_model_and_uptime() {
    let s = shared().status().await;
    assert_eq!(s["ready"], true, "{s}");
    assert_eq!(s["slots"]["total"], 4, "{s}");
    assert_eq!(s["slots"]["ctx_per_slot"], 1024, "{s}");
    let active = s["slots"]["active"].as_u64().expect("active");
    let idle = s["slots"]["idle"].as_u64().expect("idle");
    assert_eq!(active + idle, 4, "{s}");
    assert_eq!(s["queue"]["capacity"], 16, "{s}");
    assert_eq!(s["queue"]["timeout_ms"], 30_000, "{s}");
    assert!(s["queue"]["depth"].as_u64().is_some(), "{s}");
    assert_eq!(s["model"]["id"], model_id().as_str(), "{s}");
    assert!(
        s["model"]["n_params"]
            .as_u64()
            .is_some_and(|n| n > 100_000_000),
        "{s}"
    );
    assert!(s["uptime_s"].as_f64().is_some_and(|u| u > 0.0), "{s}");
}

/// The build must carry the instruction sets it was configured for (`.cargo/config.toml`),
/// whatever the build environment (SOURCE_DATE_EPOCH silently drops them otherwise).
#[tokio::test]
async fn status_shows_llama_cpp_built_with_the_expected_instruction_sets() {
    let s = shared().status().await;
    assert!(
        s["native"].is_null(),
        "the native backend does not serve: {s}"
    );
    let info = s["llama"]["system_info"].as_str().expect("system_info");
    let expected: &[&str] = if cfg!(target_arch = "x86_64") {
        &["AVX = 1", "AVX2 = 1", "FMA = 1", "F16C = 1"]
    } else if cfg!(target_arch = "aarch64") {
        &["NEON = 1", "DOTPROD = 1"]
    } else {
        &[]
    };
    for feature in expected {
        assert!(info.contains(feature), "{feature} missing from {info:?}");
    }
}

// ---- API key ----

static KEYED: LazyLock<Result<Daemon, String>> =
    LazyLock::new(|| start_for_run(&["--api-key", "secret", "--slots", "1", "--ctx", "256"]));

async fn models_with(auth: Option<&str>) -> reqwest::Response {
    let d = started(&KEYED);
    let mut req = http().get(d.url("/v1/models"));
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    req.send().await.expect("GET /v1/models")
}

/// RFC 6750 §3: a 401 names the scheme to use in `WWW-Authenticate` (none was sent before).
#[tokio::test]
async fn missing_api_key_is_401_with_a_bearer_challenge() {
    let resp = models_with(None).await;
    assert_eq!(header(&resp, "www-authenticate"), "Bearer");
    let err = assert_error(resp, 401, None, Some("invalid_api_key")).await;
    assert_eq!(err["type"], "invalid_request_error");
}

#[tokio::test]
async fn wrong_api_key_is_401_with_a_bearer_challenge() {
    let resp = models_with(Some("Bearer secrets")).await;
    let challenge = header(&resp, "www-authenticate");
    assert!(challenge.starts_with("Bearer "), "{challenge:?}");
    assert!(challenge.contains("invalid_token"), "{challenge:?}");
    assert_error(resp, 401, None, Some("invalid_api_key")).await;
}

/// The auth scheme is case-insensitive in HTTP; `bearer KEY` used to count as no key at all.
#[tokio::test]
async fn lowercase_bearer_scheme_is_served() {
    for auth in ["bearer secret", "BEARER secret"] {
        let resp = models_with(Some(auth)).await;
        assert_eq!(resp.status(), 200, "{auth}");
    }
}

/// Unknown `/v1` paths answered 404 without the key while real ones answered 401, which
/// told a client without the key which routes exist.
#[tokio::test]
async fn unknown_v1_path_without_the_key_is_401_not_404() {
    let d = started(&KEYED);
    for path in ["/v1/nope", "/v1/models/x/y", "/v1", "/v1/"] {
        let resp = d.get(path).await;
        assert_eq!(header(&resp, "www-authenticate"), "Bearer", "{path}");
        assert_error(resp, 401, None, Some("invalid_api_key")).await;
        let wrong = http()
            .get(d.url(path))
            .header("authorization", "Bearer nope")
            .send()
            .await
            .expect("GET");
        assert_error(wrong, 401, None, Some("invalid_api_key")).await;
        let keyed = http()
            .get(d.url(path))
            .header("authorization", "Bearer secret")
            .send()
            .await
            .expect("GET");
        assert_error(keyed, 404, None, Some("not_found")).await;
    }
    // A wrong method on a real route is 401 too, and 405 only with the key.
    let delete = http()
        .delete(d.url("/v1/models"))
        .send()
        .await
        .expect("DELETE");
    assert_error(delete, 401, None, Some("invalid_api_key")).await;
    let delete = http()
        .delete(d.url("/v1/models"))
        .header("authorization", "Bearer secret")
        .send()
        .await
        .expect("DELETE");
    assert_error(delete, 405, None, Some("method_not_allowed")).await;
    // Outside /v1 an unknown path stays a 404 with or without the key.
    assert_error(d.get("/nope").await, 404, None, Some("not_found")).await;
}

#[tokio::test]
async fn right_api_key_is_served() {
    let resp = models_with(Some("Bearer secret")).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("model list");
    assert_eq!(v["data"][0]["id"], model_id().as_str());
}

#[tokio::test]
async fn tokenize_and_detokenize_need_the_api_key() {
    let d = started(&KEYED);
    for (path, body) in [
        ("/tokenize", json!({"content": "Hi"})),
        ("/detokenize", json!({"tokens": [1]})),
    ] {
        let resp = d.post(path, &body).await;
        assert_error(resp, 401, None, Some("invalid_api_key")).await;
        let get = d.get(path).await;
        assert_error(get, 401, None, Some("invalid_api_key")).await;
        let keyed = http()
            .post(d.url(path))
            .header("authorization", "Bearer secret")
            .json(&body)
            .send()
            .await
            .expect("POST");
        assert_eq!(keyed.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn operational_routes_need_no_api_key() {
    let d = started(&KEYED);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let resp = d.get(path).await;
        assert_eq!(resp.status(), 200, "{path}");
    }
    // Generation is a /v1 route like the others.
    let resp = d
        .post("/v1/chat/completions", &crate::harness::chat_body("Hi", 2))
        .await;
    assert_error(resp, 401, None, Some("invalid_api_key")).await;
}

// ---- the page at `/` ----

/// The page and its assets need no key even when one is set, carry the strict CSP, and
/// hold no data of the box: the API behind them keeps its auth.
#[tokio::test]
async fn page_needs_no_key_carries_a_strict_csp_and_holds_no_data() {
    let d = started(&KEYED);
    for (path, ty, marker) in [
        (
            "/",
            "text/html; charset=utf-8",
            r#"<script src="/ui/app.js" defer>"#,
        ),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "/v1/chat/completions",
        ),
        (
            "/ui/style.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme",
        ),
    ] {
        let resp = d.get(path).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(header(&resp, "content-type"), ty, "{path}");
        assert_eq!(header(&resp, "cache-control"), "no-cache", "{path}");
        assert_eq!(header(&resp, "x-content-type-options"), "nosniff", "{path}");
        let csp = header(&resp, "content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        let body = resp.text().await.expect("body");
        assert!(body.contains(marker), "{path} lacks {marker:?}");
        assert!(!body.contains(&model_id()), "{path} names the model");
        assert!(!body.contains("secret"), "{path} holds the key");
    }
    let config = d.get("/ui/config").await;
    assert_eq!(config.status(), 200);
    let v: Value = config.json().await.expect("config JSON");
    assert_eq!(v, json!({"api_key_required": true}));
    // What the page shows comes from routes that still want the key.
    for path in ["/v1/status", "/v1/thermal", "/v1/models"] {
        assert_error(d.get(path).await, 401, None, Some("invalid_api_key")).await;
    }
}

#[tokio::test]
async fn page_answers_head_with_its_headers_and_no_body() {
    let resp = http().head(shared().url("/")).send().await.expect("HEAD /");
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "content-type"), "text/html; charset=utf-8");
    assert!(!header(&resp, "content-security-policy").is_empty());
    assert!(resp.bytes().await.expect("body").is_empty());
}

#[tokio::test]
async fn page_config_says_no_key_is_needed_and_other_paths_stay_404() {
    let d = shared();
    let v: Value = d.get("/ui/config").await.json().await.expect("config JSON");
    assert_eq!(v, json!({"api_key_required": false}));
    for path in ["/index.html", "/ui/", "/ui/nope.js", "/app.js"] {
        assert_error(d.get(path).await, 404, None, Some("not_found")).await;
    }
    let post = d.post("/", &json!({})).await;
    assert_error(post, 405, None, Some("method_not_allowed")).await;
}
