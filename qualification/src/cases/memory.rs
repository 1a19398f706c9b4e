//! `memory`: the ledger `inferloopd check` prints, the reverse gate (a small cgroup → exit 1
//! with the OOM killer idle, raw kernel counters recorded), the forward gate (a roomy cgroup
//! → served under its limit) and KV-cell admission at run time.

use std::time::Duration;

use serde_json::{json, Value};

use crate::case::{Evidence, Group, Registry, Stop};
use crate::cgroup::Cgroup;
use crate::ctx::Ctx;
use crate::daemon::{Exit, READY_TIMEOUT};
use crate::target::{chat_body, counting, metric_of, text_of, u64_at, SETTLE};
use crate::{ensure, ensure_eq};

const G: Group = Group::Memory;
const MIB: u64 = 1 << 20;
/// llama.cpp's ledger; `constraint` is structured output's parsers and `embeddings` the
/// embeddings context (that backend only).
const TERMS: &[&str] = &[
    "weights",
    "kv",
    "compute",
    "overhead",
    "constraint",
    "embeddings",
    "prompt_cache",
    "connections",
    "margin",
];
/// The native backend's ledger: its forward pass's scratch in place of llama.cpp's compute
/// buffer.
const NATIVE_TERMS: &[&str] = &[
    "weights",
    "kv",
    "scratch",
    "overhead",
    "prompt_cache",
    "connections",
    "margin",
];

/// The terms a `check --json` answer should have, by the backend its plan names.
fn terms_for(d: &Value) -> &'static [&'static str] {
    if d["plan"]["backend"] == "native" {
        NATIVE_TERMS
    } else {
        TERMS
    }
}

/// `inferloopd check ARGS --json`: exit code and the decision.
fn check(c: &Ctx, args: &[&str]) -> Result<(i32, Value), Stop> {
    let cfg = c.need_spawn("runs `inferloopd check` on the model file")?;
    c.need_subcommand("check")?;
    let key = format!("check {args:?}");
    let cfg = cfg.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    (*c.memo(&key, move || -> Result<(i32, Value), Stop> {
        let model = cfg.model.to_string_lossy().into_owned();
        let mut argv = vec!["check", "--model", model.as_str()];
        argv.extend(args.iter().map(String::as_str));
        // `--serve-args` (e.g. `--backend native`) shape the ledger the daemons admit with.
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let common = crate::daemon::common_args(&cfg.serve_args, &refs);
        argv.extend(common.iter().map(String::as_str));
        argv.push("--json");
        let out = cfg
            .command(&argv)
            .map_err(|e| Stop::fail("inferloopd check runs", e))?;
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            Stop::fail(
                "check --json prints JSON",
                format!("{e}; stderr: {}", String::from_utf8_lossy(&out.stderr)),
            )
        })?;
        Ok((out.status.code().unwrap_or(-1), v))
    }))
    .clone()
}

