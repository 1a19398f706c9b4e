//! `input` cases: what a stateless Responses API refuses, by field. They keep the ids of
//! three wrong-type rows they replaced (`min_p`, `presence_penalty`, `frequency_penalty`
//! as strings: the other seventeen rows check the same serde path).

use super::*;

const RESPONSES: &str = "/v1/responses";

/// A case: its id, its title, and the requests it sends with the field each must name.
type Row = (&'static str, &'static str, Vec<(Value, &'static str)>);

pub(super) fn register(r: &mut Registry) {
    let rows: [Row; 3] = [
        (
            "input.type.frequency_penalty_string",
            "What needs stored state is refused on /v1/responses",
            vec![
                (
                    json!({"previous_response_id": "resp_123"}),
                    "previous_response_id",
                ),
                (json!({"store": true}), "store"),
                (json!({"background": true}), "background"),
            ],
        ),
        (
            "input.type.min_p_string",
            "Built-in tools are refused on /v1/responses",
            vec![
                (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
                (
                    json!({"tools": [{"type": "function", "name": "f"},
                                     {"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
                    "tools[1].type",
                ),
            ],
        ),
        (
            "input.type.presence_penalty_string",
            "Non-text input is refused on /v1/responses",
            vec![
                (
                    json!({"input": [{"role": "user", "content": [
                        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}),
                    "input[0].content[0].type",
                ),
                (
                    json!({"input": [{"role": "user", "content": [
                        {"type": "input_file", "file_id": "file_1"}]}]}),
                    "input[0].content[0].type",
                ),
            ],
        ),
    ];
    for (id, title, cases) in rows {
        let params: Vec<&str> = cases.iter().map(|(_, p)| *p).collect();
        r.add(
            G,
            id,
            title,
            format!("400 invalid_request_error naming {}", params.join(", ")),
            move |c, ev| {
                for (extra, param) in &cases {
                    let mut body = json!({"input": "Hi", "max_output_tokens": 4});
                    for (k, v) in extra.as_object().into_iter().flatten() {
                        body[k] = v.clone();
                    }
                    let resp = c.target.post(RESPONSES, &body)?;
                    ev.text(param, &resp.describe());
                    let err = expect_error(&resp, 400, Some(param), None)?;
                    ensure_eq!("type", err["type"], json!("invalid_request_error"));
                }
                Ok(format!("400 naming {}", params.join(", ")))
            },
        )
        .inferloopd_only("the Responses API's refusals by field");
    }
}
