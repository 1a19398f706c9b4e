//! `load` cases: metrics return to zero, exact counts.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- metrics return to zero, exact counts ----
    r.add(
        G,
        "load.metrics.generated_tokens_exact",
        "Generated tokens are counted exactly",
        "Δ inferloop_generated_tokens_total = Σ completion_tokens of 4 parallel requests",
        |c, ev| {
            let d = deltas(c)?;
            let (got, want) = (
                delta(&d, "inferloop_generated_tokens_total")?,
                sum_usage(&d, "completion_tokens")?,
            );
            ev.put("delta", got);
            ev.put("sum_usage", want);
            ensure_eq!("Δ generated_tokens_total", got, want);
            Ok(format!("Δ {got}"))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.prompt_tokens_exact",
        "Prompt tokens are counted exactly",
        "Δ inferloop_prompt_tokens_total = Σ prompt_tokens",
        |c, ev| {
            let d = deltas(c)?;
            let (got, want) = (
                delta(&d, "inferloop_prompt_tokens_total")?,
                sum_usage(&d, "prompt_tokens")?,
            );
            ev.put("delta", got);
            ev.put("sum_usage", want);
            ensure_eq!("Δ prompt_tokens_total", got, want);
            Ok(format!("Δ {got}"))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.ttft_count_exact",
        "Every request observes one TTFT",
        "Δ inferloop_ttft_seconds_count = 4",
        |c, ev| {
            let d = deltas(c)?;
            let got = delta(&d, "inferloop_ttft_seconds_count")?;
            ev.put("delta", got);
            ensure_eq!("Δ ttft_seconds_count", got, 4.0);
            Ok("Δ 4".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.request_count_exact",
        "Every request observes one duration",
        "Δ inferloop_request_seconds_count = 4",
        |c, ev| {
            let d = deltas(c)?;
            let got = delta(&d, "inferloop_request_seconds_count")?;
            ev.put("delta", got);
            ensure_eq!("Δ request_seconds_count", got, 4.0);
            Ok("Δ 4".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.metrics.gauges_zero_after_burst",
        "After a burst the gauges read zero",
        "inferloop_active_slots 0, inferloop_queue_depth 0, kv reserved 0",
        |c, ev| {
            let d = deltas(c)?;
            let (a, q) = (
                metric_of(&d.after, "inferloop_active_slots")?,
                metric_of(&d.after, "inferloop_queue_depth")?,
            );
            ev.put("active_slots", a);
            ev.put("queue_depth", q);
            ensure!(a == 0.0 && q == 0.0, "0 and 0", format!("{a} and {q}"));
            let s = c.target.status()?;
            ensure_eq!("kv.reserved", s["kv"]["reserved"], json!(0));
            Ok("all zero".into())
        },
    )
    .exclusive();
    r.add(G, "load.burst.sixteen_short_requests", "Sixteen short requests at once are all served", "16 × 200 (slots plus queue absorb them)", |c, ev| {
        let out = parallel(16, |_| c.target.post(CHAT, &chat_body("Hi", 2)))?;
        let codes: Vec<u16> = out.iter().map(Response::status).collect();
        ev.put("statuses", json!(codes));
        let cap = c.facts.slots + c.facts.queue;
        if cap < 16 {
            return Err(Stop::skip(format!("the daemon admits only {cap} requests at once (slots + queue); this case needs 16")));
        }
        ensure!(codes.iter().all(|s| *s == 200), "16 × 200", format!("{codes:?}"));
        Ok("16 × 200".into())
    }).exclusive();
}
