//! A chat message as the chat path takes it, already validated.

use crate::tools::PastCall;

/// A chat message after validation: role and plain text content, plus an assistant turn's
/// earlier calls (written into its text in the model family's form when rendered) and the
/// call a `tool` turn answers (templates such as Mistral's read it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
    pub tool_calls: Vec<PastCall>,
    pub tool_call_id: Option<String>,
}
