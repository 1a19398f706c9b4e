//! `device`: what board this is and why, thermal zones and clocks (real and a fake sysfs
//! tree), `/metrics` as strict Prometheus text, the `/v1/status` schema, and the thermal
//! admission states driven through a fake sysfs tree.

use std::path::Path;
use std::time::Duration;

use inferloop_board::{Detector, Roots};
use serde_json::{json, Value};

use crate::case::{Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::fixtures::{self, write_fake_sysfs, THERMAL_INTERVAL_MS, THERMAL_SETTLE};
use crate::prom::{self, Kind};
use crate::target::{counting, expect_error, expect_retry_after, metric_of, Target};
use crate::{ensure, ensure_eq};

const G: Group = Group::Device;

/// A JSON pointer and the type its value must have.
type TypeCheck = (&'static str, fn(&Value) -> bool);

/// `inferloopd ARGS`: exit code and stdout.
fn run(c: &Ctx, sub: &str, args: &[&str]) -> Result<(i32, String, String), Stop> {
    let cfg = c.need_spawn(&format!("runs `inferloopd {sub}`"))?;
    c.need_subcommand(sub)?;
    let mut argv = vec![sub];
    argv.extend_from_slice(args);
    let out = cfg
        .command(&argv)
        .map_err(|e| Stop::fail(format!("inferloopd {sub} runs"), e))?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The value after `label:` in `inferloopd board` output.
fn field(text: &str, label: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .map(|v| v.trim().to_string())
}

/// The profile name at the start of the `board:` line.
fn board_name(text: &str) -> Option<String> {
    field(text, "board").and_then(|v| v.split_whitespace().next().map(str::to_string))
}

/// In-process detection on this machine, as the daemon would do it.
fn local_board() -> Result<String, Stop> {
    Detector::new(Roots::default())
        .detect()
        .map(|d| d.profile.name)
        .map_err(|e| Stop::fail("inferloop-board detects this machine", e.to_string()))
}

/// A fake `/proc` with the device tree of `profile`, and a matching `/sys`.
fn fake_board_tree(c: &Ctx, profile: &str) -> Result<tempfile::TempDir, Stop> {
    let p = inferloop_board::profile::find(profile)
        .map_err(|e| Stop::fail("a built-in profile", e.to_string()))?;
    let dir = tempfile::Builder::new()
        .prefix("board-")
        .tempdir_in(&c.work)
        .map_err(|e| Stop::fail("tempdir", e.to_string()))?;
    let dt = dir.path().join("proc/device-tree");
    std::fs::create_dir_all(&dt).map_err(|e| Stop::fail("mkdir", e.to_string()))?;
    let mut compat = Vec::new();
    for entry in p.compatible.iter().chain(p.soc_compatible.iter()) {
        compat.extend_from_slice(entry.as_bytes());
        compat.push(0);
    }
    std::fs::write(dt.join("compatible"), compat)
        .map_err(|e| Stop::fail("write", e.to_string()))?;
    std::fs::write(dt.join("model"), format!("{}\0", p.description))
        .map_err(|e| Stop::fail("write", e.to_string()))?;
    write_fake_sysfs(&dir.path().join("sys"))
        .map_err(|e| Stop::fail("fake sysfs", e.to_string()))?;
    Ok(dir)
}

/// `inferloopd thermal` on the fake tree (Orin NX profile).
fn fake_thermal(c: &Ctx) -> Result<String, Stop> {
    let dir = fake_board_tree(c, "jetson-orin-nx-16gb")?;
    let sys = dir.path().join("sys").to_string_lossy().into_owned();
    let (code, out, err) = run(
        c,
        "thermal",
        &["--sysfs-root", &sys, "--board", "jetson-orin-nx-16gb"],
    )?;
    ensure_eq!(format!("exit code (stderr: {err})"), code, 0);
    Ok(out)
}

/// A row of a table whose first column is `name`.
fn row<'a>(table: &'a str, name: &str) -> Option<Vec<&'a str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&name))
}

fn exposition(c: &Ctx) -> Result<(String, prom::Exposition), Stop> {
    let t = c.target.clone();
    (*c.memo("device exposition", move || {
        // Generate first so the histograms hold observations.
        t.complete(&counting(4, false))?;
        let text = t.metrics()?;
        let e = prom::parse(&text)
            .map_err(|e| Stop::fail("/metrics parses as strict Prometheus text", e))?;
        Ok((text, e))
    }))
    .clone()
}

/// Sets the fake GPU zone to `celsius` and waits until the daemon read it and applied the
/// slot cap for `state`.
fn drive(
    t: &Target,
    tree: &Path,
    celsius: f64,
    state: &str,
    max_active: u64,
) -> Result<Value, Stop> {
    fixtures::set_gpu_celsius(tree, celsius)
        .map_err(|e| Stop::fail("write the fake temperature", e.to_string()))?;
    let s = t.wait_status(
        THERMAL_SETTLE,
        &format!("GPU zone read at {celsius} °C, state {state}, max_active {max_active}"),
        |s| {
            let zone = s["thermal"]["snapshot"]["zones"]
                .as_array()
                .and_then(|zs| zs.iter().find(|z| z["name"] == "gpu-thermal"))
                .and_then(|z| z["celsius"].as_f64());
            zone == Some(celsius)
                && s["thermal"]["state"] == state
                && s["slots"]["max_active"].as_u64() == Some(max_active)
        },
    )?;
    Ok(s)
}

fn thermal_fixture(c: &Ctx) -> Result<(Target, std::sync::Arc<crate::ctx::Fixture>), Stop> {
    let fx = c.fixture("thermal")?;
    Ok((fx.target(), fx))
}

pub fn register(r: &mut Registry) {
    // ---- the board ----
    r.add(
        G,
        "device.board.command_exit_0",
        "`inferloopd board` answers",
        "exit 0 with board and why lines",
        |c, ev| {
            let (code, out, err) = run(c, "board", &[])?;
            ev.text("stdout", &out);
            ev.text("stderr", &err);
            ensure_eq!("exit code", code, 0);
            ensure!(
                field(&out, "board").is_some() && field(&out, "why").is_some(),
                "board: and why: lines",
                out
            );
            c.note_env("board_command", out.clone());
            Ok(field(&out, "board").unwrap_or_default())
        },
    );
    r.add(
        G,
        "device.board.names_a_profile",
        "The detected board is a known profile",
        "the board: line names a built-in profile",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let name = board_name(&out).unwrap_or_default();
            let known = inferloop_board::profile::builtin_names();
            ev.put("board", name.clone());
            ensure!(known.contains(&name), format!("one of {known:?}"), name);
            Ok(name)
        },
    );
    r.add(
        G,
        "device.board.says_why",
        "Detection says why it chose the board",
        "a non-empty why: line (which rule or file matched)",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let why = field(&out, "why").unwrap_or_default();
            ev.put("why", why.clone());
            ensure!(!why.is_empty(), "a reason", "empty");
            Ok(why)
        },
    );
    r.add(
        G,
        "device.board.matches_library",
        "The daemon and the board library agree",
        "`inferloopd board` names the profile inferloop-board detects in-process",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let (cli, lib) = (board_name(&out).unwrap_or_default(), local_board()?);
            ev.put("cli", cli.clone());
            ev.put("library", lib.clone());
            ensure_eq!("board", cli, lib);
            Ok(lib)
        },
    );
    r.add(
        G,
        "device.board.override",
        "--board overrides detection",
        "`board --board jetson-orin-nx-16gb` names it, why says override",
        |c, ev| {
            let (code, out, _) = run(c, "board", &["--board", "jetson-orin-nx-16gb"])?;
            ev.text("stdout", &out);
            ensure_eq!("exit code", code, 0);
            ensure_eq!(
                "board",
                board_name(&out).unwrap_or_default(),
                "jetson-orin-nx-16gb"
            );
            ensure!(
                field(&out, "why").is_some_and(|w| w.contains("override")),
                "why: override",
                out
            );
            Ok("override honoured".into())
        },
    );
    r.add(
        G,
        "device.board.unknown_exit_2",
        "An unknown --board is a usage error",
        "exit 2",
        |c, ev| {
            let (code, out, err) = run(c, "board", &["--board", "no-such-board"])?;
            ev.text("stderr", &err);
            ev.text("stdout", &out);
            ensure_eq!("exit code", code, 2);
            Ok("exit 2".into())
        },
    );
    r.add(G, "device.board.device_tree_fixture", "A Jetson device tree is recognised", "a fake /proc/device-tree of an Orin NX 16GB is detected as jetson-orin-nx-16gb from its compatible file", |c, ev| {
        let dir = fake_board_tree(c, "jetson-orin-nx-16gb")?;
        let (proc_root, sys) = (dir.path().join("proc").to_string_lossy().into_owned(), dir.path().join("sys").to_string_lossy().into_owned());
        let (code, out, _) = run(c, "board", &["--proc-root", &proc_root, "--sysfs-root", &sys])?;
        ev.text("stdout", &out);
        ensure_eq!("exit code", code, 0);
        ensure_eq!("board", board_name(&out).unwrap_or_default(), "jetson-orin-nx-16gb");
        ensure!(field(&out, "why").is_some_and(|w| w.contains("compatible")), "why names the compatible file", out);
        Ok("device tree matched".into())
    });
    r.add(
        G,
        "device.board.status_agrees",
        "/v1/status names the same board",
        "status.board.name equals the local detection (same machine)",
        |c, ev| {
            let s = c.target.status()?;
            if s.get("board").is_none() {
                return Err(Stop::skip("this daemon's /v1/status has no board"));
            }
            if !c.target.ep.is_loopback() {
                return Err(Stop::skip(
                    "the daemon runs on another machine; its board cannot be detected from here",
                ));
            }
            if c.shared
                .as_ref()
                .is_some_and(|d| d.argv.iter().any(|a| a == "--board"))
            {
                return Err(Stop::skip("the shared daemon runs with --board"));
            }
            let lib = local_board()?;
            ev.put("status_board", s["board"].clone());
            c.note_env("board", s["board"].clone());
            ensure_eq!("status.board.name", s["board"]["name"], json!(lib));
            Ok(lib)
        },
    );

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

    // ---- /v1/status ----
    r.add(G, "device.status.schema", "/v1/status has the documented schema", "version, ready, uptime_s, model{id,n_params}, slots{total,active,idle,max_active,ctx_per_slot}, queue{depth,capacity,timeout_ms}, kv{cells,reserved,shared}, memory{fits,required_bytes,terms}, integrity", |c, ev| {
        let s = c.target.status()?;
        ev.put("status", s.clone());
        let checks: [TypeCheck; 19] = [
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
            ("/memory/fits", Value::is_boolean),
            ("/memory/required_bytes", Value::is_u64),
            ("/integrity", Value::is_object),
        ];
        for (path, ok) in checks {
            let v = s.pointer(path).cloned().unwrap_or(Value::Null);
            ensure!(ok(&v), format!("{path} of the right type"), v.to_string());
        }
        ensure!(s["memory"]["terms"].is_array(), "/memory/terms array", s["memory"].to_string());
        Ok("schema holds".into())
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

    // ---- thermal admission on a fake tree ----
    r.add(
        G,
        "device.admission.normal",
        "A cool board admits every slot",
        "gpu-thermal at 45.8 °C: state normal, max_active 2, requests served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            let s = drive(&t, fx.path(), 45.8, "normal", 2)?;
            ev.put("thermal", s["thermal"]["state"].clone());
            t.complete(&counting(4, false))?;
            Ok("normal, 2 slots".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hot_halves",
        "A hot board admits half the slots",
        "75 °C (hot at 70): state hot, max_active 1, inferloop_thermal_state 1",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            let s = drive(&t, fx.path(), 75.0, "hot", 1)?;
            let m = t.metrics()?;
            ev.put(
                "thermal_state_metric",
                metric_of(&m, "inferloop_thermal_state")?,
            );
            ev.put("slots", s["slots"].clone());
            ensure_eq!(
                "inferloop_thermal_state",
                metric_of(&m, "inferloop_thermal_state")?,
                1.0
            );
            Ok("hot, 1 slot".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hot_queues_the_second",
        "While hot, a second request waits though a slot is idle",
        "one request decoding, the next queued (active 1, depth 1), then served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 75.0, "hot", 1)?;
            let running = crate::cases::load::occupy(&t, 400)?;
            let second = {
                let t = t.clone();
                std::thread::spawn(move || t.complete(&counting(4, false)))
            };
            let s = t.wait_status(crate::target::SETTLE, "the second request queued", |s| {
                s["queue"]["depth"] == 1
            })?;
            ev.put("slots", s["slots"].clone());
            ensure_eq!("slots.active", s["slots"]["active"], json!(1));
            drop(running);
            let v = second
                .join()
                .unwrap_or_else(|_| Err(Stop::fail("thread", "panicked")))?;
            ev.put("second_timings", v["timings"].clone());
            Ok("queued, then served".into())
        },
    )
    .fixture("thermal")
    .heavy();
    r.add(
        G,
        "device.admission.critical_503",
        "A critical board refuses new requests",
        "95 °C (critical at 90): 503 overheated with Retry-After",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            let resp = t.post("/v1/completions", &counting(4, false))?;
            ev.text("response", &resp.describe());
            let err = expect_error(&resp, 503, None, Some("overheated"))?;
            let ra = expect_retry_after(&resp)?;
            drive(&t, fx.path(), 45.8, "normal", 2)?;
            Ok(format!(
                "503 overheated, Retry-After {ra}: {}",
                err["message"]
            ))
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hysteresis",
        "Critical is left only below threshold − hysteresis",
        "95 → 87 °C stays critical (87 > 90 − 5); 80 °C leaves it (hot)",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            fixtures::set_gpu_celsius(fx.path(), 87.0)
                .map_err(|e| Stop::fail("write", e.to_string()))?;
            let s = t.wait_status(THERMAL_SETTLE, "87 °C read", |s| {
                s["thermal"]["snapshot"]["zones"]
                    .as_array()
                    .is_some_and(|zs| {
                        zs.iter()
                            .any(|z| z["name"] == "gpu-thermal" && z["celsius"] == 87.0)
                    })
            })?;
            std::thread::sleep(Duration::from_millis(THERMAL_INTERVAL_MS * 5));
            let s2 = t.status()?;
            ev.put(
                "at_87",
                json!([s["thermal"]["state"], s2["thermal"]["state"]]),
            );
            ensure_eq!("state at 87 °C", s2["thermal"]["state"], json!("critical"));
            let s3 = drive(&t, fx.path(), 80.0, "hot", 1)?;
            ev.put("at_80", s3["thermal"]["state"].clone());
            drive(&t, fx.path(), 45.8, "normal", 2)?;
            Ok("critical held at 87, left at 80".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.recovers",
        "A board that cools down serves fully again",
        "critical → 40 °C: normal, max_active 2, requests served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            let s = drive(&t, fx.path(), 40.0, "normal", 2)?;
            ev.put("slots", s["slots"].clone());
            let v = t.complete(&counting(4, false))?;
            ensure_eq!(
                "completion_tokens",
                v["usage"]["completion_tokens"],
                json!(4)
            );
            Ok("normal, served".into())
        },
    )
    .fixture("thermal");
}
