//! KV events: the prompt blocks this box's cells hold, published for a router in front.
//!
//! vllm-router's `kv_aware` policy subscribes to each worker's events and routes a request
//! to the box that holds the longest run of its blocks, instead of guessing from request
//! text. With `--kv-events ADDR:PORT` the daemon binds a ZeroMQ PUB socket there and tells
//! the router where it is through `GET /kv_event_sources` and `GET /get_server_info`.
//! Only blocks in the slots' cells are announced: the router credits the engine's own cache
//! alone (`medium` `"GPU"`), not the prompt cache's RAM and disk tiers.

pub mod blocks;
pub mod publisher;
pub mod wire;

pub use blocks::{BlockHash, BlockLedger, KvEvent};
pub use publisher::{start, BindError, KvEvents, Outbox, Source};

/// Tokens per block unless `--kv-events-block-size` says otherwise: vLLM's default, so a
/// router configured for vLLM workers needs no change.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
