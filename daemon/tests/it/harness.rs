//! Starts the real daemon, finds its address in its log, waits for readiness and kills it on
//! drop; plus the helpers every test module uses: requests, SSE parsing, error-shape checks.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long a daemon may take from spawn to `GET /readyz` 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `Drop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Upper bound for any single HTTP exchange, so a hung daemon fails a test instead of the suite.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound for the daemon to reach a state it must reach (a request queued, a slot
/// freed). Generous because a busy 2-core CI box can stall a decode step for seconds; only a
/// failing run waits this long.
pub const SETTLE: Duration = Duration::from_secs(30);
/// Interval between polls of a condition.
const POLL: Duration = Duration::from_millis(25);

/// A raw-completion prompt the model continues for hundreds of tokens without an end-of-text:
/// the work for tests that need a request to stay busy.
pub const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";

/// The model file under test; `Err` tells how to get it.
pub fn find_model() -> Result<PathBuf, String> {
    let path = std::env::var_os("INFERLOOP_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        });
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "test model not found at {}: run `make model` to download it, or set \
             INFERLOOP_TEST_MODEL to a GGUF file",
            path.display()
        ))
    }
}

/// The id the daemon reports for the test model: its file stem.
pub fn model_id() -> String {
    let path = find_model().unwrap_or_else(|e| panic!("{e}"));
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A running `inferloopd serve`. Dropping it stops the process (SIGTERM, then SIGKILL).
pub struct Daemon {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Daemon {
    /// Starts a daemon and waits until it is ready. `args` are extra `serve` flags; any of
    /// `--model`, `--host`, `--port`, `--threads` among them replaces the test default.
    pub fn start(args: &[&str]) -> Daemon {
        Self::try_start(args).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start(args: &[&str]) -> Result<Daemon, String> {
        Self::try_start_with_env(args, &[])
    }

    /// Like [`Daemon::try_start`], with extra environment variables for this daemon only.
    pub fn try_start_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<Daemon, String> {
        let mut daemon = spawn(args, env)?;
        daemon.addr = daemon.wait_for_address()?;
        daemon.wait_ready()?;
        Ok(daemon)
    }

    /// Starts a daemon and waits only until it listens (it may still be loading).
    pub fn start_listening_with_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut daemon = spawn(args, env).unwrap_or_else(|e| panic!("{e}"));
        daemon.addr = daemon.wait_for_address().unwrap_or_else(|e| panic!("{e}"));
        daemon
    }

    /// Runs the daemon with `args` and expects it to exit on its own within `timeout`;
    /// returns the exit status and everything it logged.
    pub fn run_to_exit(args: &[&str], timeout: Duration) -> (ExitStatus, String) {
        Self::run_to_exit_with_env(args, &[], timeout)
    }

    /// Like [`Daemon::run_to_exit`], with extra environment variables for this daemon only.
    pub fn run_to_exit_with_env(
        args: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> (ExitStatus, String) {
        let mut daemon = spawn(args, env).unwrap_or_else(|e| panic!("{e}"));
        let Some(status) = daemon.wait_exit(timeout) else {
            panic!(
                "daemon still running after {timeout:?}; log:\n{}",
                daemon.log()
            );
        };
        if let Some(reader) = daemon.reader.take() {
            reader.join().expect("stderr reader thread panicked");
        }
        (status, daemon.log())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Everything the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The last lines of the log, for assertion messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM)
            .unwrap_or_else(|e| panic!("cannot send SIGTERM to the daemon: {e}"));
    }

    /// Sends `sig` to the daemon; a daemon that already exited is not an error.
    pub fn signal(&self, sig: libc::c_int) -> std::io::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions. The pid is our child and is
        // only reaped through `Child`, which we hold, so it cannot name another process.
        if unsafe { libc::kill(pid, sig) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        // ESRCH: it already exited, which is what a stop signal wants anyway.
        match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(()),
            _ => Err(err),
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => return None,
                Err(e) => panic!("waiting for the daemon failed: {e}"),
            }
        }
    }

    fn wait_for_address(&mut self) -> Result<SocketAddr, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let log = self.log();
            if let Some(addr) = listening_address(&log) {
                return Ok(addr);
            }
            self.fail_if_exited()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "no `listening on` line within {READY_TIMEOUT:?}; log:\n{log}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if raw_get_status(self.addr, "/readyz") == Some(200) {
                return Ok(());
            }
            self.fail_if_exited()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "GET /readyz not 200 within {READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn fail_if_exited(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                // Let the reader drain the pipe so the message holds the whole log.
                if let Some(reader) = self.reader.take() {
                    reader.join().ok();
                }
                Err(format!(
                    "daemon exited during start-up ({status}); log:\n{}",
                    self.log()
                ))
            }
            Ok(None) => Ok(()),
            Err(e) => Err(format!("waiting for the daemon failed: {e}")),
        }
    }

    // ---- HTTP helpers ----

    pub async fn get(&self, path: &str) -> reqwest::Response {
        http()
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.log_tail()))
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        http()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.log_tail()))
    }

    /// POSTs `body` and returns the JSON answer, which must be a 200.
    pub async fn post_ok(&self, path: &str, body: &Value) -> Value {
        self.json_ok(self.post(path, body).await).await
    }

    pub async fn get_ok(&self, path: &str) -> Value {
        self.json_ok(self.get(path).await).await
    }

    pub async fn chat(&self, body: &Value) -> Value {
        self.post_ok("/v1/chat/completions", body).await
    }

    pub async fn complete(&self, body: &Value) -> Value {
        self.post_ok("/v1/completions", body).await
    }

    async fn json_ok(&self, resp: reqwest::Response) -> Value {
        let status = resp.status();
        let url = resp.url().path().to_string();
        let text = resp.text().await.expect("response body");
        assert_eq!(
            status,
            200,
            "{url} answered {status}: {text}\ndaemon log:\n{}",
            self.log_tail()
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {text}"))
    }

    /// POSTs a streaming request and returns its parsed chunks (see [`parse_sse`]).
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let resp = self.post(path, body).await;
        read_sse(resp).await
    }

    pub async fn metrics(&self) -> String {
        let resp = self.get("/metrics").await;
        assert_eq!(resp.status(), 200);
        resp.text().await.expect("metrics body")
    }

    pub async fn status(&self) -> Value {
        self.get_ok("/v1/status").await
    }

    /// Polls `/v1/status` until `done` holds for it; panics naming `what` after `timeout`.
    pub async fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status().await;
            if done(&status) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "not within {timeout:?}: {what}; last status {status}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls `/metrics` until `done` holds for it; panics naming `what` after `timeout`.
    pub async fn wait_metrics(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics().await;
            if done(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "not within {timeout:?}: {what}; last /metrics:\n{text}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let running = self.child.try_wait().ok().flatten().is_none();
        if running && (self.signal(libc::SIGTERM).is_err() || self.wait_exit(STOP_GRACE).is_none())
        {
            self.child.kill().ok();
            self.child.wait().ok();
        }
        if std::thread::panicking() {
            eprintln!("---- inferloopd log ({}) ----\n{}", self.addr, self.log());
        }
    }
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Result<Daemon, String> {
    let model = find_model()?;
    let model = model.to_string_lossy().into_owned();
    let mut argv: Vec<String> = vec!["serve".into()];
    // One llama.cpp thread per daemon: tests run two at a time, and ggml's threads spin at
    // every barrier, so two 2-thread daemons on a 2-core box starve each other (measured: the
    // suite took 120 s with 2 threads, 50 s with 1, and shutdown tests timed out).
    for (flag, default) in [
        ("--model", model.as_str()),
        ("--host", "127.0.0.1"),
        ("--port", "0"),
        ("--threads", "1"),
    ] {
        if !args.contains(&flag) {
            argv.push(flag.into());
            argv.push(default.into());
        }
    }
    argv.extend(args.iter().map(|a| a.to_string()));

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferloopd"));
    cmd.args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // The `listening on` line is at info level; a caller's RUST_LOG must not hide it.
        .env("RUST_LOG", "info,llama-cpp-2=warn");
    // INFERLOOP_* variables set whatever the flags leave unset; the caller's must not leak in.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("INFERLOOP_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe. It makes the daemon die with the thread that spawned it, so a
    // crashed or killed test run leaves no daemon behind.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start inferloopd {argv:?}: {e}"))?;

    let log = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn({
        let log = log.clone();
        move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut l) = log.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        }
    });
    Ok(Daemon {
        child,
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        log,
        reader: Some(reader),
    })
}

