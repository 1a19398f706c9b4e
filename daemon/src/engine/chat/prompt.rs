//! From a request's input to prompt tokens: the size bounds checked before any work, the chat
//! template, and tokenization that keeps message text plain.
//!
//! Only the chat template's own markers may become control tokens: a user who writes
//! `<|im_end|>` gets those characters, not a new turn. The template is rendered once with a
//! per-request sentinel in place of each content; the rendered text is cut at the sentinels,
//! special tokens are looked for in the template's pieces only, and the text between two
//! special tokens (template text and message text alike) is tokenized in one call with
//! special-token parsing off. That is the partition llama.cpp makes itself when it parses
//! specials, so ordinary chats get exactly the tokens the whole rendered string would get.
//! Every step is linear in the input, and the work stops once the client has left.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_2::model::{LlamaModel, VocabType};
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token_type::LlamaTokenAttr;
use rand::distributions::{Alphanumeric, DistString};

use super::model::ChatTurn;
use super::template::ChatTemplate;
use crate::tools::{Format, ToolUse};

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

/// A prompt ready for the engine: its text (for `echo`) and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tokens: Vec<i32>,
}

/// Renders `turns` with `template` and tokenizes the result, message text as plain text.
/// `gone` is polled between pieces: once set, the work stops with [`PromptError::Cancelled`].
pub fn chat(
    model: &LlamaModel,
    template: &ChatTemplate,
    vocab: &Vocabulary,
    turns: &[ChatTurn],
    (tools, format): (Option<&ToolUse>, Format),
    limit: Limit,
    gone: &AtomicBool,
) -> Result<Prompt, PromptError> {
    // Earlier calls go back in the form the model writes them, as text of their turn.
    let with_calls = with_calls_text(turns, format);
    let turns = &with_calls[..];
    // Tools reach a template that knows them through its `tools` variable; any other
    // template gets them described in the system turn, in the Hermes form.
    let native = template.knows_tools();
    let described;
    let turns = match tools {
        Some(t) if !native => {
            described = with_system_text(turns, &t.system_text());
            &described[..]
        }
        _ => turns,
    };
    let tools_value = tools.filter(|_| native).map(ToolUse::template_value);
    let pieces = render_marked(turns, |stand_ins| {
        template.render(model, stand_ins, tools_value.as_ref(), true)
    })?;
    let mut out = Tokens::new(model, vocab, limit, gone);
    for piece in pieces {
        match piece {
            Piece::Markup(m) => out.markup(&m)?,
            Piece::Text(t) => out.text(&t)?,
        }
    }
    out.finish()
}

/// `turns` with each assistant turn's calls written after its text, in `format`.
fn with_calls_text(turns: &[ChatTurn], format: Format) -> Vec<ChatTurn> {
    turns
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if !t.tool_calls.is_empty() {
                let calls = format.calls_text(&std::mem::take(&mut t.tool_calls));
                t.content = if t.content.is_empty() {
                    calls
                } else {
                    format!("{}\n{calls}", t.content)
                };
            }
            t
        })
        .collect()
}

/// `turns` with `text` added to the system turn (one is put first when there is none).
fn with_system_text(turns: &[ChatTurn], text: &str) -> Vec<ChatTurn> {
    let mut out = turns.to_vec();
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{text}", first.content);
        }
        _ => out.insert(
            0,
            ChatTurn {
                role: "system".into(),
                content: text.to_string(),
                ..ChatTurn::default()
            },
        ),
    }
    out
}

/// A rendered chat cut into the template's text and the messages' text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Written by the template: its special-token text becomes control tokens.
    Markup(String),
    /// A message's content: always plain text (JSON-escaped where the template wrote it
    /// through `tojson`).
    Text(Cow<'a, str>),
}

