//! The daemon's Prometheus series, held in a `prometheus-client` registry and encoded in the
//! Prometheus text format (0.0.4).
//!
//! The engine's series are the crate's atomics, registered once: counting a token or a request
//! that reached the engine is one `fetch_add`. Series another subsystem owns (plan, memory
//! ledger, thermal) are computed at scrape time by a renderer added with
//! [`Metrics::add_source`], which writes through [`TextWriter`].
//!
//! The 0.0.4 encoder, not the crate's default OpenMetrics one, because it writes exactly the
//! exposition scrapers were given before: counter families announced under their `_total`
//! name and no `# EOF`, served as `text/plain; version=0.0.4`.

pub mod text;

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use text::TextWriter;

/// A monotonic count: one relaxed `fetch_add` on an `AtomicU64`.
pub type Counter = prometheus_client::metrics::counter::Counter;
/// A value that goes up and down: one store on an `AtomicI64`.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;
/// Fixed-bucket histogram (the crate's; one short uncontended lock per observation).
pub type Histogram = prometheus_client::metrics::histogram::Histogram;

/// `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const REQUEST_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Labels of `inferloop_requests_total`, in the order they are written.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    code: u16,
}

/// Labels of the prompt cache tiers' series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    tier: &'static str,
    reason: &'static str,
}

/// The prompt cache tiers (RAM, disk): restores, saves, drops and sizes, by tier.
#[derive(Debug, Default)]
pub struct PromptCacheSeries {
    hits: Family<TierLabels, Counter>,
    hit_tokens: Family<TierLabels, Counter>,
    saves: Family<TierLabels, Counter>,
    dropped: Family<DropLabels, Counter>,
    bytes: Family<TierLabels, Gauge>,
    entries: Family<TierLabels, Gauge>,
    /// The disk tier has indexed its directory (it waits for the weights' SHA-256).
    disk_ready: std::sync::atomic::AtomicBool,
}

impl PromptCacheSeries {
    /// Exports `tier`'s counters at zero before anything is counted, so that a scrape
    /// tells an idle tier from an absent one.
    pub fn announce(&self, tier: &'static str) {
        let l = TierLabels { tier };
        // The series exist once created; the guards are dropped at once.
        drop(self.hits.get_or_create(&l));
        drop(self.hit_tokens.get_or_create(&l));
        drop(self.saves.get_or_create(&l));
        drop(self.bytes.get_or_create(&l));
        drop(self.entries.get_or_create(&l));
    }

    /// A restore from `tier` that spared `tokens` prompt tokens their prefill.
    pub fn hit(&self, tier: &'static str, tokens: usize) {
        let l = TierLabels { tier };
        self.hits.get_or_create(&l).inc();
        self.hit_tokens.get_or_create(&l).inc_by(tokens as u64);
    }

    pub fn saved(&self, tier: &'static str) {
        self.saves.get_or_create(&TierLabels { tier }).inc();
    }

    /// An entry left `tier`: `evicted`, `corrupt`, `mismatch`, `restore_failed`,
    /// `write_failed`.
    pub fn dropped(&self, tier: &'static str, reason: &'static str) {
        self.dropped
            .get_or_create(&DropLabels { tier, reason })
            .inc();
    }

    pub fn set_size(&self, tier: &'static str, bytes: u64, entries: usize) {
        let l = TierLabels { tier };
        self.bytes.get_or_create(&l).set(bytes as i64);
        self.entries.get_or_create(&l).set(entries as i64);
    }

