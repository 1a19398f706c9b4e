//! `device` cases: thermal zones and clocks.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- thermal zones and clocks ----
    r.add(
        G,
        "device.thermal.command_exit_0",
        "`inferloopd thermal` reads this machine",
        "exit 0 with a source line and ZONES, CLOCKS, RAILS sections",
        |c, ev| {
            let (code, out, err) = run(c, "thermal", &[])?;
            ev.text("stdout", &out);
            ev.text("stderr", &err);
            ensure_eq!("exit code", code, 0);
            ensure!(
                out.contains("source:") && out.contains("throttling:"),
                "source: and throttling: lines",
                out
            );
            Ok(out.lines().next().unwrap_or_default().to_string())
        },
    );
    r.add(G, "device.thermal.host_zones_readable", "This machine's thermal zones are readable", "every zone in /v1/status reads a plausible temperature (−40…150 °C)", |c, ev| {
        let s = c.target.status()?;
        let zones = s["thermal"]["snapshot"]["zones"].as_array().cloned().ok_or_else(|| Stop::skip("this daemon's /v1/status has no thermal snapshot"))?;
        ev.put("zones", json!(zones));
        if zones.is_empty() {
            return Err(Stop::skip("this machine exposes no thermal zones (none under /sys/devices/virtual/thermal or hwmon)"));
        }
        for z in &zones {
            let t = z["celsius"].as_f64().unwrap_or(f64::NAN);
            ensure!((-40.0..=150.0).contains(&t), format!("{}: −40…150 °C", z["name"]), t.to_string());
        }
        Ok(format!("{} zones", zones.len()))
    });
    r.add(
        G,
        "device.thermal.host_clocks_readable",
        "This machine's clocks are readable",
        "every clock in /v1/status has hz > 0 and ≤ its max",
        |c, ev| {
            let s = c.target.status()?;
            let clocks = s["thermal"]["snapshot"]["clocks"]
                .as_array()
                .cloned()
                .ok_or_else(|| Stop::skip("this daemon's /v1/status has no thermal snapshot"))?;
            ev.put("clocks", json!(clocks));
            if clocks.is_empty() {
                return Err(Stop::skip(
                    "this machine exposes no clocks (no cpufreq or devfreq in /sys)",
                ));
            }
            for k in &clocks {
                let hz = k["hz"].as_u64().unwrap_or(0);
                ensure!(
                    hz > 0 && k["max_hz"].as_u64().is_none_or(|m| hz <= m),
                    format!("{}: 0 < hz ≤ max", k["domain"]),
                    k.to_string()
                );
            }
            Ok(format!("{} clocks", clocks.len()))
        },
    );
    r.add(
        G,
        "device.thermal.fake_tree_zones",
        "Zones of a Jetson-like sysfs tree are read",
        "`thermal --sysfs-root` lists cpu-thermal 44.5 °C and gpu-thermal 45.8 °C",
        |c, ev| {
            let out = fake_thermal(c)?;
            ev.text("stdout", &out);
            ensure_eq!(
                "cpu-thermal row",
                row(&out, "cpu-thermal").and_then(|r| r.get(1).map(|s| s.to_string())),
                Some("44.5".to_string())
            );
            ensure_eq!(
                "gpu-thermal row",
                row(&out, "gpu-thermal").and_then(|r| r.get(1).map(|s| s.to_string())),
                Some("45.8".to_string())
            );
            Ok("zones read".into())
        },
    );
    r.add(
        G,
        "device.thermal.fake_tree_clocks",
        "The GPU clock of the tree is read",
        "gpu at 306 MHz of 918 MHz",
        |c, ev| {
            let out = fake_thermal(c)?;
            ev.text("stdout", &out);
            let gpu = row(&out, "gpu").map(|r| r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            ensure_eq!(
                "gpu row",
                gpu,
                Some(vec!["gpu".to_string(), "306".into(), "918".into()])
            );
            Ok("gpu 306/918 MHz".into())
        },
    );
    r.add(
        G,
        "device.thermal.offline_zone_dropped",
        "An offline sensor (−256 °C) is dropped",
        "offline-thermal is not listed",
        |c, ev| {
            let out = fake_thermal(c)?;
            ev.text("stdout", &out);
            ensure!(
                row(&out, "offline-thermal").is_none(),
                "no offline-thermal row",
                out
            );
            Ok("dropped".into())
        },
    );
}
