//! `input` cases: clients that stall.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- slow clients ----
    r.add(
        G,
        "input.slow.partial_headers",
        "A client that never finishes its headers is cut off",
        "connection closed within 5 s (read timeout 1 s), never served",
        |c, ev| {
            let fx = c.fixture("strict")?;
            let ep = fx.target().ep;
            let mut s = ep
                .connect(Duration::from_secs(5))
                .map_err(|e| Stop::fail("connect", e.to_string()))?;
            s.write_all(b"GET /healthz HTTP/1.1\r\n")
                .map_err(|e| Stop::fail("write", e.to_string()))?;
            s.set_read_timeout(Some(Duration::from_secs(6))).ok();
            let t0 = Instant::now();
            let mut buf = Vec::new();
            let closed = match s.read_to_end(&mut buf) {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
                Err(_) => false,
            };
            let took = t0.elapsed();
            ev.put("closed_after_ms", took.as_secs_f64() * 1000.0);
            ev.put("received", String::from_utf8_lossy(&buf).into_owned());
            ensure!(
                closed && took < Duration::from_secs(5),
                "closed within 5 s",
                format!("closed={closed} after {took:?}")
            );
            ensure!(
                !String::from_utf8_lossy(&buf).contains("200 OK"),
                "not served",
                String::from_utf8_lossy(&buf).into_owned()
            );
            Ok(format!("closed after {took:?}"))
        },
    )
    .fixture("strict");
    r.add(G, "input.slow.stalled_body", "A client that stalls mid-body gets 408", "408 request_timeout within 5 s (read timeout 1 s)", |c, ev| {
        let fx = c.fixture("strict")?;
        let ep = fx.target().ep;
        let mut s = ep.connect(Duration::from_secs(5)).map_err(|e| Stop::fail("connect", e.to_string()))?;
        let head = format!("POST {CHAT} HTTP/1.1\r\nHost: {ep}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"messages\":");
        s.write_all(head.as_bytes()).map_err(|e| Stop::fail("write", e.to_string()))?;
        s.set_read_timeout(Some(Duration::from_secs(6))).ok();
        let t0 = Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let took = t0.elapsed();
        let text = String::from_utf8_lossy(&buf).into_owned();
        ev.put("response", text.clone());
        ev.put("after_ms", took.as_secs_f64() * 1000.0);
        ensure!(text.starts_with("HTTP/1.1 408"), "HTTP/1.1 408", crate::case::snippet(&text, 300));
        ensure!(text.contains("request_timeout"), "code request_timeout", crate::case::snippet(&text, 300));
        ensure!(took < Duration::from_secs(5), "within 5 s", format!("{took:?}"));
        Ok(format!("408 after {took:?}"))
    }).fixture("strict");
}
