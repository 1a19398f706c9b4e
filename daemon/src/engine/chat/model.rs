//! The loaded GGUF model: weights mapped once, shared by the decode thread and the request
//! handlers (which render chat templates and tokenize off the decode thread).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use serde::Serialize;

use super::bounds::{Limit, PromptBounds};
use super::constraint::{Compiler, Constraint, Grammar};
use super::error::PromptError;
use super::prompt;
use super::template::{ChatTemplate, JinjaTemplate};
use super::tokens::{Prompt, Vocabulary};
use super::turn::ChatTurn;
use crate::engine::types::EngineError;
use crate::tools::{Format, ToolUse};

/// Facts about the model that the API and status routes report.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub id: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub n_params: u64,
    pub n_layer: u32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_ctx_train: u32,
    pub has_chat_template: bool,
    /// The form tool calls are parsed from (and forced in): `hermes`, `llama3`, `mistral`.
    pub tool_call_format: Format,
    /// How chats are rendered: `jinja` (the template itself, with minijinja) or
    /// `llama.cpp builtin` (llama.cpp's matcher, for a template minijinja cannot render).
    pub chat_template: &'static str,
    /// The `--chat-template` file that replaced the model's own template, if any.
    pub chat_template_file: Option<PathBuf>,
    /// File modification time, used as the model's `created` timestamp.
    pub created: u64,
    /// `<arch>.pooling_type` from the GGUF (llama.cpp's enum), absent for a chat model.
    pub pooling_type: Option<u32>,
}

/// `<arch>.pooling_type` as the GGUF stores it, when it does.
fn pooling_type(model: &LlamaModel) -> Option<u32> {
    let arch = model.meta_val_str("general.architecture").ok()?;
    model
        .meta_val_str(&format!("{arch}.pooling_type"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What llama.cpp was compiled with, e.g. `CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | …`. The
/// CPU features are compile-time facts of ggml: they show whether a build got the
/// instruction set it should have (see `.cargo/config.toml`).
pub fn llama_system_info() -> &'static str {
    // Read once: llama.cpp rewrites one static buffer on every call, so concurrent calls from
    // status requests would race.
    static INFO: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        // SAFETY: takes no arguments and returns a pointer to a static NUL-terminated buffer,
        // copied out at once; the OnceLock makes this the only call. Backend registration is
        // static, so no prior initialisation is needed.
        let raw = unsafe { std::ffi::CStr::from_ptr(llama_cpp_sys_2::llama_print_system_info()) };
        raw.to_string_lossy().trim().to_string()
    })
}

/// The model plus the llama.cpp backend it was loaded with.
pub struct LoadedModel {
    // llama.cpp's backend outlives every model: it is the process's (see `llama_backend`).
    model: LlamaModel,
    /// The model's own template (or `--chat-template`'s), or ChatML for a model without one.
    template: ChatTemplate,
    bounds: PromptBounds,
    vocab: Vocabulary,
    info: ModelInfo,
    /// llguidance's view of the vocabulary, built on the first constrained request.
    grammars: Compiler,
    /// How the template's family writes tool calls.
    tool_format: Format,
    /// That form's marker tokens, which output pieces spell out for the parser.
    markers: Vec<i32>,
    backend: &'static LlamaBackend,
}

impl LoadedModel {
    /// Loads the weights (memory-mapped, CPU). Fails with the path and reason.
    pub fn load(path: &Path, id: String) -> Result<Self, EngineError> {
        Self::load_with(path, id, None, false)
    }

