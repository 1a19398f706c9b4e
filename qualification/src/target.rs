//! A daemon under test seen from a client: requests with its API key, and the checks every
//! case repeats (a 200 with JSON, the OpenAI error shape) turned into verdicts.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::case::{snippet, Stop};
use crate::http::{self, Endpoint, Request, Response};
use crate::sse::{self, Capture};

/// Poll interval while waiting for a daemon to reach a state.
pub const POLL: Duration = Duration::from_millis(25);
/// Longest wait for a state the daemon must reach (a request queued, a slot freed); only a
/// failing run waits this long.
pub const SETTLE: Duration = Duration::from_secs(45);
/// Longest single exchange.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(200);

#[derive(Debug, Clone)]
pub struct Target {
    pub ep: Endpoint,
    pub key: Option<String>,
    /// The server has inferloopd's own routes (`/v1/status`, `/metrics` with its series);
    /// false for any other OpenAI-compatible server, where asking them skips the case.
    pub inferloopd: bool,
    /// `--request-timeout`: the deadline of every request that keeps the default one (and at
    /// least that of a stream), for a server known to be slow, such as one under emulation.
    pub request_timeout: Option<Duration>,
}

impl Target {
    /// An inferloopd at `ep` (see [`Target::openai_only`] for other servers).
    pub fn new(ep: Endpoint, key: Option<String>) -> Target {
        Target {
            ep,
            key,
            inferloopd: true,
            request_timeout: None,
        }
    }

    /// This target with every default request deadline replaced by `limit`.
    pub fn with_request_timeout(mut self, limit: Option<Duration>) -> Target {
        self.request_timeout = limit;
        self
    }

    /// The deadline `req` is sent with: its own, unless it kept the default and
    /// `--request-timeout` replaced that; never past [`HTTP_TIMEOUT`] otherwise.
    fn limit_of(&self, req: &Request) -> Duration {
        match self.request_timeout {
            Some(limit) if req.timeout == http::DEFAULT_TIMEOUT => limit,
            _ => req.timeout.min(HTTP_TIMEOUT),
        }
    }

    /// A stream's deadline: [`HTTP_TIMEOUT`], or `--request-timeout` where that is longer.
    fn stream_limit(&self) -> Duration {
        self.request_timeout
            .map_or(HTTP_TIMEOUT, |t| t.max(HTTP_TIMEOUT))
    }

    /// This target seen as a server that only promises OpenAI's API.
    pub fn openai_only(mut self) -> Target {
        self.inferloopd = false;
        self
    }

    /// Skips the case with the reason unless the server is an inferloopd.
    pub fn need_inferloopd(&self, what: &str) -> Result<(), Stop> {
        if self.inferloopd {
            Ok(())
        } else {
            Err(Stop::skip(crate::server::only_reason(what)))
        }
    }

    /// `req` with the API key (unless it already carries an Authorization header).
    pub fn authed(&self, req: Request) -> Request {
        match &self.key {
            Some(k) if !req.has_header("authorization") => {
                req.header("Authorization", &format!("Bearer {k}"))
            }
            _ => req,
        }
    }

    /// Sends a request as given (no key added); an I/O error fails the case.
    pub fn send_raw(&self, req: Request) -> Result<Response, Stop> {
        let what = format!("{} {}", req.method, req.path);
        let limit = self.limit_of(&req);
        http::send(&self.ep, &req.timeout(limit)).map_err(|e| {
            Stop::fail(
                format!("an HTTP response to {what}"),
                io_text(&e, limit, &self.ep),
            )
        })
    }

    pub fn send(&self, req: Request) -> Result<Response, Stop> {
        self.send_raw(self.authed(req))
    }

