//! `stream` cases: a streamed Responses API answer: OpenAI's typed events in their order,
//! each numbered. They keep the ids of two chat-chunk cases they replaced
//! (`created` constant across chunks, and the role on later chunks, which
//! `stream.id_constant` and `stream.role_first` already cover).

use super::*;

const RESPONSES: &str = "/v1/responses";

/// One streamed greedy response, shared by the cases: its events as `(event name, data)`.
fn response_events(c: &Ctx, ev: &mut Evidence) -> Result<Vec<(String, Value)>, Stop> {
    let t = c.target.clone();
    let cap = (*c.memo("responses stream", move || {
        let body = json!({"input": "Say hello.", "max_output_tokens": 12, "temperature": 0,
                          "stream": true});
        t.stream_ok(RESPONSES, &body)
    }))
    .clone()?;
    ev.text("stream", &cap.describe());
    let mut out = Vec::new();
    for t in &cap.frames {
        let text = match &t.frame {
            Frame::Comment(_) => continue,
            Frame::Data(d) => format!("data: {d}"),
            Frame::Other(o) => o.clone(),
        };
        let mut name = None;
        let mut data = None;
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = Some(d.to_string());
            }
        }
        let data = data.ok_or_else(|| Stop::fail("a data line in every event", text.clone()))?;
        let v: Value = serde_json::from_str(&data)
            .map_err(|e| Stop::fail("JSON data", format!("{e}: {data}")))?;
        let kind = v["type"].as_str().unwrap_or_default().to_string();
        if let Some(n) = name.filter(|n| *n != kind) {
            return Err(Stop::fail(
                "the event name equals the data's type",
                format!("event {n}, type {kind}"),
            ));
        }
        out.push((kind, v));
    }
    Ok(out)
}

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.created_constant",
        "A streamed response sends OpenAI's typed events in order",
        "response.created, response.in_progress, output_item.added, content_part.added, \
         output_text.delta…, output_text.done, content_part.done, output_item.done, then \
         response.completed (or response.incomplete)",
        |c, ev| {
            let events = response_events(c, ev)?;
            let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
            let n = kinds.len();
            ensure!(n >= 9, "at least 9 events", format!("{kinds:?}"));
            ensure_eq!(
                "opening",
                &kinds[..4],
                &[
                    "response.created",
                    "response.in_progress",
                    "response.output_item.added",
                    "response.content_part.added"
                ][..]
            );
            ensure!(
                kinds[4..n - 4]
                    .iter()
                    .all(|k| *k == "response.output_text.delta"),
                "only output_text.delta between the opening and the closing",
                format!("{kinds:?}")
            );
            ensure_eq!(
                "closing",
                &kinds[n - 4..n - 1],
                &[
                    "response.output_text.done",
                    "response.content_part.done",
                    "response.output_item.done"
                ][..]
            );
            ensure!(
                matches!(kinds[n - 1], "response.completed" | "response.incomplete"),
                "response.completed or response.incomplete last",
                kinds[n - 1].to_string()
            );
            ensure_eq!(
                "status in response.created",
                events[0].1["response"]["status"],
                json!("in_progress")
            );
            Ok(format!(
                "{n} events, {} deltas, ending {}",
                n - 8,
                kinds[n - 1]
            ))
        },
    );
    r.add(
        G,
        "stream.role_only_first",
        "A streamed response numbers its events and its text adds up",
        "sequence_number 0, 1, 2… on every event; the deltas joined equal output_text.done, \
         the final response's text, and one item id throughout",
        |c, ev| {
            let events = response_events(c, ev)?;
            for (i, (k, v)) in events.iter().enumerate() {
                ensure_eq!(
                    format!("{k} sequence_number"),
                    v["sequence_number"],
                    json!(i)
                );
            }
            let deltas: String = events
                .iter()
                .filter(|(k, _)| k == "response.output_text.delta")
                .filter_map(|(_, v)| v["delta"].as_str())
                .collect();
            let done = events
                .iter()
                .find(|(k, _)| k == "response.output_text.done")
                .map(|(_, v)| v["text"].clone())
                .unwrap_or(Value::Null);
            ensure_eq!("output_text.done text", done, json!(deltas));
            let last = &events[events.len() - 1].1["response"];
            let final_text: String = last["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ensure_eq!("final response text", final_text, deltas);
            let ids: std::collections::BTreeSet<String> = events
                .iter()
                .filter_map(|(_, v)| v.get("item_id").map(Value::to_string))
                .collect();
            ensure_eq!("distinct item ids", ids.len(), 1);
            ensure!(
                last["usage"]["output_tokens"]
                    .as_u64()
                    .is_some_and(|n| n > 0),
                "usage on the final response",
                last["usage"].to_string()
            );
            Ok(format!("{} events numbered, text {deltas:?}", events.len()))
        },
    );
}
