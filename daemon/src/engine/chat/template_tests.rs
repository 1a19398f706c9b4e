//! Unit tests of the chat templates' Python compatibility: `strftime_now`, `tojson`,
//! `raise_exception`, Python's methods, and templates minijinja cannot parse.

use minijinja::value::{Serde, Value};

use super::error::PromptError;
use super::strftime::strftime;
use super::template::JinjaTemplate;
use super::turn::ChatTurn;

fn turn(role: &str, content: &str) -> ChatTurn {
    ChatTurn {
        role: role.into(),
        content: content.into(),
        ..ChatTurn::default()
    }
}

#[test]
fn strftime_formats_utc_dates() {
    // 2024-07-26 13:25:09 UTC, a Friday.
    let t = 1_722_000_309;
    assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
    assert_eq!(
        strftime("%Y-%m-%d %H:%M:%S %A %j %%", t),
        "2024-07-26 13:25:09 Friday 208 %"
    );
    assert_eq!(strftime("%B %e, %y", 0), "January  1, 70");
}

#[test]
fn tojson_writes_what_python_json_dumps_writes() {
    let t = JinjaTemplate::compile(
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ [] | tojson }}",
        "",
        "",
    )
    .expect("compiles");
    let env = t.env();
    let out = env
        .render_str(
            "{{ x | tojson }}",
            minijinja::context! { x => Value::from(Serde(serde_json::json!({"b": [1, 2.5, "é<\n"], "a": null, "c": true}))) },
        )
        .expect("renders");
    // Keys in insertion order, as Python's dicts keep them (serde_json's `preserve_order`,
    // which llguidance turns on); the separators are Python's.
    assert_eq!(out, r#"{"b": [1, 2.5, "é<\n"], "a": null, "c": true}"#);
    let out = env
        .render_str(
            "{{ x | tojson(indent=2) }}",
            minijinja::context! { x => Value::from(Serde(serde_json::json!({"a": [1, {}]}))) },
        )
        .expect("renders");
    assert_eq!(out, "{\n  \"a\": [\n    1,\n    {}\n  ]\n}");
}

#[test]
fn raise_exception_refuses_with_the_templates_message() {
    let t = JinjaTemplate::compile(
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
        "<s>",
        "</s>",
    )
    .expect("compiles");
    assert_eq!(t.render(&[turn("user", "hi")], None, true), Ok("ok".into()));
    assert_eq!(
        t.render(&[turn("system", "x")], None, true),
        Err(PromptError::Refused("System role not supported".into()))
    );
}

#[test]
fn python_methods_and_globals_are_there() {
    let t = JinjaTemplate::compile(
        "{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.split(',')[1] }}|{% for k, v in m.items() %}{{ k }}{% endfor %}{% endfor %}{{ tools is none }}{{ eos_token if not add_generation_prompt }}",
        "<s>",
        "</s>",
    )
    .expect("compiles");
    assert_eq!(
        t.render(&[turn("user", " a,b ")], None, false),
        Ok("<s>A,B|b |rolecontentTrue</s>".into())
    );
}

#[test]
fn a_template_minijinja_cannot_parse_is_an_error() {
    assert!(JinjaTemplate::compile("{% for %}", "", "").is_err());
}

/// Two nested loops, each within minijinja's range limit: without fuel this renders for
/// hours (it hung the model load); with it, the render stops with a clear error.
#[test]
fn a_template_that_loops_too_long_runs_out_of_fuel() {
    let t = JinjaTemplate::compile(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
        "",
        "",
    )
    .expect("compiles");
    match t.render(&[turn("user", "x")], None, true) {
        Err(PromptError::Template(m)) => assert!(m.contains("step limit"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A template that writes one large string over and over is stopped by the render's byte
/// limit long before it fills memory.
#[test]
fn a_template_that_writes_gigabytes_is_cut_at_the_render_limit() {
    let t = JinjaTemplate::compile(
        "{% set s = 'x' * 1000000 %}{% for i in range(5000) %}{{ s }}{% endfor %}",
        "",
        "",
    )
    .expect("compiles");
    match t.render(&[turn("user", "x")], None, true) {
        Err(PromptError::Template(m)) => assert!(m.contains("render limit"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// The fuel leaves real templates ample room: every fixture renders a chat of several
/// hundred long messages with tools, far more than a context holds.
#[test]
fn real_templates_render_long_chats_well_within_the_fuel() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates");
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let long = "word ".repeat(200);
    // Alternating user and assistant turns (some templates insist), a system turn first.
    let mut turns = vec![turn("system", "Be brief.")];
    for i in 0..400 {
        turns.push(turn(if i % 2 == 0 { "user" } else { "assistant" }, &long));
    }
    turns.push(turn("user", "Last question?"));
    for entry in std::fs::read_dir(dir).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("jinja") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("template");
        let t = JinjaTemplate::compile(&source, "<s>", "</s>").expect("compiles");
        // Some fixtures refuse a system turn or tools by their own rules; the fuel must
        // never be what stops them.
        let with_tools = t.render(&turns, Some(&tools), true);
        let plain = t.render(&turns[1..], None, true);
        for r in [with_tools, plain] {
            if let Err(PromptError::Template(m)) = &r {
                assert!(
                    !m.contains("step limit") && !m.contains("render limit"),
                    "{}: {m}",
                    path.display()
                );
            }
        }
    }
}