/// The address from the daemon's `listening on http://ADDR` line; a wildcard bind is
/// reached through loopback.
fn listening_address(log: &str) -> Option<SocketAddr> {
    let rest = log
        .split("listening on http://")
        .nth(1)
        .or_else(|| log.split("listening on https://").nth(1))?;
    let token = rest.split_whitespace().next()?;
    let mut addr: SocketAddr = token.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(Ipv4Addr::LOCALHOST.into());
    }
    Some(addr)
}

/// `GET path` over a plain socket: the status code, or `None` if the exchange failed. Used
/// before any async runtime exists (the shared daemon starts outside every test's runtime).
pub fn raw_get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

// ---- daemons that live for the whole test run ----

/// Starts a daemon that lives until the test process exits, for a `static LazyLock`.
///
/// The death signal is tied to the spawning thread, so the daemon is started from a thread
/// that never ends rather than from whichever test touched the `LazyLock` first.
pub fn start_for_run(args: &'static [&'static str]) -> Result<Daemon, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("daemon-parent".into())
        .spawn(move || {
            if tx.send(Daemon::try_start(args)).is_err() {
                return;
            }
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("cannot spawn the daemon's parent thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the daemon's parent thread died".to_string())?
}

/// The daemon behind a `static`, or the reason it could not start.
pub fn started(cell: &'static LazyLock<Result<Daemon, String>>) -> &'static Daemon {
    match &**cell {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    }
}

/// Four slots, 1024 tokens each: for tests that only read, generate briefly and do not
/// depend on the daemon's load.
static SHARED: LazyLock<Result<Daemon, String>> =
    LazyLock::new(|| start_for_run(&["--slots", "4", "--ctx", "1024"]));

pub fn shared() -> &'static Daemon {
    started(&SHARED)
}

// ---- requests ----

/// A client with a generous overall timeout; one per call, so no pool outlives its runtime.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .build()
        .expect("reqwest client")
}

