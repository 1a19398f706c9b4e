//! What every case sees: the daemon under test, how to start others (spawn mode), what is
//! known about the target, dedicated daemons shared by a few cases, and results worth
//! computing once.

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::case::Stop;
use crate::daemon::{Daemon, SpawnCfg};
use crate::fixtures;
use crate::server::Server;
use crate::target::Target;

/// How the suite reaches the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--base-url`: a daemon someone else started; nothing may restart it.
    Attach,
    /// `--spawn`: the suite starts every daemon itself.
    Spawn,
}

/// What the suite learned about the daemon under test before the first case.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub model_id: String,
    pub slots: u64,
    pub ctx: u64,
    pub queue: u64,
    pub version: String,
    /// `inferloopd serve --help` (spawn mode), to tell which flags this build has.
    pub serve_help: String,
    /// `inferloopd --help` (spawn mode), to tell which subcommands this build has.
    pub top_help: String,
}

impl Facts {
    /// The facts from `GET /v1/models` and what the server said about itself: inferloopd's
    /// `/v1/status`, or llama-server's `/props` (`total_slots`, the per-slot `n_ctx`), or
    /// nothing (one slot, a 1024-token context, no queue assumed).
    pub fn learn(models: &Value, info: &Value, serve_help: String, top_help: String) -> Facts {
        let settings = &info["default_generation_settings"];
        Facts {
            model_id: models["data"][0]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            slots: info["slots"]["total"]
                .as_u64()
                .or_else(|| info["total_slots"].as_u64())
                .unwrap_or(1),
            ctx: info["slots"]["ctx_per_slot"]
                .as_u64()
                .or_else(|| settings["n_ctx"].as_u64())
                .unwrap_or(1024),
            queue: info["queue"]["capacity"].as_u64().unwrap_or(0),
            version: info["version"]
                .as_str()
                .or_else(|| info["build_info"].as_str())
                .unwrap_or_default()
                .to_string(),
            serve_help,
            top_help,
        }
    }
}

/// Latency samples for the report's charts.
#[derive(Debug, Default)]
pub struct Samples {
    pub ttft_ms: Mutex<Vec<f64>>,
    pub inter_token_ms: Mutex<Vec<f64>>,
}

impl Samples {
    pub fn add(&self, ttft_ms: f64, gaps_ms: &[f64]) {
        if let Ok(mut t) = self.ttft_ms.lock() {
            t.push(ttft_ms);
        }
        if let Ok(mut g) = self.inter_token_ms.lock() {
            g.extend_from_slice(gaps_ms);
        }
    }

    pub fn snapshot(&self) -> (Vec<f64>, Vec<f64>) {
        (
            self.ttft_ms.lock().map(|v| v.clone()).unwrap_or_default(),
            self.inter_token_ms
                .lock()
                .map(|v| v.clone())
                .unwrap_or_default(),
        )
    }
}

/// A dedicated daemon (and whatever it reads, such as a fake sysfs tree).
pub struct Fixture {
    pub daemon: Daemon,
    /// Files the daemon reads; removed when the fixture goes.
    pub dir: Option<tempfile::TempDir>,
}

impl Fixture {
    pub fn target(&self) -> Target {
        self.daemon.target()
    }

    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }
}

type Slot<T> = Arc<OnceLock<T>>;
type Memo = Arc<dyn Any + Send + Sync>;
/// A fixture that started, or why it did not.
type Started = Result<Arc<Fixture>, String>;

pub struct Ctx {
    pub mode: Mode,
    /// The daemon most cases talk to.
    pub target: Target,
    pub spawn: Option<SpawnCfg>,
    pub facts: Facts,
    /// What the server is; cases needing more than OpenAI's API skip on anything but an
    /// inferloopd.
    pub server: Server,
    /// Scratch space for manifests, model copies and fake trees.
    pub work: PathBuf,
    pub samples: Samples,
    /// Environment details cases discover (board, hashes), for the report.
    pub env_notes: Mutex<HashMap<String, Value>>,
    fixtures: Mutex<HashMap<&'static str, Slot<Started>>>,
    memo: Mutex<HashMap<String, Slot<Memo>>>,
    /// The shared daemon in spawn mode, kept alive for the run.
    pub shared: Option<Daemon>,
}

