//! `inferloop-qual`: the qualification suite for `inferloopd`. 385 cases, each with a stable
//! id, run against a server someone started (`--base-url`: an inferloopd, or any
//! OpenAI-compatible server, which skips the inferloopd-only cases) or against daemons the
//! suite starts itself (`--spawn`), with a verdict people can file: JSON, Markdown and HTML.
//!
//! # Layout
//! - [`case`]: what a case is ([`case::Case`], its [`case::Group`], [`case::Stop`] for a
//!   failure with expected vs observed or a skip with its reason) and the `ensure!` macros.
//! - [`cases`]: the 385 cases, one module per group (a folder with one file per section for
//!   the large groups), data-driven where a table fits.
//! - [`ctx`]: what a case sees: the target, spawn settings, learned facts, dedicated daemons
//!   ([`fixtures`]) and once-per-run results.
//! - [`runner`]: scheduling (`--jobs`, fixtures one case at a time, exclusive cases alone),
//!   per-case timeouts, progress.
//! - [`http`], [`sse`], [`target`]: a byte-exact HTTP/1.1 client, timed SSE capture, and the
//!   checks every case repeats (status, OpenAI error shape).
//! - [`server`]: readiness through `/readyz`, `/health` or `/v1/models`, and whether the
//!   server is an inferloopd (cases that need more than OpenAI's API skip on others).
//! - [`daemon`], [`cgroup`]: starting `inferloopd` on port 0, inside a memory cgroup.
//! - [`prom`]: a strict Prometheus text parser.
//! - [`env`], [`report`]: the environment and the three report files.
//! - [`glob`]: `--filter` patterns.

pub mod case;
pub mod cases;
pub mod cgroup;
pub mod ctx;
pub mod daemon;
pub mod env;
pub mod fixtures;
pub mod glob;
pub mod http;
pub mod prom;
pub mod report;
pub mod runner;
pub mod server;
pub mod sse;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use case::{Case, Group, Stop};
use ctx::{Ctx, Facts, Mode};
use daemon::SpawnCfg;
use http::Endpoint;
use report::{Report, Samples};
use server::Server;
use target::Target;

/// Where the daemon under test comes from.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    /// A running daemon; cases that must restart or reconfigure it are skipped.
    Attach {
        base_url: String,
        api_key: Option<String>,
        /// The CA of an `https://` base URL.
        ca_file: Option<PathBuf>,
    },
    /// The suite starts the daemons itself.
    Spawn {
        bin: PathBuf,
        model: PathBuf,
        threads: u32,
        manifest: Option<PathBuf>,
        /// Flags added to every spawned `serve`.
        serve_args: Vec<String>,
    },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub target: TargetSpec,
    pub filter: Vec<String>,
    pub jobs: usize,
    /// Overrides every case's own timeout.
    pub timeout: Option<Duration>,
    /// Replaces the default deadline of each request to the attached or shared daemon.
    pub request_timeout: Option<Duration>,
    pub report_dir: Option<PathBuf>,
    pub progress: bool,
}

/// The flags of the daemon the suite shares between most cases in spawn mode.
/// The queue timeout is long so a slow or busy box queues instead of answering 503.
pub const SHARED_ARGS: [&str; 8] = [
    "--slots",
    "4",
    "--ctx",
    "1024",
    "--queue",
    "64",
    "--queue-timeout-ms",
    "300000",
];

/// Every case id with its group and title, in report order.
pub fn list(filter: &[String]) -> Vec<(String, Group, String)> {
    let f = glob::Filter::new(filter);
    cases::all()
        .into_iter()
        .filter(|c| f.selects(&c.id, c.group.name()))
        .map(|c| (c.id, c.group, c.title))
        .collect()
}

fn stop_text(s: Stop) -> String {
    match s {
        Stop::Fail { expected, observed } => format!("expected {expected}, observed {observed}"),
        Stop::Skip(r) => r,
    }
}

