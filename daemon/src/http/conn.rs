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
//!
//! Each connection also tracks its [`Phase`] (idle, a head arriving, answering): the idle
//! and header timeouts run from it, and at the connection cap only a connection that holds
//! no answer may be closed to make room ([`super::limits`]).
//!
//! Closing a socket with unread request bytes makes the kernel send a RST, which can reach a
//! client still writing its body before it reads the answer (a 413 sent on `Content-Length`
//! alone): it sees a broken pipe instead of the 413. So a dropped connection lingers: its
//! sending side is shut, and what the peer still sends is read and discarded until it closes,
//! for at most [`LINGER`] and [`LINGER_BYTES`].

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
use tokio::time::Instant;

use super::error::ApiError;
use super::limits::{ConnTable, Ticket};

/// How often a probing response writes a newline while the answer is being generated.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// How long a closed connection keeps discarding what its peer still sends.
const LINGER: Duration = Duration::from_secs(2);
/// How much a closed connection discards at most.
const LINGER_BYTES: usize = 16 << 20;

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
    phase: watch::Sender<Phase>,
    /// Becomes `true` when the connection cap closes this connection to make room.
    evicted: watch::Sender<bool>,
    /// Closed for a timeout or the cap: nothing is owed to the peer, so the socket is
    /// closed at once instead of lingering (a flood must not hold fds for [`LINGER`]).
    no_linger: AtomicBool,
}

/// Where a connection stands, for its timeouts and for eviction at the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the next request's first byte, since then.
    Idle(Instant),
    /// A request's head is arriving, since its first byte.
    Head(Instant),
    /// A request was handed to the router and its response is not finished.
    Busy,
}

/// Why a connection was closed before its peer closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// A request's head (or, for a body, the handler's read) took longer than the read
    /// timeout.
    HeaderTimeout,
    /// No request came within the idle timeout.
    IdleTimeout,
    /// The connection cap closed it to make room for a new one.
    Evicted,
}

impl Expiry {
    /// The `reason` label of `inferloop_connections_closed_total`.
    pub fn label(self) -> &'static str {
        match self {
            Expiry::HeaderTimeout => "header_timeout",
            Expiry::IdleTimeout => "idle_timeout",
            Expiry::Evicted => "evicted",
        }
    }
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

    /// Holds no answer and is not being closed already: the cap may close it.
    pub fn evictable(&self) -> bool {
        !matches!(*self.0.phase.borrow(), Phase::Busy) && !*self.0.evicted.borrow()
    }

    /// Closes the connection to make room under the cap (see [`Peer::expired`]).
    pub fn evict(&self) {
        self.0.evicted.send_replace(true);
    }

    /// Resolves when the connection must be closed: idle past `idle`, a head arriving for
    /// longer than `read`, or evicted. Never while a request is being answered.
    pub async fn expired(&self, read: std::time::Duration, idle: std::time::Duration) -> Expiry {
        let mut phase = self.0.phase.subscribe();
        let mut evicted = self.0.evicted.subscribe();
        let expiry = loop {
            let now = *phase.borrow_and_update();
            let deadline = match now {
                Phase::Idle(since) => Some((since + idle, Expiry::IdleTimeout)),
                Phase::Head(since) => Some((since + read, Expiry::HeaderTimeout)),
                Phase::Busy => None,
            };
            let timer = async {
                match deadline {
                    Some((at, expiry)) => {
                        tokio::time::sleep_until(at).await;
                        expiry
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // The senders live in `self`: neither wait can fail while it is held.
                _ = evicted.wait_for(|e| *e) => break Expiry::Evicted,
                _ = phase.changed() => continue,
                expiry = timer => break expiry,
            }
        };
        self.0.no_linger.store(true, Ordering::Release);
        expiry
    }
}

/// A new connection's socket, the service for its requests, and its [`Peer`]; the stream
/// back when `table` is at its cap and no open connection can make room.
pub fn accept(
    stream: TcpStream,
    app: Router,
    table: &Arc<ConnTable>,
) -> Result<(PeerIo, Service, Peer), TcpStream> {
    let state = Arc::new(ConnState {
        awaiting_response: AtomicBool::new(false),
        read_closed: watch::channel(false).0,
        phase: watch::channel(Phase::Idle(Instant::now())).0,
        evicted: watch::channel(false).0,
        no_linger: AtomicBool::new(false),
    });
    let peer = Peer(state.clone());
    let Some(ticket) = table.admit(&peer) else {
        return Err(stream);
    };
    Ok((
        PeerIo {
            inner: Some(stream),
            state: state.clone(),
            ticket: Some(ticket),
        },
        Service {
            app: TowerToHyperService::new(app),
            state,
        },
        peer,
    ))
}

/// The socket as hyper sees it: reads and writes pass through, except a read-EOF while a
/// response is pending (see the module doc).
pub struct PeerIo {
    /// `None` only once dropped, when the socket moves to [`linger`].
    inner: Option<TcpStream>,
    state: Arc<ConnState>,
    /// The connection's place under the cap; it goes with the socket until it is closed.
    ticket: Option<Ticket>,
}

impl PeerIo {
    fn socket(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.inner
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl Drop for PeerIo {
    fn drop(&mut self) {
        if self.state.no_linger.load(Ordering::Acquire) {
            return;
        }
        if let (Some(stream), Ok(runtime)) =
            (self.inner.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(linger(stream, self.ticket.take()));
        }
    }
}

/// Shuts the sending side and discards what the peer still sends, so that closing never
/// resets a connection whose answer the peer has not read yet. The socket keeps its
/// `ticket` (its place under the cap) until it is closed.
async fn linger(mut stream: TcpStream, ticket: Option<Ticket>) {
    let _ticket = ticket;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // hyper may have shut it already; the draining below matters either way.
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 64 * 1024];
    let mut discarded = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while discarded < LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => discarded += n,
            }
        }
    })
    .await;
}

impl AsyncRead for PeerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(self.socket()?.poll_read(cx, buf))?;
        let eof = buf.filled().len() == before && buf.remaining() > 0;
        if !eof {
            // The first byte of a request ends the idle wait and starts the header timeout.
            self.state.phase.send_if_modified(|p| match p {
                Phase::Idle(_) => {
                    *p = Phase::Head(Instant::now());
                    true
                }
                _ => false,
            });
        }
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
        self.socket()?.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.socket()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(TcpStream::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.socket()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.socket()?.poll_shutdown(cx)
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
        state.phase.send_replace(Phase::Busy);
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
        self.state.phase.send_replace(Phase::Idle(Instant::now()));
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
