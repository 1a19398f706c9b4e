//! `chat` cases: the chat template.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- the chat template ----
    r.add(G, "chat.template.system_steers", "A system prompt reaches the model", "a French-only system prompt changes the greedy answer", |c, ev| {
        let q = "What is the capital of Italy?";
        let plain = text_of(&c.target.chat(&chat_body(q, 12))?)?;
        let steered = text_of(&c.target.chat(&messages(json!([{"role": "system", "content": "Always answer in French."}, {"role": "user", "content": q}]), 12))?)?;
        ev.put("without_system", plain.clone());
        ev.put("with_system", steered.clone());
        ensure!(plain != steered, "a different answer with the system prompt", format!("both {plain:?}"));
        Ok(format!("{plain:?} → {steered:?}"))
    });
    r.add(
        G,
        "chat.template.history_reaches_model",
        "Earlier turns reach the model",
        "the answer after a history differs from the answer without it",
        |c, ev| {
            let single = text_of(&c.target.chat(&chat_body("What is my name?", 12))?)?;
            let multi = text_of(&c.target.chat(&messages(
                json!([
            {"role": "user", "content": "My name is Zorblax."},
            {"role": "assistant", "content": "Nice to meet you, Zorblax!"},
            {"role": "user", "content": "What is my name?"}]),
                12,
            ))?)?;
            ev.put("without_history", single.clone());
            ev.put("with_history", multi.clone());
            ensure!(
                single != multi,
                "different answers",
                format!("both {single:?}")
            );
            Ok(format!(
                "history used (mentions Zorblax: {})",
                multi.contains("Zorblax")
            ))
        },
    );
    r.add(
        G,
        "chat.template.history_costs_tokens",
        "Every turn is rendered into the prompt",
        "prompt_tokens with two more turns ≥ single-turn prompt_tokens + 10",
        |c, ev| {
            let single = c.target.chat(&chat_body("What is my name?", 1))?;
            let multi = c.target.chat(&messages(
                json!([
            {"role": "user", "content": "My name is Zorblax."},
            {"role": "assistant", "content": "Nice to meet you, Zorblax!"},
            {"role": "user", "content": "What is my name?"}]),
                1,
            ))?;
            let (a, b) = (
                u64_at(&single, "/usage/prompt_tokens")?,
                u64_at(&multi, "/usage/prompt_tokens")?,
            );
            ev.put("single", a);
            ev.put("multi", b);
            ensure!(b >= a + 10, format!("≥ {}", a + 10), b.to_string());
            Ok(format!("{a} → {b} prompt tokens"))
        },
    );
    r.add(
        G,
        "chat.template.longer_prompt_more_tokens",
        "A longer message costs more prompt tokens",
        "prompt_tokens(\"Hi\") < prompt_tokens(a sentence)",
        |c, ev| {
            let a = u64_at(&c.target.chat(&chat_body("Hi", 1))?, "/usage/prompt_tokens")?;
            let b = u64_at(
                &c.target.chat(&chat_body(
                    "Hi there, how are you doing on this fine day?",
                    1,
                ))?,
                "/usage/prompt_tokens",
            )?;
            ev.put("short", a);
            ev.put("long", b);
            ensure!(b > a, format!("> {a}"), b.to_string());
            Ok(format!("{a} < {b}"))
        },
    );
    r.add(G, "chat.template.trailing_assistant_turn", "A conversation ending with an assistant turn is served", "200 with text", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! The weather"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
}
