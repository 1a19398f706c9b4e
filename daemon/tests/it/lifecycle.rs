//! The process lifecycle: refusing bad start-up settings with the documented exit codes,
//! draining on SIGTERM and SIGQUIT, and serving on through SIGHUP.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use crate::harness::{counting_body, parse_sse, stream_finish_reason, Daemon};

const EXIT_WAIT: Duration = Duration::from_secs(20);

#[test]
fn public_bind_without_api_key_exits_2() {
    let (status, log) = Daemon::run_to_exit(&["--host", "0.0.0.0"], EXIT_WAIT);
    assert_eq!(status.code(), Some(2), "log:\n{log}");
    assert!(
        log.contains("--api-key"),
        "the message must name --api-key:\n{log}"
    );
}

#[tokio::test]
async fn public_bind_with_insecure_no_auth_is_served() {
    let d = Daemon::start(&[
        "--host",
        "0.0.0.0",
        "--insecure-no-auth",
        "--slots",
        "1",
        "--ctx",
        "256",
    ]);
    assert!(
        d.log().contains("listening on http://0.0.0.0:"),
        "{}",
        d.log()
    );
    let v = d.get_ok("/healthz").await;
    assert_eq!(v["status"], "ok");
}

/// `--memory-margin-mb 18446744073709551615` wrapped to a negative margin, and a blank
/// `--api-key` passed the public-bind guard and then locked every client out.
#[test]
fn overflowing_sizes_and_a_blank_api_key_exit_2() {
    let (status, log) =
        Daemon::run_to_exit(&["--memory-margin-mb", "18446744073709551615"], EXIT_WAIT);
    assert_eq!(status.code(), Some(2), "log:\n{log}");
    assert!(log.contains("memory_margin_mb"), "names the flag:\n{log}");
    let (status, log) = Daemon::run_to_exit(&["--host", "0.0.0.0", "--api-key", "  "], EXIT_WAIT);
    assert_eq!(status.code(), Some(2), "log:\n{log}");
    assert!(
        log.contains("api_key") && log.contains("whitespace"),
        "says why the key is refused:\n{log}"
    );
}

#[test]
fn missing_model_file_exits_4() {
    let path = "/nonexistent/inferloop-test/model.gguf";
    let (status, log) = Daemon::run_to_exit(&["--model", path], EXIT_WAIT);
    assert_eq!(status.code(), Some(4), "log:\n{log}");
    assert!(log.contains(path), "the message must name the path:\n{log}");
}

#[test]
fn unknown_key_in_config_file_exits_2() {
    let file = std::env::temp_dir().join(format!("inferloop-it-{}-bad.toml", std::process::id()));
    std::fs::write(&file, "slots = 2\nprot = 8080\n").expect("write config");
    let config = file.to_string_lossy().into_owned();
    let (status, log) = Daemon::run_to_exit(&["--config", &config], EXIT_WAIT);
    std::fs::remove_file(&file).ok();
    assert_eq!(status.code(), Some(2), "log:\n{log}");
    assert!(
        log.contains("prot"),
        "the message must name the key:\n{log}"
    );
}

/// Reads one body chunk from a stream (the first SSE event at least).
async fn first_chunk<S, B>(body: &mut S) -> Vec<u8>
where
    S: futures::Stream<Item = reqwest::Result<B>> + Unpin,
    B: AsRef<[u8]>,
{
    let chunk = body
        .next()
        .await
        .expect("stream open")
        .expect("first chunk");
    chunk.as_ref().to_vec()
}

#[tokio::test]
async fn sigterm_lets_the_inflight_stream_finish_then_exits_0() {
    stop_signal_lets_the_inflight_stream_finish_then_exits_0(libc::SIGTERM).await;
}

/// SIGQUIT used to dump core at once, cutting every stream; it drains like SIGTERM now.
#[tokio::test]
async fn sigquit_drains_like_sigterm_and_exits_0() {
    stop_signal_lets_the_inflight_stream_finish_then_exits_0(libc::SIGQUIT).await;
}

