//! Chat templates rendered as Jinja: popular families' templates give exactly the text
//! Hugging Face `transformers` gives (fixtures made once by
//! `scripts/gen-chat-template-fixtures.py`), and on the real model the template's own
//! behaviour shows (its default system prompt, `--chat-template`, `raise_exception`, the
//! fallback to llama.cpp's matcher).

use std::path::PathBuf;

use inferloopd::engine::chat::prompt::{render_marked, Piece};
use inferloopd::engine::chat::ChatTurn;
use inferloopd::engine::chat::PromptError;
use inferloopd::engine::template::JinjaTemplate;
use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, shared, Daemon};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates"
    ))
}

fn read(name: &str) -> String {
    let path = fixtures().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn chat_templates_render_as_transformers_does() {
    let expected: Value = serde_json::from_str(&read("expected.json")).expect("expected.json");
    let now = expected["now"].as_i64().expect("now");
    let mut checked = 0;
    for family in expected["templates"].as_array().expect("templates") {
        let file = family["file"].as_str().expect("file");
        let template = JinjaTemplate::compile(
            &read(file),
            family["bos_token"].as_str().expect("bos_token"),
            family["eos_token"].as_str().expect("eos_token"),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .with_fixed_time(now);
        for case in family["cases"].as_array().expect("cases") {
            let title = format!("{file}, {}", case["title"]);
            let turns: Vec<ChatTurn> = case["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| ChatTurn {
                    role: m["role"].as_str().expect("role").into(),
                    content: m["content"].as_str().expect("content").into(),
                    tool_call_id: m["tool_call_id"].as_str().map(Into::into),
                    ..ChatTurn::default()
                })
                .collect();
            let tools = case.get("tools");
            let generation = case["add_generation_prompt"].as_bool().expect("flag");
            // Through the sentinel path the daemon uses, so its pieces are checked too.
            let pieces = render_marked(&turns, |stand_ins| {
                template.render(stand_ins, tools, generation)
            });
            match (case.get("expected"), case.get("raises")) {
                (Some(text), _) => {
                    let pieces = pieces.unwrap_or_else(|e| panic!("{title}: {e}"));
                    let joined: String = pieces
                        .iter()
                        .map(|p| match p {
                            Piece::Markup(m) => m.as_str(),
                            Piece::Text(t) => t.as_ref(),
                        })
                        .collect();
                    assert_eq!(joined, text.as_str().expect("text"), "{title}");
                    // Each non-blank content the template kept came back as plain text,
                    // not as markup (some templates drop a system message).
                    for t in turns
                        .iter()
                        .filter(|t| !t.content.trim().is_empty() && joined.contains(&t.content))
                    {
                        assert!(
                            pieces.contains(&Piece::Text(t.content.trim().into())),
                            "{title}: {:?} is not a text piece",
                            t.content
                        );
                    }
                }
                (None, Some(message)) => assert_eq!(
                    pieces.map(|_| ()),
                    Err(PromptError::Refused(
                        message.as_str().expect("message").into()
                    )),
                    "{title}"
                ),
                _ => panic!("{title}: neither expected nor raises"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} cases");
}

fn usage(v: &Value) -> u64 {
    v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
}

/// The default model's template adds its default system prompt when the client sends none:
/// 31 prompt tokens for "Hi", as `llama-server --jinja` counts (the built-in matcher gave 10).
#[tokio::test]
async fn the_models_own_template_adds_its_default_system_prompt() {
    let d = shared();
    let v = d.chat(&chat_body("Hi", 1)).await;
    assert_eq!(usage(&v), 31, "{v}");
    let with_system = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 1,
    });
    let v2 = d.chat(&with_system).await;
    assert!(
        usage(&v2) < usage(&v),
        "a system message replaces the default: {v2}"
    );
    let status = d.status().await;
    assert_eq!(status["model"]["chat_template"], "jinja", "{status}");
    assert_eq!(
        status["model"]["chat_template_file"],
        Value::Null,
        "{status}"
    );
}

fn template_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jinja")
        .tempfile()
        .expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write template");
    f
}

/// `--chat-template FILE` replaces the model's template; a template that calls
/// `raise_exception` refuses with a 400 carrying its message.
#[tokio::test]
async fn a_chat_template_file_overrides_and_can_refuse() {
    let file = template_file(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('No system \
         messages, please') }}{% endif %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}",
    );
    let path = file.path().to_str().expect("utf-8 path").to_string();
    let d = Daemon::start(&["--chat-template", &path]);
    let v = d.chat(&chat_body("Hi", 1)).await;
    // <|im_start|> Hi <|im_end|>: no default system prompt, no roles.
    assert_eq!(usage(&v), 3, "{v}");
    let status = d.status().await;
    assert_eq!(status["model"]["chat_template"], "jinja", "{status}");
    assert_eq!(status["model"]["chat_template_file"], path.as_str());
    let body = json!({
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}],
        "max_tokens": 1,
    });
    let resp = d.post("/v1/chat/completions", &body).await;
    let err = assert_error(resp, 400, Some("messages"), None).await;
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(msg.contains("No system messages, please"), "{msg}");
}

