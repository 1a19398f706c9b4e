//! Server-sent events as they arrive: every frame with its arrival time, kept raw so the
//! framing itself can be judged (`data: {json}\n\n`, comments, `data: [DONE]` last).

use std::time::Duration;

use serde_json::Value;

use crate::http::{self, Endpoint, Head, Request};

/// One SSE frame (the text between blank lines).
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `data: <one line>`.
    Data(String),
    /// A `:` comment line, such as a keep-alive.
    Comment(String),
    /// Anything else: several lines, other fields, no `data: ` prefix.
    Other(String),
}

#[derive(Debug, Clone)]
pub struct Timed {
    pub frame: Frame,
    /// Since the request was sent.
    pub at: Duration,
}

/// A whole streamed response.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    pub head: Head,
    pub frames: Vec<Timed>,
    pub raw: Vec<u8>,
    /// When the response head arrived, since the request was sent.
    pub head_at: Duration,
    /// When the body ended.
    pub end_at: Duration,
    /// Why reading stopped early (the connection broke or timed out), if it did.
    pub cut: Option<String>,
    /// Bytes after the last blank line (an unterminated frame).
    pub trailing: String,
    /// When the request was sent: aligns the frame times of concurrent captures.
    pub sent: Option<std::time::Instant>,
}

/// Splits complete frames off the front of `buf`.
fn take_frames(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
        let frame: Vec<u8> = buf.drain(..pos + 2).collect();
        out.push(String::from_utf8_lossy(&frame[..pos]).into_owned());
    }
    out
}

fn classify(text: String) -> Frame {
    if let Some(c) = text.strip_prefix(':') {
        if !c.contains('\n') {
            return Frame::Comment(c.trim().to_string());
        }
    }
    match text.strip_prefix("data: ") {
        Some(d) if !d.contains('\n') => Frame::Data(d.to_string()),
        _ => Frame::Other(text),
    }
}

/// Parses a complete SSE body (no timing).
pub fn parse_body(body: &str) -> Capture {
    let mut buf = body.as_bytes().to_vec();
    let frames = take_frames(&mut buf)
        .into_iter()
        .map(|t| Timed {
            frame: classify(t),
            at: Duration::ZERO,
        })
        .collect();
    Capture {
        frames,
        raw: body.as_bytes().to_vec(),
        trailing: String::from_utf8_lossy(&buf).into_owned(),
        ..Capture::default()
    }
}

