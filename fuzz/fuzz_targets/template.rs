//! A hostile chat template and hostile messages through the renderer the chat path uses
//! (`engine::chat::prompt::render_marked` around `JinjaTemplate::render`, the Jinja path
//! of `ChatTemplate::render`): compiling and rendering must return `Ok` or `Err` (never
//! panic), within the template's fuel and output cap, and the text pieces cut back out of
//! the render must be the messages' own text.
//!
//! Input: `template \0 tools-json \0 role \0 content \0 role \0 content …`. The roles are
//! mapped onto the four that validation lets through; an empty tools part means none.

#![no_main]

use std::borrow::Cow;

use inferloopd::engine::chat::prompt::{render_marked, Piece};
use inferloopd::engine::chat::{ChatTurn, JinjaTemplate};
use inferloopd::tools::PastCall;
use libfuzzer_sys::fuzz_target;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let tools_part = parts.next().unwrap_or_default();
    let tools: Option<serde_json::Value> = serde_json::from_str(tools_part).ok();
    let mut turns = Vec::new();
    while let (Some(role), Some(content)) = (parts.next(), parts.next()) {
        let role = match ROLES.iter().find(|r| **r == role) {
            Some(r) => r,
            None => ROLES[role.len() % ROLES.len()],
        };
        turns.push(ChatTurn {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: if role == "assistant" && content.starts_with('{') {
                vec![PastCall {
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: content.to_string(),
                }]
            } else {
                Vec::new()
            },
            tool_call_id: (role == "tool").then(|| "call_1".to_string()),
        });
    }
    let Ok(template) = JinjaTemplate::compile(source, "<s>", "</s>") else {
        return;
    };
    // A fixed clock: `strftime_now` then renders the same text on every run.
    let template = template.with_fixed_time(1_722_000_309);
    let add_generation_prompt = source.len() & 1 == 0;
    let rendered = render_marked(&turns, |stand_ins| {
        template.render(stand_ins, tools.as_ref(), add_generation_prompt)
    });
    let Ok(pieces) = rendered else { return };
    for piece in &pieces {
        if let Piece::Text(t) = piece {
            // A message's trimmed text, or that text JSON-escaped where `tojson` wrote it.
            let own = turns.iter().any(|turn| {
                let core = turn.content.trim();
                let escaped = serde_json::to_string(core).unwrap_or_default();
                t == &Cow::Borrowed(core)
                    || escaped.get(1..escaped.len().saturating_sub(1)) == Some(t.as_ref())
            });
            assert!(own, "a text piece that is no message's text: {t:?}");
        }
    }
});
