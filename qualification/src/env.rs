//! The environment a report is about: board, daemon version and build, model and manifest
//! hashes, the host, and how the suite ran.

use std::time::{SystemTime, UNIX_EPOCH};

use inferloop_manifest::time::utc;
use serde::Serialize;
use serde_json::{json, Value};

use crate::ctx::{Ctx, Mode};
use crate::server::Server;

#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub started_utc: String,
    pub mode: &'static str,
    pub target: String,
    /// What the server is and the route that said it was ready.
    pub server: Server,
    pub daemon_version: String,
    pub daemon_binary: Option<String>,
    pub model_id: String,
    pub model_path: Option<String>,
    pub model_sha256: Option<String>,
    pub manifest_sha256: Option<String>,
    pub board: Value,
    pub host: Value,
    pub shared_daemon: Value,
    pub suite_version: &'static str,
    pub jobs: usize,
    pub filter: Vec<String>,
    /// Details cases recorded (perf measurements, `inferloopd board` output).
    pub notes: Value,
}

pub fn now_utc() -> String {
    utc(SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()))
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> Option<String> {
    read_trim("/proc/loadavg").map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Gathers the environment at the end of a run (hashes computed by cases are reused).
pub fn gather(ctx: &Ctx, started_utc: String, jobs: usize, filter: Vec<String>) -> Environment {
    let status = ctx.target.status().ok().unwrap_or(Value::Null);
    let local = inferloop_board::Detector::new(inferloop_board::Roots::default()).detect();
    let board = match (&status["board"], &local) {
        (Value::Object(_), _) => {
            let mut b = status["board"].clone();
            if let Some(name) = b["name"].as_str() {
                if let Ok(p) = inferloop_board::profile::find(name) {
                    b["perf_floors"] = serde_json::to_value(&p.perf_floors).unwrap_or(Value::Null);
                }
            }
            b
        }
        (_, Ok(d)) => json!({
            "name": d.profile.name,
            "description": d.profile.description,
            "reason": d.reason.to_string(),
            "perf_floors": d.profile.perf_floors,
            "detected_by": "inferloop-qual on this machine",
        }),
        (_, Err(e)) => json!({"error": e.to_string()}),
    };
    // The pin when a manifest set one, else what the daemon hashed after start.
    let model_sha256 = status["integrity"]["weights_sha256"]
        .as_str()
        .or_else(|| status["integrity"]["weights_sha256_observed"].as_str())
        .map(str::to_string)
        .or_else(|| {
            ctx.spawn.as_ref()?;
            crate::cases::integrity::model_pin(ctx)
                .ok()
                .map(|(sha, _)| sha)
        });
    let daemon_binary = ctx.spawn.as_ref().map(|s| {
        let version = s
            .command(&["--version"])
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        format!("{} ({version})", s.bin.display())
    });
    let notes = ctx
        .env_notes
        .lock()
        .map(|n| {
            let mut n = n.clone();
            n.remove("loadavg_at_start");
            serde_json::to_value(&n).unwrap_or(Value::Null)
        })
        .unwrap_or(Value::Null);
    Environment {
        started_utc,
        mode: match ctx.mode {
            Mode::Attach => "attach (--base-url)",
            Mode::Spawn => "spawn (--spawn)",
        },
        target: ctx.target.ep.url(""),
        server: ctx.server.clone(),
        daemon_version: status["version"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| ctx.facts.version.clone()),
        daemon_binary,
        model_id: ctx.facts.model_id.clone(),
        model_path: ctx.model_path().map(|p| p.display().to_string()),
        model_sha256,
        manifest_sha256: status["integrity"]["manifest_sha256"]
            .as_str()
            .map(str::to_string),
        board,
        host: json!({
            "hostname": read_trim("/proc/sys/kernel/hostname"),
            "kernel": read_trim("/proc/sys/kernel/osrelease"),
            "arch": std::env::consts::ARCH,
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            // Other work on the box slows every timing; the reader should see it.
            "loadavg_at_start": ctx.env_notes.lock().ok().and_then(|n| n.get("loadavg_at_start").cloned()),
            "loadavg_at_end": loadavg(),
        }),
        shared_daemon: json!({
            "slots": ctx.facts.slots,
            "ctx": ctx.facts.ctx,
            "queue": ctx.facts.queue,
            "argv": ctx.shared.as_ref().map(|d| d.argv.join(" ")),
            // The work this run asked of it, to compare runs.
            "requests": status["requests"].clone(),
        }),
        suite_version: env!("CARGO_PKG_VERSION"),
        jobs,
        filter,
        notes,
    }
}
