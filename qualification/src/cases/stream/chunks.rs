//! `stream` cases: the chunks: role first, one id, object, model, created, index.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.role_first",
        "The first chunk carries the assistant role",
        "chunks[0].choices[0].delta.role == \"assistant\"",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            ensure_eq!(
                "first delta.role",
                ch[0]["choices"][0]["delta"]["role"],
                json!("assistant")
            );
            Ok("role first".into())
        },
    );
    r.add(
        G,
        "stream.id_constant",
        "Every chunk has the same id",
        "one id across the stream",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let ids: std::collections::BTreeSet<String> =
                ch.iter().map(|c| c["id"].to_string()).collect();
            ensure_eq!("distinct ids", ids.len(), 1);
            Ok(format!("id {}", ch[0]["id"]))
        },
    );
    r.add(
        G,
        "stream.id_prefix",
        "A chat stream's id is chatcmpl-…",
        "id starts with chatcmpl-",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let id = chunks(&cap)?[0]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ensure!(id.starts_with("chatcmpl-"), "chatcmpl-…", id);
            Ok(id)
        },
    );
    r.add(
        G,
        "stream.object_chunk",
        "Every chunk is a chat.completion.chunk",
        "object \"chat.completion.chunk\" on every chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!("object", ch["object"], json!("chat.completion.chunk"));
            }
            Ok("all chat.completion.chunk".into())
        },
    );
    r.add(
        G,
        "stream.model_field",
        "Every chunk names the served model",
        "model equals the /v1/models id on every chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!("model", ch["model"], json!(c.facts.model_id));
            }
            Ok(format!("model {}", c.facts.model_id))
        },
    );
    r.add(
        G,
        "stream.choice_index_zero",
        "Each chunk has one choice, index 0",
        "choices length 1 and index 0 on every choice chunk",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            for ch in chunks(&cap)? {
                ensure_eq!(
                    "choices length",
                    ch["choices"].as_array().map(Vec::len),
                    Some(1)
                );
                ensure_eq!("index", ch["choices"][0]["index"], json!(0));
            }
            Ok("one choice each".into())
        },
    );
}
