//! Chat templates: the model's own Jinja template rendered with minijinja as Hugging Face
//! `transformers` renders it (`trim_blocks`, `lstrip_blocks`, Python's string and list
//! methods, `raise_exception`, `strftime_now`, a `tojson` that writes what Python's
//! `json.dumps` writes), or llama.cpp's built-in matcher for a template minijinja cannot
//! compile or render.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use super::model::ChatTurn;
use super::prompt::PromptError;

/// The template's name in its environment.
const NAME: &str = "chat";

/// Where the template text came from: the GGUF's `tokenizer.chat_template` or a file
/// (`--chat-template`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    Gguf,
    File(PathBuf),
    /// The model has no template and no file was given: llama.cpp's ChatML.
    None,
}

/// How chat messages become prompt text.
pub enum ChatTemplate {
    /// Boxed: an environment is large, and there is one template per model.
    Jinja(Box<JinjaTemplate>),
    Builtin(LlamaChatTemplate),
}

impl ChatTemplate {
    /// `jinja` or `llama.cpp builtin`, as the log and `/v1/status` name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Jinja(_) => "jinja",
            Self::Builtin(_) => "llama.cpp builtin",
        }
    }

    /// Whether the template renders a `tools` list itself (a Jinja template that reads
    /// `tools`); otherwise tools are described in a system turn (see [`crate::tools`]).
    pub fn knows_tools(&self) -> bool {
        match self {
            Self::Jinja(t) => t.knows_tools,
            Self::Builtin(_) => false,
        }
    }

    /// Renders `turns` (contents already replaced by sentinels where wanted); `tools` reach
    /// a template that [`knows_tools`](Self::knows_tools).
    pub fn render(
        &self,
        model: &LlamaModel,
        turns: &[ChatTurn],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, PromptError> {
        match self {
            Self::Jinja(t) => {
                let text = t.render(turns, tools, add_generation_prompt)?;
                Ok(t.strip_added_specials(model, text))
            }
            Self::Builtin(t) => {
                let messages = turns
                    .iter()
                    .enumerate()
                    .map(|(index, t)| {
                        LlamaChatMessage::new(t.role.clone(), t.content.clone())
                            .map_err(|_| PromptError::NulByte { index })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                model
                    .apply_chat_template(t, &messages, add_generation_prompt)
                    .map_err(|e| PromptError::Template(e.to_string()))
            }
        }
    }
}

/// A raised `raise_exception(message)`: the template refuses the conversation.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A compiled Jinja chat template and the special-token texts it is rendered with.
pub struct JinjaTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    knows_tools: bool,
}

impl JinjaTemplate {
    /// Compiles `source`. The error is minijinja's, with the line it points at.
    pub fn compile(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, "raise_exception")
                    .with_source(Raised(message)))
            },
        );
        env.add_function("strftime_now", |format: String| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            strftime(&format, now)
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| format!("{e:#}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            knows_tools: source.contains("tools"),
        })
    }

    /// Makes `strftime_now` read a fixed clock (UNIX seconds): for tests.
    pub fn with_fixed_time(mut self, unix: i64) -> Self {
        self.env
            .add_function("strftime_now", move |format: String| {
                strftime(&format, unix)
            });
        self
    }

    /// Renders a conversation with `messages`, `tools` (none unless given), `documents`
    /// (none), `add_generation_prompt`, `bos_token` and `eos_token`, as `transformers` does.
    pub fn render(
        &self,
        turns: &[ChatTurn],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, PromptError> {
        let messages: Vec<Value> = turns
            .iter()
            .map(|t| match &t.tool_call_id {
                Some(id) => minijinja::context! {
                    role => &t.role, content => &t.content, tool_call_id => id
                },
                None => minijinja::context! { role => &t.role, content => &t.content },
            })
            .collect();
        let tools = tools.map(|t| Value::from(minijinja::value::Serde(t)));
        let ctx = minijinja::context! {
            messages => messages,
            tools => tools,
            documents => (),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| PromptError::Template(e.to_string()))?;
        template.render(ctx).map_err(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = source {
                if let Some(raised) = s.downcast_ref::<Raised>() {
                    return PromptError::Refused(raised.0.clone());
                }
                source = s.source();
            }
            PromptError::Template(format!("{e:#}"))
        })
    }

    /// Drops a BOS the template wrote when the tokenizer adds one anyway (and an EOS at the
    /// end likewise), as llama.cpp does: the prompt must not start with two BOS tokens.
    fn strip_added_specials(&self, model: &LlamaModel, mut text: String) -> String {
        let vocab = model.vocab();
        if vocab.should_add_bos() && !self.bos_token.is_empty() && text.starts_with(&self.bos_token)
        {
            text.drain(..self.bos_token.len());
        }
        if vocab.should_add_eos() && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        text
    }
}

/// `tojson` as `transformers` defines it: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`, not HTML-escaped.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        // Python's defaults: no space before a newline when indenting.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from(out))
}

struct JsonStyle {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if !v.to_string().contains(['.', 'e', 'E']) => out.push_str(&i.to_string()),
                _ => out.push_str(&python_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
            },
            ValueKind::String => quote(v.as_str().unwrap_or_default(), out),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                let items = keys
                    .into_iter()
                    .map(|k| {
                        let item = v.get_item(&k)?;
                        Ok((k, item))
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                self.container(('{', '}'), items.len(), depth, out, |i, out| {
                    let (k, item) = &items[i];
                    match k.as_str() {
                        Some(s) => quote(s, out),
                        None => quote(&k.to_string(), out),
                    }
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out)
                })?;
            }
            _ => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(('[', ']'), items.len(), depth, out, |i, out| {
                    self.write(&items[i], depth + 1, out)
                })?;
            }
        }
        Ok(())
    }

    fn container(
        &self,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        out: &mut String,
        mut each: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(n) = self.indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * level));
            }
        };
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            newline(out, depth + 1);
            each(i, out)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn quote(s: &str, out: &mut String) {
    out.push('"');
    json_escape(&super::prompt::mark_json_sentinels(s), out);
    out.push('"');
}

/// `s` escaped as inside a JSON string, as Python's `json.dumps(ensure_ascii=False)` does.
pub(crate) fn json_escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
}

/// A float as Python's `repr` writes it for ordinary values (`1.0`, `0.5`, `1e+20`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f.fract() == 0.0 && f.abs() < 1e16 {
        return format!("{f:.1}");
    }
    let s = format!("{f}");
    if f.abs() >= 1e16 {
        let e = format!("{f:e}");
        return match e.split_once('e') {
            Some((m, x)) if !x.starts_with('-') => format!("{m}e+{x:0>2}"),
            _ => e,
        };
    }
    s
}

/// `strftime` for UTC with the directives chat templates use; others are kept as written.
fn strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[weekday];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", (h + 11) % 12 + 1)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;

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
        let env = &t.env;
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
}
