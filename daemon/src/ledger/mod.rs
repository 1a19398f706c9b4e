//! The memory ledger: what the configured daemon will need, term by term, computed from the
//! GGUF header and the settings before anything large is allocated, and the decision against
//! the tightest limit that applies.

pub mod limits;

use std::fmt::Write as _;

use serde::Serialize;

// The header is read by the workspace's one GGUF reader.
pub use inferloop_gguf::{read_shape, GgufError, ModelShape};
pub use limits::{read_limits, Limit, LimitSource};

use crate::engine::native::forward::UBATCH;
use crate::engine::select::{BackendKind, Device};
use crate::metrics::TextWriter;

const MIB: f64 = 1024.0 * 1024.0;

/// Process memory that is not weights, KV or compute: binary, allocator, async runtime,
/// llama.cpp's tokenizer tables. Measured with `bench/memory.py` on the default model.
const OVERHEAD_BASE: u64 = 30 << 20;
const OVERHEAD_PER_VOCAB_TOKEN: u64 = 160;
/// Each slot's sampler chain keeps a candidate array over the vocabulary (`llama_token_data`,
/// 12 B) plus its working copy: measured as ~0.8 MiB per slot on a 49,152-token vocabulary.
const OVERHEAD_PER_SLOT_VOCAB_TOKEN: u64 = 16;
/// KV cache element size (llama.cpp's default f16 K and V).
const KV_ELEM_BYTES: u64 = 2;
/// llama.cpp rounds each sequence's context up to this many cells.
const KV_PAD: u64 = 256;

/// Settings the ledger depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub slots: u64,
    /// Context of each slot.
    pub ctx: u64,
    /// KV cells for all slots together (`slots × ctx` unless oversubscribed).
    pub kv_cells: u64,
    /// One pool of `kv_cells` shared by the slots, rather than `ctx` cells per slot.
    pub shared_kv: bool,
    /// Sequences that only retain prompt prefixes: `ctx` cells more each without a shared
    /// pool, nothing with one (they hold cells of the pool).
    pub prefix_slots: u64,
    /// llama.cpp micro-batch: the widest prefill step.
    pub n_ubatch: u64,
    /// Explicit margin; `None` = 5% of the rest, at least 16 MiB.
    pub margin_bytes: Option<u64>,
    /// The engine the terms are for: llama.cpp's buffers and the native forward's differ.
    pub backend: BackendKind,
    /// Where the native forward keeps weights and KV: on CUDA they are copied to GPU
    /// memory, which on a Jetson is the same DRAM, so the same bytes count.
    pub device: Device,
}

/// One named line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Term {
    pub name: &'static str,
    pub bytes: u64,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ledger {
    pub terms: Vec<Term>,
    /// What llama.cpp reserves for its compute graph (its "CPU compute buffer size"); the
    /// `compute` term is the part the daemon's worst case touches.
    pub compute_reserved_bytes: u64,
}

/// The safety margin over `subtotal`: configured, else 5% of it, at least 16 MiB.
fn margin_term(plan: &Plan, subtotal: u64) -> Term {
    match plan.margin_bytes {
        Some(bytes) => Term {
            name: "margin",
            bytes,
            detail: "configured".into(),
        },
        None => Term {
            name: "margin",
            bytes: (subtotal / 20).max(16 << 20),
            detail: "5% of the above, at least 16 MiB".into(),
        },
    }
}

