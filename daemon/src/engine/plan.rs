//! The engine's shape, derived once from the validated config: what the memory ledger sizes,
//! what the backend allocates, and what `/v1/status` and `/metrics` report are one value.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::config::{ConfigError, KvTypes, PrefixCache, ServeConfig, Spec, SpecGate};
use crate::engine::prompt_cache::{DiskPlan, TiersPlan};
use crate::metrics::text::TextWriter;

/// Prompt tokens fed per step beside the running streams, and llama.cpp's widest
/// micro-batch. One number: a chunk then fits one micro-batch, and the ledger's compute
/// term (sized by the micro-batch) covers the widest step.
pub const STEP_TOKENS: u32 = 512;

/// Most drafted tokens one sequence verifies in a step (`--spec`).
pub const MAX_DRAFT: u32 = 8;

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
    /// The KV cells' element types, K and V (`--kv-type`).
    pub kv_type: KvTypes,
    /// Most prompt tokens fed in one step.
    pub prefill_chunk: u32,
    /// Most tokens in one step: a prefill chunk plus one decode token per slot, and with
    /// speculation up to [`MAX_DRAFT`] drafted ones each.
    pub n_batch: u32,
    /// Widest micro-batch the backend computes at once.
    pub n_ubatch: u32,
    pub threads: i32,
    /// Finished requests' KV cells stay for prompt reuse (every row, or exactly).
    pub prefix_cache: PrefixCache,
    /// Backend sequences beyond the slots: idle ones retain prompt prefixes, and a request
    /// may start in any idle sequence (at most `slots` run at once).
    pub prefix_slots: usize,
    /// The prompt cache's RAM and disk tiers (both off without prompt reuse).
    pub prompt_cache: TiersPlan,
    /// Speculative decoding (`--spec`).
    pub spec: Spec,
    /// Which drafts a step verifies (`--spec-gate`).
    pub spec_gate: SpecGate,
    #[serde(skip)]
    pub queue_timeout: Duration,
    /// The longest a step should take (`None`: no limit). Under systemd's watchdog a step
    /// longer than the ping interval stops the pings and gets the daemon killed mid-request,
    /// so the prompt tokens a step feeds are cut to what the measured prefill rate says fits
    /// (a big model on a slow CPU: a 512-token chunk can take tens of seconds).
    #[serde(skip)]
    pub step_time_limit: Option<Duration>,
    /// Test-only fault hook (`INFERLOOP_DEBUG_STALL_FILE`): while this file exists the decode
    /// loop blocks, so its heartbeat goes stale (the VM's systemd watchdog test); while the
    /// same path with `.load` appended exists the model load blocks, so a test can signal
    /// the daemon mid-load.
    #[serde(skip)]
    pub debug_stall_file: Option<PathBuf>,
}

/// What a plan is derived from: the settings as given, before any default that depends on
/// the others (the pool size, the prefix slots) is filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSpec {
    pub slots: usize,
    pub queue: usize,
    pub ctx: u32,
    /// `None`: `slots × ctx`, a stream per slot.
    pub kv_cells: Option<u32>,
    pub kv_type: KvTypes,
    pub threads: i32,
    pub prefix_cache: PrefixCache,
    /// `None`: twice the slots in a shared pool (where they cost no memory), else none.
    pub prefix_slots: Option<usize>,
    /// The tiers as configured; the RAM tier's default size is set at boot, from the
    /// ledger's headroom.
    pub prompt_cache: TiersPlan,
    pub spec: Spec,
    pub spec_gate: SpecGate,
    pub queue_timeout: Duration,
    pub debug_stall_file: Option<PathBuf>,
}

impl PlanSpec {
    /// A spec with the serve defaults around `slots` and `ctx` (tests vary the rest).
    pub fn new(slots: usize, ctx: u32) -> Self {
        Self {
            slots,
            queue: 16,
            ctx,
            kv_cells: None,
            kv_type: KvTypes::F16,
            threads: 1,
            prefix_cache: PrefixCache::On,
            prefix_slots: None,
            prompt_cache: TiersPlan::default(),
            spec: Spec::Ngram,
            spec_gate: SpecGate::Cost,
            queue_timeout: Duration::from_secs(30),
            debug_stall_file: None,
        }
    }
}

