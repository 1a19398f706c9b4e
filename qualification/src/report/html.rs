//! `report.html`: one self-contained file (inline CSS, inline SVG charts, no script, no
//! network) that reads well in a browser and prints.

use std::fmt::Write as _;

use super::{histogram, Report};
use crate::case::{CaseResult, Status};
use crate::cases::percentile;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = r#"
*{box-sizing:border-box}
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1f2328;margin:0;background:#f6f8fa}
main{max-width:1280px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 10px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.banner{display:flex;align-items:center;gap:20px;background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 20px}
.verdict{font-size:30px;font-weight:700;padding:6px 18px;border-radius:6px;color:#fff}
.v-PASS{background:#1a7f37}.v-FAIL{background:#cf222e}
.muted{color:#656d76}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #d0d7de;border-radius:6px}
th,td{text-align:left;padding:5px 9px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;border:1px solid #eaeef2;border-radius:4px;padding:6px 8px;margin:4px 0;max-height:320px;overflow:auto}
.pill{display:inline-block;min-width:44px;text-align:center;border-radius:10px;padding:0 7px;font-size:12px;font-weight:600;color:#fff}
.s-passed{background:#1a7f37}.s-failed{background:#cf222e}.s-skipped{background:#9a6700}
.bar{display:flex;height:12px;width:220px;border-radius:3px;overflow:hidden;background:#eaeef2}
.bar span{display:block;height:100%}.b-p{background:#2da44e}.b-f{background:#cf222e}.b-s{background:#d4a72c}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:12px 14px}
.fail{border-left:4px solid #cf222e;margin-bottom:10px}
.kv{display:grid;grid-template-columns:120px 1fr;gap:2px 10px}
details{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:6px 0;padding:4px 10px}
summary{cursor:pointer;font-weight:600;padding:4px 0}
@media print{details{break-inside:avoid}}
"#;

fn chart(title: &str, unit: &str, values: &[f64]) -> String {
    let (w, h, pad_l, pad_b, pad_t, pad_r) = (600.0, 230.0, 44.0, 36.0, 28.0, 12.0);
    let mut s = format!("<div class=\"card\"><svg viewBox=\"0 0 {w} {h}\" width=\"100%\" role=\"img\" aria-label=\"{}\">", esc(title));
    let _ = write!(s, "<text x=\"{pad_l}\" y=\"18\" font-size=\"14\" font-weight=\"600\" fill=\"#1f2328\">{}</text>", esc(title));
    if values.is_empty() {
        let _ = write!(s, "<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#656d76\" text-anchor=\"middle\">no samples (perf cases not run)</text></svg></div>", w / 2.0, h / 2.0);
        return s;
    }
    let bins = 30;
    let (edges, counts) = histogram(values, bins);
    let max_count = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let max_x = *edges.last().unwrap_or(&1.0);
    let (plot_w, plot_h) = (w - pad_l - pad_r, h - pad_t - pad_b);
    let bw = plot_w / bins as f64;
    let x_of = |v: f64| pad_l + v / max_x * plot_w;
    let _ = write!(
        s,
        "<line x1=\"{pad_l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#8c959f\"/>",
        pad_t + plot_h,
        w - pad_r,
        pad_t + plot_h
    );
    let _ = write!(
        s,
        "<line x1=\"{pad_l}\" y1=\"{pad_t}\" x2=\"{pad_l}\" y2=\"{}\" stroke=\"#8c959f\"/>",
        pad_t + plot_h
    );
    for (i, c) in counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        let bh = *c as f64 / max_count * plot_h;
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#0969da\" opacity=\"0.85\"><title>{:.1}–{:.1} {unit}: {c}</title></rect>",
            pad_l + i as f64 * bw + 1.0,
            pad_t + plot_h - bh,
            (bw - 2.0).max(1.0),
            bh,
            edges[i],
            edges[i + 1]
        );
    }
    for k in 0..=4 {
        let v = max_x * k as f64 / 4.0;
        let x = x_of(v);
        let _ = write!(s, "<text x=\"{x:.1}\" y=\"{}\" font-size=\"11\" fill=\"#656d76\" text-anchor=\"middle\">{v:.0}</text>", pad_t + plot_h + 14.0);
    }
    let _ = write!(s, "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#656d76\" text-anchor=\"middle\">{}</text>", pad_l + plot_w / 2.0, h - 4.0, esc(unit));
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#656d76\" text-anchor=\"end\">{}</text>",
        pad_l - 6.0,
        pad_t + 8.0,
        max_count as usize
    );
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#656d76\" text-anchor=\"end\">0</text>",
        pad_l - 6.0,
        pad_t + plot_h
    );
    // Percentile lines in the plot, their values in a legend on the title row (labels inside
    // the plot collide when the percentiles are close).
    for (k, (p, color)) in [(50.0, "#1a7f37"), (99.0, "#cf222e")]
        .into_iter()
        .enumerate()
    {
        if let Some(v) = percentile(values, p) {
            let x = x_of(v);
            let _ = write!(s, "<line x1=\"{x:.1}\" y1=\"{pad_t}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>", pad_t + plot_h);
            let lx = w - pad_r - 120.0 * (1 - k) as f64 - 110.0;
            let _ = write!(s, "<line x1=\"{lx:.1}\" y1=\"14\" x2=\"{:.1}\" y2=\"14\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"18\" font-size=\"12\" fill=\"{color}\">p{p:.0} {v:.1} {}</text>", lx + 16.0, lx + 20.0, esc(unit));
        }
    }
    let _ = write!(s, "</svg><div class=\"muted\">{} samples · p50 {:.1} · p90 {:.1} · p99 {:.1} · max {:.1} {}</div></div>",
        values.len(),
        percentile(values, 50.0).unwrap_or(0.0),
        percentile(values, 90.0).unwrap_or(0.0),
        percentile(values, 99.0).unwrap_or(0.0),
        values.iter().cloned().fold(0.0, f64::max),
        esc(unit));
    s
}

fn pill(st: Status) -> String {
    let (cls, label) = match st {
        Status::Passed => ("s-passed", "pass"),
        Status::Failed => ("s-failed", "fail"),
        Status::Skipped => ("s-skipped", "skip"),
    };
    format!("<span class=\"pill {cls}\">{label}</span>")
}

fn evidence(c: &CaseResult) -> String {
    if c.evidence.is_empty() {
        return String::new();
    }
    let text = serde_json::to_string_pretty(&c.evidence).unwrap_or_default();
    format!(
        "<details><summary>evidence</summary><pre>{}</pre></details>",
        esc(&crate::case::snippet(&text, 12_000))
    )
}

pub fn render(r: &Report) -> String {
    let e = &r.environment;
    let mut o = String::new();
    let _ = write!(o, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>InferLoop qualification: {}</title><style>{CSS}</style></head><body><main>", r.verdict);
    let _ = write!(
        o,
        "<div class=\"banner\"><div class=\"verdict v-{v}\">{v}</div><div><h1>InferLoop qualification</h1><div class=\"muted\">{p} passed · {f} failed · {s} skipped of {t} cases · {wall:.1} s · started {start}</div><div class=\"muted\">board <b>{board}</b> · inferloopd {ver} · model {model}</div></div></div>",
        v = r.verdict,
        p = r.totals.passed,
        f = r.totals.failed,
        s = r.totals.skipped,
        t = r.totals.total,
        wall = r.wall_s,
        start = esc(&e.started_utc),
        board = esc(e.board["name"].as_str().unwrap_or("unknown")),
        ver = esc(&e.daemon_version),
        model = esc(&e.model_id),
    );

    o.push_str("<h2>Groups</h2><table><tr><th>group</th><th class=\"num\">pass</th><th class=\"num\">fail</th><th class=\"num\">skip</th><th class=\"num\">total</th><th></th><th>covers</th></tr>");
    for g in &r.groups {
        let t = g.counts.total.max(1) as f64;
        let _ = write!(
            o,
            "<tr><td><b>{}</b></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td><div class=\"bar\"><span class=\"b-p\" style=\"width:{:.1}%\"></span><span class=\"b-f\" style=\"width:{:.1}%\"></span><span class=\"b-s\" style=\"width:{:.1}%\"></span></div></td><td class=\"muted\">{}</td></tr>",
            g.group.name(), g.counts.passed, g.counts.failed, g.counts.skipped, g.counts.total,
            g.counts.passed as f64 / t * 100.0, g.counts.failed as f64 / t * 100.0, g.counts.skipped as f64 / t * 100.0,
            esc(g.covers)
        );
    }
    o.push_str("</table>");

    o.push_str("<h2>Environment</h2><table>");
    for (k, v) in super::environment_rows(e) {
        let _ = write!(
            o,
            "<tr><th style=\"width:170px\">{}</th><td><code>{}</code></td></tr>",
            esc(k),
            esc(&v)
        );
    }
    o.push_str("</table>");

    o.push_str("<h2>Latency</h2><div class=\"charts\">");
    o.push_str(&chart("Time to first token", "ms", &r.samples.ttft_ms));
    o.push_str(&chart(
        "Inter-token latency",
        "ms",
        &r.samples.inter_token_ms,
    ));
    o.push_str("</div>");

    let failed: Vec<&CaseResult> = r
        .cases
        .iter()
        .filter(|c| c.status == Status::Failed)
        .collect();
    let _ = write!(o, "<h2>Failures ({})</h2>", failed.len());
    if failed.is_empty() {
        o.push_str("<p class=\"muted\">None.</p>");
    }
    for c in failed {
        let _ = write!(
            o,
            "<div class=\"card fail\"><div><code><b>{}</b></code> — {}</div><div class=\"kv\"><span class=\"muted\">expected</span><pre>{}</pre><span class=\"muted\">observed</span><pre>{}</pre></div>{}</div>",
            esc(&c.id), esc(&c.title),
            esc(c.expected.as_deref().unwrap_or_default()),
            esc(&crate::case::snippet(&c.observation, 4000)),
            evidence(c)
        );
    }

    let skipped: Vec<&CaseResult> = r
        .cases
        .iter()
        .filter(|c| c.status == Status::Skipped)
        .collect();
    let _ = write!(o, "<h2>Skipped ({})</h2>", skipped.len());
    if skipped.is_empty() {
        o.push_str("<p class=\"muted\">None.</p>");
    } else {
        o.push_str("<table><tr><th>case</th><th>reason</th></tr>");
        for c in skipped {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                esc(&c.id),
                esc(c.skip_reason.as_deref().unwrap_or_default())
            );
        }
        o.push_str("</table>");
    }

    o.push_str("<h2>All cases</h2>");
    for g in &r.groups {
        let _ = write!(
            o,
            "<details{}><summary>{} — {} pass, {} fail, {} skip</summary><table><tr><th>case</th><th>status</th><th class=\"num\">ms</th><th>expectation</th><th>observation</th></tr>",
            if g.counts.failed > 0 { " open" } else { "" },
            g.group.name(), g.counts.passed, g.counts.failed, g.counts.skipped
        );
        for c in r.cases.iter().filter(|c| c.group == g.group) {
            let obs = match c.status {
                Status::Skipped => c.skip_reason.clone().unwrap_or_default(),
                _ => c.observation.clone(),
            };
            let _ = write!(
                o,
                "<tr><td><code>{}</code><div class=\"muted\">{}</div></td><td>{}</td><td class=\"num\">{:.0}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.id), esc(&c.title), pill(c.status), c.duration_ms, esc(&c.expectation),
                esc(&crate::case::snippet(&obs, 400))
            );
        }
        o.push_str("</table></details>");
    }
    o.push_str("<p class=\"muted\">Every case with its evidence (response snippets, logs, kernel counters) is in report.json next to this file.</p></main></body></html>\n");
    o
}
