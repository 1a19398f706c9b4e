//! The engine's shape, derived once from the validated config: what the memory ledger sizes,
//! what the backend allocates, and what `/v1/status` and `/metrics` report are one value.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::config::{PrefixCache, ServeConfig};
use crate::metrics::text::TextWriter;

/// Prompt tokens fed per step beside the running streams, and llama.cpp's widest
/// micro-batch. One number: a chunk then fits one micro-batch, and the ledger's compute
/// term (sized by the micro-batch) covers the widest step.
pub const STEP_TOKENS: u32 = 512;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnginePlan {
    /// Sequences decoded at once (one backend sequence each).
    pub slots: usize,
    /// Requests that may wait for a slot.
    pub queue: usize,
    /// Context length of each slot.
    pub ctx: u32,
    /// KV cells for all slots together.
    pub kv_cells: u32,
    /// Below `slots × ctx` cells the slots share one pool (llama.cpp's unified KV) and a
    /// request is admitted only when its cells are free; otherwise each slot owns `ctx`.
    pub shared_kv: bool,
    /// Most prompt tokens fed in one step.
    pub prefill_chunk: u32,
    /// Most tokens in one step: a prefill chunk plus one decode token per slot.
    pub n_batch: u32,
    /// Widest micro-batch the backend computes at once.
    pub n_ubatch: u32,
    pub threads: i32,
    /// Finished requests' KV cells stay for prompt reuse (exactly or relaxed).
    pub prefix_cache: PrefixCache,
    /// Backend sequences beyond the slots: idle ones retain prompt prefixes, and a request
    /// may start in any idle sequence (at most `slots` run at once).
    pub prefix_slots: usize,
    #[serde(skip)]
    pub queue_timeout: Duration,
    /// Test-only fault hook (`INFERLOOP_DEBUG_STALL_FILE`): while this file exists the decode
    /// loop blocks, so its heartbeat goes stale (the VM's systemd watchdog test).
    #[serde(skip)]
    pub debug_stall_file: Option<PathBuf>,
}

impl EnginePlan {
    pub fn from_config(config: &ServeConfig) -> Self {
        let full = u64::from(config.ctx) * config.slots as u64;
        let n_batch = STEP_TOKENS + config.slots as u32;
        Self {
            slots: config.slots,
            queue: config.queue,
            ctx: config.ctx,
            kv_cells: config.kv_cells,
            shared_kv: u64::from(config.kv_cells) < full,
            prefill_chunk: STEP_TOKENS,
            n_batch,
            n_ubatch: n_batch.min(STEP_TOKENS),
            threads: config.threads,
            prefix_cache: config.prefix_cache,
            prefix_slots: config.prefix_slots,
            queue_timeout: config.queue_timeout,
            debug_stall_file: config.debug_stall_file.clone(),
        }
    }

    /// The plan's series in `/metrics`, beside the live load they bound.
    pub fn render_metrics(&self, w: &mut TextWriter) {
        w.gauge(
            "inferloop_slots",
            "Sequences that may decode at once, as configured.",
            self.slots,
        );
        w.gauge(
            "inferloop_queue_capacity",
            "Requests that may wait for a slot.",
            self.queue,
        );
        w.gauge(
            "inferloop_kv_cells",
            "KV cells for all slots together.",
            u64::from(self.kv_cells),
        );
        w.gauge(
            "inferloop_prefix_slots",
            "Backend sequences beyond the slots, kept for prompt prefixes.",
            self.prefix_slots,
        );
    }

    /// Backend sequences: the slots, then the prefix slots.
    pub fn sequences(&self) -> usize {
        self.slots + self.prefix_slots
    }

    /// Cells the backend allocates: the shared pool, or `ctx` for every sequence.
    pub fn context_cells(&self) -> u32 {
        if self.shared_kv {
            self.kv_cells
        } else {
            self.ctx.saturating_mul(self.sequences() as u32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeLayer;

    fn plan(slots: usize, ctx: u32, kv_cells: Option<u32>) -> EnginePlan {
        let flags = ServeLayer {
            slots: Some(slots),
            ctx: Some(ctx),
            kv_cells,
            ..ServeLayer::default()
        };
        let config = ServeConfig::resolve(None, flags, ServeLayer::default()).expect("valid");
        EnginePlan::from_config(&config)
    }

    #[test]
    fn per_slot_kv_by_default_and_a_shared_pool_below_slots_times_ctx() {
        let p = plan(4, 2048, None);
        assert!(!p.shared_kv);
        assert_eq!((p.kv_cells, p.context_cells()), (8192, 8192));
        let p = plan(4, 2048, Some(4096));
        assert!(p.shared_kv);
        assert_eq!(p.context_cells(), 4096);
    }

    #[test]
    fn prefix_slots_are_free_in_a_shared_pool_and_cost_a_stream_each_otherwise() {
        let p = plan(4, 2048, Some(4096));
        assert_eq!(
            (p.prefix_slots, p.sequences(), p.context_cells()),
            (8, 12, 4096)
        );
        let p = plan(4, 2048, None);
        assert_eq!((p.prefix_slots, p.sequences()), (0, 4));
        let flags = ServeLayer {
            slots: Some(2),
            ctx: Some(1024),
            prefix_slots: Some(3),
            ..ServeLayer::default()
        };
        let p = EnginePlan::from_config(
            &ServeConfig::resolve(None, flags, ServeLayer::default()).expect("valid"),
        );
        assert_eq!((p.sequences(), p.context_cells()), (5, 5 * 1024));
    }

    #[test]
    fn the_plan_is_exported_as_gauges() {
        let mut w = TextWriter::new();
        plan(2, 1024, Some(1536)).render_metrics(&mut w);
        let text = w.finish();
        for line in [
            "inferloop_slots 2\n",
            "inferloop_queue_capacity 16\n",
            "inferloop_kv_cells 1536\n",
            "inferloop_prefix_slots 4\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_debug_stall_hook_comes_from_the_environment_into_the_plan() {
        let env = ServeLayer::from_env(|k| {
            (k == "INFERLOOP_DEBUG_STALL_FILE").then(|| "/run/stall".to_string())
        })
        .expect("valid");
        let config = ServeConfig::resolve(None, ServeLayer::default(), env).expect("valid");
        let p = EnginePlan::from_config(&config);
        assert_eq!(p.debug_stall_file, Some("/run/stall".into()));
        assert_eq!(plan(1, 512, None).debug_stall_file, None);
    }

    #[test]
    fn a_prefill_chunk_is_one_micro_batch_and_the_batch_adds_a_token_per_slot() {
        let p = plan(4, 2048, None);
        assert_eq!((p.prefill_chunk, p.n_ubatch, p.n_batch), (512, 512, 516));
    }
}