    pub fn set_disk_ready(&self) {
        self.disk_ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn disk_ready(&self) -> bool {
        self.disk_ready.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `tier`'s bytes, entries and restored tokens, for `/v1/status`.
    pub fn tier(&self, tier: &'static str) -> (i64, i64, u64) {
        let l = TierLabels { tier };
        (
            self.bytes.get_or_create(&l).get(),
            self.entries.get_or_create(&l).get(),
            self.hit_tokens.get_or_create(&l).get(),
        )
    }

    /// Restored tokens from `tier` so far (tests).
    pub fn hit_tokens(&self, tier: &'static str) -> u64 {
        self.hit_tokens.get_or_create(&TierLabels { tier }).get()
    }

    /// Entries dropped from `tier` for `reason` so far (tests).
    pub fn dropped_count(&self, tier: &'static str, reason: &'static str) -> u64 {
        self.dropped
            .get_or_create(&DropLabels { tier, reason })
            .get()
    }
}

/// Renders series owned by another subsystem.
type Source = Box<dyn Fn(&mut TextWriter<'_>) + Send + Sync>;

/// The renderers added with [`Metrics::add_source`], run by the registry on every scrape.
#[derive(Default, Clone)]
struct Sources(Arc<Mutex<Vec<Source>>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |s| s.len());
        f.debug_tuple("Sources").field(&n).finish()
    }
}

impl Collector for Sources {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut w = TextWriter::new(encoder);
        if let Ok(sources) = self.0.lock() {
            for f in sources.iter() {
                f(&mut w);
            }
        }
        w.finish()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloseLabels {
    reason: &'static str,
}

/// The HTTP connections: open, the cap, admitted, refused at the cap, and closed by the
/// daemon (a timeout, or to make room under the cap).
#[derive(Debug, Default)]
pub struct ConnectionSeries {
    pub open: Gauge,
    pub max: Gauge,
    pub accepted: Counter,
    pub refused: Counter,
    closed: Family<CloseLabels, Counter>,
}

impl ConnectionSeries {
    /// Every reason is exported at zero from the start, so a scrape tells "none" from "not
    /// counted".
    const REASONS: [&'static str; 4] =
        ["header_timeout", "idle_timeout", "evicted", "tls_handshake"];

    pub fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&CloseLabels { reason }).inc();
    }

