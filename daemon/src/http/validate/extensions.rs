//! llama-server's request extensions on the generation routes: a value that asks for
//! nothing (the field's off or default setting, which this server already has) is
//! accepted as a no-op; any other is refused by name with what to use instead, so that a
//! client written for llama-server never believes a setting acted when it did not.
//! `json_schema`, `grammar`, `n_predict`, `repeat_penalty` and `repeat_last_n` act, and
//! are checked in [`super::format`], [`n_predict`] and [`super::sampling`].

use serde_json::Value;

use super::request::InvalidRequest;

/// Which values of a field ask for nothing.
#[derive(Debug, Clone, Copy)]
enum Neutral {
    /// This boolean.
    Bool(bool),
    /// One of these numbers.
    Num(&'static [f64]),
    /// Any number at or below this one (the field's "off" range).
    AtMost(f64),
    /// Any number below zero.
    Negative,
    /// An empty list, object or string.
    Empty,
    /// One of these strings.
    Str(&'static [&'static str]),
    /// Any value: the field tunes a stage that is off whenever this request is accepted
    /// (its switch, named here, is refused unless off), or it has nothing to act on here.
    Any(&'static str),
    /// None: only `null` (the same as leaving it out).
    Never,
}

impl Neutral {
    fn holds(self, v: &Value) -> bool {
        match self {
            Self::Bool(b) => v.as_bool() == Some(b),
            Self::Num(ns) => v.as_f64().is_some_and(|x| ns.contains(&x)),
            Self::AtMost(max) => v.as_f64().is_some_and(|x| x <= max),
            Self::Negative => v.as_f64().is_some_and(|x| x < 0.0),
            Self::Empty => match v {
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                Value::String(s) => s.is_empty(),
                _ => false,
            },
            Self::Str(ss) => v.as_str().is_some_and(|s| ss.contains(&s)),
            Self::Any(_) => true,
            Self::Never => v.is_null(),
        }
    }