    pub fn get(&self, path: &str) -> Result<Response, Stop> {
        self.send(Request::get(path))
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Response, Stop> {
        self.send(Request::post(path).json(body))
    }

    /// Streams a request and returns the capture, whatever its status.
    pub fn stream(&self, path: &str, body: &Value) -> Result<Capture, Stop> {
        let limit = self.stream_limit();
        let req = self.authed(Request::post(path).json(body).timeout(limit));
        sse::capture(&self.ep, &req).map_err(|e| {
            Stop::fail(
                format!("a streamed response to POST {path}"),
                io_text(&e, limit, &self.ep),
            )
        })
    }

    /// Streams and requires a 200 event stream that was not cut off.
    pub fn stream_ok(&self, path: &str, body: &Value) -> Result<Capture, Stop> {
        let cap = self.stream(path, body)?;
        if cap.status() != 200 || !cap.is_event_stream() {
            return Err(Stop::fail(
                format!("POST {path} (stream) answers 200 text/event-stream"),
                cap.describe(),
            ));
        }
        if let Some(cut) = &cap.cut {
            return Err(Stop::fail(
                format!("POST {path} (stream) reads to its end"),
                format!("stream cut: {cut}; {}", cap.describe()),
            ));
        }
        Ok(cap)
    }

    pub fn get_ok(&self, path: &str) -> Result<Value, Stop> {
        json_200(&self.get(path)?, &format!("GET {path}"))
    }

    pub fn post_ok(&self, path: &str, body: &Value) -> Result<Value, Stop> {
        json_200(&self.post(path, body)?, &format!("POST {path}"))
    }

    pub fn chat(&self, body: &Value) -> Result<Value, Stop> {
        self.post_ok("/v1/chat/completions", body)
    }

    pub fn complete(&self, body: &Value) -> Result<Value, Stop> {
        self.post_ok("/v1/completions", body)
    }

    pub fn status(&self) -> Result<Value, Stop> {
        self.need_inferloopd("/v1/status")?;
        self.get_ok("/v1/status")
    }

    pub fn metrics(&self) -> Result<String, Stop> {
        self.need_inferloopd("/metrics")?;
        let r = self.get("/metrics")?;
        if r.status() != 200 {
            return Err(Stop::fail("GET /metrics answers 200", r.describe()));
        }
        Ok(r.text())
    }

    /// Polls `/v1/status` until `done` holds; fails naming `what` after `timeout`.
    pub fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, Stop> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status()?;
            if done(&s) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(Stop::fail(
                    format!("within {timeout:?}: {what}"),
                    format!(
                        "last /v1/status: slots {} queue {} kv {}",
                        s["slots"], s["queue"], s["kv"]
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Polls `/metrics` until `done` holds.
    pub fn wait_metrics(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<String, Stop> {
        let deadline = Instant::now() + timeout;
        loop {
            let m = self.metrics()?;
            if done(&m) {
                return Ok(m);
            }
            if Instant::now() > deadline {
                return Err(Stop::fail(
                    format!("within {timeout:?}: {what}"),
                    snippet(&m, 1500),
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// An I/O error in words: a read timeout says how long was waited.
fn io_text(e: &std::io::Error, limit: Duration, ep: &Endpoint) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no complete response within {limit:?} from {ep} ({e})")
        }
        _ => format!("{e} (from {ep})"),
    }
}

/// The JSON body of a 200 answer, or a failure naming `what`.
pub fn json_200(r: &Response, what: &str) -> Result<Value, Stop> {
    if r.status() != 200 {
        return Err(Stop::fail(format!("{what} answers 200"), r.describe()));
    }
    r.json()
        .map_err(|e| Stop::fail(format!("{what} answers JSON"), e))
}

/// The `Retry-After` of a refusal, which must be a whole number of seconds ≥ 1.
pub fn expect_retry_after(r: &Response) -> Result<String, Stop> {
    let ra = r.header("retry-after").unwrap_or_default().to_string();
    if ra.parse::<u64>().is_ok_and(|s| s >= 1) {
        Ok(ra)
    } else {
        Err(Stop::fail("Retry-After ≥ 1", format!("{ra:?}")))
    }
}

/// Checks the status and the OpenAI error shape `{"error":{"message","type","param","code"}}`
/// with exactly `param` and `code`; returns the `error` object.
pub fn expect_error(
    r: &Response,
    status: u16,
    param: Option<&str>,
    code: Option<&str>,
) -> Result<Value, Stop> {
    let want = format!(
        "{status} with error param={} code={}",
        param.unwrap_or("null"),
        code.unwrap_or("null")
    );
    if r.status() != status {
        return Err(Stop::fail(want, r.describe()));
    }
    let ct = r.header("content-type").unwrap_or_default();
    if !ct.starts_with("application/json") {
        return Err(Stop::fail(
            format!("{want}, Content-Type application/json"),
            format!("Content-Type {ct:?}; {}", r.describe()),
        ));
    }
    let v = r.json().map_err(|e| Stop::fail(want.clone(), e))?;
    error_shape(&v).map_err(|e| Stop::fail(format!("{want} in the OpenAI error shape"), e))?;
    let err = &v["error"];
    let param_v = param.map_or(Value::Null, Value::from);
    let code_v = code.map_or(Value::Null, Value::from);
    if err["param"] != param_v || err["code"] != code_v {
        return Err(Stop::fail(
            want,
            format!(
                "{} with error param={} code={}: {}",
                r.status(),
                err["param"],
                err["code"],
                err["message"]
            ),
        ));
    }
    Ok(err.clone())
}

/// The OpenAI error shape: only `error`, holding exactly message, type, param, code with a
/// non-empty message and type.
pub fn error_shape(v: &Value) -> Result<(), String> {
    let top: Vec<&String> = v
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    if top != ["error"] {
        return Err(format!("top-level keys {top:?}, expected [\"error\"]: {v}"));
    }
    let mut keys: Vec<&String> = v["error"]
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    keys.sort();
    if keys != ["code", "message", "param", "type"] {
        return Err(format!(
            "error keys {keys:?}, expected code, message, param, type: {v}"
        ));
    }
    for k in ["message", "type"] {
        if v["error"][k].as_str().is_none_or(str::is_empty) {
            return Err(format!("error.{k} must be a non-empty string: {v}"));
        }
    }
    Ok(())
}

/// A one-message chat request at temperature 0.
pub fn chat_body(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// A raw completion the model continues for hundreds of tokens at temperature 0: the work
/// for cases that need a request to stay busy or to run to exactly `max_tokens`.
pub const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";

pub fn counting(max_tokens: u32, stream: bool) -> Value {
    json!({
        "prompt": COUNTING,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// `body` with `"stream": true`.
pub fn streaming(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

/// `body` with one field set.
pub fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

/// The text of a non-streamed answer from either route.
pub fn text_of(v: &Value) -> Result<String, Stop> {
    let choice = &v["choices"][0];
    choice["message"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            Stop::fail(
                "choices[0].message.content or choices[0].text",
                snippet(&v.to_string(), 800),
            )
        })
}

pub fn finish_of(v: &Value) -> String {
    v["choices"][0]["finish_reason"]
        .as_str()
        .unwrap_or("<none>")
        .to_string()
}

/// A `u64` field, or a failure naming its path.
pub fn u64_at(v: &Value, path: &str) -> Result<u64, Stop> {
    v.pointer(path).and_then(Value::as_u64).ok_or_else(|| {
        Stop::fail(
            format!("{path} is an unsigned integer"),
            snippet(&v.to_string(), 800),
        )
    })
}

/// An `f64` field, or a failure naming its path.
pub fn f64_at(v: &Value, path: &str) -> Result<f64, Stop> {
    v.pointer(path)
        .and_then(Value::as_f64)
        .ok_or_else(|| Stop::fail(format!("{path} is a number"), snippet(&v.to_string(), 800)))
}

/// A string field, or a failure naming its path.
pub fn str_at(v: &Value, path: &str) -> Result<String, Stop> {
    v.pointer(path)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Stop::fail(format!("{path} is a string"), snippet(&v.to_string(), 800)))
}

/// The value of one series (name plus labels, exactly as exposed) in a /metrics body.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Like [`metric`], failing the case when the series is absent.
pub fn metric_of(text: &str, series: &str) -> Result<f64, Stop> {
    metric(text, series).ok_or_else(|| {
        Stop::fail(
            format!("series {series} in /metrics"),
            format!("absent; /metrics:\n{}", snippet(text, 1500)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(limit: Option<u64>) -> Target {
        let ep = Endpoint::parse("http://127.0.0.1:9").expect("a valid URL");
        Target::new(ep, None).with_request_timeout(limit.map(Duration::from_secs))
    }

    #[test]
    fn a_request_timeout_replaces_only_the_default_deadline() {
        let slow = target(Some(600));
        assert_eq!(
            slow.limit_of(&Request::get("/v1/models")),
            Duration::from_secs(600)
        );
        let own = Request::get("/v1/models").timeout(Duration::from_secs(3));
        assert_eq!(slow.limit_of(&own), Duration::from_secs(3));
        assert_eq!(slow.stream_limit(), Duration::from_secs(600));
        // A shorter one never shortens a stream below the usual deadline.
        assert_eq!(target(Some(5)).stream_limit(), HTTP_TIMEOUT);
    }

    #[test]
    fn without_one_requests_keep_their_deadlines_capped_as_before() {
        let t = target(None);
        assert_eq!(t.limit_of(&Request::get("/")), http::DEFAULT_TIMEOUT);
        let long = Request::get("/").timeout(Duration::from_secs(900));
        assert_eq!(t.limit_of(&long), HTTP_TIMEOUT);
        assert_eq!(t.stream_limit(), HTTP_TIMEOUT);
    }
}
