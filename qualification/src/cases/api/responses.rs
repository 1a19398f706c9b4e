//! `api` cases: the Responses API (`POST /v1/responses`): the whole response object, and a
//! function-call round trip. They keep the ids of two completions cases they replaced
//! (`created` and `model` on a completion, which `api.chat.*` already checks).

use serde_json::Value;

use super::*;

pub(super) const RESPONSES: &str = "/v1/responses";

/// A greedy Responses request for `input`.
pub(super) fn responses_body(input: Value, max_output_tokens: u32) -> Value {
    json!({"input": input, "max_output_tokens": max_output_tokens, "temperature": 0})
}

/// The `output_text` parts of a response's message items, joined.
pub(super) fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().into_iter().flatten())
        .filter(|p| p["type"] == "output_text")
        .filter_map(|p| p["text"].as_str())
        .collect()
}

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.completions.created_now",
        "POST /v1/responses answers the whole response object",
        "object response, id resp_…, created_at now, status completed/incomplete (with \
         incomplete_details.reason), one assistant message of output_text, usage that adds up \
         with input_tokens_details.cached_tokens, metadata and instructions echoed",
        |c, ev| {
            let mut body = responses_body(json!("Say hello."), 12);
            body["instructions"] = json!("Answer briefly.");
            body["metadata"] = json!({"qual": "yes"});
            let resp = c.target.post(RESPONSES, &body)?;
            ev.text("response", &resp.describe());
            let v = json_200(&resp, "POST /v1/responses")?;
            ensure_eq!("object", v["object"], json!("response"));
            let id = str_at(&v, "/id")?;
            ensure!(id.starts_with("resp_"), "id starts with resp_", id);
            let created = u64_at(&v, "/created_at")?;
            ensure!(
                created.abs_diff(now_s()) <= 300,
                "created_at within 300 s of now",
                created.to_string()
            );
            ensure_eq!("model", v["model"], json!(c.facts.model_id));
            let status = str_at(&v, "/status")?;
            match status.as_str() {
                "completed" => {}
                "incomplete" => ensure_eq!(
                    "incomplete_details.reason",
                    v["incomplete_details"]["reason"],
                    json!("max_output_tokens")
                ),
                other => return Err(Stop::fail("status completed or incomplete", other)),
            }
            let out = v["output"].as_array().cloned().unwrap_or_default();
            ensure_eq!("output items", out.len(), 1);
            ensure_eq!("output[0].type", out[0]["type"], json!("message"));
            ensure_eq!("output[0].role", out[0]["role"], json!("assistant"));
            let text = output_text(&v);
            ensure!(
                !text.trim().is_empty(),
                "non-empty output_text",
                v.to_string()
            );
            let u = &v["usage"];
            let (i, o) = (u64_at(u, "/input_tokens")?, u64_at(u, "/output_tokens")?);
            ensure!(
                i > 0 && (1..=12).contains(&o),
                "input > 0, output 1..=12",
                u.to_string()
            );
            ensure_eq!("total_tokens", u64_at(u, "/total_tokens")?, i + o);
            ensure!(
                u["input_tokens_details"]["cached_tokens"].is_u64(),
                "usage.input_tokens_details.cached_tokens",
                u.to_string()
            );
            ensure_eq!("metadata", v["metadata"], json!({"qual": "yes"}));
            ensure_eq!("instructions", v["instructions"], json!("Answer briefly."));
            Ok(format!("{status}, {o} output tokens: {text:?}"))
        },
    );
    r.add(
        G,
        "api.completions.model_field",
        "A Responses function call round trip: function_call, then function_call_output, then an answer",
        "a forced call is a function_call item (call_id, name, JSON arguments); sending it back \
         with its output is answered by a message",
        |c, ev| {
            let tool = json!({"type": "function", "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": {"type": "object", "additionalProperties": false,
                               "properties": {"city": {"type": "string", "maxLength": 20}},
                               "required": ["city"]}});
            let question = json!({"role": "user", "content": "What is the weather in Paris?"});
            let mut body = responses_body(json!([question]), 48);
            body["tools"] = json!([tool]);
            body["tool_choice"] = json!("required");
            let resp = c.target.post(RESPONSES, &body)?;
            ev.text("first", &resp.describe());
            if resp.status() == 400 && resp.text().contains("tool_choice") {
                return Err(Stop::skip(
                    "this backend cannot force a call (no constrained decoding)",
                ));
            }
            let v = json_200(&resp, "POST /v1/responses with a forced call")?;
            let call = v["output"]
                .as_array()
                .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
                .cloned()
                .ok_or_else(|| Stop::fail("a function_call output item", v.to_string()))?;
            ensure_eq!("name", call["name"], json!("get_weather"));
            let call_id = str_at(&call, "/call_id")?;
            let args = str_at(&call, "/arguments")?;
            let parsed: Value = serde_json::from_str(&args)
                .map_err(|e| Stop::fail("arguments are JSON", format!("{e}: {args}")))?;
            ensure!(parsed["city"].is_string(), "arguments.city a string", args);
            let mut back = responses_body(
                json!([question,
                    {"type": "function_call", "call_id": call_id, "name": "get_weather",
                     "arguments": args},
                    {"type": "function_call_output", "call_id": call_id,
                     "output": "{\"sky\": \"sunny\", \"celsius\": 21}"}]),
                24,
            );
            back["tools"] = json!([tool]);
            back["tool_choice"] = json!("none");
            let resp = c.target.post(RESPONSES, &back)?;
            ev.text("second", &resp.describe());
            let v2 = json_200(&resp, "POST /v1/responses with the call's output")?;
            let text = output_text(&v2);
            ensure!(!text.trim().is_empty(), "an answer message", v2.to_string());
            let mut alone = responses_body(json!([question]), 1);
            alone["tools"] = json!([tool]);
            alone["tool_choice"] = json!("none");
            let v0 = c.target.post_ok(RESPONSES, &alone)?;
            let (i0, i2) = (
                u64_at(&v0, "/usage/input_tokens")?,
                u64_at(&v2, "/usage/input_tokens")?,
            );
            ensure!(
                i2 > i0 + 10,
                "the call and its output reach the prompt",
                format!("{i0} input tokens without them, {i2} with")
            );
            Ok(format!("called get_weather({args}), then answered {text:?}"))
        },
    );
}
