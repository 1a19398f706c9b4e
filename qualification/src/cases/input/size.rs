//! `input` cases: body sizes and the context.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- sizes and the context ----
    r.add(G, "input.body.over_default_limit", "A body over the default 1 MiB limit is refused", "413 request_too_large (spawn mode: default --max-body-bytes)", |c, ev| {
        let body = chat_body(&"a".repeat(1_100_000), 8);
        let resp = c.target.post(CHAT, &body)?;
        ev.text("response", &resp.describe());
        if c.spawn.is_none() && resp.status() == 400 {
            return Err(Stop::skip("the attached daemon accepts bodies over 1 MiB (a larger --max-body-bytes); its limit is unknown here"));
        }
        expect_error(&resp, 413, None, Some("request_too_large"))?;
        Ok("413".into())
    });
    r.add(
        G,
        "input.body.over_limit",
        "A body over --max-body-bytes (4096) is refused",
        "413 request_too_large, by Content-Length",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let resp = fx
                .target()
                .post(CHAT, &chat_body(&"a".repeat(10 * 1024), 8))?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 413, None, Some("request_too_large"))?;
            Ok("413".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.body.over_limit_chunked",
        "A chunked body over the limit is refused while reading",
        "413 request_too_large without a Content-Length",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let bytes =
                serde_json::to_vec(&chat_body(&"a".repeat(10 * 1024), 8)).unwrap_or_default();
            let resp = fx.target().send(
                Request::post(CHAT)
                    .body(bytes, Some("application/json"))
                    .chunked(),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 413, None, Some("request_too_large"))?;
            Ok("413 while reading".into())
        },
    )
    .fixture("strict");
    r.add(
        G,
        "input.context.max_tokens_over",
        "max_tokens beyond the context is refused",
        "400 context_length_exceeded naming messages; the message quotes the limit",
        |c, ev| {
            let ctx = c.facts.ctx;
            let resp = c.target.post(CHAT, &chat_body("Hello", ctx as u32))?;
            ev.text("response", &resp.describe());
            let err = expect_error(
                &resp,
                400,
                Some("messages"),
                Some("context_length_exceeded"),
            )?;
            ensure!(
                err["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&ctx.to_string())),
                format!("the message quotes {ctx}"),
                err.to_string()
            );
            Ok(format!("400 at max_tokens {ctx}"))
        },
    );
    r.add(
        G,
        "input.context.prompt_over",
        "A prompt longer than the context is refused",
        "400 context_length_exceeded",
        |c, ev| {
            let long = "tell me more about the weather ".repeat((c.facts.ctx as usize / 3) + 10);
            let resp = c.target.post(CHAT, &chat_body(&long, 8))?;
            ev.text("response", &resp.describe());
            expect_error(
                &resp,
                400,
                Some("messages"),
                Some("context_length_exceeded"),
            )?;
            Ok(format!("400 for {} bytes of prompt", long.len()))
        },
    );
    r.add(
        G,
        "input.model.unknown",
        "Generation for another model is refused",
        "404 model_not_found naming model",
        |c, ev| {
            let resp = c.target.post(CHAT, &chat_with("model", json!("gpt-4")))?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 404, Some("model"), Some("model_not_found"))?;
            Ok("404".into())
        },
    );
}
