//! Constrained decoding with llguidance: a JSON schema or a Lark grammar compiled against
//! the model's vocabulary into a token mask that the sampler applies at every step, so
//! the output matches it by construction (`response_format`, forced tool calls).

use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON schema (`{"type": "object"}` for `json_object`).
    JsonSchema(Value),
    /// An llguidance Lark grammar (it may embed JSON schemas with `%json { … }`).
    Lark(String),
}

impl Grammar {
    /// The grammar llguidance compiles. JSON is written compactly (no free whitespace): a
    /// small model given free whitespace may spend its whole budget on newlines.
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema)),
            Self::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// `schema` with llguidance's compact-JSON option, unless it sets its own.
pub fn compact(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_flexible": false }));
    }
    schema
}

/// The model's grammar compiler: its vocabulary walked once into llguidance's token trie,
/// on the first constrained request (a few tens of ms for a 50k vocabulary).
#[derive(Default)]
pub struct Compiler {
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Compiler {
    fn factory(&self, model: &LlamaModel) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let env = LlamaSampler::llguidance_tok_env(model);
                let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("{e:#}"))?;
                // Errors come back as values; llguidance's own stderr log stays quiet.
                factory.quiet();
                Ok(factory)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles `grammar`; the error is llguidance's, naming what it cannot compile (e.g.
    /// `Unimplemented keys: ["if"]`).
    pub fn compile(&self, model: &LlamaModel, grammar: &Grammar) -> Result<Constraint, String> {
        let factory = self.factory(model)?;
        let parser = factory
            .create_parser(grammar.top_level())
            .map_err(|e| format!("{e:#}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint(Arc::new(Mutex::new(matcher))))
    }
}

/// A compiled grammar in its start state, shared by the request's clones; each sequence
/// that opens it gets its own copy of the parser.
#[derive(Clone)]
pub struct Constraint(Arc<Mutex<Matcher>>);

impl Constraint {
    /// A fresh llama.cpp sampler that masks every token the grammar does not allow next.
    pub fn sampler(&self) -> LlamaSampler {
        LlamaSampler::from(self.matcher())
    }

    /// A fresh parser in the grammar's start state.
    fn matcher(&self) -> Matcher {
        match self.0.lock() {
            Ok(m) => m.deep_clone(),
            Err(poisoned) => poisoned.into_inner().deep_clone(),
        }
    }

    /// A second parser that follows the tokens a sequence samples: llama-cpp-2's sampler
    /// leaves the candidates unmasked when llguidance cannot compute a mask (past its
    /// per-step limits), so a token the grammar forbids would go out silently.
    pub fn guard(&self) -> ConstraintGuard {
        ConstraintGuard(self.matcher())
    }
}

/// Follows a constrained sequence's sampled tokens and refuses one its grammar forbids.
pub struct ConstraintGuard(Matcher);

impl ConstraintGuard {
    /// Takes the sampled `token`; an error when the grammar does not allow it (the mask was
    /// not applied) or cannot say.
    pub fn follow(&mut self, token: i32) -> Result<(), String> {
        // Once the grammar is complete only the end of generation is sampled, and a stopped
        // parser refuses every token: nothing left to check.
        if self.0.is_stopped() {
            return Ok(());
        }
        let token = u32::try_from(token).map_err(|_| format!("token {token} out of range"))?;
        self.0
            .consume_token(token)
            .map_err(|e| format!("the grammar was not enforced at this token: {e}"))
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
