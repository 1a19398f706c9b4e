//! Integration tests: each starts the real `inferloopd` binary on `127.0.0.1:0` with the real
//! model and talks to it over HTTP, as a client would.
//!
//! The model comes from `INFERLOOP_TEST_MODEL` (default `models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! under the workspace root; `make model` fetches it). Read-only tests share one daemon;
//! tests that need their own settings (queue limits, auth, shutdown) start a dedicated one.

mod harness;

mod api;
mod chat;
mod choices;
mod connections;
mod disks;
mod golden;
mod input;
mod kv_events;
mod kv_type;
mod lifecycle;
mod load;
mod memory;
mod native;
mod parity;
mod prefix;
mod prompt;
mod quantize;
mod router;
mod spec;
mod spec_draft;
mod stream;
mod structured;
mod template;
mod thermal;
mod tiers;
mod tls;
mod tool_forms;
