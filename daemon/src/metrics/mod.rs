//! Prometheus metrics, kept as plain atomics and rendered to the text exposition format.
//!
//! A hand-rolled registry keeps the hot path to one atomic add and avoids a global registry;
//! the set of series is small and fixed. Every series, the engine's here and those other
//! subsystems add with [`Metrics::add_source`], is written through [`TextWriter`].

pub mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

pub use text::TextWriter;

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Fixed-bucket histogram (cumulative buckets are computed at render time).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

#[derive(Debug, Default, Clone)]
struct HistogramData {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            inner: Mutex::new(HistogramData {
                counts: vec![0; bounds.len()],
                ..HistogramData::default()
            }),
        }
    }

    pub fn observe(&self, v: f64) {
        if let Ok(mut d) = self.inner.lock() {
            if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
                d.counts[i] += 1;
            }
            d.sum += v;
            d.count += 1;
        }
    }

    pub fn count(&self) -> u64 {
        self.inner.lock().map(|d| d.count).unwrap_or(0)
    }

    fn render(&self, w: &mut TextWriter, name: &str, help: &str) {
        let d = self.inner.lock().map(|d| d.clone()).unwrap_or_default();
        w.histogram(name, help, self.bounds, &d.counts, d.sum, d.count);
    }
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const REQUEST_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Renders series owned by another subsystem.
type Source = Box<dyn Fn(&mut TextWriter) + Send + Sync>;

/// Every series the daemon exports.
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
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
    pub ttft_seconds: Histogram,
    pub inter_token_seconds: Histogram,
    pub request_seconds: Histogram,
    /// Series of other subsystems (memory ledger, thermal), written after these at render time.
    extra: Mutex<Vec<Source>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            active_slots: Gauge::default(),
            queue_depth: Gauge::default(),
            kv_reserved_cells: Gauge::default(),
            prompt_tokens_total: Counter::default(),
            generated_tokens_total: Counter::default(),
            cancelled_total: Counter::default(),
            prefix_lookup_tokens_total: Counter::default(),
            prefix_hit_tokens_total: Counter::default(),
            prefix_retained_cells: Gauge::default(),
            ttft_seconds: Histogram::new(LATENCY_BUCKETS),
            inter_token_seconds: Histogram::new(TOKEN_BUCKETS),
            request_seconds: Histogram::new(REQUEST_BUCKETS),
            extra: Mutex::default(),
        }
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
    pub fn record_request(&self, route: &str, code: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), code)).or_default() += 1;
        }
    }

    pub fn requests(&self, route: &str, code: u16) -> u64 {
        self.requests
            .lock()
            .ok()
            .and_then(|m| m.get(&(route.to_string(), code)).copied())
            .unwrap_or(0)
    }

    /// Registers a renderer for series owned elsewhere.
    pub fn add_source(&self, f: impl Fn(&mut TextWriter) + Send + Sync + 'static) {
        if let Ok(mut e) = self.extra.lock() {
            e.push(Box::new(f));
        }
    }

    pub fn render(&self) -> String {
        let mut w = TextWriter::new();
        w.counter_family(
            "inferloop_requests_total",
            "HTTP requests by route and status code.",
            |family| {
                if let Ok(m) = self.requests.lock() {
                    for ((route, code), n) in m.iter() {
                        family.sample(&[("route", route), ("code", &code.to_string())], *n);
                    }
                }
            },
        );
        w.gauge(
            "inferloop_active_slots",
            "Sequences decoding now.",
            self.active_slots.get(),
        );
        w.gauge(
            "inferloop_queue_depth",
            "Requests waiting for a slot.",
            self.queue_depth.get(),
        );
        w.gauge(
            "inferloop_kv_reserved_cells",
            "KV cells reserved by running requests.",
            self.kv_reserved_cells.get(),
        );
        w.counter(
            "inferloop_prompt_tokens_total",
            "Prompt tokens admitted.",
            self.prompt_tokens_total.get(),
        );
        w.counter(
            "inferloop_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens_total.get(),
        );
        w.counter(
            "inferloop_cancelled_total",
            "Requests stopped because the client disconnected, while running or while queued.",
            self.cancelled_total.get(),
        );
        w.counter(
            "inferloop_prefix_cache_lookup_tokens_total",
            "Prompt tokens of admitted requests looked up in the prefix cache.",
            self.prefix_lookup_tokens_total.get(),
        );
        w.counter(
            "inferloop_prefix_cache_hit_tokens_total",
            "Prompt tokens reused from resident KV cells instead of being recomputed.",
            self.prefix_hit_tokens_total.get(),
        );
        w.gauge(
            "inferloop_prefix_cache_retained_cells",
            "KV cells that idle slots keep for prompt reuse.",
            self.prefix_retained_cells.get(),
        );
        self.ttft_seconds.render(
            &mut w,
            "inferloop_ttft_seconds",
            "Request received to first token sampled.",
        );
        self.inter_token_seconds.render(
            &mut w,
            "inferloop_inter_token_seconds",
            "Time between consecutive tokens of one sequence.",
        );
        self.request_seconds.render(
            &mut w,
            "inferloop_request_seconds",
            "Request received to last token.",
        );
        if let Ok(extra) = self.extra.lock() {
            for f in extra.iter() {
                f(&mut w);
            }
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut w = TextWriter::new();
        h.render(&mut w, "x", "help");
        let out = w.finish();
        assert!(out.contains("x_bucket{le=\"0.1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
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

    /// The exposition as the daemon wrote it before every series went through [`TextWriter`]:
    /// scrapers and the qualification suite's strict parser were given exactly this.
    const BEFORE_THE_WRITER: &str = r#"# HELP inferloop_requests_total HTTP requests by route and status code.
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
# HELP inferloop_prefix_cache_hit_tokens_total Prompt tokens reused from resident KV cells instead of being recomputed.
# TYPE inferloop_prefix_cache_hit_tokens_total counter
inferloop_prefix_cache_hit_tokens_total 0
# HELP inferloop_prefix_cache_retained_cells KV cells that idle slots keep for prompt reuse.
# TYPE inferloop_prefix_cache_retained_cells gauge
inferloop_prefix_cache_retained_cells 0
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
inferloop_request_seconds_sum 500
inferloop_request_seconds_count 1
# HELP inferloop_memory_rss_bytes Resident set size of the daemon.
# TYPE inferloop_memory_rss_bytes gauge
inferloop_memory_rss_bytes 123456
"#;

    #[test]
    fn exposition_is_byte_for_byte_what_scrapers_were_given() {
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
        assert_eq!(m.render(), BEFORE_THE_WRITER);
    }
}
