//! The ZeroMQ PUB socket a router subscribes to, and the outbox the decode thread fills.
//!
//! The decode thread never waits on the network: it numbers each batch and hands it to a
//! bounded queue; the socket's task encodes and sends. A batch lost anywhere (the queue
//! full, no subscriber yet, a slow one) leaves a gap in the numbers, and on a gap the
//! router forgets what it knew of this box and starts over from the next batch, instead of
//! trusting a wrong picture.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

use super::blocks::{BlockLedger, KvEvent, TierLedger};
use super::wire::{self, Medium};

/// Batches waiting for the socket; past this the decode thread drops them (a gap).
const QUEUE: usize = 1024;

#[derive(Debug, thiserror::Error)]
#[error("cannot bind the KV event publisher on tcp://{addr}: {message}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub message: String,
}

/// What a router is told about the publisher (`/kv_event_sources`, `/get_server_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `tcp://*:PORT` when bound to every address: the router puts the box's host in.
    pub endpoint: String,
    pub block_size: u32,
}

#[derive(Debug)]
struct Batch {
    seq: i64,
    medium: Medium,
    events: Vec<KvEvent>,
}

/// The decode thread's end: numbers batches and queues them without waiting. Clones share
/// the numbering; all of them are used from the decode thread, so numbers go out in order.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Batch>,
    seq: Arc<AtomicI64>,
    block_size: u32,
    dropped: Counter,
}

impl Outbox {
    fn send(&mut self, medium: Medium, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if self
            .tx
            .try_send(Batch {
                seq,
                medium,
                events,
            })
            .is_err()
            && self.dropped.inc() == 0
        {
            tracing::warn!("KV event queue full: batches dropped; routers will resynchronise");
        }
    }
}

/// Binds the PUB socket and starts its task on the current runtime; `sent` and `dropped`
/// count batches.
pub async fn start(
    addr: SocketAddr,
    block_size: u32,
    sent: Counter,
    dropped: Counter,
) -> Result<(Source, Outbox), BindError> {
    let mut socket = zeromq::PubSocket::new();
    let bound = socket
        .bind(&format!("tcp://{addr}"))
        .await
        .map_err(|e| BindError {
            addr,
            message: e.to_string(),
        })?;
    // The port the socket got (port 0 asks for any).
    let port = match &bound {
        zeromq::Endpoint::Tcp(_, port) => *port,
        _ => addr.port(),
    };
    let endpoint = if addr.ip().is_unspecified() {
        format!("tcp://*:{port}")
    } else {
        format!("tcp://{}", SocketAddr::new(addr.ip(), port))
    };
    tracing::info!(%endpoint, block_size, "publishing KV events");
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %endpoint,
            "KV events carry prompt token ids in the clear to any subscriber: bind them to \
             a private interface or firewall the port"
        );
    }
    let (tx, mut rx) = mpsc::channel::<Batch>(QUEUE);
    tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            // Frames: topic (empty), sequence number (8 bytes big-endian), payload.
            let mut message = ZmqMessage::from(Vec::<u8>::new());
            message.push_back(batch.seq.to_be_bytes().to_vec().into());
            message.push_back(wire::encode(ts, &batch.events, block_size, batch.medium).into());
            match socket.send(message).await {
                Ok(()) => {
                    sent.inc();
                }
                Err(e) => tracing::warn!(error = %e, seq = batch.seq, "KV event batch not sent"),
            }
        }
    });
    Ok((
        Source {
            endpoint,
            block_size,
        },
        Outbox {
            tx,
            seq: Arc::new(AtomicI64::new(0)),
            block_size,
            dropped,
        },
    ))
}

/// The decode thread's half: the blocks each slot holds, and the outbox their changes go to.
#[derive(Debug)]
pub struct KvEvents {
    ledger: BlockLedger,
    outbox: Outbox,
}

impl KvEvents {
    /// Starts with an `AllBlocksCleared`: a router that knew this box before it restarted
    /// drops what it knew.
    pub fn new(slots: usize, mut outbox: Outbox) -> Self {
        outbox.send(Medium::Device, vec![KvEvent::AllCleared]);
        Self {
            ledger: BlockLedger::new(slots, outbox.block_size as usize),
            outbox,
        }
    }

    /// The slot now holds `tokens` and nothing else.
    pub fn replace(&mut self, slot: usize, tokens: &[i32]) {
        let events = self.ledger.replace(slot, tokens);
        self.outbox.send(Medium::Device, events);
    }

    /// The slot's tokens grew to `tokens`.
    pub fn extend(&mut self, slot: usize, tokens: &[i32]) {
        let events = self.ledger.extend(slot, tokens);
        self.outbox.send(Medium::Device, events);
    }
}

/// The prompt cache RAM tier's half: the prefixes it holds, published as host blocks, which
/// vllm-router credits at `--kv-penalty-host` (a restore from RAM costs a copy, not a
/// prefill).
#[derive(Debug)]
pub struct TierEvents {
    ledger: TierLedger,
    outbox: Outbox,
}

impl TierEvents {
    pub fn new(outbox: Outbox) -> Self {
        Self {
            ledger: TierLedger::new(outbox.block_size as usize),
            outbox,
        }
    }

    /// The tier now holds `entries`.
    pub fn sync<'a>(&mut self, entries: impl Iterator<Item = &'a Arc<[i32]>>) {
        let events = self.ledger.sync(entries);
        self.outbox.send(Medium::Host, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full queue drops the batch but not its number: the router sees the gap.
    #[test]
    fn a_full_queue_drops_batches_and_leaves_a_gap_in_the_numbers() {
        let (tx, mut rx) = mpsc::channel(1);
        let dropped = Counter::default();
        let mut outbox = Outbox {
            tx,
            seq: Arc::new(AtomicI64::new(0)),
            block_size: 16,
            dropped: dropped.clone(),
        };
        let mut tier = outbox.clone();
        outbox.send(Medium::Device, vec![KvEvent::AllCleared]);
        tier.send(Medium::Host, vec![KvEvent::AllCleared]);
        outbox.send(Medium::Device, Vec::new());
        assert_eq!(dropped.get(), 1, "the second batch found the queue full");
        assert_eq!(rx.try_recv().map(|b| b.seq).ok(), Some(0));
        outbox.send(Medium::Device, vec![KvEvent::AllCleared]);
        let next = rx.try_recv().expect("queued");
        assert_eq!(
            (next.seq, next.medium),
            (2, Medium::Device),
            "1 was dropped"
        );
    }
}