/// A template minijinja cannot compile falls back to llama.cpp's matcher, and says so.
#[tokio::test]
async fn a_template_minijinja_cannot_compile_falls_back_to_the_builtin() {
    // ChatML markers (so llama.cpp's matcher recognises it) in broken Jinja.
    let file = template_file("{% for m in messages %}<|im_start|>{{ m.content }<|im_end|>");
    let path = file.path().to_str().expect("utf-8 path").to_string();
    let d = Daemon::start(&["--chat-template", &path]);
    let v = d.chat(&chat_body("Hi", 1)).await;
    // llama.cpp's ChatML: no default system prompt.
    assert_eq!(usage(&v), 10, "{v}");
    let status = d.status().await;
    assert_eq!(
        status["model"]["chat_template"], "llama.cpp builtin",
        "{status}"
    );
    assert!(
        d.log().contains("using llama.cpp's built-in matcher"),
        "{}",
        d.log_tail()
    );
}

/// A copy of the test model whose GGUF carries `template` as its chat template (no longer
/// than the original: the header shrinks and the padding before the tensor data takes up
/// the difference, so every tensor keeps its offset).
fn model_with_template(dir: &std::path::Path, template: &str) -> PathBuf {
    let src = crate::harness::find_model().expect("test model");
    let bytes = std::fs::read(&src).expect("read model");
    let data_start = inferloop_gguf::Gguf::open(&src)
        .expect("gguf")
        .data_offset() as usize;
    let key = b"tokenizer.chat_template";
    let mut header = bytes[..data_start].to_vec();
    // Key, then the value's type (u32 8: string), then the string's u64 length and bytes.
    let at = header
        .windows(key.len())
        .position(|w| w == key)
        .expect("a chat template in the test model")
        + key.len()
        + 4;
    let len = u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes")) as usize;
    assert!(
        template.len() <= len,
        "the copy's template must not be longer"
    );
    let mut value = (template.len() as u64).to_le_bytes().to_vec();
    value.extend_from_slice(template.as_bytes());
    header.splice(at..at + 8 + len, value);
    header.resize(data_start, 0);
    let path = dir.join("template.gguf");
    let mut out = header;
    out.extend_from_slice(&bytes[data_start..]);
    std::fs::write(&path, out).expect("write model copy");
    path
}

/// The chat template comes with the weights, from anywhere. One that loops for hours
/// (two nested loops, each within minijinja's range limit) used to hang the model load:
/// now its check render runs out of fuel, the box falls back to llama.cpp's matcher and
/// serves. One that loops only on some conversations refuses those requests with a 400 and
/// keeps serving the rest.
#[tokio::test]
async fn a_hostile_template_in_the_gguf_is_refused_and_the_box_keeps_serving() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let always = model_with_template(
        dir.path(),
        &format!("{spin}{{% for m in messages %}}<|im_start|>{{{{ m.content }}}}<|im_end|>{{% endfor %}}"),
    );
    let d = Daemon::start(&["--model", always.to_str().expect("utf-8 path")]);
    let v = d.chat(&chat_body("Hi", 1)).await;
    assert!(v["usage"]["prompt_tokens"].as_u64() > Some(0), "{v}");
    let status = d.status().await;
    assert_eq!(
        status["model"]["chat_template"], "llama.cpp builtin",
        "{status}"
    );
    assert!(d.log().contains("step limit"), "{}", d.log_tail());
    drop(d);

    let sometimes = model_with_template(
        dir.path(),
        &format!(
            "{{% if messages | length > 2 %}}{spin}{{% endif %}}{{% for m in messages %}}\
             <|im_start|>{{{{ m.role }}}}\n{{{{ m.content }}}}<|im_end|>\n{{% endfor %}}\
             <|im_start|>assistant\n"
        ),
    );
    let d = Daemon::start(&["--model", sometimes.to_str().expect("utf-8 path")]);
    assert_eq!(d.status().await["model"]["chat_template"], "jinja");
    // Contents reach a template as sentinels; the message count is what it can loop on.
    let three = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ], "max_tokens": 1});
    let resp = d.post("/v1/chat/completions", &three).await;
    let err = assert_error(resp, 400, Some("messages"), None).await;
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(msg.contains("step limit"), "{msg}");
    let v = d.chat(&chat_body("Hi", 1)).await;
    assert!(v["usage"]["prompt_tokens"].as_u64() > Some(0), "{v}");
}
