//! Structured output and tool calls on the real model: `response_format` constrained with
//! llguidance (the reply parses and matches the schema, whole and streamed), a schema
//! llguidance cannot enforce refused by name, and tool calls (forced ones valid against the
//! function's schema, in OpenAI's answer and stream shapes; earlier calls and tool results
//! sent back through the template). llama-server's `json_schema`, `response_format.schema`
//! and `%llguidance` grammars go through the same constrained decoding; a GBNF grammar, an
//! unknown field and a llama-server setting the server does not act on are 400s naming
//! them.

use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, shared, stream_finish_reason, stream_text};

pub(crate) fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`person_schema`] by hand (no schema validator in the tests' deps).
pub(crate) fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "city", "name"], "{text}");
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 40),
        "{text}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    assert!(
        matches!(o["city"].as_str(), Some("Paris" | "London" | "Tokyo")),
        "{text}"
    );
}

fn person_body(stream: bool) -> Value {
    let mut body = chat_body("Describe a person who lives in a big city.", 96);
    body["response_format"] = json!({
        "type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": person_schema()}
    });
    body["stream"] = json!(stream);
    body
}

#[tokio::test]
async fn json_schema_reply_parses_and_matches_the_schema_whole_and_streamed() {
    let d = shared();
    let v = d.chat(&person_body(false)).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let whole = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {v}"))
        .to_string();
    assert_person(&whole);
    let chunks = d.stream("/v1/chat/completions", &person_body(true)).await;
    assert_eq!(stream_finish_reason(&chunks), "stop");
    let streamed = stream_text(&chunks);
    assert_person(&streamed);
    // Greedy decoding under the same grammar: the same reply either way.
    assert_eq!(streamed, whole);
}

#[tokio::test]
async fn json_object_reply_is_a_json_object() {
    let d = shared();
    let mut body = chat_body("Reply with a JSON object describing a cat.", 64);
    body["response_format"] = json!({"type": "json_object"});
    let v = d.chat(&body).await;
    if v["choices"][0]["finish_reason"] == "stop" {
        let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
        let parsed: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {v}"));
        assert!(parsed.is_object(), "{v}");
    } else {
        // Cut by max_tokens: still the beginning of an object.
        let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
        assert!(text.starts_with('{'), "{v}");
    }
}

#[tokio::test]
async fn a_schema_construct_llguidance_cannot_enforce_is_a_400_naming_it() {
    let d = shared();
    let mut body = chat_body("x", 4);
    body["response_format"] = json!({
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {
            "type": "object",
            "if": {"properties": {"a": {"const": 1}}},
            "then": {"required": ["b"]}
        }}
    });
    let resp = d.post("/v1/chat/completions", &body).await;
    let v = assert_error(resp, 400, Some("response_format.json_schema.schema"), None).await;
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("\"if\"") && msg.contains("\"then\""), "{v}");
}

pub fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
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
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Local time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}
        }}
    ])
}

fn assert_weather_args(arguments: &str) {
    let a: Value =
        serde_json::from_str(arguments).unwrap_or_else(|e| panic!("not JSON ({e}): {arguments}"));
    let o = a
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {arguments}"));
    assert_eq!(o.len(), 2, "{arguments}");
    assert!(
        o["city"].as_str().is_some_and(|c| c.chars().count() <= 30),
        "{arguments}"
    );
    assert!(
        matches!(o["unit"].as_str(), Some("celsius" | "fahrenheit")),
        "{arguments}"
    );
}

fn weather_body(stream: bool) -> Value {
    let mut body = chat_body("What is the weather like in Paris today?", 96);
    body["tools"] = weather_tools();
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    body["parallel_tool_calls"] = json!(false);
    body["stream"] = json!(stream);
    body
}

