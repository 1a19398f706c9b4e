//! `api` cases: requests: the model field, content types, keep-alive.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.request.model_named_served",
        "A request naming the served model is served",
        "200, and model echoes the name",
        |c, ev| {
            let mut body = chat_body("Hi", 2);
            body["model"] = json!(c.facts.model_id);
            let v = c.target.chat(&body)?;
            ev.put("model", v["model"].clone());
            ensure_eq!("model", v["model"], json!(c.facts.model_id));
            Ok(format!("served {}", c.facts.model_id))
        },
    );
    r.add(
        G,
        "api.request.charset_content_type",
        "Content-Type with a charset parameter is accepted",
        "application/json; charset=utf-8 → 200",
        |c, ev| {
            let body = serde_json::to_vec(&chat_body("Hi", 1)).unwrap_or_default();
            let resp = c.target.send(
                Request::post("/v1/chat/completions")
                    .body(body, Some("application/json; charset=utf-8")),
            )?;
            ev.text("response", &resp.describe());
            json_200(&resp, "POST with charset")?;
            Ok("200".into())
        },
    );
    r.add(
        G,
        "api.request.no_content_type",
        "A body without Content-Type is handled cleanly",
        "200 with an answer or 415 in the error shape; never a 5xx",
        |c, ev| {
            let body = serde_json::to_vec(&chat_body("Hi", 1)).unwrap_or_default();
            let resp = c
                .target
                .send(Request::post("/v1/chat/completions").body(body, None))?;
            ev.text("response", &resp.describe());
            match resp.status() {
                200 => {
                    json_200(&resp, "POST without Content-Type")?;
                    Ok("200: the JSON body was read".into())
                }
                415 => {
                    expect_error(&resp, 415, None, Some("unsupported_media_type"))?;
                    Ok("415 unsupported_media_type".into())
                }
                other => Err(Stop::fail(
                    "200 or 415",
                    format!("{other}: {}", resp.describe()),
                )),
            }
        },
    );
    r.add(
        G,
        "api.http.keep_alive",
        "One connection serves two requests in turn",
        "both GET /healthz (another server: its health route) on one keep-alive connection answer 200",
        |c, ev| {
            let ep = &c.target.ep;
            let stream = ep
                .connect(Duration::from_secs(10))
                .map_err(|e| Stop::fail("connect", e.to_string()))?;
            // One stream for both directions (a TLS session cannot be cloned).
            let mut reader = BufReader::new(stream);
            let mut statuses = Vec::new();
            for _ in 0..2 {
                let req = Request::get(c.health_path()).header("Connection", "keep-alive");
                reader
                    .get_mut()
                    .write_all(&req.encode(ep))
                    .map_err(|e| Stop::fail("write the request", e.to_string()))?;
                let deadline = Instant::now() + Duration::from_secs(30);
                let (head, mut body) = http::read_response(reader, "GET", deadline)
                    .map_err(|e| Stop::fail("a response on the same connection", e.to_string()))?;
                body.read_all()
                    .map_err(|e| Stop::fail("the body", e.to_string()))?;
                statuses.push(head.status);
                reader = body.into_reader();
            }
            ev.put("statuses", json!(statuses));
            ensure_eq!("statuses", statuses, vec![200u16, 200]);
            Ok("two answers on one connection".into())
        },
    );
    r.add(
        G,
        "api.http.http10",
        "An HTTP/1.0 client is answered",
        "GET /healthz (another server: its health route) over HTTP/1.0 → 200",
        |c, ev| {
            let ep = &c.target.ep;
            let mut s = ep
                .connect(Duration::from_secs(10))
                .map_err(|e| Stop::fail("connect", e.to_string()))?;
            write!(s, "GET {} HTTP/1.0\r\nHost: {ep}\r\n\r\n", c.health_path())
                .map_err(|e| Stop::fail("write", e.to_string()))?;
            let (head, mut body) = http::read_response(
                BufReader::new(s),
                "GET",
                Instant::now() + Duration::from_secs(30),
            )
            .map_err(|e| Stop::fail("a response", e.to_string()))?;
            let bytes = body
                .read_all()
                .map_err(|e| Stop::fail("the body", e.to_string()))?;
            ev.text("head", &head.describe());
            ensure_eq!("status", head.status, 200);
            ensure!(
                String::from_utf8_lossy(&bytes).contains("ok"),
                "body {\"status\":\"ok\"}",
                String::from_utf8_lossy(&bytes).into_owned()
            );
            Ok(format!("{} {}", head.version, head.status))
        },
    );
    r.add(G, "api.metrics.counts_requests", "/metrics counts requests by route and code", "inferloop_requests_total{route=\"/healthz\",code=\"200\"} grows by at least 1 after a GET /healthz", |c, ev| {
        let series = "inferloop_requests_total{route=\"/healthz\",code=\"200\"}";
        let before = metric(&c.target.metrics()?, series).unwrap_or(0.0);
        c.target.get("/healthz")?;
        let after = metric(&c.target.metrics()?, series).unwrap_or(0.0);
        ev.put("before", before);
        ev.put("after", after);
        ensure!(after >= before + 1.0, format!("{series} ≥ {}", before + 1.0), format!("{after}"));
        Ok(format!("{before} → {after}"))
    });
}