/// A one-message chat request at temperature 0.
pub fn chat_body(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// A raw completion of [`COUNTING`] at temperature 0: reliably runs to `max_tokens`.
pub fn counting_body(max_tokens: u32, stream: bool) -> Value {
    json!({
        "prompt": COUNTING,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// The text of a non-streamed answer from either route.
pub fn text_of(v: &Value) -> String {
    let choice = &v["choices"][0];
    choice["message"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

// ---- SSE ----

/// Checks status and content type, reads the whole stream and parses it.
pub async fn read_sse(resp: reqwest::Response) -> Vec<Value> {
    let status = resp.status();
    let content_type = header(&resp, "content-type");
    let body = resp.text().await.expect("stream body");
    assert_eq!(status, 200, "stream answered {status}: {body}");
    assert!(
        content_type.starts_with("text/event-stream"),
        "content-type {content_type:?}, body {body}"
    );
    parse_sse(&body)
}

/// Parses a complete SSE body, asserting the framing: every event is exactly
/// `data: <one line>\n\n`, the last is `data: [DONE]` and it appears nowhere else, and no
/// event carries an error. Comment frames (`: keep-alive`, sent while a slow first token is
/// computed) are valid SSE and skipped. Returns the JSON chunks before `[DONE]`.
pub fn parse_sse(body: &str) -> Vec<Value> {
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "stream does not end with `data: [DONE]\\n\\n`: {body:?}"
    );
    let frames: Vec<&str> = body
        .split_terminator("\n\n")
        .filter(|frame| !frame.starts_with(':'))
        .collect();
    let (done, chunks) = frames.split_last().expect("at least [DONE]");
    assert_eq!(*done, "data: [DONE]");
    chunks
        .iter()
        .map(|frame| {
            let json = frame
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event is not `data: ...`: {frame:?} in {body:?}"));
            assert!(
                !json.contains('\n') && json != "[DONE]",
                "malformed event {frame:?} in {body:?}"
            );
            let v: Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("event is not JSON ({e}): {frame:?}"));
            assert!(v.get("error").is_none(), "error event in stream: {v}");
            v
        })
        .collect()
}

/// The text of a parsed stream from either route.
pub fn stream_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            let choice = c["choices"].get(0)?;
            choice["delta"]["content"]
                .as_str()
                .or_else(|| choice["text"].as_str())
        })
        .collect()
}

/// The chunks that carry a choice (all but a usage-only chunk).
pub fn choice_chunks(chunks: &[Value]) -> Vec<&Value> {
    chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .collect()
}

/// The one non-null `finish_reason` of a stream; asserts it is unique and on the last
/// chunk that carries a choice.
pub fn stream_finish_reason(chunks: &[Value]) -> String {
    let with_choice = choice_chunks(chunks);
    let finished: Vec<usize> = with_choice
        .iter()
        .enumerate()
        .filter(|(_, c)| !c["choices"][0]["finish_reason"].is_null())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        finished,
        vec![with_choice.len() - 1],
        "exactly the last choice chunk must carry finish_reason: {chunks:#?}"
    );
    with_choice[with_choice.len() - 1]["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish_reason is a string")
        .to_string()
}

