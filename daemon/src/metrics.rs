//! Prometheus metrics, kept as plain atomics and rendered to the text exposition format.
//!
//! A hand-rolled registry keeps the hot path to one atomic add and avoids a global registry;
//! the set of series is small and fixed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

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

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let d = self.inner.lock().map(|d| d.clone()).unwrap_or_default();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&d.counts) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", d.count);
        let _ = writeln!(out, "{name}_sum {}", d.sum);
        let _ = writeln!(out, "{name}_count {}", d.count);
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
type Source = Box<dyn Fn(&mut String) + Send + Sync>;

/// Every series the daemon exports.
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub active_slots: Gauge,
    pub queue_depth: Gauge,
    pub kv_reserved_cells: Gauge,
    pub prompt_tokens_total: Counter,
    pub generated_tokens_total: Counter,
    pub cancelled_total: Counter,
    pub ttft_seconds: Histogram,
    pub inter_token_seconds: Histogram,
    pub request_seconds: Histogram,
    /// Extra text appended by other subsystems (memory ledger, thermal) at render time.
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
    pub fn add_source(&self, f: impl Fn(&mut String) + Send + Sync + 'static) {
        if let Ok(mut e) = self.extra.lock() {
            e.push(Box::new(f));
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP inferloop_requests_total HTTP requests by route and status code.\n");
        out.push_str("# TYPE inferloop_requests_total counter\n");
        if let Ok(m) = self.requests.lock() {
            for ((route, code), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "inferloop_requests_total{{route=\"{}\",code=\"{code}\"}} {n}",
                    escape_label(route)
                );
            }
        }
        gauge(
            &mut out,
            "inferloop_active_slots",
            "Sequences decoding now.",
            self.active_slots.get(),
        );
        gauge(
            &mut out,
            "inferloop_queue_depth",
            "Requests waiting for a slot.",
            self.queue_depth.get(),
        );
        gauge(
            &mut out,
            "inferloop_kv_reserved_cells",
            "KV cells reserved by running requests.",
            self.kv_reserved_cells.get(),
        );
        counter(
            &mut out,
            "inferloop_prompt_tokens_total",
            "Prompt tokens admitted.",
            self.prompt_tokens_total.get(),
        );
        counter(
            &mut out,
            "inferloop_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens_total.get(),
        );
        counter(
            &mut out,
            "inferloop_cancelled_total",
            "Requests stopped because the client disconnected, while running or while queued.",
            self.cancelled_total.get(),
        );
        self.ttft_seconds.render(
            &mut out,
            "inferloop_ttft_seconds",
            "Request received to first token sampled.",
        );
        self.inter_token_seconds.render(
            &mut out,
            "inferloop_inter_token_seconds",
            "Time between consecutive tokens of one sequence.",
        );
        self.request_seconds.render(
            &mut out,
            "inferloop_request_seconds",
            "Request received to last token.",
        );
        if let Ok(extra) = self.extra.lock() {
            for f in extra.iter() {
                f(&mut out);
            }
        }
        out
    }
}

fn gauge(out: &mut String, name: &str, help: &str, v: i64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Escapes a label value per the exposition format.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
        let mut out = String::new();
        h.render(&mut out, "x", "help");
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

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
