//! Chat templates: the model's own Jinja template rendered with minijinja as Hugging Face
//! `transformers` renders it (`trim_blocks`, `lstrip_blocks`, Python's string and list
//! methods, `raise_exception`, `strftime_now`, a `tojson` that writes what Python's
//! `json.dumps` writes), or llama.cpp's built-in matcher for a template minijinja cannot
//! compile or render.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

use super::error::PromptError;
use super::strftime::strftime;
use super::template_json::tojson;
use super::turn::ChatTurn;

/// The template's name in its environment.
const NAME: &str = "chat";

/// The steps (and, at about 64 bytes a unit, the memory) one render may use: minijinja's
/// fuel. The template comes with the weights, from anywhere: two nested loops within
/// minijinja's range limit would otherwise render for hours (2M steps take well under a
/// second). The fixtures' real templates need under a tenth of it for 400 long messages with
/// tools (`real_templates_render_long_chats_well_within_the_fuel`).
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// The most bytes one render may write: far beyond any prompt a context holds, far short
/// of what a looping template could write into memory.
pub const MAX_RENDER_BYTES: usize = 64 << 20;

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

/// A render's output, refused past [`MAX_RENDER_BYTES`].
#[derive(Default)]
struct Capped {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDER_BYTES {
            self.over = true;
            return Err(std::io::Error::other("render limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

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
        env.set_fuel(Some(TEMPLATE_FUEL));
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

    /// The environment the template renders in: for tests of its filters.
    #[cfg(test)]
    pub(super) fn env(&self) -> &Environment<'static> {
        &self.env
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
        let mut out = Capped::default();
        let rendered = template.render_captured_to(ctx, &mut out);
        if out.over {
            return Err(PromptError::Template(format!(
                "it wrote more than {MAX_RENDER_BYTES} bytes (the render limit)"
            )));
        }
        rendered.map_err(|e| {
            if e.kind() == ErrorKind::OutOfFuel {
                return PromptError::Template(format!(
                    "it ran past its step limit ({TEMPLATE_FUEL} steps): a template that \
                     loops this long is refused"
                ));
            }
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = source {
                if let Some(raised) = s.downcast_ref::<Raised>() {
                    return PromptError::Refused(raised.0.clone());
                }
                source = s.source();
            }
            PromptError::Template(format!("{e:#}"))
        })?;
        String::from_utf8(out.bytes)
            .map_err(|_| PromptError::Template("it wrote text that is not UTF-8".into()))
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
