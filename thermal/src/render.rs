//! A reading as a text table, for `inferloopd thermal [--watch]`.

use std::fmt::Write as _;

use crate::reading::Reading;

fn opt_c(v: Option<f64>) -> String {
    v.map(|c| format!("{c:.1}")).unwrap_or_else(|| "-".into())
}

fn mhz(hz: u64) -> String {
    format!("{:.0}", hz as f64 / 1e6)
}

/// Zones, clocks, rails, load, power mode, throttling and admission state, one block each.
/// Empty sections say so rather than vanish, so a bare machine's output is still readable.
pub fn render_table(reading: &Reading) -> String {
    let s = &*reading.snapshot;
    let mut out = String::new();
    let mut header = vec![format!("source: {}", s.source)];
    if let Some(mode) = &s.power_mode {
        header.push(match mode.id {
            Some(id) => format!("power mode: {} ({id})", mode.name),
            None => format!("power mode: {}", mode.name),
        });
    }
    if let Some(state) = reading.state {
        header.push(format!("state: {state}"));
    }
    if let Some(load) = s.gpu_load {
        header.push(format!("gpu load: {:.1} %", load * 100.0));
    }
    let _ = writeln!(out, "{}", header.join("   "));

    let _ = writeln!(out);
    if s.zones.is_empty() {
        let _ = writeln!(out, "ZONES: none found");
    } else {
        let width = s
            .zones
            .iter()
            .map(|z| z.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<width$}  {:>7}  {:>8}  {:>8}",
            "ZONE", "TEMP °C", "PASSIVE", "CRITICAL"
        );
        for z in &s.zones {
            let _ = writeln!(
                out,
                "{:<width$}  {:>7.1}  {:>8}  {:>8}",
                z.name,
                z.celsius,
                opt_c(z.passive_trip),
                opt_c(z.critical_trip)
            );
        }
    }

    let _ = writeln!(out);
    if s.clocks.is_empty() {
        let _ = writeln!(out, "CLOCKS: none found");
    } else {
        let width = s
            .clocks
            .iter()
            .map(|c| c.domain.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(out, "{:<width$}  {:>8}  {:>8}", "CLOCK", "MHz", "MAX MHz");
        for c in &s.clocks {
            let max = c.max_hz.map(mhz).unwrap_or_else(|| "-".into());
            let _ = writeln!(out, "{:<width$}  {:>8}  {:>8}", c.domain, mhz(c.hz), max);
        }
    }

    let _ = writeln!(out);
    if s.rails.is_empty() {
        let _ = writeln!(out, "RAILS: none found");
    } else {
        let width = s
            .rails
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(out, "{:<width$}  {:>8}", "RAIL", "WATTS");
        for r in &s.rails {
            let _ = writeln!(out, "{:<width$}  {:>8.3}", r.name, r.watts);
        }
    }

    let _ = writeln!(out);
    if s.throttle.is_empty() {
        let _ = writeln!(out, "throttling: none");
    } else {
        for t in &s.throttle {
            let _ = writeln!(out, "throttling: {} ({})", t.cause, t.detail);
        }
    }
    out
}