// ---- errors, headers, metrics ----

/// Asserts the status and the OpenAI error shape `{"error":{"message","type","param","code"}}`
/// with exactly these `param` and `code`; returns the `error` object.
pub async fn assert_error(
    resp: reqwest::Response,
    status: u16,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    let got = resp.status().as_u16();
    let content_type = header(&resp, "content-type");
    let text = resp.text().await.expect("error body");
    assert_eq!(got, status, "body: {text}");
    assert!(
        content_type.starts_with("application/json"),
        "content-type {content_type:?} for body {text}"
    );
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("error body not JSON ({e}): {text}"));
    let top: Vec<&String> = v
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert_eq!(top, ["error"], "{text}");
    let err = &v["error"];
    let mut keys: Vec<&String> = err
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{text}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{text}"
    );
    assert!(
        err["type"].as_str().is_some_and(|t| !t.is_empty()),
        "{text}"
    );
    assert_eq!(
        err["param"],
        param.map_or(Value::Null, Value::from),
        "{text}"
    );
    assert_eq!(err["code"], code.map_or(Value::Null, Value::from), "{text}");
    err.clone()
}

pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The value of one series (name plus labels, exactly as exposed) in a /metrics body.
pub fn metric(text: &str, series: &str) -> f64 {
    find_metric(text, series)
        .unwrap_or_else(|| panic!("series `{series}` not in /metrics:\n{text}"))
}

/// A series' value, 0 while it is not exported yet (for waits on counters that appear late).
pub fn metric_or_zero(text: &str, series: &str) -> f64 {
    find_metric(text, series).unwrap_or(0.0)
}

fn find_metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

pub fn usage_adds_up(v: &Value, max_tokens: u64) {
    let u = &v["usage"];
    let prompt = u["prompt_tokens"].as_u64().expect("prompt_tokens");
    let completion = u["completion_tokens"].as_u64().expect("completion_tokens");
    let total = u["total_tokens"].as_u64().expect("total_tokens");
    assert!(prompt > 0, "{u}");
    assert_eq!(prompt + completion, total, "{u}");
    assert!(
        completion <= max_tokens,
        "{u} exceeds max_tokens {max_tokens}"
    );
}
