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
use std::sync::atomic::AtomicBool;

use llama_cpp_2::model::LlamaModel;

use super::bounds::Limit;
use super::error::PromptError;
use super::sentinels::Sentinels;
use super::template::ChatTemplate;
use super::template_json::json_escape;
use super::tokens::{Prompt, Tokens, Vocabulary};
use super::turn::ChatTurn;
use crate::tools::{Format, ToolUse};

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
            json_escape(core, &mut escaped);
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
