//! `input` cases: out-of-range values: 400 naming the field. (`presence_penalty` below -2
//! and `frequency_penalty` above 2 gave their ids to `embeddings.rs`: the other bound of
//! each is still checked, through the same range check.)

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- out of range: 400 naming the field ----
    let long_stop = "x".repeat(513);
    let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let ranges: [(&str, &str, Value, &str); 13] = [
        (
            "input.range.temperature_above_2",
            "temperature",
            json!(2.5),
            "temperature",
        ),
        (
            "input.range.temperature_negative",
            "temperature",
            json!(-0.1),
            "temperature",
        ),
        ("input.range.top_p_zero", "top_p", json!(0), "top_p"),
        ("input.range.top_p_above_1", "top_p", json!(1.5), "top_p"),
        ("input.range.top_k_negative", "top_k", json!(-1), "top_k"),
        ("input.range.min_p_above_1", "min_p", json!(1.5), "min_p"),
        (
            "input.range.presence_penalty_above_2",
            "presence_penalty",
            json!(2.5),
            "presence_penalty",
        ),
        (
            "input.range.frequency_penalty_below_minus_2",
            "frequency_penalty",
            json!(-3),
            "frequency_penalty",
        ),
        (
            "input.range.max_tokens_zero",
            "max_tokens",
            json!(0),
            "max_tokens",
        ),
        (
            "input.range.max_completion_tokens_zero",
            "max_completion_tokens",
            json!(0),
            "max_completion_tokens",
        ),
        (
            "input.range.stop_too_many",
            "stop",
            json!(many_stops),
            "stop",
        ),
        ("input.range.stop_empty_string", "stop", json!([""]), "stop"),
        (
            "input.range.stop_too_long",
            "stop",
            json!(long_stop),
            "stop",
        ),
    ];
    for (id, field, value, param) in ranges {
        let shown = crate::case::snippet(&value.to_string(), 40);
        let case = r.add(
            G,
            id,
            format!("`{field}` = {shown} (out of range) is refused"),
            format!("400 naming `{param}`, nothing generated"),
            move |c, ev| {
                let body = chat_with(field, value.clone());
                let resp = c.target.post(CHAT, &body)?;
                ev.text("response", &resp.describe());
                let err = expect_error(&resp, 400, Some(param), None)?;
                ensure!(
                    err["message"].as_str().is_some_and(|m| m.contains(param)),
                    format!("the message names `{param}`"),
                    err.to_string()
                );
                Ok(format!("400 param {param}"))
            },
        );
        if let Some(what) = beyond_openai(id, field) {
            case.inferloopd_only(what);
        }
    }
    // `n`: two choices from one request, and a bound above every box's slots.
    r.add(
        G,
        "input.range.n_two",
        "`n` = 2 returns two choices; `n` = 129 is refused",
        "n = 2: 200 with choices[0] and choices[1] (index 0 and 1, each with text and a finish_reason), usage counting the prompt once; n = 129: 400 naming `n`",
        |c, ev| {
            let resp = c.target.post(CHAT, &chat_with("n", json!(2)))?;
            ev.text("n = 2", &resp.describe());
            // Each choice takes a slot: a one-slot inferloopd refuses n = 2, naming `n`.
            if c.server.inferloopd && resp.status() == 400 {
                let slots = c.target.status()?["slots"]["total"].as_u64();
                ensure!(slots < Some(2), "n = 2 served on a box with two slots or more", resp.describe());
                expect_error(&resp, 400, Some("n"), None)?;
                return Ok("one slot: n = 2 refused naming n".into());
            }
            let v = json_200(&resp, "n = 2")?;
            let choices = v["choices"].as_array().cloned().unwrap_or_default();
            ensure_eq!("choices", choices.len(), 2);
            for (i, ch) in choices.iter().enumerate() {
                ensure_eq!(format!("choices[{i}].index"), ch["index"].as_u64(), Some(i as u64));
                ensure!(
                    ch["message"]["content"].is_string() && ch["finish_reason"].is_string(),
                    format!("choice {i} has content and a finish_reason"),
                    ch.to_string()
                );
            }
            let u = &v["usage"];
            let (prompt, completion) = (u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64());
            ensure!(
                matches!((prompt, completion), (Some(p), Some(c)) if p > 0 && c <= 16 && u["total_tokens"].as_u64() == Some(p + c)),
                "usage: the prompt once, both choices' completion tokens (≤ 2 × max_tokens 8)",
                u.to_string()
            );
            let resp = c.target.post(CHAT, &chat_with("n", json!(129)))?;
            ev.text("n = 129", &resp.describe());
            expect_error(&resp, 400, Some("n"), None)?;
            Ok("two choices; n = 129 refused naming n".into())
        },
    );
}