impl Ledger {
    pub fn compute(shape: &ModelShape, plan: &Plan) -> Self {
        if plan.backend == BackendKind::Native {
            return Self::native(shape, plan);
        }
        let u = plan.n_ubatch;
        let per_slot = plan.ctx.div_ceil(KV_PAD) * KV_PAD;
        let cells = if plan.shared_kv {
            plan.kv_cells.div_ceil(KV_PAD) * KV_PAD
        } else {
            per_slot * (plan.slots + plan.prefix_slots)
        };
        let per_cell =
            shape.n_layer * shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v) * KV_ELEM_BYTES;
        let kv = cells * per_cell;
        let ctx_seq = per_slot.min(cells);
        // One micro-batch's graph: FFN gate/up (f32) and the residual, and the f16 attention
        // mask over the sequence's context. llama.cpp reserves its compute buffer for that
        // graph plus logits for every token of the micro-batch (n_ubatch × n_vocab).
        let activations = 4 * u * (2 * shape.n_ff + shape.n_embd) + 2 * u * ctx_seq;
        let logits = 4 * shape.n_vocab * plan.slots;
        let compute_reserved = 4 * u * shape.n_vocab + activations + logits;
        // What the worst case (every slot full, full prefill micro-batches next to decode
        // steps) touches. inferloopd never asks for prompt logits, so at most one logits row
        // per slot is written, in the graph and in llama.cpp's output buffer. But the graph
        // allocator lays out a prefill step and a decode step differently (it re-plans when
        // the graph changes), and the freed FFN tensors of the reserved layout sit where its
        // logits go: a full micro-batch's activations land at two sets of offsets, and pages
        // once touched stay resident. Charging one layout undercounted the measured peak by
        // 5.7 MiB at 4 slots × 2048 (issue 10); two layouts bound the 11–19 MiB measured
        // from 1 × 512 to 1 × 8192 with 24–38% to spare, and never exceed the reservation.
        let compute = (2 * activations + 2 * logits).min(compute_reserved);
        let overhead = OVERHEAD_BASE
            + OVERHEAD_PER_VOCAB_TOKEN * shape.n_vocab
            + OVERHEAD_PER_SLOT_VOCAB_TOKEN * shape.n_vocab * plan.slots;
        let weights = shape.tensor_bytes;
        let subtotal = weights + kv + compute + overhead;
        Self {
            terms: vec![
                Term {
                    name: "weights",
                    bytes: weights,
                    detail: format!(
                        "{} tensor bytes, mapped once for all slots",
                        shape.architecture
                    ),
                },
                Term {
                    name: "kv",
                    bytes: kv,
                    detail: format!(
                        "{cells} cells x {} layers x {} kv heads x ({}+{}) dims x {KV_ELEM_BYTES} B",
                        shape.n_layer, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v
                    ),
                },
                Term {
                    name: "compute",
                    bytes: compute,
                    detail: format!(
                        "micro-batch {u} activations in two layouts + logits for {} slots (llama.cpp reserves {:.1} MiB)",
                        plan.slots,
                        compute_reserved as f64 / MIB
                    ),
                },
                Term {
                    name: "overhead",
                    bytes: overhead,
                    detail: format!(
                        "runtime, allocator, tokenizer tables, samplers for {} slots (measured)",
                        plan.slots
                    ),
                },
                margin_term(plan, subtotal),
            ],
            compute_reserved_bytes: compute_reserved,
        }
    }

    /// The native backend: the mapped weights, an f16 KV cache of `ctx` positions for every
    /// sequence (no padding, no shared pool), the forward's fixed scratch, and the same
    /// process overhead (llama.cpp still holds the tokenizer tables).
    fn native(shape: &ModelShape, plan: &Plan) -> Self {
        let sequences = plan.slots + plan.prefix_slots;
        let kv_dim2 = shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v);
        let kv = shape.n_layer * sequences * plan.ctx * kv_dim2 * KV_ELEM_BYTES;
        let u = UBATCH as u64;
        let q_dim = shape.n_head * shape.head_dim_k;
        // Per pass row: the residual and its normalized copy, the attention output's
        // projection, Q and the attention result, K and V, and the FFN gate, up and product.
        let rows = 4 * u * (3 * shape.n_embd + 2 * q_dim + kv_dim2 + 3 * shape.n_ff);
        // Attention scores for one head over the context, per token of a pass.
        let attention = 4 * u * shape.n_head * plan.ctx.min(256);
        // A logits row per sampling sequence, and each sampler's copies of it.
        let logits = 4 * shape.n_vocab * sequences;
        let samplers = 12 * shape.n_vocab * plan.slots;
        // On CUDA the pass's activations live on the GPU too, with a logits row per pass
        // token to copy back from.
        let gpu = match plan.device {
            Device::Cpu => 0,
            Device::Cuda => rows + 4 * u * shape.n_vocab,
        };
        let scratch = rows + attention + logits + samplers + gpu;
        let overhead = OVERHEAD_BASE + OVERHEAD_PER_VOCAB_TOKEN * shape.n_vocab;
        let weights = shape.tensor_bytes;
        let (weights_where, kv_where) = match plan.device {
            Device::Cpu => ("mapped once by the native backend", ""),
            Device::Cuda => (
                "copied once to GPU memory (on a Jetson the same DRAM; the file's mapped pages \
                 are cache the kernel can drop)",
                ", in GPU memory",
            ),
        };
        let subtotal = weights + kv + scratch + overhead;
        Self {
            terms: vec![
                Term {
                    name: "weights",
                    bytes: weights,
                    detail: format!("{} tensor bytes, {weights_where}", shape.architecture),
                },
                Term {
                    name: "kv",
                    bytes: kv,
                    detail: format!(
                        "{sequences} sequences x {} ctx x {} layers x {} kv heads x ({}+{}) dims x {KV_ELEM_BYTES} B{kv_where}",
                        plan.ctx, shape.n_layer, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v
                    ),
                },
                Term {
                    name: "scratch",
                    bytes: scratch,
                    detail: format!(
                        "native forward: {u}-token passes, attention, logits and samplers for {sequences} sequences"
                    ),
                },
                Term {
                    name: "overhead",
                    bytes: overhead,
                    detail: "runtime, allocator, tokenizer tables".into(),
                },
                margin_term(plan, subtotal),
            ],
            compute_reserved_bytes: scratch,
        }
    }

    pub fn total(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }

    /// Everything but the margin: the expected peak resident set.
    pub fn expected_peak(&self) -> u64 {
        self.terms
            .iter()
            .filter(|t| t.name != "margin")
            .map(|t| t.bytes)
            .sum()
    }

    pub fn term(&self, name: &str) -> u64 {
        self.terms
            .iter()
            .find(|t| t.name == name)
            .map_or(0, |t| t.bytes)
    }
}

