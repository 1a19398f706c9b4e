//! `report.md`: the summary, every failure with expected vs observed, every skip with its
//! reason, and the full case list.

use std::fmt::Write as _;

use super::Report;
use crate::case::Status;
use crate::cases::percentile;

/// Text safe inside a Markdown table cell.
fn cell(s: &str) -> String {
    crate::case::snippet(s, 300)
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let e = &r.environment;
    let _ = writeln!(o, "# InferLoop qualification: {}\n", r.verdict);
    let _ = writeln!(
        o,
        "{} passed, {} failed, {} skipped of {} cases in {:.1} s (started {}).\n",
        r.totals.passed, r.totals.failed, r.totals.skipped, r.totals.total, r.wall_s, e.started_utc
    );
    let _ = writeln!(o, "## Environment\n\n| | |\n|---|---|");
    for (k, v) in super::environment_rows(e) {
        let _ = writeln!(o, "| {k} | {} |", cell(&v));
    }
    let _ = writeln!(o, "\n## Groups\n\n| group | pass | fail | skip | total | covers |\n|---|---:|---:|---:|---:|---|");
    for g in &r.groups {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            g.group.name(),
            g.counts.passed,
            g.counts.failed,
            g.counts.skipped,
            g.counts.total,
            cell(g.covers)
        );
    }
    let pct = |v: &[f64], p| percentile(v, p).map_or("—".to_string(), |x| format!("{x:.1}"));
    let _ = writeln!(
        o,
        "\n## Latency\n\n| | samples | p50 ms | p90 ms | p99 ms |\n|---|---:|---:|---:|---:|\n| time to first token | {} | {} | {} | {} |\n| inter-token | {} | {} | {} | {} |",
        r.samples.ttft_ms.len(),
        pct(&r.samples.ttft_ms, 50.0),
        pct(&r.samples.ttft_ms, 90.0),
        pct(&r.samples.ttft_ms, 99.0),
        r.samples.inter_token_ms.len(),
        pct(&r.samples.inter_token_ms, 50.0),
        pct(&r.samples.inter_token_ms, 90.0),
        pct(&r.samples.inter_token_ms, 99.0),
    );
    let failed: Vec<_> = r
        .cases
        .iter()
        .filter(|c| c.status == Status::Failed)
        .collect();
    let _ = writeln!(o, "\n## Failures ({})\n", failed.len());
    if failed.is_empty() {
        let _ = writeln!(o, "None.");
    }
    for c in failed {
        let _ = writeln!(
            o,
            "### `{}`: {}\n\n- **expected:** {}\n- **observed:** {}\n",
            c.id,
            c.title,
            c.expected.as_deref().unwrap_or_default().replace('\n', " "),
            crate::case::snippet(&c.observation, 1500).replace('\n', " ")
        );
    }
    let skipped: Vec<_> = r
        .cases
        .iter()
        .filter(|c| c.status == Status::Skipped)
        .collect();
    let _ = writeln!(o, "\n## Skipped ({})\n", skipped.len());
    if skipped.is_empty() {
        let _ = writeln!(o, "None.");
    } else {
        let _ = writeln!(o, "| case | reason |\n|---|---|");
        for c in skipped {
            let _ = writeln!(
                o,
                "| `{}` | {} |",
                c.id,
                cell(c.skip_reason.as_deref().unwrap_or_default())
            );
        }
    }
    let _ = writeln!(
        o,
        "\n## All cases\n\n| case | status | ms | observation |\n|---|---|---:|---|"
    );
    for c in &r.cases {
        let obs = match c.status {
            Status::Skipped => c.skip_reason.clone().unwrap_or_default(),
            _ => c.observation.clone(),
        };
        let _ = writeln!(
            o,
            "| `{}` | {} | {:.0} | {} |",
            c.id,
            c.status.label(),
            c.duration_ms,
            cell(&obs)
        );
    }
    o
}