/// Renders `turns` through `render` with a per-request sentinel in place of each content,
/// then cuts the result at the sentinels. Joined, the pieces are the rendered chat.
pub fn render_marked<'a>(
    turns: &'a [ChatTurn],
    render: impl FnOnce(&[ChatTurn]) -> Result<String, PromptError>,
) -> Result<Vec<Piece<'a>>, PromptError> {
    if let Some(index) = turns.iter().position(|t| t.content.contains('\0')) {
        return Err(PromptError::NulByte { index });
    }
    let sentinels = Sentinels::for_turns(turns);
    let stand_ins: Vec<ChatTurn> = turns
        .iter()
        .enumerate()
        .map(|(index, t)| ChatTurn {
            role: t.role.clone(),
            content: sentinels.stand_in(index, &t.content),
            tool_calls: Vec::new(),
            tool_call_id: t.tool_call_id.clone(),
        })
        .collect();
    let rendered = render(&stand_ins)?;
    let mut pieces = Vec::new();
    // Every sentinel the template wrote, in the order written, stands for its message's
    // text. A template may drop a message (some ignore a system turn) or write one twice.
    let mut rest = rendered.as_str();
    while let Some((markup, index, json, after)) = sentinels.next_in(rest, turns.len()) {
        pieces.push(Piece::Markup(markup.to_string()));
        let core = Sentinels::core(&turns[index].content);
        pieces.push(Piece::Text(if json {
            let mut escaped = String::new();
            super::template::json_escape(core, &mut escaped);
            Cow::Owned(escaped)
        } else {
            Cow::Borrowed(core)
        }));
        rest = after;
    }
    pieces.push(Piece::Markup(rest.to_string()));
    Ok(pieces)
}

/// Tokenizes a raw prompt. Special-token text stays plain unless `parse_special`.
pub fn text(
    model: &LlamaModel,
    vocab: &Vocabulary,
    text: &str,
    parse_special: bool,
    limit: Limit,
    gone: &AtomicBool,
) -> Result<Prompt, PromptError> {
    let mut out = Tokens::new(model, vocab, limit, gone);
    if parse_special {
        out.markup(text)?;
    } else {
        out.text(text)?;
    }
    out.finish()
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

const SENTINEL_OPEN: char = '\u{E000}';
const SENTINEL_CLOSE: char = '\u{E001}';
/// A sentinel's end once `tojson` wrote it: its message's text goes in JSON-escaped.
const SENTINEL_JSON_CLOSE: char = '\u{E002}';

/// A string as the template's `tojson` writes it: a sentinel in it is closed with
/// [`SENTINEL_JSON_CLOSE`], so that its message's text is put back JSON-escaped, as
/// `transformers` renders a content through `tojson` (Llama 3's tool results).
pub(crate) fn mark_json_sentinels(s: &str) -> Cow<'_, str> {
    if !s.contains(SENTINEL_OPEN) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut in_sentinel = false;
    for c in s.chars() {
        match c {
            SENTINEL_OPEN => in_sentinel = true,
            SENTINEL_CLOSE if in_sentinel => {
                in_sentinel = false;
                out.push(SENTINEL_JSON_CLOSE);
                continue;
            }
            c if !c.is_ascii_alphanumeric() => in_sentinel = false,
            _ => {}
        }
        out.push(c);
    }
    Cow::Owned(out)
}

/// One sentinel per message: private-use characters around a per-request random tag and
/// the index, so no content can contain it (checked, and drawn again if one does).
struct Sentinels {
    tag: String,
}

impl Sentinels {
    fn for_turns(turns: &[ChatTurn]) -> Self {
        loop {
            let tag = Alphanumeric.sample_string(&mut rand::thread_rng(), 16);
            let marker = format!("{SENTINEL_OPEN}{tag}");
            if !turns.iter().any(|t| t.content.contains(&marker)) {
                return Self { tag };
            }
        }
    }

    fn of(&self, index: usize) -> String {
        format!("{SENTINEL_OPEN}{}{index}{SENTINEL_CLOSE}", self.tag)
    }

    /// What the template gets for a message's content: its leading and trailing whitespace
    /// around the sentinel, so that a template's `trim` or `.strip()` still acts on the
    /// content; content that is only whitespace (or empty) as it is, since it holds no
    /// text a template could mistake and empty content must stay falsy.
    fn stand_in(&self, index: usize, content: &str) -> String {
        let core = Self::core(content);
        if core.is_empty() {
            return content.to_string();
        }
        let lead = content.len() - content.trim_start().len();
        let trail = content.len() - content.trim_end().len();
        format!(
            "{}{}{}",
            &content[..lead],
            self.of(index),
            &content[content.len() - trail..]
        )
    }

