//! The verdict in three forms: `report.json` (everything, for machines), `report.md` (for a
//! ticket) and a self-contained `report.html` (inline CSS and SVG, no network).

pub mod compare;
mod html;
mod markdown;

use std::path::Path;

use serde::Serialize;

use crate::case::{CaseResult, Group, Status};
use crate::env::Environment;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub duration_ms: f64,
}

impl Counts {
    fn add(&mut self, r: &CaseResult) {
        self.total += 1;
        self.duration_ms += r.duration_ms;
        match r.status {
            Status::Passed => self.passed += 1,
            Status::Failed => self.failed += 1,
            Status::Skipped => self.skipped += 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupSummary {
    pub group: Group,
    pub covers: &'static str,
    #[serde(flatten)]
    pub counts: Counts,
}

#[derive(Debug, Clone, Serialize)]
pub struct Samples {
    pub ttft_ms: Vec<f64>,
    pub inter_token_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub verdict: &'static str,
    pub wall_s: f64,
    pub totals: Counts,
    pub groups: Vec<GroupSummary>,
    pub environment: Environment,
    pub samples: Samples,
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn new(
        environment: Environment,
        cases: Vec<CaseResult>,
        samples: Samples,
        wall_s: f64,
    ) -> Report {
        let mut totals = Counts::default();
        let mut groups: Vec<GroupSummary> = Group::ALL
            .iter()
            .map(|&g| GroupSummary {
                group: g,
                covers: g.covers(),
                counts: Counts::default(),
            })
            .collect();
        for r in &cases {
            totals.add(r);
            if let Some(g) = groups.iter_mut().find(|g| g.group == r.group) {
                g.counts.add(r);
            }
        }
        groups.retain(|g| g.counts.total > 0);
        let verdict = if totals.failed > 0 { "FAIL" } else { "PASS" };
        Report {
            verdict,
            wall_s,
            totals,
            groups,
            environment,
            samples,
            cases,
        }
    }

    /// Writes report.json, report.md and report.html into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("report.md"), markdown::render(self))?;
        std::fs::write(dir.join("report.html"), html::render(self))?;
        Ok(())
    }

    /// The one-screen summary printed at the end of a run.
    pub fn summary_text(&self) -> String {
        let mut s = format!(
            "{} — {} passed, {} failed, {} skipped of {} in {:.1} s\n",
            self.verdict,
            self.totals.passed,
            self.totals.failed,
            self.totals.skipped,
            self.totals.total,
            self.wall_s
        );
        s.push_str(&format!(
            "{:<12} {:>5} {:>5} {:>5} {:>5}\n",
            "group", "pass", "fail", "skip", "total"
        ));
        for g in &self.groups {
            s.push_str(&format!(
                "{:<12} {:>5} {:>5} {:>5} {:>5}\n",
                g.group.name(),
                g.counts.passed,
                g.counts.failed,
                g.counts.skipped,
                g.counts.total
            ));
        }
        for r in self.cases.iter().filter(|r| r.status == Status::Failed) {
            s.push_str(&format!(
                "FAIL {}\n  expected: {}\n  observed: {}\n",
                r.id,
                r.expected.as_deref().unwrap_or_default(),
                crate::case::snippet(&r.observation, 400)
            ));
        }
        s
    }
}

/// The environment table, shared by the HTML and Markdown reports.
pub fn environment_rows(e: &Environment) -> Vec<(&'static str, String)> {
    let floors = match e.board.get("perf_floors") {
        Some(f) if !f.is_null() => f.to_string(),
        _ => "none in the profile (perf floors skipped, measured values recorded)".into(),
    };
    vec![
        (
            "board",
            format!(
                "{} — {}",
                e.board["name"].as_str().unwrap_or("unknown"),
                e.board["reason"].as_str().unwrap_or("")
            ),
        ),
        ("perf floors", floors),
        (
            "server",
            format!(
                "{} (ready via GET {}{})",
                e.server.name,
                e.server.ready_via,
                if e.server.inferloopd {
                    ""
                } else {
                    "; inferloopd-only cases skipped"
                }
            ),
        ),
        ("daemon version", e.daemon_version.clone()),
        (
            "daemon binary",
            e.daemon_binary.clone().unwrap_or_else(|| "—".into()),
        ),
        (
            "model",
            format!(
                "{} {}",
                e.model_id,
                e.model_path.clone().unwrap_or_default()
            ),
        ),
        (
            "model SHA-256",
            e.model_sha256.clone().unwrap_or_else(|| "unknown".into()),
        ),
        (
            "manifest SHA-256",
            e.manifest_sha256
                .clone()
                .unwrap_or_else(|| "none (no --manifest)".into()),
        ),
        ("mode", format!("{} → {}", e.mode, e.target)),
        ("shared daemon", shared_line(e)),
        ("host", host_line(e)),
        (
            "suite",
            format!(
                "inferloop-qual {} · --jobs {} · filter {:?}",
                e.suite_version, e.jobs, e.filter
            ),
        ),
    ]
}

/// The host in one line: name, architecture, CPUs, kernel and the load around the run.
pub fn host_line(e: &Environment) -> String {
    let h = &e.host;
    let text = |k: &str| h[k].as_str().unwrap_or("?").to_string();
    format!(
        "{} · {} · {} CPUs · kernel {} · load {} at start, {} at end",
        text("hostname"),
        text("arch"),
        h["cpus"],
        text("kernel"),
        text("loadavg_at_start"),
        text("loadavg_at_end")
    )
}

/// The shared daemon in one line: its settings, its command line and the work it did.
pub fn shared_line(e: &Environment) -> String {
    let d = &e.shared_daemon;
    let work = &d["requests"];
    format!(
        "slots {} · ctx {} · queue {} · {} prompt + {} generated tokens, {} cancelled · {}",
        d["slots"],
        d["ctx"],
        d["queue"],
        work["prompt_tokens_total"],
        work["generated_tokens_total"],
        work["cancelled_total"],
        d["argv"]
            .as_str()
            .unwrap_or("(attached: started elsewhere)")
    )
}

/// Counts of `values` in `bins` equal-width bins over [0, max]; returns (edges, counts).
pub fn histogram(values: &[f64], bins: usize) -> (Vec<f64>, Vec<usize>) {
    let max = values.iter().cloned().fold(0.0f64, f64::max).max(1e-9);
    let width = max / bins as f64;
    let mut counts = vec![0usize; bins];
    for v in values {
        let i = ((v / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    let edges = (0..=bins).map(|i| i as f64 * width).collect();
    (edges, counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Evidence;

    pub(crate) fn sample_report() -> Report {
        let mk = |id: &str, group, status| CaseResult {
            id: id.into(),
            group,
            title: format!("title of {id} <&>"),
            status,
            duration_ms: 12.0,
            expectation: "200".into(),
            observation: "500 \"boom\" <script>".into(),
            expected: (status == Status::Failed).then(|| "200".to_string()),
            skip_reason: (status == Status::Skipped).then(|| "needs --spawn".to_string()),
            evidence: Evidence::default(),
        };
        let env = crate::env::Environment {
            started_utc: "2026-01-01T00:00:00Z".into(),
            mode: "spawn (--spawn)",
            target: "http://127.0.0.1:1".into(),
            server: crate::server::Server::inferloopd("0.1.0"),
            daemon_version: "0.1.0".into(),
            daemon_binary: None,
            model_id: "m".into(),
            model_path: None,
            model_sha256: Some("ab".repeat(32)),
            manifest_sha256: None,
            board: serde_json::json!({"name": "x86_64-cpu"}),
            host: serde_json::json!({}),
            shared_daemon: serde_json::json!({}),
            suite_version: "0.1.0",
            jobs: 1,
            filter: vec![],
            notes: serde_json::json!({}),
        };
        Report::new(
            env,
            vec![
                mk("api.a", Group::Api, Status::Passed),
                mk("api.b", Group::Api, Status::Failed),
                mk("perf.c", Group::Perf, Status::Skipped),
            ],
            Samples {
                ttft_ms: vec![10.0, 12.0, 30.0],
                inter_token_ms: vec![5.0, 6.0, 6.5, 40.0],
            },
            3.5,
        )
    }

    #[test]
    fn counts_and_verdict_follow_the_cases() {
        let r = sample_report();
        assert_eq!(r.verdict, "FAIL");
        assert_eq!(
            (r.totals.passed, r.totals.failed, r.totals.skipped),
            (1, 1, 1)
        );
        assert_eq!(r.groups.len(), 2);
        assert!(r.summary_text().contains("FAIL api.b"));
    }

    #[test]
    fn html_is_self_contained_and_escaped() {
        let html = html::render(&sample_report());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(
            !html.contains("<script"),
            "no scripts, and case text is escaped"
        );
        assert!(html.contains("&lt;script&gt;"));
        for banned in ["http://", "https://"] {
            let outside_text = html.replace("http://127.0.0.1:1", "");
            assert!(
                !outside_text.contains(&format!("src=\"{banned}")),
                "no remote resources"
            );
            assert!(
                !outside_text.contains(&format!("href=\"{banned}")),
                "no remote links"
            );
        }
        assert!(html.contains("<svg"), "charts inline");
        assert!(html.contains("expected"));
    }

    #[test]
    fn markdown_lists_failures_with_expected_and_observed() {
        let md = markdown::render(&sample_report());
        assert!(md.contains("| api |"));
        assert!(md.contains("api.b"));
        assert!(md.contains("needs --spawn"));
    }

    #[test]
    fn histogram_bins_cover_the_range() {
        let (edges, counts) = histogram(&[0.0, 1.0, 2.0, 10.0], 5);
        assert_eq!(edges.len(), 6);
        assert_eq!(counts.iter().sum::<usize>(), 4);
        assert_eq!(counts[4], 1);
    }
}