impl Ctx {
    pub fn new(
        mode: Mode,
        target: Target,
        spawn: Option<SpawnCfg>,
        facts: Facts,
        work: PathBuf,
        shared: Option<Daemon>,
    ) -> Ctx {
        Ctx {
            mode,
            target,
            spawn,
            server: Server::inferloopd(&facts.version),
            facts,
            work,
            samples: Samples::default(),
            env_notes: Mutex::default(),
            fixtures: Mutex::default(),
            memo: Mutex::default(),
            shared,
        }
    }

    /// The same context about `server` (which it reads from the target as well).
    pub fn with_server(mut self, server: Server) -> Ctx {
        self.target.inferloopd = server.inferloopd;
        self.server = server;
        self
    }

    /// A cheap GET that answers 200 when all is well: inferloopd's `/healthz`, or the route
    /// that told the suite another server was ready (llama-server's `/health`).
    pub fn health_path(&self) -> &'static str {
        if self.server.inferloopd {
            "/healthz"
        } else {
            self.server.ready_via
        }
    }

    /// The spawn settings, or a skip naming what the case would have started.
    pub fn need_spawn(&self, what: &str) -> Result<&SpawnCfg, Stop> {
        self.spawn.as_ref().ok_or_else(|| {
            Stop::skip(format!(
                "needs --spawn: {what}; a running daemon (--base-url) cannot be restarted or reconfigured"
            ))
        })
    }

    /// Skips unless this daemon build has `flag` on `serve`.
    pub fn need_flag(&self, flag: &str) -> Result<(), Stop> {
        if self.facts.serve_help.contains(flag) {
            Ok(())
        } else {
            Err(Stop::skip(format!(
                "this inferloopd has no `serve {flag}` flag (not in `serve --help`)"
            )))
        }
    }

    /// Skips unless this daemon build has the subcommand `name`.
    pub fn need_subcommand(&self, name: &str) -> Result<(), Stop> {
        let listed = self
            .facts
            .top_help
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name));
        if listed {
            Ok(())
        } else {
            Err(Stop::skip(format!(
                "this inferloopd has no `{name}` subcommand (not in `inferloopd --help`)"
            )))
        }
    }

    /// The dedicated daemon `name` (see [`fixtures::spec`]), started on first use.
    pub fn fixture(&self, name: &'static str) -> Result<Arc<Fixture>, Stop> {
        let spec = fixtures::spec(name);
        let cfg = self.need_spawn(&format!("a dedicated daemon with {}", spec.args.join(" ")))?;
        for flag in spec.needs {
            self.need_flag(flag)?;
        }
        let slot = {
            let mut map = self
                .fixtures
                .lock()
                .map_err(|_| Stop::fail("fixture registry", "lock poisoned"))?;
            map.entry(name).or_default().clone()
        };
        let started = slot.get_or_init(|| fixtures::start(name, cfg, &self.work).map(Arc::new));
        started.clone().map_err(|e| {
            // A backend without the feature the fixture exercises says so and exits 2 (the
            // native backend has no shared KV pool yet): nothing to qualify, not a failure.
            if e.contains("no shared pool yet") {
                return Stop::skip(format!(
                    "the daemon's backend refuses `{}`: {e}",
                    spec.args.join(" ")
                ));
            }
            Stop::fail(
                format!("dedicated daemon `{name}` ({}) starts", spec.args.join(" ")),
                e,
            )
        })
    }

    /// Stops fixture `name` once no case needs it any more.
    pub fn release(&self, name: &str) {
        let slot = self.fixtures.lock().ok().and_then(|mut m| m.remove(name));
        drop(slot);
    }

    /// Computes `f` once per `key` for the whole run; later callers get the same value.
    pub fn memo<T: Any + Send + Sync>(&self, key: &str, f: impl FnOnce() -> T) -> Arc<T> {
        let slot = match self.memo.lock() {
            Ok(mut m) => m.entry(key.to_string()).or_default().clone(),
            Err(_) => Arc::new(OnceLock::new()),
        };
        let v = slot.get_or_init(|| Arc::new(f()) as Memo).clone();
        v.downcast::<T>()
            .unwrap_or_else(|_| panic!("memo key {key} reused with another type"))
    }

    /// Records an environment detail for the report.
    pub fn note_env(&self, key: &str, value: impl Into<Value>) {
        if let Ok(mut n) = self.env_notes.lock() {
            n.insert(key.to_string(), value.into());
        }
    }

    /// The model file under test (spawn mode).
    pub fn model_path(&self) -> Option<&Path> {
        self.spawn.as_ref().map(|s| s.model.as_path())
    }
}
