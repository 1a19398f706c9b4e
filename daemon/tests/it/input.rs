//! Bad input never reaches the model: each case gets its status code and the OpenAI error
//! shape naming the field at fault.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{assert_error, chat_body, header, http, shared, Daemon};

async fn post_chat(body: &Value) -> reqwest::Response {
    shared().post("/v1/chat/completions", body).await
}

/// `chat_body` with one field replaced.
fn chat_with(field: &str, value: Value) -> Value {
    let mut body = chat_body("Hello", 8);
    body[field] = value;
    body
}

#[tokio::test]
async fn malformed_json_is_400_invalid_json() {
    let resp = http()
        .post(shared().url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"messages": [{"role": "user", "content": "Hi"}"#)
        .send()
        .await
        .expect("POST");
    let err = assert_error(resp, 400, None, Some("invalid_json")).await;
    assert_eq!(err["type"], "invalid_request_error");
}

#[tokio::test]
async fn max_tokens_as_string_is_400_naming_it() {
    let resp = post_chat(&chat_with("max_tokens", json!("8"))).await;
    assert_error(resp, 400, Some("max_tokens"), None).await;
}

#[tokio::test]
async fn temperature_as_string_is_400_naming_it() {
    let resp = post_chat(&chat_with("temperature", json!("hot"))).await;
    assert_error(resp, 400, Some("temperature"), None).await;
}

#[tokio::test]
async fn messages_as_string_is_400_naming_it() {
    let resp = post_chat(&chat_with("messages", json!("Hello"))).await;
    assert_error(resp, 400, Some("messages"), None).await;
}

#[tokio::test]
async fn message_content_as_number_is_400_naming_it() {
    let resp = post_chat(&chat_with(
        "messages",
        json!([{"role": "user", "content": 42}]),
    ))
    .await;
    assert_error(resp, 400, Some("messages[0].content"), None).await;
}

#[tokio::test]
async fn empty_messages_is_400() {
    let resp = post_chat(&chat_with("messages", json!([]))).await;
    assert_error(resp, 400, Some("messages"), None).await;
}

#[tokio::test]
async fn more_choices_than_the_box_has_slots_for_is_400() {
    // Each choice decodes in a slot of its own: the shared daemon has fewer than 64.
    for n in [0, 64, 129] {
        let resp = post_chat(&chat_with("n", json!(n))).await;
        assert_error(resp, 400, Some("n"), None).await;
    }
}

#[tokio::test]
async fn temperature_above_two_is_400() {
    let resp = post_chat(&chat_with("temperature", json!(3))).await;
    assert_error(resp, 400, Some("temperature"), None).await;
}

#[tokio::test]
async fn top_p_zero_is_400() {
    let resp = post_chat(&chat_with("top_p", json!(0))).await;
    assert_error(resp, 400, Some("top_p"), None).await;
}

#[tokio::test]
async fn max_tokens_beyond_the_context_is_400_context_length_exceeded() {
    // The shared daemon has 1024 tokens per slot; the prompt takes some of them.
    let resp = post_chat(&chat_body("Hello", 1024)).await;
    let err = assert_error(resp, 400, Some("messages"), Some("context_length_exceeded")).await;
    assert!(
        err["message"].as_str().is_some_and(|m| m.contains("1024")),
        "{err}"
    );
}

/// The completions route named `messages`, a field it does not have.
#[tokio::test]
async fn completion_beyond_the_context_names_prompt() {
    let body = json!({"prompt": "Hello", "max_tokens": 1024});
    let resp = shared().post("/v1/completions", &body).await;
    assert_error(resp, 400, Some("prompt"), Some("context_length_exceeded")).await;
}

/// A repeated key was reported as "the body must be a JSON object".
#[tokio::test]
async fn duplicate_key_is_400_naming_the_key() {
    let resp = http()
        .post(shared().url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"max_tokens":4,"max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#)
        .send()
        .await
        .expect("POST");
    let err = assert_error(resp, 400, Some("max_tokens"), None).await;
    let msg = err["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("more than once") && !msg.contains("JSON object"),
        "{msg}"
    );
}

#[tokio::test]
async fn prompt_longer_than_the_context_is_400_context_length_exceeded() {
    let long = "tell me more about the weather ".repeat(300);
    let resp = post_chat(&chat_body(&long, 8)).await;
    assert_error(resp, 400, Some("messages"), Some("context_length_exceeded")).await;
}

#[tokio::test]
async fn context_length_exceeded_on_a_stream_is_400_not_a_stream() {
    let mut body = chat_body("Hello", 1024);
    body["stream"] = json!(true);
    let resp = post_chat(&body).await;
    assert!(
        !header(&resp, "content-type").starts_with("text/event-stream"),
        "{:?}",
        resp.headers()
    );
    assert_error(resp, 400, Some("messages"), Some("context_length_exceeded")).await;
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let d = Daemon::start(&["--max-body-bytes", "4096", "--slots", "1", "--ctx", "256"]);
    let body = chat_body(&"a".repeat(10 * 1024), 8);
    let resp = d.post("/v1/chat/completions", &body).await;
    assert_error(resp, 413, None, Some("request_too_large")).await;

    // Without a Content-Length the limit is enforced while reading.
    let bytes = serde_json::to_vec(&body).expect("json");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(1024).map(|c| Ok(c.to_vec())).collect();
    let resp = http()
        .post(d.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("chunked POST");
    assert_error(resp, 413, None, Some("request_too_large")).await;
}

#[tokio::test]
async fn unknown_route_is_404() {
    let resp = shared().get("/v1/fine_tuning/jobs").await;
    assert_error(resp, 404, None, Some("not_found")).await;
}

#[tokio::test]
async fn wrong_method_is_405() {
    let resp = shared().get("/v1/chat/completions").await;
    assert_error(resp, 405, None, Some("method_not_allowed")).await;
}

#[tokio::test]
async fn client_sending_partial_headers_is_disconnected() {
    let d = Daemon::start(&["--read-timeout-secs", "1", "--slots", "1", "--ctx", "256"]);
    let mut s = TcpStream::connect(d.addr()).expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\n").expect("write");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let closed = match s.read_to_end(&mut buf) {
        Ok(_) => true,
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset) => true,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(e) => panic!("unexpected read error: {e}"),
    };
    assert!(
        closed,
        "connection still open after {:?}; got {:?}",
        t0.elapsed(),
        String::from_utf8_lossy(&buf)
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "a partial request must not be served: {:?}",
        String::from_utf8_lossy(&buf)
    );
}

#[test]
fn a_client_still_sending_an_oversized_body_reads_its_413() {
    // The 413 goes out on Content-Length alone. A body arriving at a closed socket is
    // answered with a RST, so a client still writing it (as HTTP clients do before reading)
    // saw a broken pipe instead of the answer.
    let body = vec![b'a'; 2 << 20];
    for trial in 0..5 {
        let mut s = TcpStream::connect(shared().addr()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).expect("headers");
        // Let the answer and the close happen before the body arrives.
        std::thread::sleep(Duration::from_millis(100));
        let sent = s.write_all(&body);
        assert!(
            sent.is_ok(),
            "trial {trial}: the body could not be sent: {sent:?}"
        );
        let mut answer = String::new();
        let read = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "trial {trial}: {read:?}, got {answer:?}"
        );
    }
}
