//! The Prometheus text exposition format (0.0.4): the one place that writes `# HELP`,
//! `# TYPE`, label sets and sample values.

use std::collections::HashSet;
use std::fmt::Write as _;

/// A sample value as the format spells it. Integers print as they are; floats print the
/// shortest text that reads back the same, with `+Inf`, `-Inf` and `NaN` for the others.
pub trait Value {
    fn write_to(&self, out: &mut String);
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_value!(u8, u64, i64, usize);

impl Value for f64 {
    fn write_to(&self, out: &mut String) {
        // Rust spells infinity `inf`, which strict parsers reject.
        if self.is_nan() {
            out.push_str("NaN");
        } else if *self == f64::INFINITY {
            out.push_str("+Inf");
        } else if *self == f64::NEG_INFINITY {
            out.push_str("-Inf");
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

/// Builds one exposition. Every family is announced once, with its samples right after it,
/// so families stay contiguous as the format requires.
#[derive(Debug, Default)]
pub struct TextWriter {
    out: String,
    announced: HashSet<String>,
}

impl TextWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }

    fn announce(&mut self, name: &str, help: &str, kind: &str) {
        // Two families of one name make the whole scrape invalid: a bug in this daemon.
        let first = self.announced.insert(name.to_string());
        debug_assert!(first, "metric family {name} announced twice");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, suffix: &str, labels: &str, value: &dyn Value) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        self.out.push_str(labels);
        self.out.push(' ');
        value.write_to(&mut self.out);
        self.out.push('\n');
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl Value) {
        self.announce(name, help, "gauge");
        self.sample(name, "", "", &value);
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: impl Value) {
        self.announce(name, help, "counter");
        self.sample(name, "", "", &value);
    }

    /// A gauge family with labels, its samples added by `samples`. Announced even if no
    /// sample is added, so dashboards see it exist.
    pub fn gauge_family(&mut self, name: &str, help: &str, samples: impl FnOnce(&mut Family<'_>)) {
        self.announce(name, help, "gauge");
        samples(&mut Family::new(self, name));
    }

    /// A counter family with labels, its samples added by `samples`; announced even if
    /// none is added.
    pub fn counter_family(
        &mut self,
        name: &str,
        help: &str,
        samples: impl FnOnce(&mut Family<'_>),
    ) {
        self.announce(name, help, "counter");
        samples(&mut Family::new(self, name));
    }

    /// A histogram without labels. `counts[i]` is the number of observations that fell in
    /// bucket `i` alone (at most `bounds[i]`, above `bounds[i - 1]`); the written buckets
    /// are cumulative, and `+Inf` is `count`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
        count: u64,
    ) {
        self.announce(name, help, "histogram");
        let mut cumulative = 0;
        for (bound, n) in bounds.iter().zip(counts) {
            cumulative += n;
            let mut le = String::new();
            bound.write_to(&mut le);
            self.sample(name, "_bucket", &label_set(&[("le", &le)]), &cumulative);
        }
        self.sample(name, "_bucket", "{le=\"+Inf\"}", &count);
        self.sample(name, "_sum", "", &sum);
        self.sample(name, "_count", "", &count);
    }
}

/// The samples of one labelled family, written as they are added.
pub struct Family<'w> {
    writer: &'w mut TextWriter,
    name: &'w str,
    seen: HashSet<String>,
}

impl<'w> Family<'w> {
    fn new(writer: &'w mut TextWriter, name: &'w str) -> Self {
        Family {
            writer,
            name,
            seen: HashSet::new(),
        }
    }

    /// Adds the sample with `labels` (name, raw value; values are escaped here). A label
    /// set already written keeps its first value: two sources may name a sensor alike,
    /// and a repeated series breaks scrapers.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Value) -> &mut Self {
        let labels = label_set(labels);
        if self.seen.insert(labels.clone()) {
            self.writer.sample(self.name, "", &labels, &value);
        }
        self
    }
}

/// `{a="x",b="y"}`, in the order given.
fn label_set(labels: &[(&str, &str)]) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"{}\"", escape_label(value));
    }
    out.push('}');
    out
}

/// Escapes a label value per the exposition format.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn single_series_are_announced_then_written() {
        let mut w = TextWriter::new();
        w.gauge("g", "A gauge.", -3i64);
        w.counter("c_total", "A counter.", 7u64);
        assert_eq!(
            w.finish(),
            "# HELP g A gauge.\n# TYPE g gauge\ng -3\n\
             # HELP c_total A counter.\n# TYPE c_total counter\nc_total 7\n"
        );
    }

    #[test]
    fn family_escapes_labels_and_keeps_the_first_of_a_repeated_label_set() {
        let mut w = TextWriter::new();
        w.gauge_family("t", "Temps.", |f| {
            f.sample(&[("zone", "gpu")], 45.8)
                .sample(&[("zone", "gpu")], 99.0)
                .sample(&[("zone", "odd\"zone")], 30.0);
        });
        w.counter_family("r_total", "Requests.", |f| {
            f.sample(&[("route", "/x"), ("code", "200")], 2u64)
                .sample(&[("route", "/x"), ("code", "404")], 1u64);
        });
        assert_eq!(
            w.finish(),
            "# HELP t Temps.\n# TYPE t gauge\nt{zone=\"gpu\"} 45.8\nt{zone=\"odd\\\"zone\"} 30\n\
             # HELP r_total Requests.\n# TYPE r_total counter\n\
             r_total{route=\"/x\",code=\"200\"} 2\nr_total{route=\"/x\",code=\"404\"} 1\n"
        );
    }

    #[test]
    fn empty_family_is_still_announced() {
        let mut w = TextWriter::new();
        w.gauge_family("t", "Temps.", |_| {});
        assert_eq!(w.finish(), "# HELP t Temps.\n# TYPE t gauge\n");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let mut w = TextWriter::new();
        w.histogram("x", "help", &[0.1, 1.0], &[1, 1], 5.55, 3);
        assert_eq!(
            w.finish(),
            "# HELP x help\n# TYPE x histogram\nx_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 2\n\
             x_bucket{le=\"+Inf\"} 3\nx_sum 5.55\nx_count 3\n"
        );
    }

    #[test]
    fn non_finite_floats_use_the_format_spelling() {
        let mut w = TextWriter::new();
        w.gauge_family("f", "Floats.", |f| {
            f.sample(&[("v", "nan")], f64::NAN)
                .sample(&[("v", "inf")], f64::INFINITY)
                .sample(&[("v", "-inf")], f64::NEG_INFINITY);
        });
        let text = w.finish();
        for line in [
            "f{v=\"nan\"} NaN\n",
            "f{v=\"inf\"} +Inf\n",
            "f{v=\"-inf\"} -Inf\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    // A debug assertion: `make test` runs release builds, where it is compiled out.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "announced twice")]
    fn a_family_announced_twice_is_a_bug() {
        let mut w = TextWriter::new();
        w.gauge("g", "Once.", 1i64);
        w.gauge("g", "Twice.", 2i64);
    }
}