    /// The accepted values, for the message.
    fn describe(self) -> String {
        let list = |items: Vec<String>| items.join(" or ");
        match self {
            Self::Bool(b) => format!("`{b}`"),
            Self::Num(ns) => list(ns.iter().map(|n| format!("`{n}`")).collect()),
            Self::AtMost(max) => format!("a value of at most `{max}`"),
            Self::Negative => "a negative value".to_string(),
            Self::Empty => "an empty value".to_string(),
            Self::Str(ss) => list(ss.iter().map(|s| format!("`\"{s}\"`")).collect()),
            Self::Any(switch) if !switch.is_empty() => format!("any value while `{switch}` is off"),
            Self::Any(_) => "any value".to_string(),
            Self::Never => "no value".to_string(),
        }
    }
}

/// One llama-server field: the values that ask for nothing, and what to use instead.
struct Rule {
    name: &'static str,
    neutral: Neutral,
    instead: &'static str,
}

const fn rule(name: &'static str, neutral: Neutral, instead: &'static str) -> Rule {
    Rule {
        name,
        neutral,
        instead,
    }
}

const SAMPLER: &str = "this server's sampler chain is temperature, top_p, top_k, min_p, \
                       presence/frequency/repeat penalties, logit_bias and seed (docs/api.md)";

/// Every llama-server field the generation request types read loosely, in the order of
/// [`crate::http::wire`]'s list (a unit test keeps the two the same).
const RULES: &[Rule] = &[
    rule(
        "cache_prompt",
        Neutral::Bool(true),
        "prompt reuse is set for the whole server (`--prefix-cache`); a request cannot turn \
         it off",
    ),
    rule(
        "n_probs",
        Neutral::Num(&[0.0]),
        "use `logprobs` and `top_logprobs` (chat) or `logprobs` (completions)",
    ),
    rule(
        "id_slot",
        Neutral::Num(&[-1.0]),
        "the scheduler assigns slots; leave it out",
    ),
    rule(
        "samplers",
        Neutral::Never,
        "the sampler order is fixed: bias, penalties, grammar, top_k, top_p, min_p, \
         temperature, draw",
    ),
    rule("typical_p", Neutral::Num(&[1.0]), SAMPLER),
    rule("penalize_nl", Neutral::Bool(false), SAMPLER),
    rule("dry_multiplier", Neutral::Num(&[0.0]), SAMPLER),
    rule("dry_base", Neutral::Any("dry_multiplier"), SAMPLER),
    rule(
        "dry_allowed_length",
        Neutral::Any("dry_multiplier"),
        SAMPLER,
    ),
    rule(
        "dry_penalty_last_n",
        Neutral::Any("dry_multiplier"),
        SAMPLER,
    ),
    rule(
        "dry_sequence_breakers",
        Neutral::Any("dry_multiplier"),
        SAMPLER,
    ),
    rule("xtc_probability", Neutral::Num(&[0.0]), SAMPLER),
    rule("xtc_threshold", Neutral::Any("xtc_probability"), SAMPLER),
    rule("mirostat", Neutral::Num(&[0.0]), SAMPLER),
    rule("mirostat_tau", Neutral::Any("mirostat"), SAMPLER),
    rule("mirostat_eta", Neutral::Any("mirostat"), SAMPLER),
    rule("dynatemp_range", Neutral::Num(&[0.0]), SAMPLER),
    rule("dynatemp_exponent", Neutral::Any("dynatemp_range"), SAMPLER),
    rule("top_n_sigma", Neutral::AtMost(0.0), SAMPLER),
    // Top-p and min-p keep at least one candidate already; llama.cpp's 0 means the same.
    rule("min_keep", Neutral::Num(&[0.0, 1.0]), SAMPLER),
    rule("adaptive_target", Neutral::Negative, SAMPLER),
    rule("adaptive_decay", Neutral::Any("adaptive_target"), SAMPLER),
    rule(
        "ignore_eos",
        Neutral::Bool(false),
        "the model's end-of-generation token always ends the answer; use `logit_bias` to \
         make it unlikely",
    ),
    rule(
        "t_max_predict_ms",
        Neutral::AtMost(0.0),
        "use `max_tokens` to bound the answer",
    ),
    rule(
        "t_max_prompt_ms",
        Neutral::AtMost(0.0),
        "prompt evaluation is not cut short",
    ),
    // The context never shifts: a request that would not fit is a 400 before it runs,
    // so what to keep or discard on a shift never comes up.
    rule(
        "n_keep",
        Neutral::Any(""),
        "the context never shifts on this server",
    ),
    rule(
        "n_discard",
        Neutral::Any(""),
        "the context never shifts on this server",
    ),
    rule(
        "n_indent",
        Neutral::Num(&[0.0]),
        "use `stop` sequences to end the text",
    ),
    rule("n_cmpl", Neutral::Num(&[1.0]), "use `n`"),
    rule(
        "n_cache_reuse",
        Neutral::Num(&[0.0]),
        "prompt prefixes are reused whole, never shifted in the KV cache",
    ),
    rule(
        "return_tokens",
        Neutral::Bool(false),
        "use `POST /tokenize` on the text",
    ),
    rule(
        "post_sampling_probs",
        Neutral::Bool(false),
        "`logprobs` are reported before sampling (from the biased logits)",
    ),
    rule(
        "timings_per_token",
        Neutral::Bool(false),
        "`timings` come with the last chunk of a stream and with every whole answer",
    ),
    rule(
        "return_progress",
        Neutral::Bool(false),
        "prompt progress is not streamed",
    ),
    rule(
        "verbose",
        Neutral::Bool(false),
        "the daemon's log has the details (`RUST_LOG`)",
    ),
    rule("lora", Neutral::Empty, "no LoRA adapters are loaded"),
    rule(
        "image_data",
        Neutral::Empty,
        "the model is text-only on this server",
    ),
    rule(
        "response_fields",
        Neutral::Never,
        "answers have OpenAI's shape; pick the fields on the client",
    ),
    rule(
        "grammar_lazy",
        Neutral::Bool(false),
        "a grammar applies from the first token (`tool_choice` forces calls)",
    ),
    rule(
        "grammar_triggers",
        Neutral::Empty,
        "a grammar applies from the first token (`tool_choice` forces calls)",
    ),
    rule(
        "grammar_type",
        Neutral::Never,
        "send the grammar as `grammar` (see docs/api.md)",
    ),
    rule(
        "preserved_tokens",
        Neutral::Empty,
        "special tokens in the output are decided by the model's chat template",
    ),
    rule(
        "backend_sampling",
        Neutral::Bool(false),
        "sampling always runs on the CPU",
    ),
    rule(
        "sse_ping_interval",
        Neutral::Never,
        "streams send keep-alive comments on the server's own schedule",
    ),
    rule(
        "chat_format",
        Neutral::Never,
        "the chat form is the model's own template",
    ),
    rule(
        "chat_parser",
        Neutral::Never,
        "tool calls are parsed in the form the model's template uses",
    ),
    rule(
        "generation_prompt",
        Neutral::Never,
        "the chat template writes the assistant's opening",
    ),
    rule(
        "parse_tool_calls",
        Neutral::Bool(true),
        "tool calls are parsed whenever `tools` are offered; leave `tools` out to get plain \
         text",
    ),
    rule(
        "reasoning_format",
        Neutral::Str(&["none"]),
        "reasoning text is not split out of the answer",
    ),
    rule(
        "reasoning_budget_tokens",
        Neutral::Num(&[-1.0]),
        "reasoning is not budgeted; use `max_tokens`",
    ),
    rule(
        "reasoning_budget_message",
        Neutral::Any(""),
        "reasoning is not budgeted; use `max_tokens`",
    ),
    rule(
        "thinking_budget_tokens",
        Neutral::Num(&[-1.0]),
        "reasoning is not budgeted; use `max_tokens`",
    ),
    rule(
        "reasoning_control",
        Neutral::Never,
        "reasoning is not controlled separately",
    ),
    rule(
        "chat_template_kwargs",
        Neutral::Empty,
        "the chat template is rendered with its defaults only",
    ),
    rule(
        "add_generation_prompt",
        Neutral::Bool(true),
        "the assistant's turn is always opened; use `/v1/completions` for a raw prompt",
    ),
    rule(
        "continue_final_message",
        Neutral::Bool(false),
        "use `/v1/completions` with the rendered text to continue a message",
    ),
    // SGLang's fields, which vllm-router serializes into every request it forwards, each
    // at its default: what this server does already.
    rule(
        "no_stop_trim",
        Neutral::Bool(false),
        "a matched stop sequence is always left out of the answer, as OpenAI does",
    ),
    rule(
        "skip_special_tokens",
        Neutral::Bool(true),
        "special tokens are never written into the answer's text",
    ),
    // SGLang splits reasoning out only when started with a reasoning parser; this server
    // has none (`reasoning_format`), so either value asks for nothing here.
    rule(
        "separate_reasoning",
        Neutral::Any(""),
        "reasoning text is not split out of the answer",
    ),
    rule(
        "stream_reasoning",
        Neutral::Any(""),
        "reasoning text is not split out of the answer",
    ),
    rule(
        "include_reasoning",
        Neutral::Bool(true),
        "reasoning text, where a model writes any, stays in the answer's content",
    ),
    rule(
        "return_hidden_states",
        Neutral::Bool(false),
        "hidden states are not returned; `/v1/embeddings` gives pooled ones",
    ),
];

/// Accepts the llama-server fields that ask for nothing; refuses the first that asks for
/// something this server does not do, naming it.
pub(super) fn check(set: &[(&'static str, &Value)]) -> Result<(), InvalidRequest> {
    for &(name, value) in set {
        let Some(r) = RULES.iter().find(|r| r.name == name) else {
            // Every field the wire reads has a rule (see the test below).
            return Err(InvalidRequest::field(
                name,
                "is not supported by this server",
            ));
        };
        if !r.neutral.holds(value) {
            return Err(InvalidRequest::field(
                name,
                format!(
                    "is an extension field (llama-server, SGLang) this server does not act on; only {} is \
                     accepted, as a no-op (got {value}): {}",
                    r.neutral.describe(),
                    r.instead
                ),
            ));
        }
    }
    Ok(())
}

/// llama-server's `n_predict`, `max_tokens` by another name: `-1` is no limit (`None`),
/// and a request that also sets `max_tokens` must agree with it. `limit` is the limit
/// already read (with the field it came from).
pub(super) fn n_predict(
    n: Option<i64>,
    limit: Option<(&'static str, u32)>,
) -> Result<Option<u32>, InvalidRequest> {
    let Some(n) = n else {
        return Ok(limit.map(|l| l.1));
    };
    let own = match n {
        -1 => None,
        n if n >= 1 => Some(u32::try_from(n).map_err(|_| {
            InvalidRequest::field("n_predict", format!("must be at most {}", u32::MAX))
        })?),
        _ => {
            return Err(InvalidRequest::field(
                "n_predict",
                "must be -1 (no limit) or at least 1; a prompt-only pass is not offered",
            ))
        }
    };
    match limit {
        None => Ok(own),
        Some((_, l)) if own == Some(l) => Ok(own),
        Some((param, l)) => Err(InvalidRequest::field(
            "n_predict",
            format!("is {n} but `{param}` is {l}: send one of them"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::{ChatCompletionRequest, CompletionRequest};

    #[test]
    fn every_field_the_wire_reads_has_one_rule() {
        let names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(ChatCompletionRequest::LLAMA_EXTENSIONS, names.as_slice());
        assert_eq!(CompletionRequest::LLAMA_EXTENSIONS, names.as_slice());
    }

    #[test]
    fn a_tuning_field_is_free_only_because_its_switch_is_checked() {
        for r in RULES {
            if let Neutral::Any(switch) = r.neutral {
                if !switch.is_empty() {
                    let s = RULES.iter().find(|x| x.name == switch).expect("switch");
                    assert!(!matches!(s.neutral, Neutral::Any(_)), "{}", r.name);
                }
            }
        }
    }
}