/// llama.cpp's `LLAMA_MAX_SEQ`: the slots and prefix slots together.
const MAX_SEQUENCES: usize = 256;

impl EnginePlan {
    /// Blocks the decode loop while the plan's `debug_stall_file` exists (see the field).
    pub fn debug_stall_decode(&self) {
        if let Some(path) = &self.debug_stall_file {
            Self::debug_stall(path, "decode loop");
        }
    }

    /// Blocks the model load while the plan's `debug_stall_file` with `.load` appended
    /// exists (see the field).
    pub fn debug_stall_load(&self) {
        if let Some(path) = &self.debug_stall_file {
            let mut load = path.clone().into_os_string();
            load.push(".load");
            Self::debug_stall(std::path::Path::new(&load), "model load");
        }
    }

    fn debug_stall(path: &std::path::Path, what: &str) {
        if path.exists() {
            tracing::warn!(path = %path.display(), "debug stall file present: {what} blocked");
            while path.exists() {
                std::thread::sleep(Duration::from_millis(200));
            }
            tracing::warn!("debug stall file gone: {what} resumes");
        }
    }

    /// The plan of a validated config.
    pub fn from_config(config: &ServeConfig) -> Result<Self, ConfigError> {
        Self::new(PlanSpec {
            slots: config.slots,
            queue: config.queue,
            ctx: config.ctx,
            kv_cells: config.kv_cells,
            kv_type: config.kv_type,
            threads: config.threads,
            prefix_cache: config.prefix_cache,
            prefix_slots: config.prefix_slots,
            prompt_cache: TiersPlan {
                ram_bytes: config.prompt_cache_ram.unwrap_or(0),
                disk: config.state_dir.as_ref().map(|d| DiskPlan {
                    dir: d.join("prompt-cache"),
                    bytes: config.prompt_cache_disk,
                }),
            },
            spec: config.spec,
            spec_gate: config.spec_gate,
            queue_timeout: config.queue_timeout,
            debug_stall_file: config.debug_stall_file.clone(),
        })
    }

    /// The one place cells, sequences and sharing are derived; the errors name the setting.
    pub fn new(spec: PlanSpec) -> Result<Self, ConfigError> {
        let invalid = |field, message: String| ConfigError::Invalid { field, message };
        let full = full_cells(spec.slots, spec.ctx).min(u64::from(u32::MAX)) as u32;
        let kv_cells = spec.kv_cells.unwrap_or(full);
        if kv_cells < spec.ctx || kv_cells > full {
            return Err(invalid(
                "kv_cells",
                format!(
                    "must be between ctx ({}) and slots x ctx ({full})",
                    spec.ctx
                ),
            ));
        }
        let shared_kv = kv_cells < full;
        let prefix_slots = match (spec.prefix_cache.enabled(), spec.prefix_slots) {
            (false, _) => 0,
            (true, Some(n)) => n,
            // They cost no memory in a shared pool: keep twice as many prompts as run.
            (true, None) if shared_kv => 2 * spec.slots,
            (true, None) => 0,
        };
        if spec.slots + prefix_slots > MAX_SEQUENCES {
            return Err(invalid(
                "prefix_slots",
                format!(
                    "must be at most {} ({MAX_SEQUENCES} sequences with the slots)",
                    MAX_SEQUENCES.saturating_sub(spec.slots)
                ),
            ));
        }
        let per_slot = if spec.spec.enabled() {
            1 + MAX_DRAFT
        } else {
            1
        };
        let n_batch = STEP_TOKENS + spec.slots as u32 * per_slot;
        Ok(Self {
            slots: spec.slots,
            queue: spec.queue,
            ctx: spec.ctx,
            kv_cells,
            shared_kv,
            kv_type: spec.kv_type,
            prefill_chunk: STEP_TOKENS,
            n_batch,
            n_ubatch: n_batch.min(STEP_TOKENS),
            threads: spec.threads,
            prefix_cache: spec.prefix_cache,
            prefix_slots,
            prompt_cache: if spec.prefix_cache.enabled() {
                spec.prompt_cache
            } else {
                TiersPlan::default()
            },
            spec: spec.spec,
            spec_gate: spec.spec_gate,
            queue_timeout: spec.queue_timeout,
            step_time_limit: None,
            debug_stall_file: spec.debug_stall_file,
        })
    }

