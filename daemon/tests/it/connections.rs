//! The connection cap and the connection timeouts, over raw sockets: which connections the
//! daemon closes, which it keeps, what it answers at the cap, and how `/metrics` counts it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::harness::{counting_body, Daemon};

/// The value of the series `name` (labels included) in a `/metrics` text.
fn series(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// Waits up to `within` for the daemon to close `s`; the time it took, or `None` if it is
/// still open.
fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(e) => panic!("unexpected read error: {e}"),
        }
    }
}

fn connect(d: &Daemon) -> TcpStream {
    TcpStream::connect(d.addr()).expect("connect")
}

/// The header timeout runs from a request's first byte, the idle timeout from the end of
/// the last answer (or the accept): a connection idle past the header timeout stays open,
/// a head cut short is closed, and each closing is counted under its reason.
#[tokio::test]
async fn header_and_idle_timeouts_are_separate_and_counted() {
    let d = Daemon::start(&[
        "--read-timeout-secs",
        "1",
        "--idle-timeout-secs",
        "4",
        "--slots",
        "1",
        "--ctx",
        "256",
    ]);
    let mut idle = connect(&d);
    let mut half = connect(&d);
    half.write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .expect("half a head");
    let mut kept = connect(&d);
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("a whole request");

    let half_took = closed_within(&mut half, Duration::from_secs(3)).expect("half a head cut off");
    // The idle ones outlive the read timeout...
    assert_eq!(closed_within(&mut idle, Duration::from_millis(1500)), None);
    let mut answer = [0u8; 512];
    let n = kept.read(&mut answer).expect("the answer");
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    // ...and close at the idle timeout, the kept-alive one counted from its answer.
    assert!(closed_within(&mut idle, Duration::from_secs(6)).is_some());
    assert!(closed_within(&mut kept, Duration::from_secs(6)).is_some());
    assert!(half_took < Duration::from_secs(3), "{half_took:?}");

    let m = d.metrics().await;
    assert_eq!(
        series(
            &m,
            "inferloop_connections_closed_total{reason=\"header_timeout\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        series(
            &m,
            "inferloop_connections_closed_total{reason=\"idle_timeout\"}"
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        series(&m, "inferloop_connections_closed_total{reason=\"evicted\"}"),
        0.0
    );
}

/// At the cap, a new connection closes the oldest one that holds no answer: a client that
/// sends its request is served whatever number of sockets sit idle.
#[tokio::test]
async fn at_the_cap_the_oldest_idle_connection_makes_room() {
    let d = Daemon::start(&["--max-connections", "3", "--slots", "1", "--ctx", "256"]);
    let mut idle: Vec<TcpStream> = (0..3)
        .map(|_| {
            let s = connect(&d);
            // Accepted in this order.
            std::thread::sleep(Duration::from_millis(100));
            s
        })
        .collect();
    let mut s = connect(&d);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(2)).is_some(),
        "the oldest idle connection made room"
    );
    for (i, s) in idle.iter_mut().enumerate().skip(1) {
        assert_eq!(
            closed_within(s, Duration::from_millis(200)),
            None,
            "connection {i} is kept"
        );
    }
    drop(idle);
    let m = d
        .wait_metrics(Duration::from_secs(5), "the evicted one counted", |m| {
            series(m, "inferloop_connections_closed_total{reason=\"evicted\"}") >= 1.0
        })
        .await;
    assert!(
        series(&m, "inferloop_connections_closed_total{reason=\"evicted\"}") >= 1.0,
        "{m}"
    );
    assert_eq!(series(&m, "inferloop_connections_max"), 3.0);
}

/// When every open connection is answering a request, a new one is refused at once with a
/// 503 in the OpenAI error shape, and the answers in flight go on.
#[tokio::test]
async fn at_the_cap_with_every_connection_answering_a_new_one_gets_a_503() {
    let d = Daemon::start(&["--max-connections", "2", "--slots", "2", "--ctx", "512"]);
    let client = crate::harness::http();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let resp = client
            .post(d.url("/v1/completions"))
            .json(&counting_body(400, true))
            .send()
            .await
            .expect("stream starts");
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        body.next().await.expect("a first chunk").expect("bytes");
        streams.push(body);
    }
    let mut s = connect(&d);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("the refusal");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).expect("a JSON error body");
    assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");

    // The streams were not disturbed.
    for body in &mut streams {
        body.next().await.expect("more chunks").expect("bytes");
    }
    drop(streams);
    // Until the streams' connections are gone, a scrape may be refused too (a 503, or a
    // connection closed under a request the client had pooled).
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        if let Ok(resp) = client.get(d.url("/metrics")).send().await {
            if resp.status() == 200 {
                break resp.text().await.expect("metrics");
            }
        }
        assert!(Instant::now() < deadline, "no scrape within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        series(&m, "inferloop_connections_refused_total") >= 1.0,
        "{m}"
    );
    assert!(
        series(&m, "inferloop_connections_accepted_total") >= 3.0,
        "{m}"
    );
}

/// Thousands of sockets trickling half a head against a cap of 100: the daemon's open fds
/// stay below the cap plus what it holds anyway, and a real request is served meanwhile.
#[tokio::test]
async fn a_flood_of_trickling_sockets_holds_no_more_fds_than_the_cap() {
    let d = Daemon::start(&["--max-connections", "100", "--slots", "1", "--ctx", "256"]);
    let pid = d.pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("the daemon's fds")
            .count()
    };
    let before = fds();
    let flood: Vec<TcpStream> = (0..2000)
        .filter_map(|_| {
            let mut s = TcpStream::connect(d.addr()).ok()?;
            let _ = s.write_all(b"POST /v1/completions HTTP/1.1\r\nHo");
            Some(s)
        })
        .collect();
    assert!(flood.len() > 1500, "only {} sockets opened", flood.len());
    // Accepted after the flood: every flooding socket was admitted (or made room) first.
    let v = d.complete(&counting_body(4, false)).await;
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = fds();
    assert!(
        during <= before + 100 + 8,
        "{during} fds with 2000 sockets at a cap of 100 ({before} before)"
    );
    drop(flood);
    let m = d.metrics().await;
    assert!(
        series(&m, "inferloop_connections_closed_total{reason=\"evicted\"}") >= 1800.0,
        "{m}"
    );
}