/// The ledger against the limits.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub fits: bool,
    pub required_bytes: u64,
    pub expected_peak_bytes: u64,
    /// The tightest limit, if any applies.
    pub limit: Option<Limit>,
    pub limits: Vec<Limit>,
    pub ledger: Ledger,
    pub shape: ModelShape,
    pub plan: Plan,
}

impl Decision {
    pub fn new(shape: ModelShape, plan: Plan, limits: Vec<Limit>) -> Self {
        let ledger = Ledger::compute(&shape, &plan);
        let required = ledger.total();
        let limit = limits.iter().min_by_key(|l| l.bytes).cloned();
        Self {
            fits: limit.as_ref().is_none_or(|l| required <= l.bytes),
            required_bytes: required,
            expected_peak_bytes: ledger.expected_peak(),
            limit,
            limits,
            ledger,
            shape,
            plan,
        }
    }

    /// The one-line accounting: `reason=… requiredMB=… limitMB=… weightsMB=… …`.
    pub fn accounting(&self) -> String {
        let mb = |b: u64| format!("{:.1}", b as f64 / MIB);
        let mut s = String::new();
        let reason = self
            .limit
            .as_ref()
            .map_or("no-limit", |l| l.source.reason());
        let _ = write!(
            s,
            "reason={reason} requiredMB={} limitMB={}",
            mb(self.required_bytes),
            self.limit
                .as_ref()
                .map_or("unlimited".into(), |l| mb(l.bytes)),
        );
        for t in &self.ledger.terms {
            let _ = write!(s, " {}MB={}", t.name, mb(t.bytes));
        }
        if let Some(l) = &self.limit {
            let _ = write!(s, " limitSource={} limitFrom={}", l.source.label(), l.from);
        }
        s
    }