    /// Loads the model with the chat template of `chat_template` (a Jinja file) instead of
    /// its own; `vocab_only` loads the vocabulary, template and hyperparameters only, for a
    /// backend that reads the weights itself, so that they are not mapped twice.
    pub fn load_with(
        path: &Path,
        id: String,
        chat_template: Option<&Path>,
        vocab_only: bool,
    ) -> Result<Self, EngineError> {
        let fail = |reason: String| EngineError::ModelLoad {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_file() {
            return Err(fail("no such file".into()));
        }
        let backend = llama_backend().map_err(fail)?;
        let params = LlamaModelParams::default().with_vocab_only(vocab_only);
        let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
            fail(format!(
                "llama.cpp could not load it ({e}); is it a GGUF file?"
            ))
        })?;
        let file_text = match chat_template {
            Some(file) => {
                Some(
                    std::fs::read_to_string(file).map_err(|e| EngineError::ModelLoad {
                        path: file.display().to_string(),
                        reason: format!("cannot read the chat template file: {e}"),
                    })?,
                )
            }
            None => None,
        };
        let own_text = match file_text {
            Some(text) => Some(text),
            None => model
                .chat_template(None)
                .ok()
                .and_then(|t| t.to_string().ok()),
        };
        let has_chat_template = own_text.is_some();
        let tool_format = own_text.as_deref().map_or(Format::Hermes, Format::detect);
        let markers = marker_tokens(&model, tool_format);
        tracing::info!(form = tool_format.name(), ?markers, "tool calls");
        let origin = match chat_template {
            Some(file) => file.display().to_string(),
            None => "the GGUF".to_string(),
        };
        let template = match own_text {
            Some(text) => choose_template(&model, &text, &origin).map_err(fail)?,
            None => {
                tracing::info!("the model has no chat template: using llama.cpp's ChatML");
                ChatTemplate::Builtin(
                    LlamaChatTemplate::new("chatml").map_err(|e| fail(e.to_string()))?,
                )
            }
        };
        let bounds = PromptBounds::measure(&model, &template);
        let vocab = Vocabulary::of(&model);
        tracing::debug!(?bounds, "prompt bounds measured");
        let created = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let mut info = ModelInfo {
            id,
            path: path.to_path_buf(),
            size_bytes: model.size(),
            n_params: model.n_params(),
            n_layer: model.n_layer(),
            n_embd: model.n_embd(),
            n_vocab: model.n_vocab(),
            n_ctx_train: model.n_ctx_train(),
            has_chat_template,
            tool_call_format: tool_format,
            chat_template: template.kind(),
            chat_template_file: chat_template.map(Path::to_path_buf),
            created,
            pooling_type: pooling_type(&model),
        };
        if vocab_only {
            // llama.cpp leaves the layer hyperparameters unread without the weights.
            let shape = inferloop_gguf::read_shape(path).map_err(|e| fail(e.to_string()))?;
            info.n_layer = u32::try_from(shape.n_layer).unwrap_or(u32::MAX);
            info.n_embd = i32::try_from(shape.n_embd).unwrap_or(i32::MAX);
            info.n_ctx_train = u32::try_from(shape.n_ctx_train).unwrap_or(u32::MAX);
        }
        Ok(Self {
            model,
            template,
            bounds,
            vocab,
            info,
            grammars: Compiler::default(),
            tool_format,
            markers,
            backend,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub(crate) fn llama(&self) -> &LlamaModel {
        &self.model
    }

    pub(crate) fn backend(&self) -> &LlamaBackend {
        self.backend
    }

    /// What bounds the input that can fit a context, measured at load.
    pub fn prompt_bounds(&self) -> PromptBounds {
        self.bounds
    }

    /// Renders messages with the model's own template (its Jinja source, or llama.cpp's
    /// built-in matcher for one minijinja cannot render; ChatML for a model without one),
    /// ending with the assistant's turn opened, and tokenizes it with message text kept
    /// plain (see [`prompt`](super::prompt)).
    ///
    /// Whatever the template adds is kept, e.g. a default system prompt when the client sends
    /// none: the model sees what it was trained to see, as with `transformers` and
    /// `llama-server --jinja`.
    pub fn chat_prompt(
        &self,
        turns: &[ChatTurn],
        tools: Option<&ToolUse>,
        limit: Limit,
        gone: &AtomicBool,
    ) -> Result<Prompt, PromptError> {
        prompt::chat(
            &self.model,
            &self.template,
            &self.vocab,
            turns,
            (tools, self.tool_format),
            limit,
            gone,
        )
    }

    /// How the template's family writes tool calls.
    pub fn tool_format(&self) -> Format {
        self.tool_format
    }

    /// A token's output bytes: control tokens are left out, except the tool-call form's
    /// markers, which the parser needs to see.
    pub fn output_piece(&self, token: i32) -> Vec<u8> {
        let special = self.markers.contains(&token);
        self.model
            .vocab()
            .token_to_piece(llama_cpp_2::token::LlamaToken(token), special, None)
    }

    /// Compiles a grammar against this model's vocabulary (see [`constraint`](super::constraint));
    /// the error names what llguidance cannot compile.
    pub fn compile_grammar(&self, grammar: &Grammar) -> Result<Constraint, String> {
        self.grammars.compile(&self.model, grammar)
    }

    /// Tokenizes a raw prompt (BOS added if the vocabulary wants it). Text that looks like a
    /// special token stays text unless `parse_special`.
    pub fn text_prompt(
        &self,
        text: &str,
        parse_special: bool,
        limit: Limit,
        gone: &AtomicBool,
    ) -> Result<Prompt, PromptError> {
        prompt::text(&self.model, &self.vocab, text, parse_special, limit, gone)
    }

    /// llama.cpp's tokenization of a whole string in one call, specials parsed: what the
    /// piecewise assembly in [`prompt`](super::prompt) must equal for ordinary text.
    pub fn tokenize_whole(&self, text: &str) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), true, true)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// llama.cpp's tokenization of `text` as `/tokenize` asks for it.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), add_special, parse_special)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// A token's bytes with control tokens spelled out (`<|im_end|>`), as `/detokenize`
    /// and `logprobs` show them. The id must be in the vocabulary.
    pub fn token_bytes(&self, token: i32) -> Vec<u8> {
        self.model
            .vocab()
            .token_to_piece(llama_cpp_2::token::LlamaToken(token), true, None)
    }

