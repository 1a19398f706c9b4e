//! One accepted connection: the socket wrapper that keeps a half-closed peer served, and the
//! write probes that tell a half-closed peer from one that left.
//!
//! Some clients (`nc -N`, scripts that `shutdown(SHUT_WR)`) close their sending side once the
//! request is out and then read the answer. hyper, by default, takes that read-EOF on a busy
//! connection as "the client left" and drops the connection: such a client got no answer.
//! hyper's `half_close(true)` stops reading mid-message altogether, which would also hide a
//! client that really left, and a non-streaming answer writes nothing until it is complete,
//! so such a client would hold its slot (or queue place) until the whole answer was decoded.
//!
//! TCP cannot tell a half-close from a full close without writing. So:
//! - [`PeerIo`] hides a read-EOF from hyper while a request has been fully received and its
//!   response is not finished, and records it instead ([`Peer::read_closed`]).
//! - A streaming response writes anyway: a peer that left answers the next frame with a RST,
//!   the following write fails, hyper drops the body and the engine cancels.
//! - A JSON answer that is not ready when the read side closes becomes a probing response
//!   ([`json_or_probe`]): `200` at once, then a newline every [`PROBE_EVERY`] (leading
//!   whitespace is valid JSON) and finally the JSON object. A half-closed peer reads all of
//!   it; a peer that left resets the connection after the first newline.
//!
//! Once the response is finished, the EOF is passed on and hyper closes the connection.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::stream::{self, StreamExt};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::error::ApiError;

/// How often a probing response writes a newline while the answer is being generated.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

tokio::task_local! {
    /// The connection of the request being handled. A task-local instead of a request
    /// extension so that only the handler that needs it (the JSON answer) looks it up; every
    /// request runs inside the scope that [`Service`] opens.
    static PEER: Peer;
}

/// What a handler may learn about its connection.
#[derive(Clone)]
pub struct Peer(Arc<ConnState>);

struct ConnState {
    /// The request body was read to its end and the response is not finished: an EOF now
    /// may be a half-close, so it is held back from hyper.
    awaiting_response: AtomicBool,
    /// Becomes `true` once the peer's sending side closed (half or full, we cannot tell).
    read_closed: watch::Sender<bool>,
}

impl Peer {
    /// The connection of the current request, if it came through [`Service`].
    pub fn current() -> Option<Peer> {
        PEER.try_with(Clone::clone).ok()
    }

    /// Resolves once the peer has closed its sending side.
    pub async fn read_closed(&self) {
        let mut rx = self.0.read_closed.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// A request was received whole and its response is not finished yet: closing the
    /// connection now would cut an answer, not a request still arriving.
    pub fn answer_pending(&self) -> bool {
        self.0.awaiting_response.load(Ordering::Acquire)
    }
}

/// A new connection's socket, the service for its requests, and its [`Peer`].
pub fn accept(stream: TcpStream, app: Router) -> (PeerIo, Service, Peer) {
    let state = Arc::new(ConnState {
        awaiting_response: AtomicBool::new(false),
        read_closed: watch::channel(false).0,
    });
    (
        PeerIo {
            inner: stream,
            state: state.clone(),
        },
        Service {
            app: TowerToHyperService::new(app),
            state: state.clone(),
        },
        Peer(state),
    )
}

/// The socket as hyper sees it: reads and writes pass through, except a read-EOF while a
/// response is pending (see the module doc).
pub struct PeerIo {
    inner: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for PeerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let eof = buf.filled().len() == before && buf.remaining() > 0;
        if eof && self.state.awaiting_response.load(Ordering::Acquire) {
            self.state.read_closed.send_replace(true);
            // No read wake-up is registered (EOF stays readable); hyper's task is woken by
            // the response it is waiting for, polls again, and gets the EOF once that
            // response is finished.
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PeerIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router behind hyper, marking when a request was fully received and when its
/// response is finished, and running the handler inside the [`PEER`] scope.
#[derive(Clone)]
pub struct Service {
    app: TowerToHyperService<Router>,
    state: Arc<ConnState>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Service {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let state = self.state.clone();
        // From the moment hyper hands a request over, an EOF may be a half-close: hyper may
        // read it before the handler has taken the (already buffered) body, so waiting for
        // the body's end to start holding the EOF back would race. A body cut short by a
        // real close then ends in the handler's read timeout instead of at once.
        state.awaiting_response.store(true, Ordering::Release);
        let req: Request = req.map(|inner| {
            Body::new(Received {
                inner,
                state: state.clone(),
            })
        });
        let answer = hyper::service::Service::call(&self.app, req);
        Box::pin(PEER.scope(Peer(state.clone()), async move {
            let resp = answer.await?;
            Ok(resp.map(|inner| Body::new(Answered { inner, state })))
        }))
    }
}

/// The request body; its end means the request is complete.
struct Received {
    inner: Incoming,
    state: Arc<ConnState>,
}

impl hyper::body::Body for Received {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() || self.inner.is_end_stream() {
            self.state.awaiting_response.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body; hyper drops it once it is written (or the connection failed).
struct Answered {
    inner: Body,
    state: Arc<ConnState>,
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.state.awaiting_response.store(false, Ordering::Release);
    }
}

impl hyper::body::Body for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Awaits a JSON answer. If the peer closes its sending side first, answers `200` at once
/// with a body that probes with newlines until the answer is ready and then carries it (an
/// error then arrives as its JSON object under that `200`). Dropping the body, which hyper
/// does when a probe fails, drops `answer`, and with it the engine's receiver.
pub async fn json_or_probe<F>(answer: F) -> Result<Response, ApiError>
where
    F: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    let Some(peer) = Peer::current() else {
        return answer.await;
    };
    let mut answer = Box::pin(answer);
    tokio::select! {
        biased;
        r = &mut answer => return r,
        () = peer.read_closed() => {}
    }
    tracing::debug!("peer closed its sending side; probing while the answer is generated");
    let body = stream::unfold(Some(answer), |answer| async move {
        let mut answer = answer?;
        tokio::select! {
            biased;
            r = &mut answer => Some((json_bytes(r.unwrap_or_else(IntoResponse::into_response)).await, None)),
            () = tokio::time::sleep(PROBE_EVERY) => Some((Bytes::from_static(b"\n"), Some(answer))),
        }
    });
    let first = stream::iter([Bytes::from_static(b"\n")]);
    let mut resp = Body::from_stream(first.chain(body).map(Ok::<_, Infallible>)).into_response();
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The body of a finished JSON response.
async fn json_bytes(resp: Response) -> Bytes {
    match axum::body::to_bytes(resp.into_body(), usize::MAX).await {
        Ok(b) => b,
        Err(e) => Bytes::from(ApiError::internal(format!("serialization failed: {e}")).to_json()),
    }
}
