//! Streamed generation: SSE framing in the OpenAI shape, usage chunks, and the same text as
//! the non-streamed answer.

use serde_json::{json, Value};

use crate::chat::{pick_stop, EXPLAIN};
use crate::harness::{
    chat_body, choice_chunks, counting_body, model_id, shared, stream_finish_reason, stream_text,
    text_of,
};

fn streaming(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

#[tokio::test]
async fn chat_stream_opens_with_the_role_and_keeps_one_id() {
    let chunks = shared()
        .stream("/v1/chat/completions", &streaming(chat_body(EXPLAIN, 16)))
        .await;
    assert!(chunks.len() >= 2, "{chunks:#?}");
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["role"], "assistant",
        "{}",
        chunks[0]
    );
    let id = chunks[0]["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-"), "{id}");
    for c in &chunks {
        assert_eq!(c["id"], id, "{c}");
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], model_id().as_str(), "{c}");
        assert!(c.get("usage").is_none(), "usage only when asked for: {c}");
    }
    for c in &chunks[1..] {
        assert!(
            c["choices"][0]["delta"].get("role").is_none(),
            "role only first: {c}"
        );
    }
    let reason = stream_finish_reason(&chunks);
    assert!(["stop", "length"].contains(&reason.as_str()), "{reason}");
}

#[tokio::test]
async fn include_usage_adds_a_final_chunk_without_choices() {
    let mut body = streaming(chat_body(EXPLAIN, 16));
    body["stream_options"] = json!({"include_usage": true});
    let chunks = shared().stream("/v1/chat/completions", &body).await;
    let (last, rest) = chunks.split_last().expect("chunks");
    assert_eq!(last["choices"], json!([]), "{last}");
    assert_eq!(last["id"], chunks[0]["id"]);
    let u = &last["usage"];
    let prompt = u["prompt_tokens"].as_u64().expect("prompt_tokens");
    let completion = u["completion_tokens"].as_u64().expect("completion_tokens");
    assert!(prompt > 0, "{u}");
    assert!((1..=16).contains(&completion), "{u}");
    assert_eq!(u["total_tokens"], prompt + completion, "{u}");
    for c in rest {
        assert!(c["usage"].is_null(), "usage only on the last chunk: {c}");
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1), "{c}");
    }
    assert_eq!(choice_chunks(&chunks).len(), rest.len());
    stream_finish_reason(&chunks);
}

#[tokio::test]
async fn streamed_chat_text_equals_the_non_streamed_text() {
    let d = shared();
    let whole = d.chat(&chat_body(EXPLAIN, 32)).await;
    let chunks = d
        .stream("/v1/chat/completions", &streaming(chat_body(EXPLAIN, 32)))
        .await;
    assert_eq!(stream_text(&chunks), text_of(&whole));
    assert_eq!(
        stream_finish_reason(&chunks),
        whole["choices"][0]["finish_reason"]
            .as_str()
            .expect("finish_reason")
    );
}

#[tokio::test]
async fn streamed_completion_text_equals_the_non_streamed_text() {
    let d = shared();
    let whole = d.complete(&counting_body(24, false)).await;
    let chunks = d.stream("/v1/completions", &counting_body(24, true)).await;
    let id = chunks[0]["id"].as_str().expect("id");
    assert!(id.starts_with("cmpl-"), "{id}");
    for c in &chunks {
        assert_eq!(c["id"], id, "{c}");
        assert_eq!(c["object"], "text_completion", "{c}");
    }
    assert_eq!(stream_text(&chunks), text_of(&whole));
    assert_eq!(stream_finish_reason(&chunks), "length");
}

#[tokio::test]
async fn stream_stop_sequence_ends_the_output_just_before_it() {
    let d = shared();
    let free = text_of(&d.chat(&chat_body(EXPLAIN, 32)).await);
    let (stop, before) = pick_stop(&free);

    let mut body = streaming(chat_body(EXPLAIN, 32));
    body["stop"] = json!(stop);
    let chunks = d.stream("/v1/chat/completions", &body).await;
    let text = stream_text(&chunks);
    assert_eq!(text, before, "stop {stop:?}; unstopped output {free:?}");
    assert!(!text.contains(&stop));
    assert_eq!(stream_finish_reason(&chunks), "stop");
}

#[tokio::test]
async fn stream_reaching_max_tokens_finishes_with_length() {
    let mut body = counting_body(10, true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = shared().stream("/v1/completions", &body).await;
    assert_eq!(stream_finish_reason(&chunks), "length");
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 10, "{usage}");
}
