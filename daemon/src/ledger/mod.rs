//! The memory ledger: what the configured daemon will need, term by term (the serving
//! backend's [`Footprint`] for the engine plan, computed from the GGUF header before anything
//! large is allocated, plus a margin), and the decision against the tightest limit that
//! applies.

pub mod limits;

use std::fmt::Write as _;

use serde::Serialize;

// The header is read by the workspace's one GGUF reader.
pub use inferloop_gguf::{read_shape, GgufError, ModelShape};
pub use limits::{read_limits, Limit, LimitSource};

pub use crate::engine::footprint::{Footprint, Term};
use crate::engine::select::{Device, Selection};
use crate::engine::EnginePlan;
use crate::metrics::TextWriter;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ledger {
    pub terms: Vec<Term>,
    /// What the backend reserves for its compute graph (llama.cpp's "CPU compute buffer
    /// size"); the `compute` term is the part the daemon's worst case touches.
    pub compute_reserved_bytes: u64,
}

/// The safety margin over `subtotal`: configured, else 5% of it, at least 16 MiB.
fn margin_term(margin_bytes: Option<u64>, subtotal: u64) -> Term {
    match margin_bytes {
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
    /// A backend's footprint and the margin over it (`margin_bytes`; `None` = 5%, at least
    /// 16 MiB).
    pub fn new(footprint: Footprint, margin_bytes: Option<u64>) -> Self {
        let Footprint {
            mut terms,
            compute_reserved_bytes,
        } = footprint;
        let subtotal = terms.iter().map(|t| t.bytes).sum();
        terms.push(margin_term(margin_bytes, subtotal));
        Self {
            terms,
            compute_reserved_bytes,
        }
    }

    pub fn total(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }

    /// Everything but the margin and the connections' reserve: the expected peak resident
    /// set when serving (a flood of connections is what the reserve is for).
    pub fn expected_peak(&self) -> u64 {
        self.terms
            .iter()
            .filter(|t| t.name != "margin" && t.name != "connections")
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
    /// The engine plan the ledger is for, with the backend and the margin.
    pub plan: SizedPlan,
}

/// The plan as the decision reports it: the engine plan, the backend and device it was
/// sized for, and the margin asked for.
#[derive(Debug, Clone, Serialize)]
pub struct SizedPlan {
    #[serde(flatten)]
    pub engine: EnginePlan,
    pub backend: &'static str,
    pub device: Device,
    pub margin_bytes: Option<u64>,
}

impl Decision {
    /// The ledger of `selection`'s backend for `plan` on this model (and its draft model's
    /// lines, with one), with room for `connections` open connections, against `limits`.
    pub fn new(
        shape: ModelShape,
        draft: Option<&ModelShape>,
        plan: &EnginePlan,
        selection: &Selection,
        connections: usize,
        margin_bytes: Option<u64>,
        limits: Vec<Limit>,
    ) -> Self {
        let mut footprint = selection.footprint(&shape, plan);
        footprint.terms.extend(prompt_cache_term(&shape, plan));
        footprint.terms.extend(connections_term(connections));
        if let Some(draft) = draft {
            footprint
                .terms
                .extend(crate::engine::footprint::draft(draft, plan));
        }
        let ledger = Ledger::new(footprint, margin_bytes);
        let plan = SizedPlan {
            engine: plan.clone(),
            backend: selection.name(),
            device: selection.device,
            margin_bytes,
        };
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
            self.plan.engine.slots,
            self.plan.engine.ctx,
            self.plan.engine.kv_cells
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

/// The open connections' reserve: the cap times what one may hold.
pub fn connections_term(connections: usize) -> Option<Term> {
    use crate::http::limits::CONNECTION_BYTES;
    (connections > 0).then(|| Term {
        name: "connections",
        bytes: connections as u64 * CONNECTION_BYTES,
        detail: format!(
            "up to {connections} open connections (--max-connections) x {} KiB (measured)",
            CONNECTION_BYTES >> 10
        ),
    })
}

/// The prompt cache's host memory: the RAM tier's budget, plus the entries that may be in
/// flight beside it (one being saved or read, and with a disk tier the writer's queue and
/// the one it writes), each at most a full context of KV rows.
pub fn prompt_cache_term(shape: &ModelShape, plan: &EnginePlan) -> Option<Term> {
    let tiers = &plan.prompt_cache;
    if tiers.ram_bytes == 0 && tiers.disk.is_none() {
        return None;
    }
    let entry = prompt_cache_entry_bytes(shape, plan);
    let in_flight = if tiers.disk.is_some() {
        2 + crate::engine::prompt_cache::disk::WRITE_QUEUE as u64
    } else {
        1
    };
    Some(Term {
        name: "prompt_cache",
        bytes: tiers.ram_bytes + in_flight * entry,
        detail: format!(
            "RAM tier {:.1} MiB + {in_flight} entries in flight x {:.1} MiB (a full context)",
            tiers.ram_bytes as f64 / MIB,
            entry as f64 / MIB
        ),
    })
}

/// The largest saved prefix: a full context of K and V rows of every layer, in the plan's
/// KV types, and llama.cpp's per-cell position and sequence.
pub fn prompt_cache_entry_bytes(shape: &ModelShape, plan: &EnginePlan) -> u64 {
    let per_row = crate::engine::footprint::kv_cell_bytes(shape, plan.kv_type) + 16;
    per_row * u64::from(plan.ctx)
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
mod tests;