    /// A human table for `inferloopd check`.
    pub fn table(&self) -> String {
        let mb = |b: u64| b as f64 / MIB;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "model: {} ({} layers, {} kv heads, vocab {}), slots {} x ctx {}, kv cells {}",
            self.shape.architecture,
            self.shape.n_layer,
            self.shape.n_head_kv,
            self.shape.n_vocab,
            self.plan.slots,
            self.plan.ctx,
            self.plan.kv_cells
        );
        let _ = writeln!(s, "{:<10} {:>10}  detail", "term", "MiB");
        for t in &self.ledger.terms {
            let _ = writeln!(s, "{:<10} {:>10.1}  {}", t.name, mb(t.bytes), t.detail);
        }
        let _ = writeln!(s, "{:<10} {:>10.1}", "required", mb(self.required_bytes));
        for l in &self.limits {
            let _ = writeln!(
                s,
                "limit      {:>10.1}  {} ({})",
                mb(l.bytes),
                l.source.label(),
                l.from
            );
        }
        let verdict = if self.fits { "FITS" } else { "REFUSED" };
        let _ = writeln!(s, "decision: {verdict}  {}", self.accounting());
        s
    }

    /// Prometheus series for the ledger and limits.
    pub fn render_metrics(&self, w: &mut TextWriter) {
        w.gauge_family(
            "inferloop_memory_required_bytes",
            "Memory ledger terms computed at cold load.",
            |family| {
                for t in &self.ledger.terms {
                    family.sample(&[("term", t.name)], t.bytes);
                }
                family.sample(&[("term", "total")], self.required_bytes);
            },
        );
        w.gauge_family(
            "inferloop_memory_limit_bytes",
            "Memory limits that apply to the process.",
            |family| {
                for l in &self.limits {
                    family.sample(&[("source", l.source.label())], l.bytes);
                }
            },
        );
    }
}

/// Resident set size of this process, from `/proc/self/status`.
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:")
}

/// Peak resident set size of this process.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:")
}

