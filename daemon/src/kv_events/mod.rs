//! KV events: the prompt blocks this box's cells hold, published for a router in front.
//!
//! vllm-router's `kv_aware` policy subscribes to each worker's events and routes a request
//! to the box that holds the longest run of its blocks, instead of guessing from request
//! text. With `--kv-events ADDR:PORT` the daemon binds a ZeroMQ PUB socket there and tells
//! the router where it is through `GET /kv_event_sources` and `GET /get_server_info`.
//! Blocks in the slots' cells are announced as the engine's own cache (`medium` `"GPU"`),
//! those of the prompt cache's RAM tier as host memory (`"CPU"`), which the router credits
//! less (a restore is a copy). The disk tier is not announced: its writes finish on another
//! thread, after the decode thread has moved on.

pub mod blocks;
pub mod publisher;
pub mod wire;

pub use blocks::{BlockHash, BlockLedger, KvEvent, TierLedger};
pub use publisher::{start, BindError, KvEvents, Outbox, Source, TierEvents};

/// Tokens per block unless `--kv-events-block-size` says otherwise: vLLM's default, so a
/// router configured for vLLM workers needs no change.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