    /// The part of a content a sentinel stands for.
    fn core(content: &str) -> &str {
        content.trim()
    }

    /// The first sentinel in `text` for one of `n` messages: the text before it, the
    /// message index, whether `tojson` wrote it (see [`mark_json_sentinels`]) and the text
    /// after it.
    fn next_in<'t>(&self, text: &'t str, n: usize) -> Option<(&'t str, usize, bool, &'t str)> {
        let open = format!("{SENTINEL_OPEN}{}", self.tag);
        let mut from = 0;
        while let Some(at) = text[from..].find(&open).map(|i| from + i) {
            let digits_from = at + open.len();
            let tail = &text[digits_from..];
            let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
            let close = tail[digits..].chars().next();
            if let (Ok(index), Some(close @ (SENTINEL_CLOSE | SENTINEL_JSON_CLOSE))) =
                (tail[..digits].parse::<usize>(), close)
            {
                if index < n {
                    let after = &tail[digits + close.len_utf8()..];
                    return Some((&text[..at], index, close == SENTINEL_JSON_CLOSE, after));
                }
            }
            from = digits_from;
        }
        None
    }
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
const CHUNK_BYTES: usize = 4096;

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
fn chunk_end(text: &str) -> Option<usize> {
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
struct Tokens<'a> {
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
    fn new(
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
    fn markup(&mut self, mut piece: &str) -> Result<(), PromptError> {
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
    fn text(&mut self, piece: &str) -> Result<(), PromptError> {
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

    fn finish(mut self) -> Result<Prompt, PromptError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> PromptBounds {
        PromptBounds {
            min_tokens_per_message: 5,
            max_bytes_per_token: 16,
        }
    }

    fn turns(n: usize, content: &str) -> Vec<ChatTurn> {
        (0..n)
            .map(|_| ChatTurn {
                role: "user".into(),
                content: content.into(),
                ..ChatTurn::default()
            })
            .collect()
    }

    #[test]
    fn message_count_is_bounded_by_the_context() {
        let b = bounds();
        assert_eq!(b.max_messages(2048), 409);
        assert!(b.check_chat(&turns(409, "a"), 2048).is_ok());
        let err = b.check_chat(&turns(20_000, "a"), 2048).unwrap_err();
        assert!(err.is_too_long());
        assert_eq!(
            err,
            PromptError::TooManyMessages {
                count: 20_000,
                max: 409,
                ctx: 2048,
                per_message: 5
            }
        );
    }

    #[test]
    fn text_bytes_are_bounded_by_the_context() {
        let b = bounds();
        assert!(b.check_bytes(2048 * 16, 2048).is_ok());
        assert!(matches!(
            b.check_bytes(2048 * 16 + 1, 2048),
            Err(PromptError::TooManyBytes { max: 32768, .. })
        ));
        let one_big = turns(1, &"x".repeat(40_000));
        assert!(b.check_chat(&one_big, 2048).unwrap_err().is_too_long());
    }

    #[test]
    fn chunks_end_before_a_space_between_two_words() {
        assert_eq!(chunk_end("short text"), None);
        let text = format!("{}  x yz", "a".repeat(CHUNK_BYTES));
        let end = chunk_end(&text).expect("a word boundary");
        assert_eq!(&text[end..], " yz", "not inside the double space");
        assert_eq!(chunk_end(&"b".repeat(CHUNK_BYTES * 2)), None);
    }

    #[test]
    fn sentinels_never_occur_in_contents() {
        let t = turns(3, "hello \u{E000} world");
        let s = Sentinels::for_turns(&t);
        assert!(t.iter().all(|m| !m.content.contains(&s.of(0))));
        assert_ne!(s.of(1), s.of(11));
        assert!(!s.of(1).contains(&s.of(11)) && !s.of(11).starts_with(&s.of(1)));
    }
}