async fn stop_signal_lets_the_inflight_stream_finish_then_exits_0(sig: libc::c_int) {
    // A deadline far beyond the stream's length: only a shutdown that cuts in-flight work
    // fails this, not a slow machine.
    let mut d = Daemon::start(&["--slots", "1", "--ctx", "512", "--shutdown-timeout", "300"]);
    let mut req = counting_body(60, true);
    req["stream_options"] = json!({"include_usage": true});
    let resp = d.post("/v1/completions", &req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut raw = first_chunk(&mut body).await;
    let events_before = String::from_utf8_lossy(&raw).matches("data: ").count();

    d.signal(sig).expect("send the stop signal");
    let refused_by = Instant::now() + Duration::from_secs(3);
    while tokio::net::TcpStream::connect(d.addr()).await.is_ok() {
        assert!(
            Instant::now() < refused_by,
            "still accepting connections after signal {sig}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    while let Some(chunk) = body.next().await {
        raw.extend_from_slice(&chunk.expect("stream interrupted by shutdown"));
    }
    let chunks = parse_sse(&String::from_utf8(raw).expect("utf-8 stream"));
    assert!(
        events_before < chunks.len(),
        "the stream must still be running when signal {sig} arrives ({events_before} of {} \
         events before it)",
        chunks.len() + 1
    );
    assert_eq!(stream_finish_reason(&chunks), "length");
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 60, "{usage}");

    let status = d.wait_exit(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", d.log_tail());
}

/// SIGHUP used to kill the daemon at once (a clean exit to systemd, so no restart) and cut
/// every stream. Now it is logged and the daemon keeps serving, the open stream included.
#[tokio::test]
async fn sighup_is_logged_and_serving_goes_on_stream_included() {
    let mut d = Daemon::start(&["--slots", "2", "--ctx", "512"]);
    let mut req = counting_body(150, true);
    req["stream_options"] = json!({"include_usage": true});
    let resp = d.post("/v1/completions", &req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut raw = first_chunk(&mut body).await;

    d.signal(libc::SIGHUP).expect("send SIGHUP");
    let logged_by = Instant::now() + Duration::from_secs(5);
    while !d.log().contains("SIGHUP: nothing to reload, still serving") {
        assert!(
            Instant::now() < logged_by,
            "no SIGHUP line in the log:\n{}",
            d.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(d.get_ok("/healthz").await["status"], "ok");
    let answer = d.complete(&counting_body(3, false)).await;
    assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");

    while let Some(chunk) = body.next().await {
        raw.extend_from_slice(&chunk.expect("stream interrupted by SIGHUP"));
    }
    let chunks = parse_sse(&String::from_utf8(raw).expect("utf-8 stream"));
    assert_eq!(stream_finish_reason(&chunks), "length");
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 150, "{usage}");
    assert!(
        d.wait_exit(Duration::from_millis(200)).is_none(),
        "the daemon exited after SIGHUP:\n{}",
        d.log_tail()
    );
}

#[tokio::test]
async fn sigterm_past_the_shutdown_timeout_cancels_and_exits_0() {
    let mut d = Daemon::start(&["--slots", "1", "--ctx", "4096", "--shutdown-timeout", "1"]);
    let resp = d.post("/v1/completions", &counting_body(2000, true)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut raw = first_chunk(&mut body).await;

    let t0 = Instant::now();
    d.sigterm();
    let rest = tokio::time::timeout(Duration::from_secs(4), async {
        while let Some(Ok(chunk)) = body.next().await {
            raw.extend_from_slice(&chunk);
        }
    })
    .await;
    assert!(
        rest.is_ok(),
        "stream still open {:?} after SIGTERM",
        t0.elapsed()
    );
    let status = d.wait_exit(Duration::from_secs(4).saturating_sub(t0.elapsed()));
    let took = t0.elapsed();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit {status:?} after {took:?}\n{}",
        d.log_tail()
    );
    assert!(
        took >= Duration::from_secs(1),
        "exited after {took:?}, before the deadline"
    );

    // The stream was cut, not completed: the HTTP layer ends it with the shutting_down error
    // as soon as the deadline passes, without waiting for the decode thread's next step.
    let text = String::from_utf8_lossy(&raw);
    assert!(
        !text.contains("[DONE]"),
        "a cancelled stream must not claim completion"
    );
    let tail = &text[text.len().saturating_sub(400)..];
    assert!(
        text.trim_end().ends_with("\"code\":\"shutting_down\"}}"),
        "a cancelled stream ends with the shutting_down error: {tail:?}"
    );
}

#[test]
fn systemd_hears_ready_then_watchdog_pings_then_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).expect("bind notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let path = sock_path.to_str().expect("utf8");
    // WatchdogSec=0.4 s: the daemon pings every 200 ms while its decode loop turns.
    let daemon = Daemon::try_start_with_env(
        &["--slots", "1", "--ctx", "256"],
        &[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "400000")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 64];
    let mut recv = || {
        let n = sock.recv(&mut buf).expect("a notification within 30 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(recv(), "READY=1");
    for _ in 0..3 {
        assert_eq!(recv(), "WATCHDOG=1");
    }
    daemon.sigterm();
    let mut seen = Vec::new();
    loop {
        let msg = recv();
        if msg == "STOPPING=1" {
            break;
        }
        assert_eq!(msg, "WATCHDOG=1", "unexpected notification after {seen:?}");
        seen.push(msg);
    }
}

/// The VM's watchdog case in small: `INFERLOOP_DEBUG_STALL_FILE` reaches the decode loop
/// (through the config and the engine plan); while the file exists the loop never turns and
/// no `WATCHDOG=1` goes out; once it is gone the pings come.
#[test]
fn the_debug_stall_file_withholds_watchdog_pings_until_it_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("notify.sock");
    let stall = dir.path().join("stall");
    std::fs::write(&stall, b"").expect("stall file");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).expect("bind notify socket");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let daemon = Daemon::try_start_with_env(
        &["--slots", "1", "--ctx", "256"],
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().expect("utf8")),
            ("WATCHDOG_USEC", "400000"),
            ("INFERLOOP_DEBUG_STALL_FILE", stall.to_str().expect("utf8")),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 64];
    let mut recv = || {
        sock.recv(&mut buf)
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    assert_eq!(recv().expect("READY=1 within 30 s"), "READY=1");
    // Five ping intervals with the loop held: not one ping.
    sock.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    match recv() {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("no notification while stalled, got {other:?}"),
    }
    std::fs::remove_file(&stall).expect("remove the stall file");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    assert_eq!(recv().expect("a ping once resumed"), "WATCHDOG=1");
    drop(daemon);
}

/// Regression: a connection holding half a request (headers cut short, or a body shorter
/// than its `Content-Length`) kept the daemon up 2 s past `--shutdown-timeout`, waiting for
/// a request that would never be complete.
#[test]
fn sigterm_with_half_sent_requests_exits_within_the_shutdown_timeout() {
    use std::io::Write;
    let mut d = Daemon::start(&["--slots", "1", "--ctx", "256", "--shutdown-timeout", "1"]);
    let connect = || std::net::TcpStream::connect(d.addr()).expect("connect");
    let mut half_head = connect();
    half_head
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        .expect("half the headers");
    let mut short_body = connect();
    short_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"prompt\":",
        )
        .expect("headers and 10 of 1000 body bytes");
    // Let the daemon read both before the signal.
    std::thread::sleep(Duration::from_millis(300));

    let t0 = Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(10));
    let took = t0.elapsed();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit {status:?} after {took:?}\n{}",
        d.log_tail()
    );
    assert!(
        took < Duration::from_millis(1700),
        "exited {took:?} after SIGTERM with --shutdown-timeout 1\n{}",
        d.log_tail()
    );
    drop((half_head, short_body));
}

