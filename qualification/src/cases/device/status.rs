//! `device` cases: the `/v1/status` schema.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- /v1/status ----
    r.add(G, "device.status.schema", "/v1/status has the documented schema", "version, ready, uptime_s, model{id,n_params}, slots{total,active,idle,max_active,ctx_per_slot}, queue{depth,capacity,timeout_ms}, kv{cells,reserved,shared,type{k,v} ∈ f16|q8_0|q4_0,cell_bytes > 0 dividing the ledger's kv term}, memory{fits,required_bytes,terms}, integrity, prefix_cache{mode,hit_rate,tiers{ram{budget_bytes,bytes,entries,hit_tokens},disk: null or with ready}}, speculative{mode ∈ ngram|draft|off,gate ∈ cost|always,max_draft,accepted ≤ drafted,acceptance_rate their ratio}", |c, ev| {
        let s = c.target.status()?;
        ev.put("status", s.clone());
        let checks: [TypeCheck; 32] = [
            ("/version", Value::is_string),
            ("/ready", Value::is_boolean),
            ("/uptime_s", Value::is_number),
            ("/model/id", Value::is_string),
            ("/model/n_params", Value::is_u64),
            ("/slots/total", Value::is_u64),
            ("/slots/active", Value::is_u64),
            ("/slots/idle", Value::is_u64),
            ("/slots/max_active", Value::is_u64),
            ("/slots/ctx_per_slot", Value::is_u64),
            ("/queue/depth", Value::is_u64),
            ("/queue/capacity", Value::is_u64),
            ("/queue/timeout_ms", Value::is_u64),
            ("/kv/cells", Value::is_u64),
            ("/kv/reserved", Value::is_u64),
            ("/kv/shared", Value::is_boolean),
            ("/kv/type/k", Value::is_string),
            ("/kv/type/v", Value::is_string),
            ("/kv/cell_bytes", Value::is_u64),
            ("/memory/fits", Value::is_boolean),
            ("/memory/required_bytes", Value::is_u64),
            ("/integrity", Value::is_object),
            ("/prefix_cache/mode", Value::is_string),
            ("/prefix_cache/hit_rate", Value::is_number),
            ("/prefix_cache/tiers/ram/budget_bytes", Value::is_u64),
            ("/prefix_cache/tiers/ram/bytes", Value::is_u64),
            ("/prefix_cache/tiers/ram/entries", Value::is_u64),
            ("/prefix_cache/tiers/ram/hit_tokens", Value::is_u64),
            ("/speculative/mode", Value::is_string),
            ("/speculative/max_draft", Value::is_u64),
            ("/speculative/drafted_tokens_total", Value::is_u64),
            ("/speculative/accepted_tokens_total", Value::is_u64),
        ];
        for (path, ok) in checks {
            let v = s.pointer(path).cloned().unwrap_or(Value::Null);
            ensure!(ok(&v), format!("{path} of the right type"), v.to_string());
        }
        ensure!(s["memory"]["terms"].is_array(), "/memory/terms array", s["memory"].to_string());
        let disk = &s["prefix_cache"]["tiers"]["disk"];
        ensure!(
            disk.is_null() || (disk["ready"].is_boolean() && disk["budget_bytes"].is_u64()),
            "/prefix_cache/tiers/disk null, or with ready and budget_bytes",
            disk.to_string()
        );
        // The KV cells' element types, and what one cell costs: the ledger's KV term is a
        // whole number of cells at that price.
        let kv = &s["kv"];
        for half in ["k", "v"] {
            let t = kv["type"][half].as_str().unwrap_or_default();
            ensure!(["f16", "q8_0", "q4_0"].contains(&t), format!("/kv/type/{half} f16|q8_0|q4_0"), kv.to_string());
        }
        let cell = kv["cell_bytes"].as_u64().unwrap_or(0);
        ensure!(cell > 0, "/kv/cell_bytes > 0", kv.to_string());
        let terms = s["memory"]["terms"].as_array().cloned().unwrap_or_default();
        let kv_term = terms.iter().find(|t| t["name"] == "kv").and_then(|t| t["bytes"].as_u64());
        ensure!(
            kv_term.is_some_and(|b| b > 0 && b % cell == 0),
            format!("a kv term in /memory/terms, a whole number of {cell}-byte cells"),
            format!("{kv_term:?}")
        );
        // Speculative decoding: its mode and counts that agree with each other.
        let spec = &s["speculative"];
        ensure!(
            ["ngram", "draft", "off"].contains(&spec["mode"].as_str().unwrap_or_default()),
            "/speculative/mode ngram|draft|off",
            spec.to_string()
        );
        ensure!(
            ["cost", "always"].contains(&spec["gate"].as_str().unwrap_or_default()),
            "/speculative/gate cost|always",
            spec.to_string()
        );
        let drafted = spec["drafted_tokens_total"].as_u64().unwrap_or(0);
        let accepted = spec["accepted_tokens_total"].as_u64().unwrap_or(0);
        ensure!(accepted <= drafted, "accepted_tokens_total ≤ drafted_tokens_total", spec.to_string());
        let rate = spec["acceptance_rate"].as_f64().unwrap_or(f64::NAN);
        // The counts are read together with the rate, so they agree exactly but for rounding.
        let expected_rate = if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 };
        ensure!(
            (rate - expected_rate).abs() < 1e-9,
            format!("acceptance_rate = accepted / drafted = {expected_rate}"),
            spec.to_string()
        );
        Ok(format!(
            "schema holds; kv {}/{} at {cell} B a cell; speculative {} ({accepted} of {drafted} accepted)",
            kv["type"]["k"].as_str().unwrap_or_default(),
            kv["type"]["v"].as_str().unwrap_or_default(),
            spec["mode"].as_str().unwrap_or_default()
        ))
    });
    r.add(G, "device.status.thermal_schema", "/v1/status carries the thermal state and thresholds", "thermal{state ∈ normal|hot|critical, hot_celsius < critical_celsius, hysteresis_celsius ≥ 0, hot_fraction ∈ (0,1], snapshot}", |c, ev| {
        let s = c.target.status()?;
        let t = s.get("thermal").cloned().ok_or_else(|| Stop::skip("this daemon's /v1/status has no thermal section"))?;
        ev.put("thermal", t.clone());
        ensure!(["normal", "hot", "critical"].contains(&t["state"].as_str().unwrap_or_default()), "state normal|hot|critical", t["state"].to_string());
        let (hot, crit) = (t["hot_celsius"].as_f64().unwrap_or(f64::NAN), t["critical_celsius"].as_f64().unwrap_or(f64::NAN));
        ensure!(hot < crit, "hot_celsius < critical_celsius", format!("{hot} vs {crit}"));
        ensure!(t["hysteresis_celsius"].as_f64().is_some_and(|h| h >= 0.0), "hysteresis ≥ 0", t["hysteresis_celsius"].to_string());
        ensure!(t["hot_fraction"].as_f64().is_some_and(|f| f > 0.0 && f <= 1.0), "hot_fraction in (0, 1]", t["hot_fraction"].to_string());
        ensure!(t["snapshot"].is_object(), "a snapshot", t.to_string());
        Ok(format!("{} (hot {hot}, critical {crit})", t["state"]))
    });
    r.add(
        G,
        "device.status.uptime_increases",
        "Uptime moves forward",
        "uptime_s grows between two reads 200 ms apart",
        |c, ev| {
            let a = c.target.status()?["uptime_s"].as_f64().unwrap_or(-1.0);
            std::thread::sleep(Duration::from_millis(200));
            let b = c.target.status()?["uptime_s"].as_f64().unwrap_or(-1.0);
            ev.put("uptime_s", json!([a, b]));
            ensure!(
                a > 0.0 && b >= a + 0.15,
                format!("≥ {:.2}", a + 0.15),
                format!("{b}")
            );
            Ok(format!("{a:.2} → {b:.2}"))
        },
    );
}
