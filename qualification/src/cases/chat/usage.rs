//! `chat` cases: usage and timings.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- usage ----
    r.add(
        G,
        "chat.usage.total_adds_up",
        "total_tokens = prompt_tokens + completion_tokens",
        "the sum holds",
        |c, ev| {
            let (v, _) = explain(c)?;
            let u = &v["usage"];
            ev.put("usage", u.clone());
            let (p, q, t) = (
                u64_at(&v, "/usage/prompt_tokens")?,
                u64_at(&v, "/usage/completion_tokens")?,
                u64_at(&v, "/usage/total_tokens")?,
            );
            ensure_eq!("total_tokens", t, p + q);
            Ok(format!("{p} + {q} = {t}"))
        },
    );
    r.add(
        G,
        "chat.usage.completion_within_max",
        "completion_tokens never exceeds max_tokens",
        "1 ≤ completion_tokens ≤ max_tokens (16)",
        |c, ev| {
            let (v, _) = explain(c)?;
            let q = u64_at(&v, "/usage/completion_tokens")?;
            ev.put("completion_tokens", q);
            ensure!(
                (1..=N as u64).contains(&q),
                format!("1..={N}"),
                q.to_string()
            );
            Ok(format!("{q} ≤ {N}"))
        },
    );
    r.add(
        G,
        "chat.usage.prompt_stable",
        "The same messages cost the same prompt tokens",
        "prompt_tokens equal across two requests",
        |c, ev| {
            let a = u64_at(
                &c.target.chat(&chat_body(EXPLAIN, 1))?,
                "/usage/prompt_tokens",
            )?;
            let b = u64_at(
                &c.target.chat(&chat_body(EXPLAIN, 1))?,
                "/usage/prompt_tokens",
            )?;
            ev.put("prompt_tokens", json!([a, b]));
            ensure_eq!("prompt_tokens", b, a);
            Ok(format!("{a} both times"))
        },
    );
    r.add(
        G,
        "chat.usage.completion_is_predicted_n",
        "usage and timings agree on generated tokens",
        "timings.predicted_n == usage.completion_tokens",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("usage", v["usage"].clone());
            ev.put("timings", v["timings"].clone());
            ensure_eq!(
                "predicted_n",
                u64_at(&v, "/timings/predicted_n")?,
                u64_at(&v, "/usage/completion_tokens")?
            );
            Ok("agree".into())
        },
    );
    r.add(
        G,
        "chat.usage.prompt_is_prompt_n",
        "usage and timings agree on prompt tokens",
        "timings.prompt_n + timings.cache_n == usage.prompt_tokens, cache_n == usage's cached_tokens",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("timings", v["timings"].clone());
            ev.put("usage", v["usage"].clone());
            // A prompt seen before is partly reused: prompt_n counts only what was evaluated.
            let cached = u64_at(&v, "/timings/cache_n")?;
            ensure_eq!(
                "prompt_n + cache_n",
                u64_at(&v, "/timings/prompt_n")? + cached,
                u64_at(&v, "/usage/prompt_tokens")?
            );
            ensure_eq!(
                "cache_n",
                cached,
                u64_at(&v, "/usage/prompt_tokens_details/cached_tokens")?
            );
            Ok("agree".into())
        },
    )
    .inferloopd_only("timings.cache_n matching usage.prompt_tokens_details.cached_tokens (llama-server's usage need not carry it)");

    // ---- timings ----
    r.add(G, "chat.timings.present", "Every answer carries llama-server style timings", "timings has queue_ms, prompt_n, prompt_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_second as numbers", |c, ev| {
        let (v, _) = explain(c)?;
        ev.put("timings", v["timings"].clone());
        for k in ["queue_ms", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"] {
            f64_at(&v, &format!("/timings/{k}"))?;
        }
        Ok("all present".into())
    })
    .inferloopd_only("timings.queue_ms (llama-server's timings have none)");
    r.add(
        G,
        "chat.timings.nonnegative",
        "Timings are finite and not negative",
        "every timings value ≥ 0; prompt_ms > 0",
        |c, ev| {
            let (v, _) = explain(c)?;
            let t = v["timings"].as_object().cloned().unwrap_or_default();
            ev.put("timings", v["timings"].clone());
            for (k, x) in &t {
                let x = x
                    .as_f64()
                    .ok_or_else(|| Stop::fail(format!("timings.{k} a number"), x.to_string()))?;
                ensure!(
                    x.is_finite() && x >= 0.0,
                    format!("timings.{k} ≥ 0"),
                    x.to_string()
                );
            }
            ensure!(
                f64_at(&v, "/timings/prompt_ms")? > 0.0,
                "prompt_ms > 0",
                v["timings"].to_string()
            );
            Ok(format!("{} values ≥ 0", t.len()))
        },
    );
    r.add(
        G,
        "chat.timings.rate_formula",
        "Decode rate matches tokens over time",
        "predicted_per_second = (predicted_n − 1 or predicted_n) / predicted_ms × 1000 within 2%",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 12))?;
            ev.put("timings", v["timings"].clone());
            let n = f64_at(&v, "/timings/predicted_n")?;
            let ms = f64_at(&v, "/timings/predicted_ms")?;
            let rate = f64_at(&v, "/timings/predicted_per_second")?;
            ensure!(
                n >= 2.0 && ms > 0.0,
                "≥ 2 tokens over > 0 ms",
                v["timings"].to_string()
            );
            let fits = |k: f64| (rate - k / ms * 1000.0).abs() <= 0.02 * rate.max(1e-9);
            ensure!(
                fits(n - 1.0) || fits(n),
                format!(
                    "{:.2} or {:.2} tok/s",
                    (n - 1.0) / ms * 1000.0,
                    n / ms * 1000.0
                ),
                format!("{rate:.2} tok/s")
            );
            Ok(format!("{rate:.1} tok/s consistent"))
        },
    );
    r.add(
        G,
        "chat.timings.ttft_consistent",
        "Time to first token covers the queue and the prompt and fits the wall time",
        "queue_ms ≤ ttft_ms, prompt_ms ≤ ttft_ms, ttft_ms ≤ the client's wall time",
        |c, ev| {
            let t0 = Instant::now();
            let v = c.target.chat(&chat_body(EXPLAIN, 4))?;
            let wall = t0.elapsed().as_secs_f64() * 1000.0;
            ev.put("timings", v["timings"].clone());
            ev.put("client_wall_ms", wall);
            let ttft = match v["timings"]["ttft_ms"].as_f64() {
                Some(x) => x,
                None => return Err(Stop::skip("this daemon's timings have no ttft_ms")),
            };
            let (q, p) = (
                f64_at(&v, "/timings/queue_ms")?,
                f64_at(&v, "/timings/prompt_ms")?,
            );
            ensure!(
                q <= ttft + 0.01 && p <= ttft + 0.01,
                format!("queue_ms {q:.1} and prompt_ms {p:.1} ≤ ttft_ms"),
                format!("ttft_ms {ttft:.1}")
            );
            ensure!(
                ttft <= wall + 1.0,
                format!("ttft_ms ≤ wall {wall:.1} ms"),
                format!("{ttft:.1}")
            );
            Ok(format!("ttft {ttft:.1} ms of {wall:.1} ms wall"))
        },
    );
}
