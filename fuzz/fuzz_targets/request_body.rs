//! Any bytes as the body of each generation route and `/v1/embeddings`: the parse and the
//! checks the handlers run before the engine (`http::generate::chat`, `completion`,
//! `responses`, `embeddings`), then what the request path computes from a valid request
//! without a model: the vocabulary check, the tools' grammar and system text in every
//! form, earlier calls written back. Every refusal must become an OpenAI error body.

#![no_main]

use inferloopd::http::embeddings::wire::EmbeddingRequest;
use inferloopd::http::error::ApiError;
use inferloopd::http::responses::wire::ResponsesRequest;
use inferloopd::http::validate::{self, EmbedInputs, Input, InvalidRequest, ValidRequest};
use inferloopd::http::wire::{ChatCompletionRequest, CompletionRequest};
use inferloopd::tools::Format;
use libfuzzer_sys::fuzz_target;

/// The default model's sizes (SmolLM2-135M).
const N_VOCAB: i32 = 49_152;
const N_EMBD: i32 = 576;
const FORMATS: [Format; 3] = [Format::Hermes, Format::Llama3, Format::Mistral];

fuzz_target!(|body: &[u8]| {
    match validate::parse_json::<ChatCompletionRequest>(body).and_then(validate::chat) {
        Ok(req) => valid(&req),
        Err(e) => refused(e),
    }
    match validate::parse_json::<CompletionRequest>(body).and_then(validate::completion) {
        Ok(req) => valid(&req),
        Err(e) => refused(e),
    }
    match validate::parse_json::<ResponsesRequest>(body).and_then(validate::responses) {
        Ok(req) => {
            valid(&req.request);
            serde_json::to_string(&req.echo).expect("the echo serializes");
        }
        Err(e) => refused(e),
    }
    match validate::parse_json::<EmbeddingRequest>(body).and_then(validate::embeddings) {
        Ok(req) => {
            assert!(
                !req.inputs.is_empty(),
                "a valid embeddings request has input"
            );
            if let Err(e) = validate::check_dimensions(req.dimensions, N_EMBD) {
                refused(e);
            }
            if let EmbedInputs::Tokens { lists, flat } = &req.inputs {
                match validate::check_token_ids(lists, *flat, N_VOCAB) {
                    Ok(ids) => assert!(ids.iter().flatten().all(|&id| (0..N_VOCAB).contains(&id))),
                    Err(e) => refused(e),
                }
            }
        }
        Err(e) => refused(e),
    }
});

/// What the request path derives from a valid request before it needs the model.
fn valid(req: &ValidRequest) {
    assert!(req.n >= 1, "n is at least 1");
    if let Err(e) = validate::check_vocab(&req.sampling, N_VOCAB) {
        refused(e);
    }
    if let Some(tools) = &req.tools {
        for f in FORMATS {
            let _ = tools.grammar(f);
        }
        let _ = tools.system_text();
        let _ = tools.template_value();
    }
    if let Input::Chat(turns) = &req.input {
        assert!(!turns.is_empty());
        for t in turns {
            assert!(!t.content.contains('\0'), "NUL reached a chat turn");
            for f in FORMATS {
                let _ = f.calls_text(&t.tool_calls);
            }
        }
    }
}

/// A refusal: a 4xx whose body is the OpenAI error object.
fn refused(e: InvalidRequest) {
    let api: ApiError = e.into();
    assert!(api.status.is_client_error(), "{}", api.status);
    let body: serde_json::Value = serde_json::from_str(&api.to_json()).expect("error JSON");
    assert!(body["error"]["message"].is_string());
}