/// Runs the selected cases and writes the report when asked; `Err` means the suite could not
/// start (bad arguments, no daemon), not that a case failed.
pub fn run(opts: Options) -> Result<Report, String> {
    let started = env::now_utc();
    let t0 = Instant::now();
    let f = glob::Filter::new(&opts.filter);
    let selected: Vec<Arc<Case>> = cases::all()
        .into_iter()
        .filter(|c| f.selects(&c.id, c.group.name()))
        .map(Arc::new)
        .collect();
    if selected.is_empty() {
        return Err(format!("no case matches --filter {:?}", opts.filter));
    }
    let work = tempfile::Builder::new()
        .prefix("inferloop-qual-")
        .tempdir()
        .map_err(|e| format!("cannot create a scratch dir: {e}"))?;

    let (mode, target, spawn, shared) = match &opts.target {
        TargetSpec::Attach {
            base_url,
            api_key,
            ca_file,
        } => {
            let ep = Endpoint::parse_with_ca(base_url, ca_file.as_deref())?;
            (Mode::Attach, Target::new(ep, api_key.clone()), None, None)
        }
        TargetSpec::Spawn {
            bin,
            model,
            threads,
            manifest,
            serve_args,
        } => {
            if !bin.is_file() {
                return Err(format!("--spawn {}: no such file (build it with `cargo build --release -p inferloopd`)", bin.display()));
            }
            if !model.is_file() {
                return Err(format!(
                    "--model {}: no such file (`make model` fetches the default)",
                    model.display()
                ));
            }
            let cfg = SpawnCfg {
                bin: std::fs::canonicalize(bin).unwrap_or_else(|_| bin.clone()),
                model: std::fs::canonicalize(model).unwrap_or_else(|_| model.clone()),
                threads: *threads,
                serve_args: serve_args.clone(),
            };
            let mut args: Vec<String> = SHARED_ARGS.iter().map(|s| s.to_string()).collect();
            if let Some(m) = manifest {
                args.push("--manifest".into());
                args.push(m.to_string_lossy().into_owned());
            }
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let d = cfg
                .start(&refs)
                .map_err(|e| format!("the shared daemon did not start: {e}"))?;
            (Mode::Spawn, d.target(), Some(cfg), Some(d))
        }
    };

    // Attached servers may still be loading; any OpenAI-compatible one may be attached.
    let target = target.with_request_timeout(opts.request_timeout);
    let ready_via = server::wait_ready(&target, daemon::READY_TIMEOUT)?;
    let (server, info) = match mode {
        // What the suite started is an inferloopd; its /v1/status must answer.
        Mode::Spawn => {
            let status = target.status().map_err(stop_text)?;
            let version = status["version"].as_str().unwrap_or_default().to_string();
            (Server::inferloopd(&version), status)
        }
        Mode::Attach => server::detect(&target, ready_via),
    };
    let target = if server.inferloopd {
        target
    } else {
        target.openai_only()
    };
    let models = target.get_ok("/v1/models").map_err(stop_text)?;
    let (serve_help, top_help) = match &spawn {
        Some(cfg) => (
            cfg.serve_help(),
            cfg.command(&["--help"])
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default(),
        ),
        None => (String::new(), String::new()),
    };
    let facts = Facts::learn(&models, &info, serve_help, top_help);
    let ctx = Arc::new(
        Ctx::new(
            mode,
            target,
            spawn,
            facts,
            work.path().to_path_buf(),
            shared,
        )
        .with_server(server),
    );
    ctx.note_env("loadavg_at_start", env::loadavg());
    let results = runner::run(
        &ctx,
        selected,
        &runner::RunOptions {
            jobs: opts.jobs,
            timeout: opts.timeout,
            progress: opts.progress,
        },
    );
    let environment = env::gather(&ctx, started, opts.jobs, opts.filter.clone());
    let (ttft_ms, inter_token_ms) = ctx.samples.snapshot();
    let report = Report::new(
        environment,
        results,
        Samples {
            ttft_ms,
            inter_token_ms,
        },
        t0.elapsed().as_secs_f64(),
    );
    if let Some(dir) = &opts.report_dir {
        report
            .write(dir)
            .map_err(|e| format!("cannot write the report to {}: {e}", dir.display()))?;
    }
    // Stops the shared daemon and any fixture still up (a timed-out case may hold a clone).
    drop(ctx);
    drop(work);
    Ok(report)
}
