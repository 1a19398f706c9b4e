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
