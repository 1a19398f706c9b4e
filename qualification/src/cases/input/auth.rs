//! `input` cases: the API key.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- auth ----
    r.add(
        G,
        "input.auth.missing_key",
        "A request without the API key is refused",
        "401 invalid_api_key with `WWW-Authenticate: Bearer`, on known and unknown /v1 paths",
        |c, ev| {
            let (t, _, _fx) = keyed(c)?;
            for path in ["/v1/models", "/v1/fine_tuning/jobs"] {
                let resp = t.send_raw(Request::get(path))?;
                ev.text(path, &resp.describe());
                expect_error(&resp, 401, None, Some("invalid_api_key"))?;
                let challenge = resp.header("www-authenticate").unwrap_or_default();
                ensure!(
                    challenge.starts_with("Bearer"),
                    format!("GET {path}: WWW-Authenticate names Bearer (RFC 6750)"),
                    format!("{challenge:?}")
                );
            }
            Ok("401 with a Bearer challenge".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.wrong_key",
        "A wrong API key is refused and not echoed",
        "401 invalid_api_key; the message does not contain either key",
        |c, ev| {
            let (t, key, _fx) = keyed(c)?;
            let wrong = format!("{key}x");
            let resp = t.send_raw(
                Request::get("/v1/models").header("Authorization", &format!("Bearer {wrong}")),
            )?;
            ev.text("response", &resp.describe());
            let err = expect_error(&resp, 401, None, Some("invalid_api_key"))?;
            let msg = err["message"].as_str().unwrap_or_default();
            ensure!(
                !msg.contains(&key),
                "no key in the message",
                msg.to_string()
            );
            Ok("401".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.right_key",
        "The right API key is served",
        "200 on /v1/models (also with a lowercase `bearer` scheme) and a chat answer",
        |c, ev| {
            let (t, key, _fx) = keyed(c)?;
            let auth = format!("Bearer {key}");
            let models = t.send_raw(Request::get("/v1/models").header("Authorization", &auth))?;
            json_200(&models, "GET /v1/models with the key")?;
            // The auth scheme is case-insensitive (RFC 9110 §11.1).
            let lower = t.send_raw(
                Request::get("/v1/models").header("Authorization", &format!("bearer {key}")),
            )?;
            json_200(&lower, "GET /v1/models with `bearer KEY`")?;
            let chat = t.send_raw(
                Request::post(CHAT)
                    .json(&chat_body("Hi", 2))
                    .header("Authorization", &auth),
            )?;
            ev.text("chat", &chat.describe());
            text_of(&json_200(&chat, "POST chat with the key")?)?;
            Ok("200".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.auth.operational_routes_open",
        "Health, readiness and metrics need no key; generation does",
        "/healthz, /readyz, /metrics 200 without a key; POST chat 401",
        |c, ev| {
            let (t, _, _fx) = keyed(c)?;
            for path in ["/healthz", "/readyz", "/metrics"] {
                let r = t.send_raw(Request::get(path))?;
                ensure_eq!(format!("{path} status"), r.status(), 200);
            }
            let resp = t.send_raw(Request::post(CHAT).json(&chat_body("Hi", 2)))?;
            ev.text("chat_without_key", &resp.describe());
            expect_error(&resp, 401, None, Some("invalid_api_key"))?;
            Ok("open operational routes, closed /v1".into())
        },
    )
    .fixture("strict");
}
