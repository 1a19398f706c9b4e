//! A strict parser for the Prometheus text exposition format (0.0.4): every sample belongs to
//! a family announced by `# TYPE` before it, names and labels are well formed, values parse,
//! families are contiguous and no series appears twice. Scrapers are lenient; the device must
//! not depend on that.

use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "summary" => Kind::Summary,
            "untyped" => Kind::Untyped,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
            Kind::Untyped => "untyped",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's own name (`x_bucket`, `x_sum` for histograms).
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub kind: Kind,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub families: Vec<Family>,
}

impl Exposition {
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// The value of the sample `name` with exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.families
            .iter()
            .flat_map(|f| &f.samples)
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.label(k) == Some(v))
            })
            .map(|s| s.value)
    }

    pub fn sample_count(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }
}

fn valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse::<f64>().ok().filter(|v| v.is_finite()),
    }
}

/// Parses `name{a="b",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let end;
        loop {
            // label name
            let start = match chars.peek() {
                Some((i, '}')) => {
                    end = *i;
                    break;
                }
                Some((i, _)) => *i,
                None => return Err("unterminated label set".into()),
            };
            let mut eq = None;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    eq = Some(i);
                    break;
                }
            }
            let eq = eq.ok_or("label without `=`")?;
            let lname = &after[start..eq];
            if !valid_label_name(lname) {
                return Err(format!("invalid label name {lname:?}"));
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {lname} value must be quoted"));
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => return Err(format!("bad escape \\{other:?} in label {lname}")),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\n' => return Err("newline inside a label value".into()),
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(format!("unterminated value of label {lname}"));
            }
            if labels.iter().any(|(k, _): &(String, String)| k == lname) {
                return Err(format!("label {lname} repeated"));
            }
            labels.push((lname.to_string(), value));
            match chars.next() {
                Some((_, ',')) => {
                    // A trailing comma before `}` is allowed by the format.
                    if let Some((i, '}')) = chars.peek().copied() {
                        end = i;
                        break;
                    }
                }
                Some((i, '}')) => {
                    end = i;
                    break;
                }
                other => return Err(format!("expected `,` or `}}` after a label, got {other:?}")),
            }
        }
        rest = &after[end + 1..];
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or("expected one space before the value")?;
    let mut parts = rest.split(' ');
    let value_text = parts.next().unwrap_or_default();
    let value = parse_value(value_text).ok_or_else(|| format!("invalid value {value_text:?}"))?;
    if let Some(ts) = parts.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("invalid timestamp {ts:?}"))?;
    }
    if parts.next().is_some() {
        return Err("trailing fields after the timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Which family a sample name belongs to, given the family's kind.
fn belongs(family: &Family, sample: &str) -> bool {
    match family.kind {
        Kind::Histogram => [
            format!("{}_bucket", family.name),
            format!("{}_sum", family.name),
            format!("{}_count", family.name),
        ]
        .contains(&sample.to_string()),
        Kind::Summary => {
            sample == family.name
                || sample == format!("{}_sum", family.name)
                || sample == format!("{}_count", family.name)
        }
        _ => sample == family.name,
    }
}

/// Parses a whole exposition strictly; the error names the line.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut families: Vec<Family> = Vec::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut series: HashSet<String> = HashSet::new();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the exposition must end with a newline".into());
    }
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match words.next() {
                Some("HELP") => {
                    let name = words
                        .next()
                        .ok_or_else(|| at("HELP without a name".into()))?;
                    if !valid_metric_name(name) {
                        return Err(at(format!("invalid metric name {name:?}")));
                    }
                    if helps
                        .insert(name.to_string(), words.next().unwrap_or("").to_string())
                        .is_some()
                    {
                        return Err(at(format!("second HELP for {name}")));
                    }
                }
                Some("TYPE") => {
                    let name = words
                        .next()
                        .ok_or_else(|| at("TYPE without a name".into()))?;
                    let kind = words
                        .next()
                        .and_then(|k| Kind::parse(k.trim()))
                        .ok_or_else(|| {
                            at("TYPE needs counter|gauge|histogram|summary|untyped".into())
                        })?;
                    if !valid_metric_name(name) {
                        return Err(at(format!("invalid metric name {name:?}")));
                    }
                    if families.iter().any(|f| f.name == name) {
                        return Err(at(format!("second TYPE for {name}")));
                    }
                    if let Some(prev) = families.last() {
                        closed.insert(prev.name.clone());
                    }
                    families.push(Family {
                        name: name.to_string(),
                        kind,
                        help: None,
                        samples: Vec::new(),
                    });
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        let sample = parse_sample(line).map_err(at)?;
        let Some(family) = families.last_mut() else {
            return Err(at("sample before any # TYPE".into()));
        };
        if !belongs(family, &sample.name) {
            let owner = closed.iter().find(|f| sample.name.starts_with(f.as_str()));
            return Err(at(match owner {
                Some(f) => format!("sample of family {f} after that family ended"),
                None => format!(
                    "sample {} does not belong to the announced family {} ({})",
                    sample.name,
                    family.name,
                    family.kind.name()
                ),
            }));
        }
        let mut key = sample.name.clone();
        let mut sorted = sample.labels.clone();
        sorted.sort();
        for (k, v) in &sorted {
            key.push_str(&format!("|{k}={v}"));
        }
        if !series.insert(key) {
            return Err(at(format!("series {} repeated", sample.name)));
        }
        family.samples.push(sample);
    }
    for f in &mut families {
        f.help = helps.remove(&f.name);
    }
    Ok(Exposition { families })
}

/// Histogram invariants per label set: `le` buckets in increasing order with cumulative
/// non-decreasing counts, a `+Inf` bucket equal to `_count`, and a `_sum`.
pub fn check_histogram(f: &Family) -> Result<(), String> {
    let mut groups: BTreeMap<Vec<(String, String)>, Vec<&Sample>> = BTreeMap::new();
    for s in &f.samples {
        let mut labels: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        labels.sort();
        groups.entry(labels).or_default().push(s);
    }
    if groups.is_empty() {
        return Err(format!("histogram {} has no samples", f.name));
    }
    for (labels, samples) in groups {
        let bucket = format!("{}_bucket", f.name);
        let mut last_le = f64::NEG_INFINITY;
        let mut last_count = 0.0;
        let mut inf = None;
        for s in samples.iter().filter(|s| s.name == bucket) {
            let le = s
                .label("le")
                .and_then(parse_value)
                .ok_or_else(|| format!("{bucket} {labels:?} without a numeric le"))?;
            if le <= last_le {
                return Err(format!("{bucket} {labels:?}: le {le} not above {last_le}"));
            }
            if s.value < last_count {
                return Err(format!(
                    "{bucket} {labels:?}: count {} at le {le} below {last_count}",
                    s.value
                ));
            }
            last_le = le;
            last_count = s.value;
            if le.is_infinite() {
                inf = Some(s.value);
            }
        }
        let count = samples
            .iter()
            .find(|s| s.name == format!("{}_count", f.name))
            .map(|s| s.value)
            .ok_or_else(|| format!("{} {labels:?} has no _count", f.name))?;
        if !samples.iter().any(|s| s.name == format!("{}_sum", f.name)) {
            return Err(format!("{} {labels:?} has no _sum", f.name));
        }
        match inf {
            Some(v) if v == count => {}
            Some(v) => {
                return Err(format!(
                    "{} {labels:?}: +Inf bucket {v} differs from _count {count}",
                    f.name
                ))
            }
            None => return Err(format!("{} {labels:?} has no +Inf bucket", f.name)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP a_total Things.\n# TYPE a_total counter\na_total{route=\"/x\",code=\"200\"} 3\n\
        # TYPE g gauge\ng 1.5\n# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n";

    #[test]
    fn a_well_formed_exposition_parses_with_types_and_help() {
        let e = parse(GOOD).expect("valid");
        assert_eq!(e.families.len(), 3);
        assert_eq!(e.family("a_total").map(|f| f.kind), Some(Kind::Counter));
        assert_eq!(
            e.family("a_total").and_then(|f| f.help.as_deref()),
            Some("Things.")
        );
        assert_eq!(
            e.value("a_total", &[("code", "200"), ("route", "/x")]),
            Some(3.0)
        );
        check_histogram(e.family("h").expect("h")).expect("consistent");
    }

    #[test]
    fn samples_without_a_type_or_out_of_family_are_rejected() {
        assert!(parse("x 1\n").is_err());
        assert!(parse("# TYPE g gauge\nh 1\n").is_err());
        assert!(
            parse("# TYPE g gauge\ng 1\ng 2\n").is_err(),
            "duplicate series"
        );
        assert!(
            parse("# TYPE g gauge\n# TYPE k gauge\nk 1\ng 1\n").is_err(),
            "split family"
        );
    }

    #[test]
    fn malformed_lines_are_rejected() {
        for bad in [
            "# TYPE g gauge\ng{a=b} 1\n",
            "# TYPE g gauge\ng{a=\"b\" 1\n",
            "# TYPE g gauge\ng  1\n",
            "# TYPE g gauge\ng one\n",
            "# TYPE g gauge\n9g 1\n",
            "# TYPE g gauge\ng{a=\"x\\q\"} 1\n",
            "# TYPE g gauge\ng 1",
            "# TYPE g thing\ng 1\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let e = parse("# TYPE g gauge\ng{a=\"q\\\"\\\\\\n\",} 1 1700000000\n").expect("escapes");
        assert_eq!(e.families[0].samples[0].label("a"), Some("q\"\\\n"));
    }

    #[test]
    fn inconsistent_histograms_are_caught() {
        let e = parse("# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n")
            .expect("parses");
        assert!(check_histogram(&e.families[0]).is_err());
        let e = parse("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n")
            .expect("parses");
        assert!(check_histogram(&e.families[0]).is_err());
    }
}
