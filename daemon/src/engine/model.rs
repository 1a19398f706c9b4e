//! The loaded GGUF model: weights mapped once, shared by the decode thread and the request
//! handlers (which render chat templates and tokenize off the decode thread).

use std::path::{Path, PathBuf};

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use serde::Serialize;

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

/// Why a chat could not be turned into a prompt.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("message {index}: content contains a NUL byte")]
    NulByte { index: usize },
    #[error("the model's chat template could not render these messages (code {0})")]
    Template(String),
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
    template: Option<LlamaChatTemplate>,
    info: ModelInfo,
    backend: LlamaBackend,
}

impl LoadedModel {
    /// Loads the weights (memory-mapped, CPU). Fails with the path and reason.
    pub fn load(path: &Path, id: String) -> Result<Self, EngineError> {
        let fail = |reason: String| EngineError::ModelLoad {
            path: path.display().to_string(),
            reason,
        };
        if !path.is_file() {
            return Err(fail("no such file".into()));
        }
        let backend = LlamaBackend::init().map_err(|e| fail(e.to_string()))?;
        let params = LlamaModelParams::default();
        let model = LlamaModel::load_from_file(&backend, path, &params).map_err(|e| {
            fail(format!(
                "llama.cpp could not load it ({e}); is it a GGUF file?"
            ))
        })?;
        let template = model.chat_template(None).ok();
        let created = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let info = ModelInfo {
            id,
            path: path.to_path_buf(),
            size_bytes: model.size(),
            n_params: model.n_params(),
            n_layer: model.n_layer(),
            n_embd: model.n_embd(),
            n_vocab: model.n_vocab(),
            n_ctx_train: model.n_ctx_train(),
            has_chat_template: template.is_some(),
            created,
        };
        Ok(Self {
            model,
            template,
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

    /// Renders messages with the model's own template (llama.cpp's built-in matcher), ending
    /// with the assistant's turn opened. Models without a template fall back to ChatML.
    ///
    /// No system prompt is injected when the client sends none: what the model sees is what
    /// the client sent, and short prompts keep TTFT low.
    pub fn render_chat(&self, turns: &[ChatTurn]) -> Result<String, PromptError> {
        let messages = turns
            .iter()
            .enumerate()
            .map(|(index, t)| {
                LlamaChatMessage::new(t.role.clone(), t.content.clone())
                    .map_err(|_| PromptError::NulByte { index })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let chatml;
        let template = match &self.template {
            Some(t) => t,
            None => {
                chatml = LlamaChatTemplate::new("chatml")
                    .map_err(|e| PromptError::Template(e.to_string()))?;
                &chatml
            }
        };
        self.model
            .apply_chat_template(template, &messages, true)
            .map_err(|e| PromptError::Template(e.to_string()))
    }

    /// Tokenizes a prompt, adding BOS if the vocabulary wants it and parsing special tokens
    /// (the rendered template contains them).
    pub fn tokenize(&self, text: &str) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), true, true)
            .into_iter()
            .map(|t| t.0)
            .collect()
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
