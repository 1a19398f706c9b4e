//! [`TextWriter`]: how a subsystem writes the series it computes at scrape time (plan, backend,
//! memory ledger, thermal) through `prometheus-client`'s encoder.

use std::collections::HashSet;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Writes gauges into one scrape. Renderers stay infallible: the first encoding error is kept,
/// later writes are skipped, and [`TextWriter::finish`] hands the error to the registry.
pub struct TextWriter<'e> {
    encoder: DescriptorEncoder<'e>,
    result: std::fmt::Result,
}

impl<'e> TextWriter<'e> {
    pub(super) fn new(encoder: DescriptorEncoder<'e>) -> Self {
        Self {
            encoder,
            result: Ok(()),
        }
    }

    pub(super) fn finish(self) -> std::fmt::Result {
        self.result
    }

    /// Announces a gauge family (`# HELP`, `# TYPE`; `help` is written as given) and writes
    /// its samples with `samples`.
    fn family(
        &mut self,
        name: &str,
        help: &str,
        samples: impl FnOnce(&mut MetricEncoder<'_>) -> std::fmt::Result,
    ) {
        if self.result.is_err() {
            return;
        }
        self.result = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Gauge)
            .and_then(|mut e| samples(&mut e));
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl EncodeGaugeValue) {
        self.family(name, help, |e| e.encode_gauge(&value));
    }

    /// A gauge family with labels, its samples added by `samples`. Announced even if no
    /// sample is added, so dashboards see it exist.
    pub fn gauge_family(
        &mut self,
        name: &str,
        help: &str,
        samples: impl FnOnce(&mut Family<'_, '_>),
    ) {
        self.family(name, help, |encoder| {
            let mut family = Family {
                encoder,
                seen: HashSet::new(),
                result: Ok(()),
            };
            samples(&mut family);
            family.result
        });
    }
}

/// The samples of one labelled gauge family, written as they are added.
pub struct Family<'f, 'e> {
    encoder: &'f mut MetricEncoder<'e>,
    seen: HashSet<Vec<(String, String)>>,
    result: std::fmt::Result,
}

impl Family<'_, '_> {
    /// Adds the sample with `labels` (name, raw value; the encoder escapes values). A label
    /// set already written keeps its first value: two sources may name a sensor alike, and
    /// a repeated series breaks scrapers.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl EncodeGaugeValue) -> &mut Self {
        let key = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if self.result.is_ok() && self.seen.insert(key) {
            self.result = self
                .encoder
                .encode_family(&labels)
                .and_then(|mut e| e.encode_gauge(&value));
        }
        self
    }
}

/// One renderer's text alone, as `/metrics` would carry it (tests of the renderers).
pub fn render(f: impl Fn(&mut TextWriter<'_>) + Send + Sync + 'static) -> String {
    struct One<F>(F);
    impl<F> std::fmt::Debug for One<F> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("One")
        }
    }
    impl<F: Fn(&mut TextWriter<'_>) + Send + Sync + 'static> Collector for One<F> {
        fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
            let mut w = TextWriter::new(encoder);
            (self.0)(&mut w);
            w.finish()
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(One(f)));
    let mut out = String::new();
    // A `String` takes every write.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let text = render(|w| {
            w.gauge_family("t", "Temps.", |f| {
                f.sample(&[("zone", "a\"b\\c\nd")], 1i64);
            })
        });
        assert!(text.contains("t{zone=\"a\\\"b\\\\c\\nd\"} 1\n"), "{text}");
    }

    #[test]
    fn single_series_are_announced_then_written() {
        let text = render(|w| {
            w.gauge("g", "A gauge.", -3i64);
            w.gauge("u", "Another.", 7u64);
        });
        assert_eq!(
            text,
            "# HELP g A gauge.\n# TYPE g gauge\ng -3\n\
             # HELP u Another.\n# TYPE u gauge\nu 7\n"
        );
    }

    #[test]
    fn family_escapes_labels_and_keeps_the_first_of_a_repeated_label_set() {
        let text = render(|w| {
            w.gauge_family("t", "Temps.", |f| {
                f.sample(&[("zone", "gpu")], 45.8)
                    .sample(&[("zone", "gpu")], 99.0)
                    .sample(&[("zone", "odd\"zone")], 30.0);
            });
            w.gauge_family("r", "Two labels.", |f| {
                f.sample(&[("route", "/x"), ("code", "200")], 2u64)
                    .sample(&[("route", "/x"), ("code", "404")], 1u64);
            });
        });
        assert_eq!(
            text,
            "# HELP t Temps.\n# TYPE t gauge\nt{zone=\"gpu\"} 45.8\nt{zone=\"odd\\\"zone\"} 30.0\n\
             # HELP r Two labels.\n# TYPE r gauge\n\
             r{route=\"/x\",code=\"200\"} 2\nr{route=\"/x\",code=\"404\"} 1\n"
        );
    }

    #[test]
    fn empty_family_is_still_announced() {
        let text = render(|w| w.gauge_family("t", "Temps.", |_| {}));
        assert_eq!(text, "# HELP t Temps.\n# TYPE t gauge\n");
    }

    #[test]
    fn non_finite_floats_use_the_format_spelling() {
        let text = render(|w| {
            w.gauge_family("f", "Floats.", |f| {
                f.sample(&[("v", "nan")], f64::NAN)
                    .sample(&[("v", "inf")], f64::INFINITY)
                    .sample(&[("v", "-inf")], f64::NEG_INFINITY);
            })
        });
        for line in [
            "f{v=\"nan\"} NaN\n",
            "f{v=\"inf\"} +Inf\n",
            "f{v=\"-inf\"} -Inf\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
