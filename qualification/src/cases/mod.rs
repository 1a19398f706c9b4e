//! The 385 cases, one module per group, and the helpers they share.

pub mod api;
pub mod chat;
pub mod completions;
pub mod device;
pub mod input;
pub mod integrity;
pub mod lifecycle;
pub mod load;
pub mod memory;
pub mod perf;
pub mod stream;
pub mod text;

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::case::{Case, Registry, Stop};
use crate::ctx::Ctx;

/// Every case, in report order.
pub fn all() -> Vec<Case> {
    let mut r = Registry::default();
    api::register(&mut r);
    chat::register(&mut r);
    stream::register(&mut r);
    completions::register(&mut r);
    input::register(&mut r);
    load::register(&mut r);
    memory::register(&mut r);
    integrity::register(&mut r);
    device::register(&mut r);
    lifecycle::register(&mut r);
    text::register(&mut r);
    perf::register(&mut r);
    r.cases
}

/// A prompt whose temperature-0 answer is a few plain English sentences.
pub const EXPLAIN: &str = "Explain in three sentences why the sky is blue.";

/// The temperature-0 answer to `body` on `path` of the shared daemon, computed once per run
/// and shared by every case comparing against it.
pub fn reference(c: &Ctx, path: &str, body: &Value) -> Result<Value, Stop> {
    let key = format!("ref {path} {body}");
    let t = c.target.clone();
    let (p, b) = (path.to_string(), body.clone());
    (*c.memo(&key, move || t.post_ok(&p, &b))).clone()
}

/// Seconds since the Unix epoch on this machine.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A word of `text` to stop on (with its leading space, past the first few words) and the
/// text before its first occurrence.
pub fn pick_stop(text: &str) -> Result<(String, String), Stop> {
    let word = text
        .split_whitespace()
        .skip(3)
        .find(|w| w.len() >= 4 && w.chars().all(char::is_alphabetic))
        .ok_or_else(|| Stop::fail("a reference output with a word to stop on", text))?;
    let stop = format!(" {word}");
    let at = text
        .find(&stop)
        .ok_or_else(|| Stop::fail(format!("{stop:?} in the reference"), text))?;
    Ok((stop, text[..at].to_string()))
}

/// Percentile `p` (0–100) of `values` by nearest rank; `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v.get(rank.min(v.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::case::Group;

    #[test]
    fn there_are_385_cases_with_unique_ids_in_the_issue_counts() {
        let cases = all();
        assert_eq!(cases.len(), 385);
        let mut seen = HashSet::new();
        let mut per: BTreeMap<Group, usize> = BTreeMap::new();
        for c in &cases {
            assert!(seen.insert(c.id.clone()), "duplicate id {}", c.id);
            assert!(
                c.id.starts_with(&format!("{}.", c.group.name())),
                "{} is not under its group {}",
                c.id,
                c.group
            );
            assert!(
                c.id.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._".contains(ch)),
                "id {} must be lowercase ascii, digits, dots and underscores",
                c.id
            );
            assert!(!c.title.is_empty() && !c.expect.is_empty(), "{}", c.id);
            assert!(!c.title.contains('\n'), "{}: one-line title", c.id);
            *per.entry(c.group).or_default() += 1;
        }
        for g in Group::ALL {
            assert_eq!(per.get(&g).copied().unwrap_or(0), g.size(), "group {g}");
        }
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn stop_words_come_from_the_middle_of_the_text() {
        let (stop, before) =
            pick_stop("The sky is blue because of Rayleigh scattering").expect("a word");
        assert_eq!(stop, " blue");
        assert_eq!(before, "The sky is");
    }
}
