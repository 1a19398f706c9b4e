//! How much input can fit a context: the bounds measured once at load (checked before any
//! templating or tokenization) and the token limit one request's prompt must stay under.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::error::PromptError;
use super::template::ChatTemplate;
use super::turn::ChatTurn;

/// Facts about the vocabulary and template that bound how much input can fit a context.
/// Measured once at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptBounds {
    /// The fewest tokens one more message adds to a rendered chat (at least 1).
    pub min_tokens_per_message: usize,
    /// The most bytes of text any one token stands for: `bytes / this` is a lower bound on
    /// the tokens a text needs.
    pub max_bytes_per_token: usize,
}

impl PromptBounds {
    /// Measures the bounds of a loaded model and its template.
    pub fn measure(model: &LlamaModel, template: &ChatTemplate) -> Self {
        let vocab = model.vocab();
        let max_bytes_per_token = (0..vocab.n_tokens())
            .map(|t| vocab.token_to_piece(LlamaToken(t), false, None).len())
            .max()
            .unwrap_or(1)
            .max(1);
        // One more message of each role after a fixed first one: the template's cost of a
        // message with empty content. Roles a template cannot render are skipped.
        let count = |turns: &[(&str, &str)]| -> Option<usize> {
            let turns: Vec<ChatTurn> = turns
                .iter()
                .map(|(r, c)| ChatTurn {
                    role: (*r).into(),
                    content: (*c).into(),
                    ..ChatTurn::default()
                })
                .collect();
            let text = template.render(model, &turns, None, true).ok()?;
            Some(vocab.tokenize(text.as_bytes(), true, true).len())
        };
        let base = count(&[("user", "x")]);
        let min_tokens_per_message = ["system", "user", "assistant"]
            .iter()
            .filter_map(|role| Some(count(&[("user", "x"), (role, "")])?.saturating_sub(base?)))
            .min()
            .unwrap_or(1)
            .max(1);
        Self {
            min_tokens_per_message,
            max_bytes_per_token,
        }
    }

    /// Most messages a chat may have to fit `ctx` tokens.
    pub fn max_messages(&self, ctx: u32) -> usize {
        ctx as usize / self.min_tokens_per_message
    }

    /// Most bytes of text (all contents together) that can fit `ctx` tokens.
    pub fn max_bytes(&self, ctx: u32) -> usize {
        (ctx as usize).saturating_mul(self.max_bytes_per_token)
    }

    /// Refuses, before any templating or tokenization, a chat that cannot fit `ctx` tokens.
    pub fn check_chat(&self, turns: &[ChatTurn], ctx: u32) -> Result<(), PromptError> {
        let max = self.max_messages(ctx);
        if turns.len() > max {
            return Err(PromptError::TooManyMessages {
                count: turns.len(),
                max,
                ctx,
                per_message: self.min_tokens_per_message,
            });
        }
        self.check_bytes(turns.iter().map(|t| t.content.len()).sum(), ctx)
    }

    /// Refuses, before tokenization, a text of `bytes` bytes that cannot fit `ctx` tokens.
    pub fn check_bytes(&self, bytes: usize, ctx: u32) -> Result<(), PromptError> {
        let max = self.max_bytes(ctx);
        if bytes > max {
            return Err(PromptError::TooManyBytes {
                bytes,
                max,
                ctx,
                per_token: self.max_bytes_per_token,
            });
        }
        Ok(())
    }
}

/// Most prompt tokens a request may have, and the context that sets it (for the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub tokens: usize,
    pub ctx: u32,
}

impl Limit {
    /// A prompt must leave at least one cell of the slot's context for the completion.
    pub fn for_context(ctx: u32) -> Self {
        Self {
            tokens: (ctx as usize).saturating_sub(1),
            ctx,
        }
    }
}
