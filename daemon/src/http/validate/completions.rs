//! `/v1/completions`: a raw prompt, with the legacy endpoint's defaults and limits.

use super::extensions;
use super::format::output_grammar;
use super::output::{check_max_tokens, check_n, stops, stream_usage};
use super::request::{unsupported, Input, InvalidRequest, ValidRequest};
use super::sampling::{logit_bias, sampling};
use crate::http::wire::{CompletionRequest, PromptField};

/// The legacy completions endpoint's `logprobs` limit, as OpenAI sets it.
const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// A `/v1/completions` body, checked field by field.
pub fn completion(req: CompletionRequest) -> Result<ValidRequest, InvalidRequest> {
    let n = check_n(req.n)?;
    unsupported_completion(&req)?;
    extensions::check(&req.llama_extensions())?;
    let format = output_grammar(None, req.json_schema.as_ref(), req.grammar.as_ref())?;
    let mut sampling = sampling(&req.sampling())?;
    sampling.logit_bias = logit_bias(req.logit_bias.as_ref())?;
    sampling.logprobs = match req.logprobs {
        None => None,
        Some(n) if n > MAX_COMPLETION_LOGPROBS => {
            return Err(InvalidRequest::field(
                "logprobs",
                format!("must be between 0 and {MAX_COMPLETION_LOGPROBS}"),
            ))
        }
        // Prompt tokens would need logits at every prompt position, which are not kept.
        Some(_) if req.echo == Some(true) => {
            return Err(InvalidRequest::field(
                "logprobs",
                "is not supported together with `echo`: prompt tokens have no \
                 log-probabilities on this server",
            ))
        }
        Some(n) => Some(n as u8),
    };
    let prompt = match req.prompt {
        PromptField::One(p) => p,
        PromptField::Many(mut v) if v.len() == 1 => v.remove(0),
        PromptField::Many(_) => {
            return Err(InvalidRequest::field(
                "prompt",
                "must be a string or a list of exactly one string",
            ))
        }
    };
    if prompt.is_empty() {
        return Err(InvalidRequest::field("prompt", "must not be empty"));
    }
    if prompt.contains('\0') {
        return Err(InvalidRequest::field(
            "prompt",
            "must not contain NUL characters",
        ));
    }
    // The legacy endpoint's default, as OpenAI documents it, unless llama-server's
    // `n_predict` sets another (`-1`: up to the context's end).
    let max_tokens = req
        .max_tokens
        .map(|m| check_max_tokens("max_tokens", m).map(|m| ("max_tokens", m)))
        .transpose()?;
    let max_tokens = match (req.n_predict, max_tokens) {
        (None, None) => Some(16),
        (predict, given) => extensions::n_predict(predict, given)?,
    };
    let stream = req.stream.unwrap_or(false);
    let (grammar, grammar_from) = format.unzip();
    Ok(ValidRequest {
        model: req.model,
        input: Input::Text(prompt),
        max_tokens,
        sampling,
        stop: stops(req.stop)?,
        include_usage: stream_usage(stream, req.stream_options)?,
        stream,
        echo: req.echo.unwrap_or(false),
        parse_special: req.parse_special.unwrap_or(false),
        grammar,
        grammar_from,
        tools: None,
        speculative: req.speculative.unwrap_or(true),
        n,
    })
}

/// Fields OpenAI defines for legacy completions that this server does not implement.
fn unsupported_completion(req: &CompletionRequest) -> Result<(), InvalidRequest> {
    match req.best_of {
        None | Some(1) => {}
        Some(0) => return Err(InvalidRequest::field("best_of", "must be at least 1")),
        Some(_) => {
            return Err(unsupported(
                "best_of",
                "only 1; send separate requests and compare",
            ))
        }
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("suffix", "text insertion"));
    }
    Ok(())
}