#[tokio::test]
async fn a_forced_tool_call_matches_the_functions_schema_whole_and_streamed() {
    let d = shared();
    let v = d.chat(&weather_body(false)).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1, "parallel_tool_calls is false: {v}");
    let call = &calls[0];
    assert!(
        call["id"].as_str().is_some_and(|i| i.starts_with("call_")),
        "{v}"
    );
    assert_eq!(call["type"], "function", "{v}");
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let whole_args = call["function"]["arguments"]
        .as_str()
        .expect("arguments")
        .to_string();
    assert_weather_args(&whole_args);

    let chunks = d.stream("/v1/chat/completions", &weather_body(true)).await;
    assert_eq!(stream_finish_reason(&chunks), "tool_calls");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["tool_calls"].get(0))
        .collect();
    assert!(deltas.len() >= 2, "{chunks:?}");
    // OpenAI's shape: the first delta names the call, the ones after carry arguments.
    assert!(
        deltas[0]["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("call_")),
        "{chunks:?}"
    );
    assert_eq!(deltas[0]["type"], "function");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert!(deltas.iter().all(|d| d["index"] == 0), "{chunks:?}");
    assert!(
        deltas[1..].iter().all(|d| d.get("id").is_none()),
        "{chunks:?}"
    );
    let args: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    assert_weather_args(&args);
    assert_eq!(args, whole_args);
    assert_eq!(stream_text(&chunks), "", "no content around a forced call");
}

#[tokio::test]
async fn required_tool_choice_calls_one_of_the_tools() {
    let d = shared();
    let mut body = chat_body("What time is it in Tokyo?", 96);
    body["tools"] = weather_tools();
    body["tool_choice"] = json!("required");
    let v = d.chat(&body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    for c in calls {
        let name = c["function"]["name"].as_str().unwrap_or_default();
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap_or(""))
            .unwrap_or_else(|e| panic!("arguments not JSON ({e}): {v}"));
        match name {
            "get_weather" => assert_weather_args(&args.to_string()),
            "get_time" => assert!(args["city"].is_string(), "{v}"),
            other => panic!("called `{other}`: {v}"),
        }
    }
}

#[tokio::test]
async fn tool_results_go_back_through_the_template() {
    let d = shared();
    let body = json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather",
                             "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"sunny\"}"}
        ],
        "tools": weather_tools(),
        "tool_choice": "none",
        "max_tokens": 24,
        "temperature": 0
    });
    let v = d.chat(&body).await;
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none(),
        "{v}"
    );
    // The call and its result are in the prompt: more tokens than the question alone.
    let alone = d.chat(&chat_body("What is the weather in Paris?", 1)).await;
    assert!(
        v["usage"]["prompt_tokens"].as_u64() > alone["usage"]["prompt_tokens"].as_u64(),
        "{v}\n{alone}"
    );
}

