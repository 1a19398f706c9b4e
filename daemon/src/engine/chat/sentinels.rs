//! Sentinels: per-request markers rendered in place of each message's content, so that
//! the rendered chat can be cut back into the template's text and the messages' text.

use std::borrow::Cow;

use rand::distributions::{Alphanumeric, DistString};

use super::turn::ChatTurn;

const SENTINEL_OPEN: char = '\u{E000}';
const SENTINEL_CLOSE: char = '\u{E001}';
/// A sentinel's end once `tojson` wrote it: its message's text goes in JSON-escaped.
const SENTINEL_JSON_CLOSE: char = '\u{E002}';

/// A string as the template's `tojson` writes it: a sentinel in it is closed with
/// [`SENTINEL_JSON_CLOSE`], so that its message's text is put back JSON-escaped, as
/// `transformers` renders a content through `tojson` (Llama 3's tool results).
pub(super) fn mark_json_sentinels(s: &str) -> Cow<'_, str> {
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
pub(super) struct Sentinels {
    tag: String,
}

impl Sentinels {
    pub(super) fn for_turns(turns: &[ChatTurn]) -> Self {
        loop {
            let tag = Alphanumeric.sample_string(&mut rand::thread_rng(), 16);
            let marker = format!("{SENTINEL_OPEN}{tag}");
            if !turns.iter().any(|t| t.content.contains(&marker)) {
                return Self { tag };
            }
        }
    }

    pub(super) fn of(&self, index: usize) -> String {
        format!("{SENTINEL_OPEN}{}{index}{SENTINEL_CLOSE}", self.tag)
    }

    /// What the template gets for a message's content: its leading and trailing whitespace
    /// around the sentinel, so that a template's `trim` or `.strip()` still acts on the
    /// content; content that is only whitespace (or empty) as it is, since it holds no
    /// text a template could mistake and empty content must stay falsy.
    pub(super) fn stand_in(&self, index: usize, content: &str) -> String {
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
    pub(super) fn core(content: &str) -> &str {
        content.trim()
    }

    /// The first sentinel in `text` for one of `n` messages: the text before it, the
    /// message index, whether `tojson` wrote it (see [`mark_json_sentinels`]) and the text
    /// after it.
    pub(super) fn next_in<'t>(
        &self,
        text: &'t str,
        n: usize,
    ) -> Option<(&'t str, usize, bool, &'t str)> {
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
