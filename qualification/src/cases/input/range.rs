//! `input` cases: out-of-range values: 400 naming the field. (`presence_penalty` below -2
//! and `frequency_penalty` above 2 gave their ids to `embeddings.rs`: the other bound of
//! each is still checked, through the same range check.)

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- out of range: 400 naming the field ----
    let long_stop = "x".repeat(513);
    let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let ranges: [(&str, &str, Value, &str); 14] = [
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
        ("input.range.n_two", "n", json!(2), "n"),
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
}
