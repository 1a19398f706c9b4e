//! Why an input could not become a prompt: one error for the whole chat path (bounds,
//! template, tokenization), so the HTTP layer maps it once.

/// Why an input could not become a prompt.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PromptError {
    #[error("message {index}: content contains a NUL byte")]
    NulByte { index: usize },
    #[error("the model's chat template could not render these messages: {0}")]
    Template(String),
    /// The template's own `raise_exception(message)`.
    #[error("the model's chat template refuses these messages: {0}")]
    Refused(String),
    #[error(
        "has {count} messages; a context of {ctx} tokens holds at most {max} (each message \
         costs at least {per_message} tokens in this model's chat template)"
    )]
    TooManyMessages {
        count: usize,
        max: usize,
        ctx: u32,
        per_message: usize,
    },
    #[error(
        "holds {bytes} bytes of text; a context of {ctx} tokens holds at most {max} bytes \
         (no token of this model covers more than {per_token} bytes)"
    )]
    TooManyBytes {
        bytes: usize,
        max: usize,
        ctx: u32,
        per_token: usize,
    },
    #[error(
        "tokenizes to more than {limit} tokens; a context of {ctx} tokens leaves at most \
         {limit} for the prompt"
    )]
    TooManyTokens { limit: usize, ctx: u32 },
    #[error("the client left while the prompt was being prepared")]
    Cancelled,
}

impl PromptError {
    /// Errors that say the prompt cannot fit the context, whatever the model would make of it.
    pub fn is_too_long(&self) -> bool {
        matches!(
            self,
            Self::TooManyMessages { .. } | Self::TooManyBytes { .. } | Self::TooManyTokens { .. }
        )
    }
}
