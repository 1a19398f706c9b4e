//! The connection cap: how many sockets the daemon holds open at most, and who makes room.
//!
//! Every open connection costs a file descriptor and a few KiB. Without a cap, idle or
//! trickling sockets (a scanner, a slowloris, clients that never close) take fds until
//! `accept` fails with `EMFILE` and the box stops answering. With it:
//! - Below the cap a connection is admitted.
//! - At the cap, the oldest connection that holds no answer (idle between requests, or a
//!   head still arriving) is closed to make room: a real client that sends its request at
//!   once is served however many idle sockets there are.
//! - When every open connection is being answered, the new one gets a `503` with
//!   `Retry-After` and is closed.
//!
//! The cap counts sockets until they are closed, lingering ones included, so the daemon's
//! fds stay below the cap plus [`FD_RESERVE`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::conn::Peer;
use super::error::ApiError;
use crate::metrics::ConnectionSeries;

/// File descriptors kept for the daemon itself (weights, the prompt cache's files, logs,
/// threads' eventfds) when the default cap is derived from the open-file limit.
pub const FD_RESERVE: u64 = 256;
/// The default cap when the fd limit allows it: far more than the clients a box with a few
/// slots serves at once, and the memory ledger charges each for [`CONNECTION_BYTES`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// What one open connection may hold, for the memory ledger. Measured on x86-64 with 4000
/// sockets: 12 KiB idle, 20 KiB with a head arriving (hyper's 8 KiB read buffer). Under a
/// flood that keeps replacing them (bench/flood.py, 30,000 sockets, cap 1024), RSS rose by
/// 54 KiB per place under the cap, 28 of which the same requests raise without a flood:
/// about 26 KiB for the connections, closing ones and allocator slack included.
pub const CONNECTION_BYTES: u64 = 48 << 10;
/// How long a refused connection gets to read its 503.
const REFUSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Raises the soft open-file limit to the hard one (systemd's default soft limit is 1024,
/// its hard limit far higher); returns the soft limit now in force.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let lim = nofile()?;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct passed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(raised.rlim_cur);
        }
    }
    Ok(lim.rlim_cur)
}

/// The open-file limits in force.
fn nofile() -> std::io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim)
}

/// The soft open-file limit in force (1024, Linux's default, when it cannot be read).
fn fd_limit() -> u64 {
    nofile().map_or(1024, |l| l.rlim_cur)
}

/// The cap for `requested` (`--max-connections`) under the current fd limit: by default
/// [`DEFAULT_MAX_CONNECTIONS`] or what the limit leaves after [`FD_RESERVE`]; a request the
/// limit cannot honour is refused rather than discovered as `EMFILE` under load.
pub fn max_connections(requested: Option<usize>) -> Result<usize, String> {
    cap_for(requested, fd_limit())
}

fn cap_for(requested: Option<usize>, fds: u64) -> Result<usize, String> {
    let room = usize::try_from(fds.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
    match requested {
        Some(0) => Err("must be at least 1".into()),
        Some(n) if n > room => Err(format!(
            "is {n}, but the open-file limit ({fds}) leaves room for {room} connections after \
             the {FD_RESERVE} kept for the daemon; raise the limit (systemd: LimitNOFILE=) or \
             lower max_connections"
        )),
        Some(n) => Ok(n),
        None if room < 16 => Err(format!(
            "cannot be derived: the open-file limit ({fds}) leaves room for {room} connections \
             after the {FD_RESERVE} kept for the daemon; raise the limit (systemd: \
             LimitNOFILE=)"
        )),
        None => Ok(room.min(DEFAULT_MAX_CONNECTIONS)),
    }
}

/// The open connections, oldest first.
pub struct ConnTable {
    max: usize,
    state: Mutex<Open>,
    series: Arc<ConnectionSeries>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    peers: BTreeMap<u64, Peer>,
}

/// A connection's place under the cap, given back when dropped.
pub struct Ticket {
    id: u64,
    table: Arc<ConnTable>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        open.peers.remove(&self.id);
        self.table.series.open.set(open.peers.len() as i64);
    }
}

impl ConnTable {
    pub fn new(max: usize, series: Arc<ConnectionSeries>) -> Arc<Self> {
        series.max.set(max as i64);
        Arc::new(Self {
            max,
            state: Mutex::new(Open::default()),
            series,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The map stays consistent whatever panicked while holding it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for `peer`, after closing the oldest connection holding no answer when at
    /// the cap; `None` when every open connection holds an answer (the caller refuses).
    pub fn admit(self: &Arc<Self>, peer: &Peer) -> Option<Ticket> {
        let mut open = self.lock();
        if open.peers.len() >= self.max {
            // Closing takes a moment (the connection's task must run): until then the
            // evicted one still counts, so the fds may pass the cap by the evictions in
            // flight, each of which ends within a scheduler turn.
            let Some(victim) = open.peers.values().find(|p| p.evictable()) else {
                self.series.refused.inc();
                return None;
            };
            victim.evict();
        }
        let id = open.next_id;
        open.next_id += 1;
        open.peers.insert(id, peer.clone());
        self.series.accepted.inc();
        self.series.open.set(open.peers.len() as i64);
        Some(Ticket {
            id,
            table: self.clone(),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// Answers a connection refused at the cap: a `503` in the OpenAI error shape, then close.
/// What the client sends meanwhile is read and dropped, so the close does not reset the
/// connection before the client has read the answer.
pub async fn refuse(mut stream: TcpStream, max: usize) {
    let body = ApiError::too_many_connections(max).to_json();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSE_GRACE, async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_follows_the_fd_limit() {
        assert_eq!(cap_for(None, 1_048_576), Ok(DEFAULT_MAX_CONNECTIONS));
        assert_eq!(cap_for(None, 1024), Ok(1024 - FD_RESERVE as usize));
        assert!(cap_for(None, 260).is_err(), "4 connections is no server");
    }

    #[test]
    fn a_cap_the_fd_limit_cannot_hold_is_refused() {
        assert_eq!(cap_for(Some(10_000), 20_000), Ok(10_000));
        let e = cap_for(Some(10_000), 1024).expect_err("over the limit");
        assert!(e.contains("1024") && e.contains("LimitNOFILE"), "{e}");
        assert!(cap_for(Some(0), 1024).is_err());
    }
}
