//! `stream` cases: SSE framing: content type, `data:` frames, `[DONE]` once and last.

use super::*;

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "stream.content_type",
        "A stream is served as text/event-stream",
        "200, Content-Type text/event-stream",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let ct = cap
                .head
                .header("content-type")
                .unwrap_or_default()
                .to_string();
            ensure!(ct.starts_with("text/event-stream"), "text/event-stream", ct);
            Ok(ct)
        },
    );
    r.add(
        G,
        "stream.cache_control",
        "A stream is not cached",
        "Cache-Control: no-cache",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let cc = cap
                .head
                .header("cache-control")
                .unwrap_or_default()
                .to_string();
            ensure!(cc.contains("no-cache"), "no-cache", cc);
            Ok(cc)
        },
    );
    r.add(
        G,
        "stream.framing.data_frames",
        "Every event is one `data:` line followed by a blank line",
        "only `data: <one line>` frames (or `:` comments), body ends on a frame boundary",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let bad: Vec<&Frame> = cap
                .frames
                .iter()
                .map(|t| &t.frame)
                .filter(|f| matches!(f, Frame::Other(_)))
                .collect();
            ensure!(
                bad.is_empty(),
                "no multi-line or non-data frames",
                format!("{bad:?}")
            );
            ensure!(
                cap.trailing.is_empty(),
                "no bytes after the last blank line",
                format!("{:?}", cap.trailing)
            );
            Ok(format!("{} well-formed frames", cap.frames.len()))
        },
    );
    r.add(
        G,
        "stream.done_last",
        "The stream ends with data: [DONE]",
        "the last frame is `data: [DONE]` and nothing follows",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let last = cap
                .frames
                .last()
                .map(|t| format!("{:?}", t.frame))
                .unwrap_or_default();
            ensure!(
                cap.ends_with_done(),
                "last frame `data: [DONE]`",
                format!("last frame {last}, trailing {:?}", cap.trailing)
            );
            Ok("ends with [DONE]".into())
        },
    );
    r.add(
        G,
        "stream.done_once",
        "[DONE] is sent exactly once",
        "one `data: [DONE]` frame",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            ensure_eq!("[DONE] frames", cap.done_count(), 1);
            Ok("one [DONE]".into())
        },
    );
    r.add(
        G,
        "stream.chunks_json",
        "Every chunk is a JSON object",
        "each data frame before [DONE] parses as a JSON object",
        |c, ev| {
            let cap = explain_stream(c, ev)?;
            let n = chunks(&cap)?.len();
            Ok(format!("{n} JSON chunks"))
        },
    );
}
