//! `input` cases: what `/v1/embeddings` refuses, naming the field. They keep the ids of
//! two range rows they replaced (`presence_penalty` below -2, `frequency_penalty` above 2:
//! the other bound of each goes through the same check and stays).

use super::*;

const EMBEDDINGS: &str = "/v1/embeddings";

/// A case: its id, its title, and the bodies it sends with the field each must name.
type Row = (&'static str, &'static str, Vec<(Value, &'static str)>);

pub(super) fn register(r: &mut Registry) {
    let rows: [Row; 2] = [
        (
            "input.range.presence_penalty_below_minus_2",
            "Embedding dimensions other than the model's are refused",
            vec![
                (json!({"input": "a", "dimensions": 7}), "dimensions"),
                (json!({"input": "a", "dimensions": 0}), "dimensions"),
            ],
        ),
        (
            "input.range.frequency_penalty_above_2",
            "Empty embedding inputs and token ids outside the vocabulary are refused",
            vec![
                (json!({"input": ""}), "input"),
                (json!({"input": []}), "input"),
                (json!({"input": ["fine", ""]}), "input[1]"),
                (json!({"input": [[1, 2], [3, 99_999_999]]}), "input[1][1]"),
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
                for (body, param) in &cases {
                    let resp = c.target.post(EMBEDDINGS, body)?;
                    ev.text(&body.to_string(), &resp.describe());
                    let err = expect_error(&resp, 400, Some(param), None)?;
                    ensure_eq!("type", err["type"], json!("invalid_request_error"));
                }
                Ok(format!("400 naming {}", params.join(", ")))
            },
        )
        .inferloopd_only(
            "the item named in `param`, and `dimensions` held to the model's size (OpenAI \
             shortens its v3 vectors)",
        );
    }
}
