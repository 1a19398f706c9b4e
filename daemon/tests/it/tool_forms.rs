//! Tool calls in the forms of other template families, on the real model given their
//! templates (`--chat-template` with the Llama 3.2 and Mistral Nemo fixtures): the form is
//! detected from the template, a forced call is written and parsed in that form, whole and
//! streamed, and earlier calls and results go back through the family's template (Mistral's
//! checks the call ids itself).

use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, stream_finish_reason, stream_text, Daemon};

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/chat_templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn start(template: &str) -> Daemon {
    Daemon::start(&[
        "--chat-template",
        &fixture(template),
        "--slots",
        "2",
        "--ctx",
        "2048",
    ])
}

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "unit"],
            "additionalProperties": false
        }
    }}])
}

fn forced(stream: bool) -> Value {
    let mut body = chat_body("What is the weather like in Paris today?", 64);
    body["tools"] = tools();
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    body["stream"] = json!(stream);
    body
}

fn assert_args(arguments: &str) {
    let a: Value =
        serde_json::from_str(arguments).unwrap_or_else(|e| panic!("not JSON ({e}): {arguments}"));
    assert!(a["city"].is_string(), "{arguments}");
    assert!(
        matches!(a["unit"].as_str(), Some("celsius" | "fahrenheit")),
        "{arguments}"
    );
}

/// The forced call, whole and streamed: its id (checked by `id_ok`) and arguments.
async fn assert_forced_call(d: &Daemon, id_ok: impl Fn(&str) -> bool) {
    let v = d.chat(&forced(false)).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    assert!(call["id"].as_str().is_some_and(&id_ok), "{v}");
    let whole = call["function"]["arguments"].as_str().expect("arguments");
    assert_args(whole);

    let chunks = d.stream("/v1/chat/completions", &forced(true)).await;
    assert_eq!(stream_finish_reason(&chunks), "tool_calls", "{chunks:?}");
    assert_eq!(stream_text(&chunks), "", "{chunks:?}");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["tool_calls"].get(0))
        .collect();
    // The name first, then the arguments as they are written.
    assert!(deltas.len() >= 2, "{chunks:?}");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert!(deltas[0]["id"].as_str().is_some_and(&id_ok), "{chunks:?}");
    let args: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, whole, "greedy: the stream writes the same call");
}

/// A conversation with an earlier call (id `id`) and its result.
fn round_trip(id: &str) -> Value {
    json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": id, "type": "function",
                "function": {"name": "get_weather",
                             "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": id, "content": "{\"temp\": 21}"}
        ],
        "tools": tools(),
        "max_tokens": 8,
        "temperature": 0
    })
}

#[tokio::test]
async fn llama3_templates_get_calls_in_the_llama3_form() {
    let d = start("llama3.2");
    let status = d.status().await;
    assert_eq!(status["model"]["tool_call_format"], "llama3", "{status}");
    assert_forced_call(&d, |id| id.starts_with("call_")).await;
    let v = d.chat(&round_trip("call_1")).await;
    assert!(v["choices"][0]["message"].is_object(), "{v}");
}

#[tokio::test]
async fn mistral_templates_get_calls_in_the_mistral_form_with_its_ids() {
    let d = start("mistral-nemo");
    let status = d.status().await;
    assert_eq!(status["model"]["tool_call_format"], "mistral", "{status}");
    // Mistral's template wants 9 alphanumerics back in `tool_call_id`: ours are.
    let nine = |id: &str| id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric());
    assert_forced_call(&d, nine).await;
    let v = d.chat(&round_trip("abcDEF123")).await;
    assert!(v["choices"][0]["message"].is_object(), "{v}");
    // The id reaches the template, which refuses another shape by its own rule.
    let resp = d.post("/v1/chat/completions", &round_trip("call_1")).await;
    let err = assert_error(resp, 400, Some("messages"), None).await;
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(msg.contains("length 9"), "{msg}");
}