/// Sends `req` and reads the response to its end, timing every frame. A non-200 answer is
/// read whole into `raw` with no frames.
pub fn capture(ep: &Endpoint, req: &Request) -> std::io::Result<Capture> {
    let mut ex = http::open(ep, req)?;
    let head_at = ex.head_at.duration_since(ex.sent_at);
    let mut cap = Capture {
        head: ex.head.clone(),
        head_at,
        sent: Some(ex.sent_at),
        ..Capture::default()
    };
    let is_stream = ex
        .head
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let mut pending = Vec::new();
    loop {
        match ex.body.next_piece() {
            Ok(Some(piece)) => {
                let at = ex.sent_at.elapsed();
                cap.raw.extend_from_slice(&piece);
                if is_stream {
                    pending.extend_from_slice(&piece);
                    for text in take_frames(&mut pending) {
                        cap.frames.push(Timed {
                            frame: classify(text),
                            at,
                        });
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                cap.cut = Some(e.to_string());
                break;
            }
        }
    }
    cap.end_at = ex.sent_at.elapsed();
    cap.trailing = String::from_utf8_lossy(&pending).into_owned();
    Ok(cap)
}

impl Capture {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    pub fn is_event_stream(&self) -> bool {
        self.head
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    }

    pub fn raw_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// The data frames' payloads, `[DONE]` included.
    pub fn data(&self) -> Vec<&str> {
        self.frames
            .iter()
            .filter_map(|t| match &t.frame {
                Frame::Data(d) => Some(d.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn done_count(&self) -> usize {
        self.data().iter().filter(|d| **d == "[DONE]").count()
    }

    /// The last frame is `data: [DONE]` and the body ends right after it.
    pub fn ends_with_done(&self) -> bool {
        matches!(self.frames.last().map(|t| &t.frame), Some(Frame::Data(d)) if d == "[DONE]")
            && self.trailing.is_empty()
            && self.raw.ends_with(b"data: [DONE]\n\n")
    }

    /// The JSON chunks: every data frame but `[DONE]`, parsed. Err names the first frame
    /// that is not a JSON object.
    pub fn chunks(&self) -> Result<Vec<Value>, String> {
        self.data()
            .into_iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| match serde_json::from_str::<Value>(d) {
                Ok(v) if v.is_object() => Ok(v),
                Ok(v) => Err(format!("data frame is JSON but not an object: {v}")),
                Err(e) => Err(format!("data frame is not JSON ({e}): {d:?}")),
            })
            .collect()
    }

    /// The chunks that carry a choice (all but a usage-only chunk or an error).
    pub fn choice_chunks(&self) -> Vec<Value> {
        self.chunks()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .collect()
    }

    /// The generated text of either route.
    pub fn text(&self) -> String {
        self.choice_chunks()
            .iter()
            .filter_map(|c| {
                let choice = &c["choices"][0];
                choice["delta"]["content"]
                    .as_str()
                    .or_else(|| choice["text"].as_str())
                    .map(str::to_string)
            })
            .collect()
    }

    /// Arrival times of the frames carrying non-empty generated text.
    pub fn content_times(&self) -> Vec<Duration> {
        self.frames
            .iter()
            .filter_map(|t| {
                let Frame::Data(d) = &t.frame else {
                    return None;
                };
                let v: Value = serde_json::from_str(d).ok()?;
                let choice = v["choices"].get(0)?;
                let text = choice["delta"]["content"]
                    .as_str()
                    .or_else(|| choice["text"].as_str())?;
                (!text.is_empty()).then_some(t.at)
            })
            .collect()
    }

    /// The error objects sent inside the stream.
    pub fn errors(&self) -> Vec<Value> {
        self.chunks()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.get("error").is_some())
            .collect()
    }

    /// The finish reasons of the choice chunks, in order, nulls included.
    pub fn finish_reasons(&self) -> Vec<Value> {
        self.choice_chunks()
            .iter()
            .map(|c| c["choices"][0]["finish_reason"].clone())
            .collect()
    }

    /// The one non-null finish reason, when exactly the last choice chunk has one.
    pub fn final_finish_reason(&self) -> Result<String, String> {
        let reasons = self.finish_reasons();
        let set: Vec<usize> = reasons
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_null())
            .map(|(i, _)| i)
            .collect();
        match (set.as_slice(), reasons.len()) {
            ([i], n) if *i + 1 == n => reasons[*i]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("finish_reason is not a string: {}", reasons[*i])),
            _ => Err(format!(
                "finish_reason set on choice chunks {set:?} of {}; expected only the last",
                reasons.len()
            )),
        }
    }

    /// The usage object of the final usage-only chunk, if any.
    pub fn usage(&self) -> Option<Value> {
        let chunks = self.chunks().ok()?;
        let last = chunks.last()?;
        (last["choices"].as_array().is_some_and(|a| a.is_empty()) && last["usage"].is_object())
            .then(|| last["usage"].clone())
    }

    /// A bounded view of the raw body, for evidence.
    pub fn describe(&self) -> String {
        format!(
            "HTTP {} ({} frames{})\n{}",
            self.head.status,
            self.frames.len(),
            self.cut
                .as_ref()
                .map(|c| format!(", cut: {c}"))
                .unwrap_or_default(),
            crate::case::snippet(&self.raw_text(), 2000)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_on_blank_lines_and_are_classified() {
        let cap =
            parse_body(": keep-alive\n\ndata: {\"a\":1}\n\nevent: x\ndata: y\n\ndata: [DONE]\n\n");
        let kinds: Vec<&Frame> = cap.frames.iter().map(|t| &t.frame).collect();
        assert_eq!(
            kinds,
            [
                &Frame::Comment("keep-alive".into()),
                &Frame::Data("{\"a\":1}".into()),
                &Frame::Other("event: x\ndata: y".into()),
                &Frame::Data("[DONE]".into()),
            ]
        );
        assert!(cap.ends_with_done());
        assert_eq!(cap.done_count(), 1);
    }

    #[test]
    fn a_stream_without_done_is_not_complete() {
        let cap = parse_body(
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n",
        );
        assert!(!cap.ends_with_done());
        assert_eq!(cap.text(), "hi");
        assert_eq!(cap.final_finish_reason().as_deref(), Ok("stop"));
    }

    #[test]
    fn finish_reason_must_be_on_the_last_choice_chunk_only() {
        let body = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n";
        assert!(parse_body(body).final_finish_reason().is_err());
    }
}