    /// Cells for a whole context per slot: `slots × ctx`.
    pub fn full_cells(&self) -> u64 {
        full_cells(self.slots, self.ctx)
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

    /// The draft model's context (`--spec draft`): the same sequences and batch, one pool of
    /// `slots × ctx` cells (at most `slots` sequences draft at once, and a sequence's cells
    /// are freed when its request leaves its slot), no prompt reuse of its own.
    pub fn draft_plan(&self) -> EnginePlan {
        let full = self.full_cells().min(u64::from(u32::MAX)) as u32;
        EnginePlan {
            kv_cells: full,
            shared_kv: true,
            prefix_cache: PrefixCache::Off,
            prompt_cache: TiersPlan::default(),
            ..self.clone()
        }
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

fn full_cells(slots: usize, ctx: u32) -> u64 {
    slots as u64 * u64::from(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeLayer;

    fn plan(slots: usize, ctx: u32, kv_cells: Option<u32>) -> EnginePlan {
        EnginePlan::new(PlanSpec {
            kv_cells,
            ..PlanSpec::new(slots, ctx)
        })
        .expect("valid")
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
        let p = EnginePlan::new(PlanSpec {
            prefix_slots: Some(3),
            ..PlanSpec::new(2, 1024)
        })
        .expect("valid");
        assert_eq!((p.sequences(), p.context_cells()), (5, 5 * 1024));
    }

    #[test]
    fn a_config_becomes_its_plan_and_bad_geometry_names_the_setting() {
        let flags = ServeLayer {
            slots: Some(2),
            ctx: Some(1024),
            kv_cells: Some(1536),
            ..ServeLayer::default()
        };
        let config = ServeConfig::resolve(None, flags, ServeLayer::default()).expect("valid");
        let p = EnginePlan::from_config(&config).expect("valid");
        assert_eq!((p.kv_cells, p.shared_kv, p.prefix_slots), (1536, true, 4));
        for (kv_cells, ok) in [(512, false), (1024, true), (2048, true), (2049, false)] {
            let r = EnginePlan::new(PlanSpec {
                kv_cells: Some(kv_cells),
                ..PlanSpec::new(2, 1024)
            });
            assert_eq!(r.is_ok(), ok, "{kv_cells}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("kv_cells"), "{e}");
            }
        }
        let err = EnginePlan::new(PlanSpec {
            prefix_slots: Some(253),
            ..PlanSpec::new(4, 1024)
        })
        .expect_err("257 sequences");
        assert!(err.to_string().contains("prefix_slots"), "{err}");
        assert!(err.to_string().contains("at most 252"), "{err}");
    }

    #[test]
    fn the_plan_is_exported_as_gauges() {
        let p = plan(2, 1024, Some(1536));
        let text = crate::metrics::text::render(move |w| p.render_metrics(w));
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
        let p = EnginePlan::from_config(&config).expect("valid");
        assert_eq!(p.debug_stall_file, Some("/run/stall".into()));
        assert_eq!(plan(1, 512, None).debug_stall_file, None);
    }

    #[test]
    fn a_prefill_chunk_is_one_micro_batch_and_the_batch_adds_a_token_per_slot() {
        let p = plan(4, 2048, None);
        // With speculation (the default) each slot may verify `MAX_DRAFT` drafts too.
        assert_eq!((p.prefill_chunk, p.n_ubatch, p.n_batch), (512, 512, 548));
        let off = EnginePlan::new(PlanSpec {
            spec: Spec::Off,
            ..PlanSpec::new(4, 2048)
        })
        .expect("valid");
        assert_eq!(
            (off.prefill_chunk, off.n_ubatch, off.n_batch),
            (512, 512, 516)
        );
    }
}
