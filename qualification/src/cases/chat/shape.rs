//! `chat` cases: the answer's shape and the message roles.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- shape ----
    r.add(
        G,
        "chat.shape.one_choice",
        "An answer holds exactly one choice",
        "choices has one element with index 0",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("choices", v["choices"].clone());
            ensure_eq!(
                "choices length",
                v["choices"].as_array().map(Vec::len),
                Some(1)
            );
            ensure_eq!("choices[0].index", v["choices"][0]["index"], json!(0));
            Ok("one choice, index 0".into())
        },
    );
    r.add(
        G,
        "chat.shape.assistant_role",
        "The answer's message comes from the assistant",
        "message.role \"assistant\"",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("message", v["choices"][0]["message"].clone());
            ensure_eq!(
                "message.role",
                v["choices"][0]["message"]["role"],
                json!("assistant")
            );
            Ok("role assistant".into())
        },
    );
    r.add(
        G,
        "chat.shape.content_nonempty",
        "The answer has text",
        "message.content is a non-empty string",
        |c, ev| {
            let (_, t) = explain(c)?;
            ev.put("content", t.clone());
            ensure!(!t.is_empty(), "non-empty content", "empty");
            Ok(format!("{} chars", t.chars().count()))
        },
    );
    r.add(
        G,
        "chat.shape.finish_reason_valid",
        "finish_reason is stop or length",
        "finish_reason ∈ {stop, length}",
        |c, ev| {
            let (v, _) = explain(c)?;
            let f = finish_of(&v);
            ev.put("finish_reason", f.clone());
            ensure!(f == "stop" || f == "length", "stop or length", f);
            Ok(format!("finish_reason {f}"))
        },
    );
    r.add(
        G,
        "chat.shape.logprobs_null",
        "logprobs is present and null",
        "choices[0].logprobs == null (key present)",
        |c, ev| {
            let (v, _) = explain(c)?;
            let choice = &v["choices"][0];
            ev.put(
                "choice_keys",
                json!(choice
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>())),
            );
            ensure!(
                choice
                    .as_object()
                    .is_some_and(|o| o.get("logprobs") == Some(&Value::Null)),
                "logprobs: null",
                choice.to_string()
            );
            Ok("logprobs null".into())
        },
    );

    // ---- roles ----
    r.add(G, "chat.role.system_accepted", "A system message before the user's is served", "200 with text", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok(format!("served: {:?}", text_of(&v)?))
    });
    r.add(G, "chat.role.developer_is_system", "The developer role is the system role", "developer and system messages give the same greedy text", |c, ev| {
        let sys = c.target.chat(&messages(json!([{"role": "system", "content": "Always answer in French."}, {"role": "user", "content": "What is the capital of Italy?"}]), 12))?;
        let dev = c.target.chat(&messages(json!([{"role": "developer", "content": "Always answer in French."}, {"role": "user", "content": "What is the capital of Italy?"}]), 12))?;
        let (a, b) = (text_of(&sys)?, text_of(&dev)?);
        ev.put("system", a.clone());
        ev.put("developer", b.clone());
        ensure!(a == b, format!("developer text equal to system text {a:?}"), b);
        Ok("same text".into())
    });
    r.add(G, "chat.role.assistant_history", "A conversation with an assistant turn is served", "user/assistant/user → 200", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(G, "chat.role.tool_accepted", "A tool message is accepted", "user, assistant tool_calls, tool result with its tool_call_id → 200", |c, ev| {
        // OpenAI's shape: a tool message answers an assistant call by its id (a tool message
        // without `tool_call_id` is a 400 there and here).
        let call = json!({"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": "{\"a\": 6, \"b\": 7}"}});
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "What is 6 x 7?"}, {"role": "assistant", "content": null, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(G, "chat.role.content_parts_joined", "Text parts are joined into one message", "[{type:text},{type:text}] gives the same greedy text as the joined string", |c, ev| {
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "Explain in three sentences"}, {"type": "text", "text": " why the sky is blue."}]}]);
        let r = same_as_greedy(c, ev, messages(parts, N), "text parts")?;
        Ok(r)
    });
    r.add(G, "chat.role.assistant_null_content", "An assistant turn with null content is accepted", "200", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null}, {"role": "user", "content": "Hello?"}]), 2))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(
        G,
        "chat.role.empty_user_content",
        "An empty user message is served",
        "200, prompt_tokens > 0 (the template's own tokens)",
        |c, ev| {
            let v = c.target.chat(&chat_body("", 2))?;
            let p = u64_at(&v, "/usage/prompt_tokens")?;
            ev.put("usage", v["usage"].clone());
            ensure!(p > 0, "prompt_tokens > 0", p.to_string());
            Ok(format!("prompt_tokens {p}"))
        },
    );
}
