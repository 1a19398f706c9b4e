//! The streamed response body: engine events turned into framed chunks, keep-alive comments
//! while nothing else is sent, and the SSE headers.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use super::framer::{error_frame, Framer};
use crate::engine::{EngineError, Event, FinishReason, Timings, TokenLogprob, Usage};
use crate::http::error::ApiError;

/// A comment line sent when nothing else was, so proxies and clients keep the stream open
/// through a long queue wait or prefill.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);

/// How one route frames a stream: the chat and completions chunks ([`Framer`]), or the
/// Responses API's typed events.
pub trait Frames: Send + 'static {
    /// Text that can go out now (empty when nothing is ready to send).
    fn text(&mut self, text: &str, logprobs: &[TokenLogprob]) -> Bytes;
    /// The end of a stream that finished.
    fn closing(&mut self, reason: FinishReason, usage: Usage, timings: Timings) -> Bytes;
    /// The end of a stream that failed.
    fn failure(&mut self, e: &ApiError) -> Bytes;
}

impl Frames for Framer {
    fn text(&mut self, text: &str, logprobs: &[TokenLogprob]) -> Bytes {
        Framer::text(self, text, logprobs)
    }

    fn closing(&mut self, reason: FinishReason, usage: Usage, timings: Timings) -> Bytes {
        Framer::closing(self, reason, usage, timings)
    }

    fn failure(&mut self, e: &ApiError) -> Bytes {
        error_frame(e)
    }
}

/// Turns the engine's events into the SSE body. Dropping the body (client gone) drops the
/// receiver, which the decode thread sees after its current step. `cancel` ends the stream
/// with a `shutting_down` error frame at once when shutdown gives up on it.
pub fn events_to_body<F: Frames>(
    framer: F,
    opening: Option<Bytes>,
    events: UnboundedReceiver<Event>,
    cancel: watch::Receiver<bool>,
    keepalive: Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let rest = stream::unfold(Some((events, framer, cancel)), move |state| async move {
        let (mut events, mut framer, mut cancel) = state?;
        let shutting_down = |framer: &mut F| {
            let e: ApiError = EngineError::ShuttingDown.into();
            framer.failure(&e)
        };
        loop {
            let next = tokio::select! {
                biased;
                _ = cancel.wait_for(|c| *c) => return Some((shutting_down(&mut framer), None)),
                next = tokio::time::timeout(keepalive, events.recv()) => next,
            };
            let bytes = match next {
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                Ok(Some(Event::Admitted { .. } | Event::Embedding(_))) => continue,
                Ok(Some(Event::Text { text, logprobs })) => {
                    let bytes = framer.text(&text, &logprobs);
                    // The tool parser may hold all of it back for now.
                    if bytes.is_empty() {
                        continue;
                    }
                    bytes
                }
                Ok(Some(Event::Finished {
                    reason,
                    usage,
                    timings,
                })) => return Some((framer.closing(reason, usage, timings), None)),
                Ok(Some(Event::Failed(e))) => return Some((framer.failure(&e.into()), None)),
                Ok(None) => return Some((shutting_down(&mut framer), None)),
            };
            return Some((bytes, Some((events, framer, cancel))));
        }
    });
    stream::iter(opening).chain(rest).map(Ok)
}

/// [`events_to_body`] for a request with several choices: each choice's events framed by
/// its own [`Framer`] (its index, tool parser, offsets), interleaved as they come; a
/// choice's finish chunk when it finishes, then, once all have, one usage chunk over them
/// ([`Usage::of_choices`]) and `[DONE]`. A choice that fails ends the stream with an error
/// frame, and dropping the rest cancels them.
pub fn choices_to_body(
    framers: Vec<Framer>,
    opening: Vec<Bytes>,
    choices: Vec<UnboundedReceiver<Event>>,
    cancel: watch::Receiver<bool>,
    keepalive: Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let pending = framers.len();
    let merged = stream::select_all(choices.into_iter().enumerate().map(|(i, rx)| {
        stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
            .map(move |e| (i, e))
            .boxed()
    }));
    let state = Choices {
        framers,
        merged,
        cancel,
        usages: Vec::new(),
        pending,
    };
    let rest = stream::unfold(Some(state), move |state| async move {
        let mut st = state?;
        let shutting_down = || {
            let e: ApiError = EngineError::ShuttingDown.into();
            error_frame(&e)
        };
        loop {
            let next = tokio::select! {
                biased;
                _ = st.cancel.wait_for(|c| *c) => return Some((shutting_down(), None)),
                next = tokio::time::timeout(keepalive, st.merged.next()) => next,
            };
            let bytes = match next {
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                Ok(Some((_, Event::Admitted { .. } | Event::Embedding(_)))) => continue,
                Ok(Some((i, Event::Text { text, logprobs }))) => {
                    let bytes = st.framers[i].text(&text, &logprobs);
                    if bytes.is_empty() {
                        continue;
                    }
                    bytes
                }
                Ok(Some((
                    i,
                    Event::Finished {
                        reason,
                        usage,
                        timings,
                    },
                ))) => {
                    let mut bytes = st.framers[i].finish(reason, timings).to_vec();
                    st.usages.push(usage);
                    st.pending -= 1;
                    if st.pending == 0 {
                        bytes.extend_from_slice(&st.framers[0].end(Usage::of_choices(&st.usages)));
                        return Some((Bytes::from(bytes), None));
                    }
                    Bytes::from(bytes)
                }
                Ok(Some((_, Event::Failed(e)))) => return Some((error_frame(&e.into()), None)),
                Ok(None) => return Some((shutting_down(), None)),
            };
            return Some((bytes, Some(st)));
        }
    });
    stream::iter(opening).chain(rest).map(Ok)
}

/// The state of a stream of several choices.
struct Choices<S> {
    framers: Vec<Framer>,
    merged: S,
    cancel: watch::Receiver<bool>,
    /// The usage of each choice that finished.
    usages: Vec<Usage>,
    /// Choices still generating.
    pending: usize,
}

pub fn response(body: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static) -> Response {
    let mut resp = Body::from_stream(body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell nginx-style proxies not to buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
