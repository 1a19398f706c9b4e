//! `chat` cases: length limits: `max_tokens` and `max_completion_tokens`.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- length ----
    r.add(
        G,
        "chat.max_tokens.length_finish",
        "max_tokens ends a long answer with length",
        "max_tokens 5 → 5 completion tokens, finish_reason length",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 5))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                5
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("5 tokens, length".into())
        },
    );
    r.add(
        G,
        "chat.max_tokens.one",
        "max_tokens 1 gives one token",
        "1 completion token, finish_reason length",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 1))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                1
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("1 token".into())
        },
    );
    r.add(G, "chat.max_completion_tokens.honoured", "max_completion_tokens limits the answer", "max_completion_tokens 3 → 3 tokens, length", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_completion_tokens": 3, "temperature": 0});
        let v = c.target.chat(&body)?;
        ev.put("usage", v["usage"].clone());
        ensure_eq!("completion_tokens", u64_at(&v, "/usage/completion_tokens")?, 3);
        ensure_eq!("finish_reason", finish_of(&v), "length");
        Ok("3 tokens".into())
    });
    r.add(G, "chat.max_completion_tokens.wins", "max_completion_tokens wins over max_tokens", "max_tokens 6 with max_completion_tokens 3 → 3 tokens", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 6, "max_completion_tokens": 3, "temperature": 0});
        let v = c.target.chat(&body)?;
        ev.put("usage", v["usage"].clone());
        ensure_eq!("completion_tokens", u64_at(&v, "/usage/completion_tokens")?, 3);
        Ok("3 tokens".into())
    });
    r.add(
        G,
        "chat.max_tokens.absent_runs_to_eos",
        "Without max_tokens the answer runs to end-of-text",
        "a short-answer prompt finishes with stop, well inside the context",
        |c, ev| {
            let v = c.target.chat(
                &json!({"messages": [{"role": "user", "content": "Say OK."}], "temperature": 0}),
            )?;
            ev.put("usage", v["usage"].clone());
            ev.put("content", text_of(&v)?);
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("{} tokens, stop", v["usage"]["completion_tokens"]))
        },
    );
    r.add(
        G,
        "chat.max_tokens.stop_before_limit",
        "An answer that ends early says stop, not length",
        "max_tokens 64 on a short-answer prompt → stop with fewer than 64 tokens",
        |c, ev| {
            let v = c.target.chat(&chat_body("Say OK.", 64))?;
            let n = u64_at(&v, "/usage/completion_tokens")?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            ensure!(n < 64, "< 64 tokens", n.to_string());
            Ok(format!("{n} tokens, stop"))
        },
    );
}
