//! `api` cases: routes: health, readiness, metrics, models, status, unknown routes and methods.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.healthz.ok",
        "GET /healthz answers that the process is up",
        "200 {\"status\":\"ok\"}",
        |c, ev| {
            let resp = c.target.get("/healthz")?;
            ev.text("response", &resp.describe());
            let v = json_200(&resp, "GET /healthz")?;
            ensure_eq!("body", v, json!({"status": "ok"}));
            Ok("200 {\"status\":\"ok\"}".into())
        },
    )
    .inferloopd_only("/healthz");
    r.add(
        G,
        "api.healthz.json_content_type",
        "GET /healthz is JSON",
        "Content-Type application/json",
        |c, ev| {
            let resp = c.target.get("/healthz")?;
            let ct = resp.header("content-type").unwrap_or_default().to_string();
            ev.put("content_type", ct.clone());
            ensure!(
                ct.starts_with("application/json"),
                "Content-Type application/json",
                ct
            );
            Ok(format!("Content-Type {ct}"))
        },
    )
    .inferloopd_only("/healthz");
    r.add(
        G,
        "api.healthz.head",
        "HEAD /healthz answers without a body",
        "200, no body",
        |c, ev| {
            let resp = c.target.send(Request::new("HEAD", "/healthz"))?;
            ev.text("head", &resp.head.describe());
            ensure_eq!("status", resp.status(), 200);
            ensure!(
                resp.body.is_empty(),
                "an empty body",
                format!("{} body bytes", resp.body.len())
            );
            Ok("HEAD 200 with an empty body".into())
        },
    )
    .inferloopd_only("/healthz");
    r.add(
        G,
        "api.readyz.ready",
        "GET /readyz says ready once the model is loaded",
        "200 {\"status\":\"ready\"}",
        |c, ev| {
            let resp = c.target.get("/readyz")?;
            ev.text("response", &resp.describe());
            let v = json_200(&resp, "GET /readyz")?;
            ensure_eq!("body", v, json!({"status": "ready"}));
            Ok("200 ready".into())
        },
    )
    .inferloopd_only("/readyz");
    r.add(
        G,
        "api.metrics.text_plain",
        "GET /metrics is Prometheus text",
        "200, Content-Type text/plain; version=0.0.4",
        |c, ev| {
            let resp = c.target.get("/metrics")?;
            let ct = resp.header("content-type").unwrap_or_default().to_string();
            ev.put("content_type", ct.clone());
            ensure_eq!("status", resp.status(), 200);
            ensure!(
                ct.starts_with("text/plain") && ct.contains("version=0.0.4"),
                "text/plain; version=0.0.4",
                ct
            );
            Ok(format!("200 {ct}, {} bytes", resp.body.len()))
        },
    )
    .inferloopd_only("/metrics");
    r.add(
        G,
        "api.models.list_object",
        "GET /v1/models is a list of one model",
        "object \"list\", data holds exactly the served model",
        |c, ev| {
            let v = c.target.get_ok("/v1/models")?;
            ev.put("response", v.clone());
            ensure_eq!("object", v["object"], json!("list"));
            let n = v["data"].as_array().map(Vec::len);
            ensure_eq!("data length", n, Some(1));
            Ok(format!("list with {}", v["data"][0]["id"]))
        },
    );
    r.add(
        G,
        "api.models.card_fields",
        "The model card has the OpenAI fields",
        "id string, object \"model\", created a Unix time after 2020 and not in the future, \
         owned_by string",
        |c, ev| {
            let v = c.target.get_ok("/v1/models")?;
            let card = &v["data"][0];
            ev.put("card", card.clone());
            ensure!(
                card["id"].as_str().is_some_and(|s| !s.is_empty()),
                "id: non-empty string",
                card.to_string()
            );
            ensure_eq!("object", card["object"], json!("model"));
            ensure!(
                card["created"]
                    .as_u64()
                    .is_some_and(|t| t > 1_600_000_000 && t <= now_s() + 86_400),
                "created: a Unix time after 2020 and not in the future",
                card.to_string()
            );
            ensure!(
                card["owned_by"].is_string(),
                "owned_by: string",
                card.to_string()
            );
            Ok(card.to_string())
        },
    );
    r.add(
        G,
        "api.models.id_is_served_model",
        "The listed id names the served model",
        "spawn: the GGUF file stem; attach: the id the generation routes echo",
        |c, ev| {
            let v = c.target.get_ok("/v1/models")?;
            let id = str_at(&v, "/data/0/id")?;
            ev.put("id", id.clone());
            match c.model_path() {
                Some(path) => {
                    let stem = path
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    ensure_eq!("model id", id, stem);
                }
                None => {
                    let reply = c.target.chat(&chat_body("Hi", 1))?;
                    ensure_eq!(
                        "model id echoed by a chat answer",
                        reply["model"],
                        json!(id)
                    );
                }
            }
            Ok(format!("id {id}"))
        },
    );
    r.add(
        G,
        "api.models.by_id",
        "GET /v1/models/{id} returns the card",
        "200, the same card as in the list",
        |c, ev| {
            let list = c.target.get_ok("/v1/models")?;
            let id = str_at(&list, "/data/0/id")?;
            let card = c.target.get_ok(&format!("/v1/models/{id}"))?;
            ev.put("card", card.clone());
            ensure_eq!("card", card, list["data"][0]);
            Ok(format!("card for {id}"))
        },
    );
    r.add(
        G,
        "api.models.unknown_id_404",
        "GET /v1/models/gpt-4 is not found",
        "404 model_not_found, param model, message names the id",
        |c, ev| {
            let resp = c.target.get("/v1/models/gpt-4")?;
            ev.text("response", &resp.describe());
            let err = expect_error(&resp, 404, Some("model"), Some("model_not_found"))?;
            ensure!(
                err["message"].as_str().is_some_and(|m| m.contains("gpt-4")),
                "message names gpt-4",
                err.to_string()
            );
            Ok("404 model_not_found".into())
        },
    );
    r.add(
        G,
        "api.status.ok_json",
        "GET /v1/status answers JSON",
        "200, a JSON object with ready = true",
        |c, ev| {
            let v = c.target.status()?;
            ev.put("status", v.clone());
            ensure!(v.is_object(), "a JSON object", v.to_string());
            ensure_eq!("ready", v["ready"], json!(true));
            Ok("status: ready".into())
        },
    )
    .inferloopd_only("/v1/status");
    r.add(
        G,
        "api.status.version",
        "/v1/status reports the daemon version",
        "version is the binary's own (`inferloopd --version`), or semver when attached",
        |c, ev| {
            let v = c.target.status()?;
            let version = str_at(&v, "/version")?;
            ev.put("version", version.clone());
            let parts: Vec<&str> = version.split('.').collect();
            ensure!(
                parts.len() >= 3
                    && parts[..3]
                        .iter()
                        .all(|p| p.chars().next().is_some_and(|c| c.is_ascii_digit())),
                "a semver version",
                version.clone()
            );
            if let Some(cfg) = &c.spawn {
                let out = cfg
                    .command(&["--version"])
                    .map_err(|e| Stop::fail("inferloopd --version runs", e))?;
                let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
                ev.put("binary", printed.clone());
                ensure!(
                    printed.ends_with(&version),
                    format!("`inferloopd --version` ends with {version}"),
                    printed
                );
            }
            Ok(format!("version {version}"))
        },
    )
    .inferloopd_only("/v1/status");
    r.add(
        G,
        "api.thermal.history_route",
        "GET /v1/thermal returns the thermal history",
        "200 JSON with state, interval_ms and a history array",
        |c, ev| {
            let resp = c.target.get("/v1/thermal")?;
            if resp.status() == 404 {
                return Err(Stop::skip("this daemon has no /v1/thermal route (404)"));
            }
            ev.text("response", &crate::case::snippet(&resp.text(), 1500));
            let v = json_200(&resp, "GET /v1/thermal")?;
            ensure!(v["state"].is_string(), "state: string", v.to_string());
            ensure!(
                v["interval_ms"].as_u64().is_some_and(|i| i > 0),
                "interval_ms > 0",
                v.to_string()
            );
            ensure!(v["history"].is_array(), "history: array", v.to_string());
            Ok(format!(
                "state {}, {} readings",
                v["state"],
                v["history"].as_array().map_or(0, Vec::len)
            ))
        },
    )
    .inferloopd_only("/v1/thermal/history");
    r.add(
        G,
        "api.route.unknown_v1_404",
        "GET /v1/fine_tuning/jobs is an unknown route",
        "404 not_found in the OpenAI error shape",
        |c, ev| {
            let resp = c.target.get("/v1/fine_tuning/jobs")?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 404, None, Some("not_found"))?;
            Ok("GET /v1/fine_tuning/jobs: 404 not_found".into())
        },
    );
    // The id predates the page: `/` was a 404 before it served one. On the `cors` daemon,
    // which has an API key: the page needs none, the API behind it still does.
    r.add(
        G,
        "api.route.root_404",
        "GET / serves the page on the box, without a key and without the box's data",
        "on a daemon with an API key, sent without it: 200 text/html, Cache-Control no-cache, \
         a CSP with default-src 'none' and script-src 'self' and no 'unsafe-inline'; the body \
         names neither the model id nor its path (the page asks the API for them); \
         GET /v1/status without the key stays 401",
        |c, ev| {
            let fx = c.fixture("cors")?;
            let t = fx.target();
            let resp = t.send_raw(Request::get("/"))?;
            ev.text("head", &resp.head.describe());
            ensure_eq!("status", resp.status(), 200);
            let ct = resp.header("content-type").unwrap_or_default();
            ensure!(ct.starts_with("text/html"), "Content-Type text/html", ct);
            ensure_eq!(
                "Cache-Control",
                resp.header("cache-control").unwrap_or_default(),
                "no-cache"
            );
            let csp = resp.header("content-security-policy").unwrap_or_default();
            ensure!(
                csp.contains("default-src 'none'")
                    && csp.contains("script-src 'self'")
                    && !csp.contains("unsafe-inline"),
                "a CSP with default-src 'none', script-src 'self', no 'unsafe-inline'",
                csp
            );
            let body = resp.text();
            ensure!(
                body.contains("<html") && body.contains("/ui/app.js"),
                "an HTML page loading /ui/app.js",
                crate::case::snippet(&body, 300)
            );
            let keyless = t.send_raw(Request::get("/v1/status"))?;
            ev.text("status_without_key", &keyless.describe());
            expect_error(&keyless, 401, None, Some("invalid_api_key"))?;
            let status = t.status()?;
            let model = &status["model"];
            for (what, value) in [("id", &model["id"]), ("path", &model["path"])] {
                let value = value.as_str().unwrap_or_default();
                ensure!(
                    !value.is_empty() && !body.contains(value),
                    format!("the page does not contain the model {what}"),
                    format!("model {what} {value:?} found in the page")
                );
            }
            Ok(format!("200 {ct}, {} bytes, CSP {csp:?}", body.len()))
        },
    )
    .inferloopd_only("the page at /");
    for (id, method, path, allowed) in [
        (
            "api.method.get_chat_405",
            "GET",
            "/v1/chat/completions",
            "POST",
        ),
        (
            "api.method.get_completions_405",
            "GET",
            "/v1/completions",
            "POST",
        ),
        ("api.method.post_models_405", "POST", "/v1/models", "GET"),
        (
            "api.method.delete_status_405",
            "DELETE",
            "/v1/status",
            "GET",
        ),
    ] {
        let case = r.add(
            G,
            id,
            format!("{method} {path} is not allowed"),
            format!("405 method_not_allowed, Allow lists {allowed}"),
            move |c, ev| {
                let resp = c.target.send(Request::new(method, path))?;
                ev.text(
                    "response",
                    &format!("{}\n{}", resp.head.describe(), resp.text()),
                );
                expect_error(&resp, 405, None, Some("method_not_allowed"))?;
                let allow = resp.header("allow").unwrap_or_default().to_string();
                ensure!(
                    allow.split(',').any(|m| m.trim() == allowed),
                    format!("Allow header lists {allowed}"),
                    format!("Allow: {allow:?}")
                );
                Ok(format!("405, Allow: {allow}"))
            },
        );
        if matches!(path, "/v1/status" | "/healthz" | "/metrics") {
            case.inferloopd_only(path);
        }
    }
}