fn status_kb(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M as its GGUF header describes it.
    fn smollm2() -> ModelShape {
        ModelShape {
            architecture: "llama".into(),
            n_layer: 30,
            n_embd: 576,
            n_head: 9,
            n_head_kv: 3,
            head_dim_k: 64,
            head_dim_v: 64,
            n_ff: 1536,
            n_vocab: 49152,
            n_ctx_train: 8192,
            tensor_bytes: 96_576_768,
            file_bytes: 98_362_432,
        }
    }

    fn plan(slots: u64, ctx: u64) -> Plan {
        Plan {
            slots,
            ctx,
            kv_cells: slots * ctx,
            shared_kv: false,
            prefix_slots: 0,
            n_ubatch: 512,
            margin_bytes: None,
            backend: BackendKind::LlamaCpp,
            device: Device::Cpu,
        }
    }

    #[test]
    fn kv_term_matches_llama_cpp_for_the_default_model() {
        // llama.cpp reports "KV buffer size = 45.00 MiB" at n_ctx 2048 and 180 MiB at 8192.
        assert_eq!(
            Ledger::compute(&smollm2(), &plan(1, 2048)).term("kv"),
            45 << 20
        );
        assert_eq!(
            Ledger::compute(&smollm2(), &plan(4, 2048)).term("kv"),
            180 << 20
        );
        assert_eq!(
            Ledger::compute(&smollm2(), &plan(1, 8192)).term("kv"),
            180 << 20
        );
    }

    #[test]
    fn weights_are_counted_once_however_many_slots() {
        let one = Ledger::compute(&smollm2(), &plan(1, 1024));
        let eight = Ledger::compute(&smollm2(), &plan(8, 1024));
        assert_eq!(one.term("weights"), eight.term("weights"));
        assert_eq!(eight.term("kv"), 8 * one.term("kv"));
    }

    #[test]
    fn oversubscribed_kv_is_sized_by_its_cells() {
        let mut p = plan(4, 2048);
        p.kv_cells = 2048;
        p.shared_kv = true;
        assert_eq!(Ledger::compute(&smollm2(), &p).term("kv"), 45 << 20);
        p.prefix_slots = 4;
        assert_eq!(
            Ledger::compute(&smollm2(), &p).term("kv"),
            45 << 20,
            "prefix slots hold cells of the pool"
        );
    }

    #[test]
    fn each_prefix_slot_is_a_stream_more_without_a_shared_pool() {
        let mut p = plan(4, 2048);
        p.prefix_slots = 2;
        assert_eq!(Ledger::compute(&smollm2(), &p).term("kv"), 6 * (45 << 20));
    }

    #[test]
    fn reserved_compute_is_close_to_llama_cpp_figure() {
        // llama.cpp's "CPU compute buffer size" for slots x ctx (n_ubatch 512, flash attention,
        // non-unified KV: the reservation follows each sequence's context, not the slots).
        for (slots, ctx, reported) in [
            (1, 512, 102.14),
            (1, 2048, 104.77),
            (4, 1024, 103.77),
            (2, 2048, 104.77),
            (4, 2048, 104.77),
            (1, 8192, 109.64),
        ] {
            let l = Ledger::compute(&smollm2(), &plan(slots, ctx));
            let mib = l.compute_reserved_bytes as f64 / MIB;
            assert!(
                (mib - reported).abs() / reported < 0.03,
                "{slots} x {ctx}: {mib} vs {reported}"
            );
        }
    }

    /// Worst case measured with `bench/memory.py` on SmolLM2-135M Q4_1, 2 threads: every slot
    /// holding a prompt that nearly fills its context, prefilled in 512-token micro-batches
    /// next to the other slots' decode steps. `touched`: anonymous pages that appeared in
    /// llama.cpp's compute buffer during the run (from /proc/PID/pagemap); `peak`: VmHWM.
    const MEASURED: [(u64, u64, f64, f64); 5] = [
        (1, 512, 11.4, 148.5),
        (4, 1024, 13.4, 234.1),
        (2, 2048, 14.2, 232.9),
        (4, 2048, 14.4, 325.9),
        (1, 8192, 18.9, 328.2),
    ];

    #[test]
    fn compute_term_bounds_what_the_worst_case_touches_within_the_reservation() {
        for (slots, ctx, touched, _) in MEASURED {
            let l = Ledger::compute(&smollm2(), &plan(slots, ctx));
            let mib = l.term("compute") as f64 / MIB;
            assert!(
                touched <= mib,
                "{slots} x {ctx}: {touched} MiB touched, {mib:.1} charged"
            );
            assert!(
                touched / mib > 0.6,
                "{slots} x {ctx}: {mib:.1} MiB charged for {touched} touched"
            );
            assert!(l.term("compute") <= l.compute_reserved_bytes);
        }
    }

    #[test]
    fn expected_peak_without_the_margin_bounds_the_measured_worst_case() {
        for (slots, ctx, _, peak) in MEASURED {
            let l = Ledger::compute(&smollm2(), &plan(slots, ctx));
            let expected = l.expected_peak() as f64 / MIB;
            let ratio = peak / expected;
            assert!(
                (0.9..=1.0).contains(&ratio),
                "{slots} x {ctx}: peak {peak} MiB, expected {expected:.1} MiB ({ratio:.3})"
            );
        }
    }

    #[test]
    fn margin_defaults_to_five_percent() {
        let l = Ledger::compute(&smollm2(), &plan(4, 2048));
        let rest = l.expected_peak();
        assert_eq!(l.term("margin"), (rest / 20).max(16 << 20));
        assert_eq!(l.total(), rest + l.term("margin"));
    }

    fn limit(source: LimitSource, mb: u64) -> Limit {
        Limit {
            source,
            bytes: mb << 20,
            from: "test".into(),
        }
    }

    #[test]
    fn tightest_limit_decides_and_is_named() {
        let d = Decision::new(
            smollm2(),
            plan(4, 2048),
            vec![
                limit(LimitSource::MemAvailable, 20_000),
                limit(LimitSource::CgroupV1, 200),
            ],
        );
        assert!(!d.fits);
        let line = d.accounting();
        assert!(
            line.starts_with("reason=cgroup-limit requiredMB="),
            "{line}"
        );
        for key in [
            "limitMB=200.0",
            "weightsMB=",
            "kvMB=180.0",
            "computeMB=",
            "overheadMB=",
            "marginMB=",
        ] {
            assert!(line.contains(key), "{key} missing in {line}");
        }
    }

    #[test]
    fn no_limit_fits() {
        let d = Decision::new(smollm2(), plan(1, 1024), vec![]);
        assert!(d.fits);
        assert!(d.accounting().starts_with("reason=no-limit"));
    }

    #[test]
    fn metrics_name_every_term_and_limit() {
        let d = Decision::new(
            smollm2(),
            plan(1, 1024),
            vec![limit(LimitSource::CgroupV2, 4096)],
        );
        let out = crate::metrics::text::render(move |w| d.render_metrics(w));
        for t in ["weights", "kv", "compute", "overhead", "margin", "total"] {
            assert!(out.contains(&format!("inferloop_memory_required_bytes{{term=\"{t}\"}}")));
        }
        assert!(out.contains("inferloop_memory_limit_bytes{source=\"cgroup-v2\"} 4294967296"));
        for help in [
            "# HELP inferloop_memory_required_bytes Memory ledger terms computed at cold load.\n",
            "# HELP inferloop_memory_limit_bytes Memory limits that apply to the process.\n",
        ] {
            assert!(out.contains(help), "{out}");
        }
    }

    #[test]
    fn native_terms_are_weights_kv_per_sequence_scratch_and_overhead() {
        let native = |slots, ctx| Plan {
            backend: BackendKind::Native,
            ..plan(slots, ctx)
        };
        let l = Ledger::compute(&smollm2(), &native(2, 1000));
        let names: Vec<&str> = l.terms.iter().map(|t| t.name).collect();
        assert_eq!(names, ["weights", "kv", "scratch", "overhead", "margin"]);
        assert_eq!(l.term("weights"), 96_576_768);
        // 30 layers x 2 sequences x 1000 positions (unpadded) x 3 kv heads x (64+64) x 2 B.
        assert_eq!(l.term("kv"), 30 * 2 * 1000 * 3 * 128 * 2);
        let scratch = l.term("scratch");
        assert!((1 << 20..16 << 20).contains(&scratch), "{scratch}");
        // A limit below the total refuses with the accounting line naming the native terms.
        let d = Decision::new(
            smollm2(),
            native(2, 1000),
            vec![limit(LimitSource::CgroupV2, 100)],
        );
        assert!(!d.fits);
        assert!(d.accounting().contains(" scratchMB="), "{}", d.accounting());
    }

    #[test]
    fn native_on_cuda_counts_the_gpu_copies_in_the_same_memory() {
        let on = |device| Plan {
            backend: BackendKind::Native,
            device,
            ..plan(2, 1000)
        };
        let (cpu, gpu) = (
            Ledger::compute(&smollm2(), &on(Device::Cpu)),
            Ledger::compute(&smollm2(), &on(Device::Cuda)),
        );
        assert_eq!(gpu.term("weights"), cpu.term("weights"));
        assert_eq!(gpu.term("kv"), cpu.term("kv"));
        // The pass's activations and its logits rows on the GPU besides the host's.
        assert!(gpu.term("scratch") > cpu.term("scratch"));
        let detail = |l: &Ledger, name| {
            l.terms
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.detail.clone())
                .unwrap_or_default()
        };
        assert!(detail(&gpu, "weights").contains("GPU memory"));
        assert!(detail(&gpu, "kv").ends_with("in GPU memory"));
        assert!(!detail(&cpu, "kv").contains("GPU"));
    }
}
