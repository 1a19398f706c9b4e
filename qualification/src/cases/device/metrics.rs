//! `device` cases: `/metrics` as strict Prometheus text.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- /metrics ----
    r.add(G, "device.metrics.parse_strict", "/metrics is strict Prometheus text", "every sample under a # TYPE, valid names, labels and values, contiguous families, no duplicates", |c, ev| {
        let (text, e) = exposition(c)?;
        ev.text("metrics", &text);
        Ok(format!("{} families, {} samples", e.families.len(), e.sample_count()))
    });
    r.add(G, "device.metrics.types_declared", "The core series have their documented types", "requests/prompt/generated totals counters, active_slots and queue_depth gauges, ttft/inter_token/request histograms", |c, ev| {
        let (_, e) = exposition(c)?;
        let want = [
            ("inferloop_requests_total", Kind::Counter),
            ("inferloop_prompt_tokens_total", Kind::Counter),
            ("inferloop_generated_tokens_total", Kind::Counter),
            ("inferloop_active_slots", Kind::Gauge),
            ("inferloop_queue_depth", Kind::Gauge),
            ("inferloop_ttft_seconds", Kind::Histogram),
            ("inferloop_inter_token_seconds", Kind::Histogram),
            ("inferloop_request_seconds", Kind::Histogram),
        ];
        let mut seen = Vec::new();
        for (name, kind) in want {
            let f = e.family(name).ok_or_else(|| Stop::fail(format!("family {name}"), "absent"))?;
            ensure_eq!(format!("{name} type"), f.kind, kind);
            seen.push(name);
        }
        ev.put("checked", json!(seen));
        Ok(format!("{} families typed", seen.len()))
    });
    r.add(
        G,
        "device.metrics.histograms_consistent",
        "Histograms are internally consistent",
        "per histogram: increasing le, cumulative counts, +Inf = _count, a _sum",
        |c, ev| {
            let (_, e) = exposition(c)?;
            let mut n = 0;
            for f in e.families.iter().filter(|f| f.kind == Kind::Histogram) {
                prom::check_histogram(f)
                    .map_err(|err| Stop::fail("a consistent histogram", err))?;
                n += 1;
            }
            ev.put("histograms", n);
            ensure!(n >= 3, "≥ 3 histograms", n.to_string());
            Ok(format!("{n} histograms consistent"))
        },
    );
    r.add(
        G,
        "device.metrics.counter_names",
        "Counters are named *_total",
        "every counter family ends in _total",
        |c, ev| {
            let (_, e) = exposition(c)?;
            let bad: Vec<&str> = e
                .families
                .iter()
                .filter(|f| f.kind == Kind::Counter && !f.name.ends_with("_total"))
                .map(|f| f.name.as_str())
                .collect();
            ev.put(
                "counters",
                json!(e
                    .families
                    .iter()
                    .filter(|f| f.kind == Kind::Counter)
                    .map(|f| f.name.clone())
                    .collect::<Vec<_>>()),
            );
            ensure!(bad.is_empty(), "all *_total", format!("{bad:?}"));
            Ok("all *_total".into())
        },
    );
    r.add(
        G,
        "device.metrics.help_present",
        "Every family is documented",
        "a # HELP line for every family",
        |c, ev| {
            let (_, e) = exposition(c)?;
            let bad: Vec<&str> = e
                .families
                .iter()
                .filter(|f| f.help.as_deref().is_none_or(str::is_empty))
                .map(|f| f.name.as_str())
                .collect();
            ev.put("missing_help", json!(bad));
            ensure!(bad.is_empty(), "HELP everywhere", format!("{bad:?}"));
            Ok(format!("{} families documented", e.families.len()))
        },
    );
    r.add(G, "device.metrics.memory_series", "The memory ledger is exported", "gauges inferloop_memory_required_bytes{term}, inferloop_memory_limit_bytes{source}, inferloop_memory_rss_bytes", |c, ev| {
        let (_, e) = exposition(c)?;
        for name in ["inferloop_memory_required_bytes", "inferloop_memory_limit_bytes", "inferloop_memory_rss_bytes"] {
            let f = e.family(name).ok_or_else(|| Stop::fail(format!("family {name}"), "absent"))?;
            ensure_eq!(format!("{name} type"), f.kind, Kind::Gauge);
            ensure!(!f.samples.is_empty() && f.samples.iter().all(|s| s.value > 0.0), format!("{name} > 0"), format!("{:?}", f.samples));
        }
        let terms: Vec<String> = e.family("inferloop_memory_required_bytes").map(|f| f.samples.iter().filter_map(|s| s.label("term").map(str::to_string)).collect()).unwrap_or_default();
        ev.put("terms", json!(terms));
        ensure!(terms.iter().any(|t| t == "total"), "a term=\"total\" series", format!("{terms:?}"));
        Ok(format!("terms {terms:?}"))
    });
    r.add(G, "device.metrics.thermal_series", "Temperatures, clocks, power, throttling and the state are exported", "gauges inferloop_temperature_celsius, inferloop_clock_hz, inferloop_power_watts, inferloop_throttled, inferloop_thermal_state ∈ {0,1,2}", |c, ev| {
        let (_, e) = exposition(c)?;
        if e.family("inferloop_thermal_state").is_none() {
            return Err(Stop::skip("this daemon exports no thermal metrics"));
        }
        for name in ["inferloop_temperature_celsius", "inferloop_clock_hz", "inferloop_power_watts", "inferloop_throttled", "inferloop_thermal_state"] {
            let f = e.family(name).ok_or_else(|| Stop::fail(format!("family {name}"), "absent"))?;
            ensure_eq!(format!("{name} type"), f.kind, Kind::Gauge);
        }
        let state = e.value("inferloop_thermal_state", &[]).unwrap_or(-1.0);
        ev.put("thermal_state", state);
        ensure!([0.0, 1.0, 2.0].contains(&state), "0, 1 or 2", state.to_string());
        Ok(format!("state {state}"))
    });
}
