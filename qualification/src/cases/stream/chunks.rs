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
        "stream.role_only_first",
        "Only the first chunk carries the role",
        "no later delta has a role",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let late: Vec<usize> = ch
                .iter()
                .enumerate()
                .skip(1)
                .filter(|(_, c)| c["choices"][0]["delta"].get("role").is_some())
                .map(|(i, _)| i)
                .collect();
            ensure!(
                late.is_empty(),
                "role on chunk 0 only",
                format!("role also on chunks {late:?}")
            );
            Ok("role once".into())
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
        "stream.created_constant",
        "Every chunk has the same created time",
        "one created value, a plausible Unix time",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ch = chunks(&cap)?;
            let set: std::collections::BTreeSet<String> =
                ch.iter().map(|c| c["created"].to_string()).collect();
            ensure_eq!("distinct created values", set.len(), 1);
            ensure!(
                ch[0]["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
                "a Unix time",
                ch[0]["created"].to_string()
            );
            Ok(format!("created {}", ch[0]["created"]))
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