#[tokio::test]
async fn bad_tool_and_format_fields_are_400s_naming_them() {
    let d = shared();
    let cases = [
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (
            json!({"tools": weather_tools(), "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (extra, param) in cases {
        let mut body = chat_body("x", 4);
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let resp = d.post("/v1/chat/completions", &body).await;
        assert_error(resp, 400, Some(param), None).await;
    }
}

#[tokio::test]
async fn llama_servers_schema_fields_are_enforced_like_response_format() {
    let d = shared();
    let prompt = "Describe a person who lives in a big city.";
    let mut top = chat_body(prompt, 96);
    top["json_schema"] = person_schema();
    let mut bare = chat_body(prompt, 96);
    bare["response_format"] = json!({"type": "json_object", "schema": person_schema()});
    let mut unwrapped = chat_body(prompt, 96);
    unwrapped["response_format"] = json!({"type": "json_schema", "schema": person_schema()});
    let mut texts = Vec::new();
    for body in [top, bare, unwrapped] {
        let v = d.chat(&body).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("no content: {v}"))
            .to_string();
        assert_person(&text);
        texts.push(text);
    }
    // One grammar, greedy decoding: the same reply from each spelling of it.
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:?}");
    let v = d
        .complete(&json!({"prompt": "A person as JSON: ", "max_tokens": 96,
                          "temperature": 0, "json_schema": person_schema()}))
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_person(v["choices"][0]["text"].as_str().unwrap_or_default());
    // A schema llguidance cannot compile names the field it came from.
    let mut body = chat_body("x", 4);
    body["json_schema"] = json!({"type": "object", "if": {"required": ["a"]}, "then": {}});
    let resp = d.post("/v1/chat/completions", &body).await;
    assert_error(resp, 400, Some("json_schema"), None).await;
}

#[tokio::test]
async fn an_llguidance_grammar_is_enforced_and_a_gbnf_one_refused() {
    let d = shared();
    let grammar = "%llguidance {}\nstart: (\"yes\" | \"no\") \", \" NUM\nNUM: /[0-9]{1,3}/";
    let mut body = chat_body("Is the sky blue? Answer and give a number.", 16);
    body["grammar"] = json!(grammar);
    let v = d.chat(&body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_yes_no_number(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default(),
    );
    let v = d
        .complete(&json!({"prompt": "Q: Is fire cold?\nA:", "max_tokens": 16,
                          "temperature": 0, "grammar": grammar}))
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_yes_no_number(v["choices"][0]["text"].as_str().unwrap_or_default());
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let mut body = chat_body("x", 4);
        if path == "/v1/completions" {
            body = json!({"prompt": "x", "max_tokens": 4});
        }
        body["grammar"] = json!("root ::= \"yes\" | \"no\"");
        let resp = d.post(path, &body).await;
        let v = assert_error(resp, 400, Some("grammar"), None).await;
        assert!(
            v["message"].as_str().unwrap_or_default().contains("GBNF"),
            "{v}"
        );
    }
}

/// The grammar's language: `yes` or `no`, a comma and a space, one to three digits.
fn assert_yes_no_number(text: &str) {
    let ok = text.split_once(", ").is_some_and(|(word, num)| {
        (word == "yes" || word == "no")
            && (1..=3).contains(&num.len())
            && num.bytes().all(|b| b.is_ascii_digit())
    });
    assert!(ok, "does not match the grammar: {text:?}");
}

#[tokio::test]
async fn unknown_fields_and_settings_not_acted_on_are_400s_naming_them() {
    let d = shared();
    for (extra, param) in [
        (json!({"foo": 1}), "foo"),
        (json!({"cache_prompt": false}), "cache_prompt"),
        (json!({"mirostat": 2}), "mirostat"),
        (json!({"n_probs": 3}), "n_probs"),
        (
            json!({"response_format": {"type": "json_object", "strict": true}}),
            "response_format.strict",
        ),
    ] {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let mut body = if path == "/v1/completions" {
                json!({"prompt": "x", "max_tokens": 4})
            } else {
                chat_body("x", 4)
            };
            if param.starts_with("response_format") && path == "/v1/completions" {
                continue;
            }
            for (k, v) in extra.as_object().expect("object") {
                body[k] = v.clone();
            }
            let resp = d.post(path, &body).await;
            let v = assert_error(resp, 400, Some(param), None).await;
            assert!(
                v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&format!("`{param}`")),
                "{v}"
            );
        }
    }
    // Neutral llama-server settings are accepted, and `n_predict` limits the answer.
    let mut body = chat_body("Count from one to twenty.", 64);
    body.as_object_mut().expect("object").remove("max_tokens");
    for (k, v) in [
        ("n_predict", json!(3)),
        ("cache_prompt", json!(true)),
        ("id_slot", json!(-1)),
        ("mirostat", json!(0)),
        ("typical_p", json!(1.0)),
    ] {
        body[k] = v;
    }
    let v = d.chat(&body).await;
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
}

/// The guard that follows a constrained sequence's tokens: the grammar's own text passes,
/// a token it forbids is refused (llama-cpp-2's sampler would let such a token through
/// unmasked when llguidance cannot compute a mask).
#[test]
fn the_constraint_guard_refuses_a_token_the_grammar_forbids() {
    use inferloopd::engine::constraint::Grammar;
    let path = crate::harness::find_model().expect("test model");
    let model = inferloopd::engine::chat::LoadedModel::load_with(&path, "guard".into(), None, true)
        .expect("vocabulary");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"], "additionalProperties": false});
    let constraint = model
        .compile_grammar(&Grammar::JsonSchema(schema))
        .expect("compiles");
    let mut guard = constraint.guard();
    for t in model.tokenize_whole(r#"{"a":12}"#) {
        guard.follow(t).expect("the grammar's own text");
    }
    let mut guard = constraint.guard();
    let hello = model.tokenize_whole("Hello");
    let err = guard.follow(hello[0]).expect_err("not JSON");
    assert!(err.contains("not enforced"), "{err}");
}