    pub fn closed_count(&self, reason: &'static str) -> u64 {
        self.closed.get_or_create(&CloseLabels { reason }).get()
    }
}

/// Every series the daemon exports.
pub struct Metrics {
    registry: Registry,
    sources: Sources,
    requests: Family<RequestLabels, Counter>,
    pub active_slots: Gauge,
    pub queue_depth: Gauge,
    pub kv_reserved_cells: Gauge,
    pub prompt_tokens_total: Counter,
    pub generated_tokens_total: Counter,
    pub cancelled_total: Counter,
    /// Prompt tokens looked up in the prefix cache, and those found resident.
    pub prefix_lookup_tokens_total: Counter,
    pub prefix_hit_tokens_total: Counter,
    /// KV cells idle slots hold for reuse.
    pub prefix_retained_cells: Gauge,
    /// Speculative decoding: drafted tokens verified, and those the model accepted.
    pub spec_drafted_tokens_total: Counter,
    pub spec_accepted_tokens_total: Counter,
    pub prompt_cache: PromptCacheSeries,
    pub connections: Arc<ConnectionSeries>,
    /// KV event batches (`--kv-events`) handed to the socket, and dropped because its
    /// queue was full (each one a gap the router resynchronises on).
    pub kv_event_batches_sent: Counter,
    pub kv_event_batches_dropped: Counter,
    pub ttft_seconds: Histogram,
    pub inter_token_seconds: Histogram,
    pub request_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            registry: Registry::default(),
            sources: Sources::default(),
            requests: Family::default(),
            active_slots: Gauge::default(),
            queue_depth: Gauge::default(),
            kv_reserved_cells: Gauge::default(),
            prompt_tokens_total: Counter::default(),
            generated_tokens_total: Counter::default(),
            cancelled_total: Counter::default(),
            prefix_lookup_tokens_total: Counter::default(),
            prefix_hit_tokens_total: Counter::default(),
            prefix_retained_cells: Gauge::default(),
            spec_drafted_tokens_total: Counter::default(),
            spec_accepted_tokens_total: Counter::default(),
            prompt_cache: PromptCacheSeries::default(),
            connections: Arc::default(),
            kv_event_batches_sent: Counter::default(),
            kv_event_batches_dropped: Counter::default(),
            ttft_seconds: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            inter_token_seconds: Histogram::new(TOKEN_BUCKETS.iter().copied()),
            request_seconds: Histogram::new(REQUEST_BUCKETS.iter().copied()),
        };
        m.registered()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("active_slots", &self.active_slots.get())
            .field("queue_depth", &self.queue_depth.get())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every series in exposition order. The registry holds clones of the handles
    /// (each an `Arc` of its atomics), so the fields above and the scrape see the same values.
    /// Counters are registered without `_total` and helps without the final period: the
    /// encoder adds both.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "inferloop_requests",
            "HTTP requests by route and status code",
            self.requests.clone(),
        );
        r.register(
            "inferloop_active_slots",
            "Sequences decoding now",
            self.active_slots.clone(),
        );
        r.register(
            "inferloop_queue_depth",
            "Requests waiting for a slot",
            self.queue_depth.clone(),
        );
        r.register(
            "inferloop_kv_reserved_cells",
            "KV cells reserved by running requests",
            self.kv_reserved_cells.clone(),
        );
        r.register(
            "inferloop_prompt_tokens",
            "Prompt tokens admitted",
            self.prompt_tokens_total.clone(),
        );
        r.register(
            "inferloop_generated_tokens",
            "Tokens generated",
            self.generated_tokens_total.clone(),
        );
        r.register(
            "inferloop_cancelled",
            "Requests stopped because the client disconnected, while running or while queued",
            self.cancelled_total.clone(),
        );
        r.register(
            "inferloop_prefix_cache_lookup_tokens",
            "Prompt tokens of admitted requests looked up in the prefix cache",
            self.prefix_lookup_tokens_total.clone(),
        );
        r.register(
            "inferloop_prefix_cache_hit_tokens",
            "Prompt tokens not recomputed: reused from resident KV cells or restored from the prompt cache's RAM and disk tiers",
            self.prefix_hit_tokens_total.clone(),
        );
        r.register(
            "inferloop_prefix_cache_retained_cells",
            "KV cells that idle slots keep for prompt reuse",
            self.prefix_retained_cells.clone(),
        );
        r.register(
            "inferloop_spec_drafted_tokens",
            "Drafted tokens verified by speculative decoding",
            self.spec_drafted_tokens_total.clone(),
        );
        r.register(
            "inferloop_spec_accepted_tokens",
            "Drafted tokens the model accepted (each saved one decode step)",
            self.spec_accepted_tokens_total.clone(),
        );
        let pc = &self.prompt_cache;
        r.register(
            "inferloop_prompt_cache_hits",
            "Saved prefixes restored into a slot, by tier",
            pc.hits.clone(),
        );
        r.register(
            "inferloop_prompt_cache_hit_tokens",
            "Prompt tokens restored from a tier instead of being recomputed (part of inferloop_prefix_cache_hit_tokens)",
            pc.hit_tokens.clone(),
        );
        r.register(
            "inferloop_prompt_cache_saves",
            "Prefixes stored in a tier",
            pc.saves.clone(),
        );
        r.register(
            "inferloop_prompt_cache_dropped",
            "Entries that left a tier, by reason (evicted, corrupt, mismatch, restore_failed, write_failed)",
            pc.dropped.clone(),
        );
        r.register(
            "inferloop_prompt_cache_bytes",
            "Bytes a tier holds",
            pc.bytes.clone(),
        );
        r.register(
            "inferloop_prompt_cache_entries",
            "Entries a tier holds",
            pc.entries.clone(),
        );
        let conns = &self.connections;
        for reason in ConnectionSeries::REASONS {
            drop(conns.closed.get_or_create(&CloseLabels { reason }));
        }
        r.register(
            "inferloop_connections_open",
            "HTTP connections open now, lingering ones included",
            conns.open.clone(),
        );
        r.register(
            "inferloop_connections_max",
            "The cap on open HTTP connections (--max-connections)",
            conns.max.clone(),
        );
        r.register(
            "inferloop_connections_accepted",
            "HTTP connections admitted",
            conns.accepted.clone(),
        );
        r.register(
            "inferloop_connections_refused",
            "HTTP connections refused with a 503 at the cap, every open one answering a request",
            conns.refused.clone(),
        );
        r.register(
            "inferloop_connections_closed",
            "HTTP connections the daemon closed, by reason (header_timeout, idle_timeout, evicted to make room at the cap, tls_handshake failed)",
            conns.closed.clone(),
        );
        r.register(
            "inferloop_kv_event_batches_sent",
            "KV event batches (--kv-events) handed to the publisher socket",
            self.kv_event_batches_sent.clone(),
        );
        r.register(
            "inferloop_kv_event_batches_dropped",
            "KV event batches dropped on a full queue: a gap on which routers forget this box's blocks and start over",
            self.kv_event_batches_dropped.clone(),
        );
        r.register(
            "inferloop_ttft_seconds",
            "Request received to first token sampled",
            self.ttft_seconds.clone(),
        );
        r.register(
            "inferloop_inter_token_seconds",
            "Time between consecutive tokens of one sequence",
            self.inter_token_seconds.clone(),
        );
        r.register(
            "inferloop_request_seconds",
            "Request received to last token",
            self.request_seconds.clone(),
        );
        // Collectors are encoded after the registered series.
        r.register_collector(Box::new(self.sources.clone()));
        self
    }

    /// Counts an HTTP response. Once per request, off the decode path: a shared read lock
    /// and a hash of the label set find the counter, then one atomic add.
    pub fn record_request(&self, route: &str, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                code,
            })
            .inc();
    }

    /// Registers a renderer for series owned elsewhere, written after these on every scrape.
    pub fn add_source(&self, f: impl Fn(&mut TextWriter<'_>) + Send + Sync + 'static) {
        if let Ok(mut s) = self.sources.0.lock() {
            s.push(Box::new(f));
        }
    }

    /// The exposition, in the format [`CONTENT_TYPE`] names.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a `String` cannot fail; a renderer's error would cut the text short,
        // and a partial scrape still beats none.
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding /metrics failed part way");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.request_seconds.observe(0.07);
        m.request_seconds.observe(0.5);
        m.request_seconds.observe(500.0);
        let out = m.render();
        assert!(
            out.contains("inferloop_request_seconds_bucket{le=\"0.05\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("inferloop_request_seconds_bucket{le=\"0.1\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("inferloop_request_seconds_bucket{le=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("inferloop_request_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("inferloop_request_seconds_count 3\n"), "{out}");
    }

    #[test]
    fn requests_are_labelled_by_route_and_code() {
        let m = Metrics::default();
        m.record_request("/v1/models", 200);
        m.record_request("/v1/models", 200);
        m.record_request("/v1/chat/completions", 429);
        let text = m.render();
        assert!(text.contains("inferloop_requests_total{route=\"/v1/models\",code=\"200\"} 2"));
        assert!(text
            .contains("inferloop_requests_total{route=\"/v1/chat/completions\",code=\"429\"} 1"));
    }

    /// The exposition scrapers and the qualification suite's strict parser are given. Against
    /// the hand-rolled writer it replaced, only three things differ, none in a series' name,
    /// type, labels or help: a float that is whole prints with `.0` (`_sum 500.0`), the
    /// request series come in the family's hash order (sorted here before comparing), and a
    /// labelled family with no series yet (`inferloop_requests_total` before the first
    /// request) is left out until it has one.
    const EXPOSITION: &str = r#"# HELP inferloop_requests_total HTTP requests by route and status code.
# TYPE inferloop_requests_total counter
inferloop_requests_total{route="/odd\"route\\x",code="404"} 1
inferloop_requests_total{route="/v1/chat/completions",code="429"} 1
inferloop_requests_total{route="/v1/models",code="200"} 2
# HELP inferloop_active_slots Sequences decoding now.
# TYPE inferloop_active_slots gauge
inferloop_active_slots 2
# HELP inferloop_queue_depth Requests waiting for a slot.
# TYPE inferloop_queue_depth gauge
inferloop_queue_depth -1
# HELP inferloop_kv_reserved_cells KV cells reserved by running requests.
# TYPE inferloop_kv_reserved_cells gauge
inferloop_kv_reserved_cells 4096
# HELP inferloop_prompt_tokens_total Prompt tokens admitted.
# TYPE inferloop_prompt_tokens_total counter
inferloop_prompt_tokens_total 17
# HELP inferloop_generated_tokens_total Tokens generated.
# TYPE inferloop_generated_tokens_total counter
inferloop_generated_tokens_total 8
# HELP inferloop_cancelled_total Requests stopped because the client disconnected, while running or while queued.
# TYPE inferloop_cancelled_total counter
inferloop_cancelled_total 1
# HELP inferloop_prefix_cache_lookup_tokens_total Prompt tokens of admitted requests looked up in the prefix cache.
# TYPE inferloop_prefix_cache_lookup_tokens_total counter
inferloop_prefix_cache_lookup_tokens_total 0
# HELP inferloop_prefix_cache_hit_tokens_total Prompt tokens not recomputed: reused from resident KV cells or restored from the prompt cache's RAM and disk tiers.
# TYPE inferloop_prefix_cache_hit_tokens_total counter
inferloop_prefix_cache_hit_tokens_total 0
# HELP inferloop_prefix_cache_retained_cells KV cells that idle slots keep for prompt reuse.
# TYPE inferloop_prefix_cache_retained_cells gauge
inferloop_prefix_cache_retained_cells 0
# HELP inferloop_spec_drafted_tokens_total Drafted tokens verified by speculative decoding.
# TYPE inferloop_spec_drafted_tokens_total counter
inferloop_spec_drafted_tokens_total 0
# HELP inferloop_spec_accepted_tokens_total Drafted tokens the model accepted (each saved one decode step).
# TYPE inferloop_spec_accepted_tokens_total counter
inferloop_spec_accepted_tokens_total 0
# HELP inferloop_connections_open HTTP connections open now, lingering ones included.
# TYPE inferloop_connections_open gauge
inferloop_connections_open 0
# HELP inferloop_connections_max The cap on open HTTP connections (--max-connections).
# TYPE inferloop_connections_max gauge
inferloop_connections_max 0
# HELP inferloop_connections_accepted_total HTTP connections admitted.
# TYPE inferloop_connections_accepted_total counter
inferloop_connections_accepted_total 0
# HELP inferloop_connections_refused_total HTTP connections refused with a 503 at the cap, every open one answering a request.
# TYPE inferloop_connections_refused_total counter
inferloop_connections_refused_total 0
# HELP inferloop_connections_closed_total HTTP connections the daemon closed, by reason (header_timeout, idle_timeout, evicted to make room at the cap, tls_handshake failed).
# TYPE inferloop_connections_closed_total counter
inferloop_connections_closed_total{reason="evicted"} 0
inferloop_connections_closed_total{reason="header_timeout"} 0
inferloop_connections_closed_total{reason="idle_timeout"} 0
inferloop_connections_closed_total{reason="tls_handshake"} 0
# HELP inferloop_kv_event_batches_sent_total KV event batches (--kv-events) handed to the publisher socket.
# TYPE inferloop_kv_event_batches_sent_total counter
inferloop_kv_event_batches_sent_total 0
# HELP inferloop_kv_event_batches_dropped_total KV event batches dropped on a full queue: a gap on which routers forget this box's blocks and start over.
# TYPE inferloop_kv_event_batches_dropped_total counter
inferloop_kv_event_batches_dropped_total 0
# HELP inferloop_ttft_seconds Request received to first token sampled.
# TYPE inferloop_ttft_seconds histogram
inferloop_ttft_seconds_bucket{le="0.005"} 0
inferloop_ttft_seconds_bucket{le="0.01"} 0
inferloop_ttft_seconds_bucket{le="0.025"} 1
inferloop_ttft_seconds_bucket{le="0.05"} 1
inferloop_ttft_seconds_bucket{le="0.1"} 1
inferloop_ttft_seconds_bucket{le="0.25"} 1
inferloop_ttft_seconds_bucket{le="0.5"} 1
inferloop_ttft_seconds_bucket{le="1"} 1
inferloop_ttft_seconds_bucket{le="2.5"} 1
inferloop_ttft_seconds_bucket{le="5"} 2
inferloop_ttft_seconds_bucket{le="10"} 2
inferloop_ttft_seconds_bucket{le="30"} 2
inferloop_ttft_seconds_bucket{le="60"} 2
inferloop_ttft_seconds_bucket{le="+Inf"} 2
inferloop_ttft_seconds_sum 3.02
inferloop_ttft_seconds_count 2
# HELP inferloop_inter_token_seconds Time between consecutive tokens of one sequence.
# TYPE inferloop_inter_token_seconds histogram
inferloop_inter_token_seconds_bucket{le="0.001"} 0
inferloop_inter_token_seconds_bucket{le="0.0025"} 0
inferloop_inter_token_seconds_bucket{le="0.005"} 1
inferloop_inter_token_seconds_bucket{le="0.0075"} 1
inferloop_inter_token_seconds_bucket{le="0.01"} 1
inferloop_inter_token_seconds_bucket{le="0.015"} 1
inferloop_inter_token_seconds_bucket{le="0.02"} 1
inferloop_inter_token_seconds_bucket{le="0.03"} 1
inferloop_inter_token_seconds_bucket{le="0.05"} 1
inferloop_inter_token_seconds_bucket{le="0.1"} 1
inferloop_inter_token_seconds_bucket{le="0.25"} 1
inferloop_inter_token_seconds_bucket{le="0.5"} 1
inferloop_inter_token_seconds_bucket{le="1"} 1
inferloop_inter_token_seconds_bucket{le="+Inf"} 1
inferloop_inter_token_seconds_sum 0.004
inferloop_inter_token_seconds_count 1
# HELP inferloop_request_seconds Request received to last token.
# TYPE inferloop_request_seconds histogram
inferloop_request_seconds_bucket{le="0.05"} 0
inferloop_request_seconds_bucket{le="0.1"} 0
inferloop_request_seconds_bucket{le="0.25"} 0
inferloop_request_seconds_bucket{le="0.5"} 0
inferloop_request_seconds_bucket{le="1"} 0
inferloop_request_seconds_bucket{le="2.5"} 0
inferloop_request_seconds_bucket{le="5"} 0
inferloop_request_seconds_bucket{le="10"} 0
inferloop_request_seconds_bucket{le="30"} 0
inferloop_request_seconds_bucket{le="60"} 0
inferloop_request_seconds_bucket{le="120"} 0
inferloop_request_seconds_bucket{le="+Inf"} 1
inferloop_request_seconds_sum 500.0
inferloop_request_seconds_count 1
# HELP inferloop_memory_rss_bytes Resident set size of the daemon.
# TYPE inferloop_memory_rss_bytes gauge
inferloop_memory_rss_bytes 123456
"#;

    /// `text` with each run of a labelled family's lines sorted (a family's series come in
    /// hash order).
    fn requests_sorted(text: &str) -> String {
        let mut out: Vec<&str> = Vec::new();
        let mut run: Vec<&str> = Vec::new();
        for line in text.lines() {
            if line.starts_with("inferloop_requests_total{")
                || line.starts_with("inferloop_connections_closed_total{")
            {
                run.push(line);
                continue;
            }
            run.sort_unstable();
            out.append(&mut run);
            out.push(line);
        }
        run.sort_unstable();
        out.append(&mut run);
        out.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn exposition_keeps_the_names_types_labels_and_helps_scrapers_know() {
        let m = Metrics::default();
        m.record_request("/v1/models", 200);
        m.record_request("/v1/models", 200);
        m.record_request("/v1/chat/completions", 429);
        m.record_request("/odd\"route\\x", 404);
        m.active_slots.set(2);
        m.queue_depth.set(-1);
        m.kv_reserved_cells.set(4096);
        m.prompt_tokens_total.inc_by(17);
        m.generated_tokens_total.inc_by(8);
        m.cancelled_total.inc();
        m.ttft_seconds.observe(0.02);
        m.ttft_seconds.observe(3.0);
        m.inter_token_seconds.observe(0.004);
        m.request_seconds.observe(500.0);
        m.add_source(|w| {
            w.gauge(
                "inferloop_memory_rss_bytes",
                "Resident set size of the daemon.",
                123_456u64,
            )
        });
        assert_eq!(requests_sorted(&m.render()), EXPOSITION);
    }

    #[test]
    fn the_request_family_appears_with_its_first_request() {
        let m = Metrics::default();
        assert!(!m.render().contains("inferloop_requests_total"));
        m.record_request("/healthz", 200);
        assert!(m
            .render()
            .contains("# TYPE inferloop_requests_total counter\n"));
    }

    #[test]
    fn the_content_type_is_the_text_format_0_0_4() {
        assert_eq!(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    }
}
