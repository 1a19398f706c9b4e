//! Tokenization that keeps message text plain: special tokens are looked for in the
//! template's markup only, and the text between two of them is tokenized in one call with
//! special-token parsing off.

use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_2::model::{LlamaModel, VocabType};
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token_type::LlamaTokenAttr;

use super::bounds::Limit;
use super::error::PromptError;

/// A prompt ready for the engine: its text (for `echo`) and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tokens: Vec<i32>,
}

/// What prompt assembly needs to know about the vocabulary, read once at load: its special
/// tokens (control and user-defined) by their text, longest first so that a marker that is
/// a prefix of another never wins; and whether long text may be tokenized in chunks.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    by_text: Vec<(String, i32)>,
    /// Byte-level BPE: its pre-tokenizer never joins a word to a space before the next
    /// word, so text cut just before " word" tokenizes exactly as the whole would. That lets
    /// an oversized text be refused after its first `limit` tokens instead of all of them.
    chunkable: bool,
}

/// Bytes of text tokenized in one call when the vocabulary allows chunks.
pub(super) const CHUNK_BYTES: usize = 4096;

impl Vocabulary {
    pub fn of(model: &LlamaModel) -> Self {
        let vocab = model.vocab();
        let mut by_text: Vec<(String, i32)> = (0..vocab.n_tokens())
            .filter(|t| {
                let attr = vocab.attr(LlamaToken(*t));
                attr.contains(LlamaTokenAttr::Control) || attr.contains(LlamaTokenAttr::UserDefined)
            })
            .filter_map(|t| {
                let text = vocab.text(LlamaToken(t))?.to_str().ok()?;
                (!text.is_empty()).then(|| (text.to_string(), t))
            })
            .collect();
        by_text.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Self {
            by_text,
            chunkable: matches!(vocab.vocab_type(), VocabType::BPE),
        }
    }

    /// The first special token in `text`: where it starts, its length and its id.
    fn first_in(&self, text: &str) -> Option<(usize, usize, i32)> {
        text.char_indices().find_map(|(at, _)| {
            let rest = &text[at..];
            self.by_text
                .iter()
                .find(|(s, _)| rest.starts_with(s.as_str()))
                .map(|(s, id)| (at, s.len(), *id))
        })
    }
}

/// Where to cut `text` so that the first part is about `CHUNK_BYTES` long and the cut
/// falls just before a space that follows a non-space and precedes a non-space (a word
/// boundary no pre-tokenizer merges across). `None`: no such place; take the whole text.
pub(super) fn chunk_end(text: &str) -> Option<usize> {
    if text.len() <= CHUNK_BYTES {
        return None;
    }
    let bytes = text.as_bytes();
    (CHUNK_BYTES..bytes.len() - 1).find(|&i| {
        bytes[i] == b' '
            && !bytes[i - 1].is_ascii_whitespace()
            && !bytes[i + 1].is_ascii_whitespace()
    })
}

/// Accumulates a prompt: special tokens found in the template's markup go out as they are;
/// all text between two of them is tokenized in one call with special parsing off. BOS (if
/// the vocabulary wants one) goes first, EOS (if it wants one) last, as a whole-string
/// tokenization would place them.
pub(super) struct Tokens<'a> {
    model: &'a LlamaModel,
    vocab: &'a Vocabulary,
    limit: Limit,
    gone: &'a AtomicBool,
    text: String,
    tokens: Vec<i32>,
    /// Byte offset in `text` where the text not yet tokenized starts.
    pending_from: usize,
}

impl<'a> Tokens<'a> {
    pub(super) fn new(
        model: &'a LlamaModel,
        vocab: &'a Vocabulary,
        limit: Limit,
        gone: &'a AtomicBool,
    ) -> Self {
        let llama = model.vocab();
        let tokens = if llama.should_add_bos() {
            vec![llama.bos().0]
        } else {
            Vec::new()
        };
        Self {
            model,
            vocab,
            limit,
            gone,
            text: String::new(),
            tokens,
            pending_from: 0,
        }
    }

    /// Stops the work once the client has left or the prompt can no longer fit.
    fn check(&self) -> Result<(), PromptError> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(PromptError::Cancelled);
        }
        if self.tokens.len() > self.limit.tokens {
            return Err(PromptError::TooManyTokens {
                limit: self.limit.tokens,
                ctx: self.limit.ctx,
            });
        }
        Ok(())
    }

    /// Template text: its special tokens become control tokens.
    pub(super) fn markup(&mut self, mut piece: &str) -> Result<(), PromptError> {
        self.check()?;
        while let Some((at, len, id)) = self.vocab.first_in(piece) {
            self.text.push_str(&piece[..at]);
            self.flush()?;
            self.text.push_str(&piece[at..at + len]);
            self.tokens.push(id);
            self.pending_from = self.text.len();
            piece = &piece[at + len..];
        }
        self.text.push_str(piece);
        Ok(())
    }

    /// Message text: always plain text.
    pub(super) fn text(&mut self, piece: &str) -> Result<(), PromptError> {
        self.check()?;
        self.text.push_str(piece);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PromptError> {
        self.check()?;
        let vocab = self.model.vocab();
        while self.pending_from < self.text.len() {
            let pending = &self.text[self.pending_from..];
            let end = if self.vocab.chunkable {
                chunk_end(pending).unwrap_or(pending.len())
            } else {
                pending.len()
            };
            let tokens = vocab.tokenize(&pending.as_bytes()[..end], false, false);
            self.tokens.extend(tokens.into_iter().map(|t| t.0));
            self.pending_from += end;
            self.check()?;
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<Prompt, PromptError> {
        self.flush()?;
        let vocab = self.model.vocab();
        if vocab.should_add_eos() {
            self.tokens.push(vocab.eos().0);
            self.check()?;
        }
        Ok(Prompt {
            text: self.text,
            tokens: self.tokens,
        })
    }
}