fn term(d: &Value, name: &str) -> Result<u64, Stop> {
    d["ledger"]["terms"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .and_then(|t| t["bytes"].as_u64())
        .ok_or_else(|| {
            Stop::fail(
                format!("a `{name}` term"),
                crate::case::snippet(&d["ledger"].to_string(), 800),
            )
        })
}

const SHARED_ARGS: [&str; 4] = ["--slots", "4", "--ctx", "1024"];

/// A daemon run inside a memory cgroup with `limit` bytes.
#[derive(Clone)]
struct Gated {
    exit: Option<i32>,
    log: String,
    counters: Value,
    oom_kills: Option<u64>,
    peak: Option<u64>,
    served: Option<String>,
}

fn gated(c: &Ctx, forward: bool) -> Result<Gated, Stop> {
    let cfg = c
        .need_spawn("starts the daemon inside a memory cgroup")?
        .clone();
    let key = if forward {
        "cgroup forward"
    } else {
        "cgroup reverse"
    };
    (*c.memo(key, move || -> Result<Gated, Stop> {
        let cg = Cgroup::create(if forward {
            "inferloop-qual-forward"
        } else {
            "inferloop-qual-reverse"
        })
        .map_err(|reason| Stop::skip(format!("cgroup gate: {reason}")))?;
        let limit = if forward { 512 * MIB } else { 120 * MIB };
        cg.limit(limit)
            .map_err(|e| Stop::skip(format!("cgroup gate: {e}")))?;
        let d = cfg
            .spawn(
                cfg.serve_argv(&["--slots", "1", "--ctx", "1024"]),
                Some(&cg.dir),
            )
            .map_err(|e| Stop::fail("the daemon starts in the cgroup", e))?;
        let mut served = None;
        let exit = if forward {
            d.wait_address(READY_TIMEOUT)
                .map_err(|e| Stop::fail("the daemon binds", e))?;
            d.wait_ready(READY_TIMEOUT)
                .map_err(|e| Stop::fail("the daemon gets ready", e))?;
            let reply = d.target().chat(&chat_body("What is 2+2?", 8))?;
            served = Some(text_of(&reply)?);
            d.sigterm().map_err(|e| Stop::fail("SIGTERM", e))?;
            d.wait_exit(Duration::from_secs(30)).and_then(|s| s.code())
        } else {
            d.wait_exit(Duration::from_secs(60)).and_then(|s| s.code())
        };
        if exit.is_some() {
            d.join_log();
        }
        let log = d.log();
        drop(d);
        let (oom_kills, _) = cg.oom_kills();
        Ok(Gated {
            exit,
            log,
            counters: cg.counters(),
            oom_kills,
            peak: cg.peak(),
            served,
        })
    }))
    .clone()
}

fn record(ev: &mut Evidence, g: &Gated) {
    ev.put("kernel_counters", g.counters.clone());
    ev.put("exit_code", json!(g.exit));
    ev.text("log", &g.log);
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "memory.check.exit_0_fits",
        "`check` accepts the shared configuration",
        "exit 0 and fits true for --slots 4 --ctx 1024",
        |c, ev| {
            let (code, d) = check(c, &SHARED_ARGS)?;
            ev.put("decision", d.clone());
            ensure_eq!("exit code", code, 0);
            ensure_eq!("fits", d["fits"], json!(true));
            Ok(format!(
                "fits: {} of {} bytes",
                d["required_bytes"], d["limit"]["bytes"]
            ))
        },
    );
    r.add(G, "memory.check.json_schema", "`check --json` has the documented shape", "fits, required_bytes, expected_peak_bytes, limit{source,bytes}, limits[], ledger.terms[{name,bytes,detail}], shape, plan", |c, ev| {
        let (_, d) = check(c, &SHARED_ARGS)?;
        ev.put("keys", json!(d.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>())));
        ensure!(d["fits"].is_boolean(), "fits: bool", d.to_string());
        for p in ["/required_bytes", "/expected_peak_bytes", "/limit/bytes"] {
            u64_at(&d, p)?;
        }
        ensure!(d["limit"]["source"].is_string() && d["limits"].is_array(), "limit.source and limits[]", d["limit"].to_string());
        for t in d["ledger"]["terms"].as_array().into_iter().flatten() {
            ensure!(t["name"].is_string() && t["bytes"].is_u64() && t["detail"].is_string(), "term {name, bytes, detail}", t.to_string());
        }
        ensure!(d["shape"].is_object() && d["plan"].is_object(), "shape and plan objects", "missing");
        Ok("schema holds".into())
    });
    r.add(
        G,
        "memory.check.terms_named",
        "The ledger names every term",
        "terms weights, kv, compute, overhead, constraint, embeddings, margin in that order (native: weights, kv, scratch, overhead, margin)",
        |c, ev| {
            let (_, d) = check(c, &SHARED_ARGS)?;
            let names: Vec<String> = d["ledger"]["terms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect();
            ev.put("terms", json!(names));
            ensure_eq!("terms", names, terms_for(&d).to_vec());
            Ok(names.join(", "))
        },
    );
    r.add(
        G,
        "memory.check.terms_sum",
        "The terms add up to the requirement",
        "Σ terms == required_bytes",
        |c, ev| {
            let (_, d) = check(c, &SHARED_ARGS)?;
            let sum: u64 = terms_for(&d)
                .iter()
                .map(|t| term(&d, t))
                .sum::<Result<u64, Stop>>()?;
            ev.put("sum", sum);
            ensure_eq!("required_bytes", u64_at(&d, "/required_bytes")?, sum);
            Ok(format!("{sum} bytes"))
        },
    );
    r.add(
        G,
        "memory.check.weights_from_gguf",
        "The weights term is the GGUF tensor data",
        "weights == shape.tensor_bytes, between 80% and 100% of the file size",
        |c, ev| {
            let (_, d) = check(c, &SHARED_ARGS)?;
            let w = term(&d, "weights")?;
            let size = c
                .model_path()
                .and_then(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .unwrap_or(0);
            ev.put("weights", w);
            ev.put("file_bytes", size);
            ensure_eq!("weights", w, u64_at(&d, "/shape/tensor_bytes")?);
            ensure!(
                w <= size && w * 5 >= size * 4,
                format!("80–100% of {size}"),
                w.to_string()
            );
            Ok(format!("{w} of {size} bytes"))
        },
    );
    r.add(
        G,
        "memory.check.kv_formula",
        "The KV term follows the model's shape",
        "kv == cells × n_layer × n_head_kv × (head_dim_k + head_dim_v) × 2 B",
        |c, ev| {
            let (_, d) = check(c, &SHARED_ARGS)?;
            let s = &d["shape"];
            let want = u64_at(&d, "/plan/kv_cells")?
                * u64_at(s, "/n_layer")?
                * u64_at(s, "/n_head_kv")?
                * (u64_at(s, "/head_dim_k")? + u64_at(s, "/head_dim_v")?)
                * 2;
            ev.put("shape", s.clone());
            ensure_eq!("kv", term(&d, "kv")?, want);
            Ok(format!("{want} bytes"))
        },
    );
    r.add(
        G,
        "memory.check.kv_scales_with_ctx",
        "Doubling the context doubles the KV term",
        "kv(ctx 2048) == 2 × kv(ctx 1024)",
        |c, ev| {
            let (_, a) = check(c, &SHARED_ARGS)?;
            let (_, b) = check(c, &["--slots", "4", "--ctx", "2048"])?;
            let (ka, kb) = (term(&a, "kv")?, term(&b, "kv")?);
            ev.put("kv", json!([ka, kb]));
            ensure_eq!("kv at 2048", kb, 2 * ka);
            Ok(format!("{ka} → {kb}"))
        },
    );
    r.add(
        G,
        "memory.check.weights_shared_by_slots",
        "Weights are counted once however many slots",
        "weights(slots 1) == weights(slots 4)",
        |c, ev| {
            let (_, a) = check(c, &SHARED_ARGS)?;
            let (_, b) = check(c, &["--slots", "1", "--ctx", "1024"])?;
            let (wa, wb) = (term(&a, "weights")?, term(&b, "weights")?);
            ev.put("weights", json!([wb, wa]));
            ensure_eq!("weights", wb, wa);
            Ok(format!("{wa} bytes either way"))
        },
    );
    r.add(G, "memory.check.budget_refuses_exit_1", "A budget below the ledger is refused", "--memory-budget-mb 100: exit 1, fits false, limit memory-budget 100 MiB", |c, ev| {
        let (code, d) = check(c, &["--slots", "1", "--ctx", "1024", "--memory-budget-mb", "100"])?;
        ev.put("decision", json!({"fits": d["fits"], "limit": d["limit"], "required_bytes": d["required_bytes"]}));
        ensure_eq!("exit code", code, 1);
        ensure_eq!("fits", d["fits"], json!(false));
        ensure_eq!("limit.source", d["limit"]["source"], json!("memory-budget"));
        ensure_eq!("limit.bytes", d["limit"]["bytes"].as_u64(), Some(100 * MIB));
        Ok("exit 1, refused".into())
    });
    r.add(
        G,
        "memory.check.budget_fits",
        "A roomy budget is accepted",
        "--memory-budget-mb 4096: exit 0, fits true",
        |c, ev| {
            let (code, d) = check(
                c,
                &[
                    "--slots",
                    "1",
                    "--ctx",
                    "1024",
                    "--memory-budget-mb",
                    "4096",
                ],
            )?;
            ev.put("decision", json!({"fits": d["fits"], "limit": d["limit"]}));
            ensure_eq!("exit code", code, 0);
            ensure_eq!("fits", d["fits"], json!(true));
            Ok("exit 0".into())
        },
    );
    r.add(
        G,
        "memory.check.table_names_terms",
        "`check` without --json prints a readable table",
        "exit 0 and every term named on stdout",
        |c, ev| {
            let cfg = c.need_spawn("runs `inferloopd check`")?;
            c.need_subcommand("check")?;
            let model = cfg.model.to_string_lossy().into_owned();
            let out = cfg
                .command(&["check", "--model", &model, "--slots", "4", "--ctx", "1024"])
                .map_err(|e| Stop::fail("check runs", e))?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            ev.text("stdout", &text);
            ensure_eq!("exit code", out.status.code(), Some(0));
            for t in TERMS {
                ensure!(
                    text.contains(t),
                    format!("`{t}` in the table"),
                    crate::case::snippet(&text, 600)
                );
            }
            Ok("table with every term".into())
        },
    );
    r.add(
        G,
        "memory.serve.budget_refused_exit_1",
        "`serve` refuses a budget below the ledger before binding",
        "exit 1, one `memory admission rejected` line with the accounting, nothing listening",
        |c, ev| {
            let cfg = c.need_spawn("starts the daemon with --memory-budget-mb 100")?;
            let e: Exit = cfg
                .run_to_exit(
                    &["--slots", "1", "--ctx", "1024", "--memory-budget-mb", "100"],
                    Duration::from_secs(60),
                )
                .map_err(|e| Stop::fail("the daemon exits on its own", e))?;
            ev.text("log", &e.log);
            ensure_eq!("exit code", e.code, Some(1));
            let line = e
                .log
                .lines()
                .find(|l| l.contains("memory admission rejected"))
                .ok_or_else(|| {
                    Stop::fail(
                        "a `memory admission rejected` line",
                        crate::case::snippet(&e.log, 1500),
                    )
                })?
                .to_string();
            for k in [
                "reason=memory-budget",
                "requiredMB=",
                "limitMB=100.0",
                "weightsMB=",
                "kvMB=",
                "overheadMB=",
                "marginMB=",
            ] {
                ensure!(line.contains(k), format!("`{k}` in the line"), line.clone());
            }
            // llama.cpp's compute buffer, or the native backend's scratch.
            ensure!(
                line.contains("computeMB=") || line.contains("scratchMB="),
                "`computeMB=` (llama.cpp) or `scratchMB=` (native) in the line",
                line.clone()
            );
            ensure!(
                !e.log.contains("listening on"),
                "nothing listening",
                "it bound a port"
            );
            Ok(line)
        },
    );
    r.add(
        G,
        "memory.serve.status_ledger",
        "/v1/status carries the ledger the daemon admitted itself with",
        "memory.fits true, Σ terms == required_bytes; in spawn mode the terms equal `check`'s",
        |c, ev| {
            let s = c.target.status()?;
            let m = &s["memory"];
            ev.put("memory", m.clone());
            ensure_eq!("memory.fits", m["fits"], json!(true));
            let sum: u64 = m["terms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["bytes"].as_u64())
                .sum();
            ensure_eq!("required_bytes", u64_at(&s, "/memory/required_bytes")?, sum);
            if c.spawn.is_some() {
                let args = [
                    "--slots",
                    &c.facts.slots.to_string(),
                    "--ctx",
                    &c.facts.ctx.to_string(),
                ]
                .map(str::to_string);
                let (_, d) = check(c, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
                ensure_eq!("terms", m["terms"], d["ledger"]["terms"]);
            }
            Ok(format!(
                "{sum} bytes in {} terms",
                m["terms"].as_array().map_or(0, Vec::len)
            ))
        },
    );
    r.add(G, "memory.serve.metrics_ledger", "/metrics exports the ledger", "inferloop_memory_required_bytes{term} equal the status terms; term=\"total\" = required_bytes; a limit series", |c, ev| {
        let s = c.target.status()?;
        let m = c.target.metrics()?;
        for t in s["memory"]["terms"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or_default();
            let v = metric_of(&m, &format!("inferloop_memory_required_bytes{{term=\"{name}\"}}"))?;
            ensure_eq!(format!("term {name}"), v as u64, t["bytes"].as_u64().unwrap_or(0));
        }
        let total = metric_of(&m, "inferloop_memory_required_bytes{term=\"total\"}")?;
        ensure_eq!("total", total as u64, u64_at(&s, "/memory/required_bytes")?);
        ensure!(m.contains("inferloop_memory_limit_bytes{source="), "an inferloop_memory_limit_bytes series", "absent");
        ev.put("total", total);
        Ok(format!("total {total}"))
    });
    r.add(G, "memory.serve.peak_within_ledger", "The daemon stays within what it asked for", "memory.peak_rss_bytes ≤ memory.required_bytes (after this run's requests)", |c, ev| {
        let s = c.target.status()?;
        let m = &s["memory"];
        let (peak, req) = (u64_at(&s, "/memory/peak_rss_bytes")?, u64_at(&s, "/memory/required_bytes")?);
        ev.put("memory", json!({"peak_rss_bytes": peak, "rss_bytes": m["rss_bytes"], "required_bytes": req, "expected_peak_bytes": m["expected_peak_bytes"]}));
        ensure!(peak <= req, format!("peak RSS ≤ {req}"), peak.to_string());
        Ok(format!("peak {:.1} MiB of {:.1} MiB", peak as f64 / MIB as f64, req as f64 / MIB as f64))
    });
    r.add(
        G,
        "memory.cgroup.reverse_exit_1",
        "In a 120 MiB cgroup the daemon refuses to start",
        "exit 1, `memory admission rejected: reason=cgroup-limit` with limitMB=120.0",
        |c, ev| {
            let g = gated(c, false)?;
            record(ev, &g);
            ensure_eq!("exit code", g.exit, Some(1));
            ensure!(
                g.log
                    .contains("memory admission rejected: reason=cgroup-limit")
                    && g.log.contains("limitMB=120.0"),
                "the rejection line with the cgroup limit",
                crate::case::snippet(&g.log, 1500)
            );
            Ok("exit 1, cgroup-limit".into())
        },
    )
    .fixture("cgroup")
    .timeout_s(180);
    r.add(
        G,
        "memory.cgroup.reverse_no_oom_kill",
        "The refusal leaves the OOM killer idle",
        "oom_kill 0 in the cgroup's kernel counters, peak < 120 MiB",
        |c, ev| {
            let g = gated(c, false)?;
            record(ev, &g);
            ensure_eq!("oom_kill", g.oom_kills, Some(0));
            ensure!(
                g.peak.is_some_and(|p| p < 120 * MIB),
                "peak < 120 MiB",
                format!("{:?}", g.peak)
            );
            Ok(format!("oom_kill 0, peak {:?} bytes", g.peak))
        },
    )
    .fixture("cgroup")
    .timeout_s(180);
    r.add(
        G,
        "memory.cgroup.forward_serves",
        "In a 512 MiB cgroup the daemon serves",
        "ready, a chat answered, exit 0 on SIGTERM",
        |c, ev| {
            let g = gated(c, true)?;
            record(ev, &g);
            ensure!(
                g.log.contains("memory admission accepted"),
                "`memory admission accepted` logged",
                crate::case::snippet(&g.log, 1500)
            );
            ensure!(g.served.is_some(), "a chat answer", "none");
            ensure_eq!("exit code", g.exit, Some(0));
            Ok(format!("served {:?}", g.served.unwrap_or_default()))
        },
    )
    .fixture("cgroup")
    .timeout_s(180);
    r.add(
        G,
        "memory.cgroup.forward_under_limit",
        "Serving stays under the cgroup limit",
        "peak < 512 MiB, oom_kill 0",
        |c, ev| {
            let g = gated(c, true)?;
            record(ev, &g);
            ensure_eq!("oom_kill", g.oom_kills, Some(0));
            ensure!(
                g.peak.is_some_and(|p| p > 0 && p < 512 * MIB),
                "0 < peak < 512 MiB",
                format!("{:?}", g.peak)
            );
            Ok(format!(
                "peak {:.1} MiB",
                g.peak.unwrap_or(0) as f64 / MIB as f64
            ))
        },
    )
    .fixture("cgroup")
    .timeout_s(180);
    r.add(G, "memory.kv.waits_for_cells", "A request waits for KV cells even with a free slot", "2 slots sharing 256 cells: while a 238-cell request runs, a 58-cell one queues with a slot free, then is served", |c, ev| {
        let fx = c.fixture("kv")?;
        let t = fx.target();
        let first = crate::cases::load::occupy(&t, 200)?;
        t.wait_status(SETTLE, "the first request running", |s| s["slots"]["active"] == 1)?;
        let second = { let t = t.clone(); std::thread::spawn(move || t.complete(&counting(20, false))) };
        let s = t.wait_status(SETTLE, "the second request queued for cells", |s| s["queue"]["depth"] == 1)?;
        ev.put("status", json!({"slots": s["slots"], "queue": s["queue"], "kv": s["kv"]}));
        ensure_eq!("slots.active while the second waits", s["slots"]["active"], json!(1));
        ensure_eq!("kv.shared", s["kv"]["shared"], json!(true));
        ensure!(s["kv"]["reserved"].as_u64().is_some_and(|r| r > 200), "the first request's cells reserved (> 200)", s["kv"].to_string());
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(first);
        let b = second.join().unwrap_or_else(|_| Err(Stop::fail("thread", "panicked")))?;
        ensure_eq!("second completion_tokens", b["usage"]["completion_tokens"], json!(20));
        let q = b["timings"]["queue_ms"].as_f64().unwrap_or(0.0);
        ensure!(q > 100.0, "the second waited > 100 ms", format!("{q} ms"));
        Ok(format!("second waited {q:.0} ms for cells"))
    }).fixture("kv");
}
