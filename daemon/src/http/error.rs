//! Errors on the wire: every failure leaves as `{"error":{"message","type","param","code"}}`
//! with the matching status code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::validate::InvalidRequest;
use crate::engine::EngineError;

/// `Retry-After` while the board is critical: cooling by the hysteresis takes a while, and
/// clients retrying every second would only add load.
pub const OVERHEATED_RETRY_AFTER_SECS: u64 = 10;

/// An error ready to be sent to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI `error.type`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after_secs: Option<u64>,
    /// `WWW-Authenticate` on a 401 (RFC 6750 §3).
    pub challenge: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_secs: None,
            challenge: None,
        }
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message).param(param)
    }

    /// One input that cannot fit the context (an embedding's), named by its own message.
    pub fn input_too_long(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid(param, message).code("context_length_exceeded")
    }

    /// `param` names the input that holds the prompt: `messages` on chat, `prompt` on
    /// completions.
    pub fn context_length_exceeded(
        param: &'static str,
        limit: u32,
        prompt: usize,
        completion: u32,
    ) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested \
                 {} tokens ({prompt} in the prompt, {completion} for the completion). Please \
                 reduce the length of the prompt or of max_tokens.",
                prompt + completion as usize
            ),
        )
        .param(param)
        .code("context_length_exceeded")
    }

    /// The input cannot fit the context whatever it tokenizes to (too many messages or
    /// bytes): refused before templating, with the same code as a counted overflow.
    pub fn prompt_too_long(param: &'static str, message: impl Into<String>) -> Self {
        let message = format!("`{param}` {}", message.into());
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .param(param)
            .code("context_length_exceeded")
    }

    pub fn model_not_found(requested: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{requested}` does not exist or you do not have access to it."),
        )
        .param("model")
        .code("model_not_found")
    }

    /// No credentials: the challenge names the scheme and nothing else (RFC 6750 §3.1).
    pub fn missing_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Missing API key: send it as `Authorization: Bearer KEY`.",
        )
        .code("invalid_api_key")
        .challenge("Bearer")
    }

    /// Credentials that do not match; the message never echoes them.
    pub fn wrong_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect API key provided.",
        )
        .code("invalid_api_key")
        .challenge("Bearer error=\"invalid_token\"")
    }

    fn challenge(mut self, challenge: &'static str) -> Self {
        self.challenge = Some(challenge);
        self
    }

    /// A path segment the router could not decode (`/v1/models/%ff`: not UTF-8).
    pub fn bad_path(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message).code("invalid_path")
    }

    pub fn route_not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Unknown route: {path}"),
        )
        .code("not_found")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("Method {method} is not allowed on {path}"),
        )
        .code("method_not_allowed")
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("Request body exceeds the limit of {limit} bytes"),
        )
        .code("request_too_large")
    }

    pub fn read_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "Timed out reading the request body",
        )
        .code("request_timeout")
    }

    pub fn unsupported_media_type(got: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!("Content-Type must be application/json, got `{got}`"),
        )
        .code("unsupported_media_type")
    }

    pub fn not_ready() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The model is still loading; retry shortly",
        )
        .code("model_loading")
        .retry_after(1)
    }

    pub fn too_many_connections(max: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!(
                "The server holds its maximum of {max} open connections, each answering a \
                 request; retry shortly"
            ),
        )
        .code("too_many_connections")
        .retry_after(1)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message).code("internal_error")
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(e: InvalidRequest) -> Self {
        let message = e.to_string();
        match e {
            InvalidRequest::Json(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
                    .code("invalid_json")
            }
            InvalidRequest::Field { param, .. } => ApiError::invalid(param, message),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::QueueFull { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
                    .code("queue_full")
                    .retry_after(1)
            }
            EngineError::QueueTimeout { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
                    .code("queue_timeout")
                    .retry_after(1)
            }
            EngineError::Overheated { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
                    .code("overheated")
                    .retry_after(OVERHEATED_RETRY_AFTER_SECS)
            }
            EngineError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
                    .code("shutting_down")
            }
            EngineError::Decode(_) | EngineError::ModelLoad { .. } | EngineError::Context(_) => {
                ApiError::internal(message).code(e.kind())
            }
        }
    }
}

impl ApiError {
    /// The JSON body alone, for an error sent inside an SSE stream.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Detail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_else(|_| r#"{"error":{"message":"internal error"}}"#.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response();
        if let Some(secs) = self.retry_after_secs {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(challenge) = self.challenge {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_401_carries_a_bearer_challenge() {
        for err in [ApiError::missing_api_key(), ApiError::wrong_api_key()] {
            let resp = err.into_response();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
            let challenge = resp
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            assert!(challenge.starts_with("Bearer"), "{challenge:?}");
        }
        let other = ApiError::route_not_found("/nope").into_response();
        assert!(!other.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    #[tokio::test]
    async fn a_full_queue_renders_as_a_429_rate_limit_error_with_retry_after() {
        let resp = ApiError::from(EngineError::QueueFull {
            slots: 1,
            capacity: 1,
        })
        .into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            resp.headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .expect("body");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(json["error"]["type"], "rate_limit_error");
        assert_eq!(json["error"]["code"], "queue_full");
    }

    #[test]
    fn context_length_exceeded_names_the_input_it_was_given() {
        let completion = ApiError::context_length_exceeded("prompt", 128, 120, 9);
        assert_eq!(completion.param.as_deref(), Some("prompt"));
        assert_eq!(completion.code, Some("context_length_exceeded"));
        let chat = ApiError::context_length_exceeded("messages", 128, 120, 9);
        assert_eq!(chat.param.as_deref(), Some("messages"));
    }
}