/// SIGTERM while the model loads stops the daemon at once. The load was a blocking task of
/// the async runtime, and dropping the runtime waited for it: a stop during a long load (a
/// large model on slow storage, a template that had to run out of fuel) waited for the
/// whole load. The stall file's `.load` twin holds the load for as long as the test needs.
#[test]
fn sigterm_while_the_model_loads_exits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stall = dir.path().join("stall");
    std::fs::write(dir.path().join("stall.load"), b"").expect("load stall file");
    let mut d = Daemon::start_listening_with_env(
        &["--slots", "1", "--ctx", "256"],
        &[("INFERLOOP_DEBUG_STALL_FILE", stall.to_str().expect("utf8"))],
    );
    let blocked = Instant::now() + Duration::from_secs(30);
    while !d.log().contains("model load blocked") {
        assert!(Instant::now() < blocked, "{}", d.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        crate::harness::raw_get_status(d.addr(), "/readyz"),
        Some(503),
        "not ready while loading"
    );
    let t0 = Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(10));
    let took = t0.elapsed();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit {status:?} after {took:?}\n{}",
        d.log_tail()
    );
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after SIGTERM during the load\n{}",
        d.log_tail()
    );
    assert!(
        d.log().contains("shutdown requested while loading"),
        "{}",
        d.log_tail()
    );
}

fn threads(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .expect("the daemon's /proc/PID/task")
        .count()
}

/// Threads a burst adds (tokenizing off the async workers) end once the daemon is idle
/// again. The thermal sampler once ran on the same blocking pool every second, which woke
/// the idle threads in turn so none ever reached its keep-alive: a 2-hour soak ended with
/// 5 more threads than at idle.
#[tokio::test]
async fn threads_a_burst_adds_end_at_idle() {
    let d = Daemon::start(&["--slots", "1", "--ctx", "256"]);
    let idle = threads(&d);
    let body = json!({ "content": "hello world ".repeat(60_000) });
    let burst = (0..10).map(|_| d.post_ok("/tokenize", &body));
    futures::future::join_all(burst).await;
    let busy = threads(&d);
    assert!(
        busy > idle,
        "the burst added no thread ({busy} vs {idle} idle): it tests nothing"
    );
    // tokio's blocking threads end after 10 s idle.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = busy;
    while now > idle && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = threads(&d);
    }
    assert!(
        now <= idle,
        "{now} threads 30 s after the burst, {idle} before it"
    );
}
