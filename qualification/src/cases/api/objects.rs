//! `api` cases: the answer objects: `object`, ids, `created`, `model`, content types.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.chat.object",
        "A chat answer is a chat.completion with a chatcmpl- id",
        "object \"chat.completion\", id chatcmpl- and a random part",
        |c, ev| {
            let v = crate::cases::reference(c, "/v1/chat/completions", &chat_body(EXPLAIN, 8))?;
            ev.put("response", v.clone());
            ensure_eq!("object", v["object"], json!("chat.completion"));
            let id = str_at(&v, "/id")?;
            ensure!(
                id.starts_with("chatcmpl-") && id.len() > "chatcmpl-".len() + 8,
                "chatcmpl-<random>",
                id.clone()
            );
            Ok(format!("object chat.completion, {id}"))
        },
    );
    r.add(
        G,
        "api.chat.ids_unique",
        "Two answers never share an id",
        "two identical requests get different ids",
        |c, ev| {
            let a = str_at(&c.target.chat(&chat_body("Hi", 1))?, "/id")?;
            let b = str_at(&c.target.chat(&chat_body("Hi", 1))?, "/id")?;
            ev.put("ids", json!([a, b]));
            ensure!(a != b, "different ids", format!("both {a}"));
            Ok(format!("{a} != {b}"))
        },
    );
    r.add(
        G,
        "api.chat.created_now",
        "A chat answer's created time is now",
        "created within 5 minutes of this machine's clock",
        |c, ev| {
            let v = c.target.chat(&chat_body("Hi", 1))?;
            let created = u64_at(&v, "/created")?;
            let now = now_s();
            ev.put("created", created);
            ev.put("local_now", now);
            ensure!(
                created.abs_diff(now) <= 300,
                format!("within 300 s of {now}"),
                created.to_string()
            );
            Ok(format!("created {created}, local clock {now}"))
        },
    );
    r.add(
        G,
        "api.chat.model_field",
        "A chat answer names the served model",
        "model equals the /v1/models id",
        |c, ev| {
            let v = c.target.chat(&chat_body("Hi", 1))?;
            ev.put("model", v["model"].clone());
            ensure_eq!("model", v["model"], json!(c.facts.model_id));
            Ok(format!("model {}", v["model"]))
        },
    );
    r.add(
        G,
        "api.chat.system_fingerprint",
        "A chat answer carries a system fingerprint",
        "system_fingerprint is a non-empty string",
        |c, ev| {
            let v = c.target.chat(&chat_body("Hi", 1))?;
            ev.put("system_fingerprint", v["system_fingerprint"].clone());
            ensure!(
                v["system_fingerprint"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "a non-empty string",
                v["system_fingerprint"].to_string()
            );
            Ok(format!("system_fingerprint {}", v["system_fingerprint"]))
        },
    );
    r.add(
        G,
        "api.chat.json_content_type",
        "A chat answer is JSON",
        "Content-Type application/json",
        |c, ev| {
            let resp = c.target.post("/v1/chat/completions", &chat_body("Hi", 1))?;
            let ct = resp.header("content-type").unwrap_or_default().to_string();
            ev.put("content_type", ct.clone());
            ensure_eq!("status", resp.status(), 200);
            ensure!(ct.starts_with("application/json"), "application/json", ct);
            Ok(ct)
        },
    );
    r.add(
        G,
        "api.completions.object",
        "A completion is a text_completion with a cmpl- id",
        "object \"text_completion\", id cmpl- and a random part",
        |c, ev| {
            let v = c.target.complete(&counting(2, false))?;
            ev.put("response", v.clone());
            ensure_eq!("object", v["object"], json!("text_completion"));
            let id = str_at(&v, "/id")?;
            ensure!(
                id.starts_with("cmpl-") && id.len() > "cmpl-".len() + 8,
                "cmpl-<random>",
                id.clone()
            );
            Ok(format!("object text_completion, {id}"))
        },
    );
}
