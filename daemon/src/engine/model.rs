//! The loaded GGUF model: weights mapped once, shared by the decode thread and the request
//! handlers (which render chat templates and tokenize off the decode thread).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use serde::Serialize;

use super::prompt::{self, Limit, Prompt, PromptBounds, PromptError, Vocabulary};
use super::EngineError;

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
    /// File modification time, used as the model's `created` timestamp.
    pub created: u64,
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

/// A chat message after validation: role and plain text content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// The model plus the llama.cpp backend it was loaded with.
pub struct LoadedModel {
    // Field order matters: the model must be freed before the backend.
    model: LlamaModel,
    /// The model's own template, or ChatML for a model without one.
    template: LlamaChatTemplate,
    bounds: PromptBounds,
    vocab: Vocabulary,
    info: ModelInfo,
    backend: LlamaBackend,
}

impl LoadedModel {
    /// Loads the weights (memory-mapped, CPU). Fails with the path and reason.
    pub fn load(path: &Path, id: String) -> Result<Self, EngineError> {
        Self::load_with(path, id, false)
    }

    /// Loads the vocabulary, chat template and hyperparameters only: for a backend that
    /// reads the weights itself, so that they are not mapped twice.
    pub fn load_vocab_only(path: &Path, id: String) -> Result<Self, EngineError> {
        Self::load_with(path, id, true)
    }

    fn load_with(path: &Path, id: String, vocab_only: bool) -> Result<Self, EngineError> {
        let fail = |reason: String| EngineError::ModelLoad {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_file() {
            return Err(fail("no such file".into()));
        }
        let backend = LlamaBackend::init().map_err(|e| fail(e.to_string()))?;
        let params = LlamaModelParams::default().with_vocab_only(vocab_only);
        let model = LlamaModel::load_from_file(&backend, path, &params).map_err(|e| {
            fail(format!(
                "llama.cpp could not load it ({e}); is it a GGUF file?"
            ))
        })?;
        let own_template = model.chat_template(None).ok();
        let has_chat_template = own_template.is_some();
        let template = match own_template {
            Some(t) => t,
            None => LlamaChatTemplate::new("chatml").map_err(|e| fail(e.to_string()))?,
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
            created,
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
        &self.backend
    }

    /// What bounds the input that can fit a context, measured at load.
    pub fn prompt_bounds(&self) -> PromptBounds {
        self.bounds
    }

    /// Renders messages with the model's own template (llama.cpp's built-in matcher; ChatML
    /// for a model without one), ending with the assistant's turn opened, and tokenizes it
    /// with message text kept plain (see [`prompt`](super::prompt)).
    ///
    /// No system prompt is injected when the client sends none: what the model sees is what
    /// the client sent, and short prompts keep TTFT low.
    pub fn chat_prompt(
        &self,
        turns: &[ChatTurn],
        limit: Limit,
        gone: &AtomicBool,
    ) -> Result<Prompt, PromptError> {
        prompt::chat(&self.model, &self.template, &self.vocab, turns, limit, gone)
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
