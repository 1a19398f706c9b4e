//! Tool calls in the forms of other template families, on the real model given their
//! templates (`--chat-template` with the Llama 3.2 and Mistral Nemo fixtures): the form is
//! detected from the template, a forced call is written and parsed in that form, whole and
//! streamed, and earlier calls and results go back through the family's template (Mistral's
//! checks the call ids itself).

use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, stream_finish_reason, stream_text, Daemon};
use crate::structured::weather_tools;

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

fn forced(stream: bool) -> Value {
    let mut body = chat_body("What is the weather like in Paris today?", 64);
    body["tools"] = weather_tools();
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
        "tools": weather_tools(),
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

/// A copy of the test model whose vocabulary has the two forms' markers as control tokens:
/// two of SmolLM2's unused control tokens renamed in the GGUF's token list (the header is
/// rewritten; the tensor data keeps its offset, the padding before it takes up the
/// difference). Returns the file and the markers' ids.
fn model_with_markers(dir: &std::path::Path) -> (std::path::PathBuf, [(i32, &'static str); 2]) {
    let src = crate::harness::find_model().expect("test model");
    let bytes = std::fs::read(&src).expect("read model");
    let data_start = inferloop_gguf::Gguf::open(&src)
        .expect("gguf")
        .data_offset() as usize;
    let renames = [
        (10, "<issue_closed>", "<|python_tag|>"),
        (12, "<jupyter_text>", "[TOOL_CALLS]"),
    ];
    let mut header = bytes[..data_start].to_vec();
    let mut shrunk = 0;
    for (_, old, new) in renames {
        let mut from = (old.len() as u64).to_le_bytes().to_vec();
        from.extend_from_slice(old.as_bytes());
        let at = header
            .windows(from.len())
            .position(|w| w == from.as_slice())
            .unwrap_or_else(|| panic!("{old} not in the token list"));
        let mut to = (new.len() as u64).to_le_bytes().to_vec();
        to.extend_from_slice(new.as_bytes());
        header.splice(at..at + from.len(), to);
        shrunk += old.len() - new.len();
    }
    header.extend(std::iter::repeat_n(0u8, shrunk));
    assert_eq!(header.len(), data_start);
    let path = dir.join("markers.gguf");
    let mut out = header;
    out.extend_from_slice(&bytes[data_start..]);
    std::fs::write(&path, out).expect("write model copy");
    (path, [(10, "<|python_tag|>"), (12, "[TOOL_CALLS]")])
}

/// The markers are control tokens, which output leaves out: the form's own marker is
/// spelled out for the parser, every other control token still is not.
#[test]
fn a_forms_marker_token_is_spelled_out_in_the_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (model, [(tag, tag_text), (calls, calls_text)]) = model_with_markers(dir.path());
    let im_end = 2;
    for (template, format, marker, text, other) in [
        ("llama3.2", "llama3", tag, tag_text, calls),
        ("mistral-nemo", "mistral", calls, calls_text, tag),
    ] {
        let m = inferloopd::engine::chat::LoadedModel::load_with(
            &model,
            "markers".into(),
            Some(std::path::Path::new(&fixture(template))),
            true,
        )
        .expect("load the vocabulary");
        assert_eq!(m.tool_format().name(), format);
        assert_eq!(m.output_piece(marker), text.as_bytes(), "{template}");
        assert!(m.output_piece(other).is_empty(), "{template}");
        assert!(m.output_piece(im_end).is_empty(), "{template}");
    }
}