    /// Whether a token is a control token (a template marker such as `<|im_start|>`).
    pub fn is_control(&self, token: i32) -> bool {
        self.model
            .vocab()
            .is_control(llama_cpp_2::token::LlamaToken(token))
    }

    /// The text of a token sequence, for echoing prompts back.
    pub fn detokenize(&self, tokens: &[i32]) -> String {
        let vocab = self.model.vocab();
        let mut bytes = Vec::new();
        for t in tokens {
            vocab.token_to_piece_into(llama_cpp_2::token::LlamaToken(*t), &mut bytes, false, None);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// llama.cpp's backend, initialised on first use and kept for the process: llama-cpp-2
/// allows one at a time, and a process may load more than one model (`golden`, tests, a
/// vocabulary-only model beside the native backend's weights).
pub(crate) fn llama_backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: std::sync::OnceLock<Result<LlamaBackend, String>> = std::sync::OnceLock::new();
    BACKEND
        .get_or_init(|| LlamaBackend::init().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The control tokens that stand for `format`'s markers in this vocabulary (none where a
/// marker is not a single control token: it is then plain text and needs no spelling).
fn marker_tokens(model: &LlamaModel, format: Format) -> Vec<i32> {
    let vocab = model.vocab();
    format
        .markers()
        .iter()
        .filter_map(|m| match vocab.tokenize(m.as_bytes(), false, true)[..] {
            [t] if vocab.is_control(t) => Some(t.0),
            _ => None,
        })
        .collect()
}

/// The model's template as Jinja when minijinja compiles it and renders a one-message chat
/// with it; otherwise llama.cpp's built-in matcher on the same text. The log says which.
fn choose_template(model: &LlamaModel, text: &str, origin: &str) -> Result<ChatTemplate, String> {
    let vocab = model.vocab();
    let special = |t: LlamaToken| {
        (0..vocab.n_tokens())
            .contains(&t.0)
            .then(|| vocab.text(t).and_then(|c| c.to_str().ok()))
            .flatten()
            .unwrap_or_default()
            .to_string()
    };
    let (bos, eos) = (special(vocab.bos()), special(vocab.eos()));
    let probe = [ChatTurn {
        role: "user".into(),
        content: "x".into(),
        ..Default::default()
    }];
    let jinja =
        JinjaTemplate::compile(text, &bos, &eos).and_then(|t| match t.render(&probe, None, true) {
            Ok(_) => Ok(t),
            Err(e) => Err(e.to_string()),
        });
    match jinja {
        Ok(t) => {
            tracing::info!(source = origin, "chat template: jinja (minijinja)");
            Ok(ChatTemplate::Jinja(Box::new(t)))
        }
        Err(reason) => {
            tracing::warn!(
                source = origin,
                %reason,
                "chat template: minijinja cannot render it; using llama.cpp's built-in matcher"
            );
            let builtin = LlamaChatTemplate::new(text).map_err(|e| e.to_string())?;
            Ok(ChatTemplate::Builtin(builtin))
        }
    }
}
