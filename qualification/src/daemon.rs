//! Starting `inferloopd` the way the cases need it: on `127.0.0.1:0` (the address comes from
//! its `listening on http://ADDR` log line), optionally inside a cgroup, with its stderr
//! captured; stopped with SIGTERM then SIGKILL when dropped.
//!
//! Every child is forked by one long-lived spawner thread with `PR_SET_PDEATHSIG`, so a
//! killed suite leaves no daemon behind (the signal follows the forking *thread*).

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::{self, Endpoint};
use crate::target::Target;

/// From spawn to `/readyz` 200; a busy 2-core box needs a while.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Between SIGTERM and SIGKILL when a daemon is dropped.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How to start daemons: the binary, the model, the thread count and flags for every
/// `serve` (e.g. `--backend native`).
#[derive(Debug, Clone)]
pub struct SpawnCfg {
    pub bin: PathBuf,
    pub model: PathBuf,
    pub threads: u32,
    pub serve_args: Vec<String>,
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks `cmd` from the spawner thread.
fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("qual-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // The caller may have given up waiting; the child is then dropped and
                    // reaped by nobody, which only leaves a zombie until the suite exits.
                    if reply.send(cmd.spawn()).is_err() {
                        eprintln!("qual: spawn reply dropped");
                    }
                }
            })
            .expect("spawn the spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .map_err(|_| std::io::Error::other("spawner lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("spawner thread gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread gone"))?
}

/// Makes the child die with the spawner thread and, when `procs` is set, join that cgroup
/// (by writing "0" to its `cgroup.procs`) before exec.
fn prepare(cmd: &mut Command, procs: Option<CString>) {
    // SAFETY: between fork and exec only prctl(2), open(2), write(2) and close(2) run, all
    // async-signal-safe; the path was allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(path) = &procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if !ok {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
}

/// The daemon's environment must not leak the caller's `INFERLOOP_*` overrides, and its log
/// must hold the info-level `listening on` line.
fn clean_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("INFERLOOP_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "info,llama-cpp-2=warn");
}

/// How a one-shot run ended.
#[derive(Debug, Clone)]
pub struct Exit {
    pub code: Option<i32>,
    pub log: String,
    pub wall: Duration,
}

/// The flags of `args` (`--flag value` or `--flag=value`) that `extra` does not set.
pub(crate) fn common_args(args: &[String], extra: &[&str]) -> Vec<String> {
    let set_in_extra = |flag: &str| {
        extra
            .iter()
            .any(|e| *e == flag || e.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].split('=').next().unwrap_or_default();
        let takes_value =
            !args[i].contains('=') && args.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        let n = if takes_value { 2 } else { 1 };
        if !set_in_extra(flag) {
            out.extend(args[i..i + n].iter().cloned());
        }
        i += n;
    }
    out
}

impl SpawnCfg {
    /// `serve` with the model, loopback, port 0, the thread count and `serve_args`, unless
    /// `extra` sets any of those flags itself.
    pub fn serve_argv(&self, extra: &[&str]) -> Vec<String> {
        let model = self.model.to_string_lossy().into_owned();
        let threads = self.threads.to_string();
        let mut argv = vec!["serve".to_string()];
        for (flag, value) in [
            ("--model", model.as_str()),
            ("--host", "127.0.0.1"),
            ("--port", "0"),
            ("--threads", threads.as_str()),
        ] {
            if !extra.contains(&flag) {
                argv.push(flag.into());
                argv.push(value.into());
            }
        }
        argv.extend(common_args(&self.serve_args, extra));
        argv.extend(extra.iter().map(|s| s.to_string()));
        argv
    }

    /// Spawns the daemon with exactly `argv`, inside the cgroup directory `cgroup` when set.
    pub fn spawn(&self, argv: Vec<String>, cgroup: Option<&Path>) -> Result<Daemon, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        clean_env(&mut cmd);
        let procs = match cgroup {
            Some(dir) => Some(
                CString::new(
                    dir.join("cgroup.procs")
                        .into_os_string()
                        .into_encoded_bytes(),
                )
                .map_err(|e| format!("cgroup path: {e}"))?,
            ),
            None => None,
        };
        prepare(&mut cmd, procs);
        let mut child = spawn_child(cmd)
            .map_err(|e| format!("cannot start {} {argv:?}: {e}", self.bin.display()))?;
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().ok_or("stderr not piped")?;
        let reader = std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut l) = log.lock() {
                        l.push_str(&line);
                        l.push('\n');
                    }
                }
            }
        });
        Ok(Daemon {
            child: Mutex::new(child),
            ep: Mutex::new(None),
            log,
            reader: Mutex::new(Some(reader)),
            argv,
            api_key: None,
            spawned_at: Instant::now(),
        })
    }

    /// Starts `serve` with `extra` flags and waits until it answers `/readyz` 200.
    pub fn start(&self, extra: &[&str]) -> Result<Daemon, String> {
        let mut d = self.spawn(self.serve_argv(extra), None)?;
        d.api_key = flag_value(extra, "--api-key");
        d.wait_address(READY_TIMEOUT)?;
        d.wait_ready(READY_TIMEOUT)?;
        Ok(d)
    }

    /// Runs `serve` with `extra` flags and expects it to exit on its own within `timeout`.
    pub fn run_to_exit(&self, extra: &[&str], timeout: Duration) -> Result<Exit, String> {
        self.exit_of(self.spawn(self.serve_argv(extra), None)?, timeout)
    }

    /// Waits for a spawned daemon to exit on its own.
    pub fn exit_of(&self, d: Daemon, timeout: Duration) -> Result<Exit, String> {
        match d.wait_exit(timeout) {
            Some(status) => {
                d.join_log();
                Ok(Exit {
                    code: status.code(),
                    log: d.log(),
                    wall: d.spawned_at.elapsed(),
                })
            }
            None => Err(format!(
                "daemon still running after {timeout:?}; log tail:\n{}",
                d.log_tail(20)
            )),
        }
    }

    /// Runs another subcommand (`check`, `board`, `thermal`) to completion.
    pub fn command(&self, args: &[&str]) -> Result<Output, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).stdin(Stdio::null());
        clean_env(&mut cmd);
        cmd.env("RUST_LOG", "warn");
        cmd.output()
            .map_err(|e| format!("cannot run {} {args:?}: {e}", self.bin.display()))
    }

    /// `inferloopd serve --help`, to learn which flags this build has.
    pub fn serve_help(&self) -> String {
        self.command(&["serve", "--help"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

fn flag_value(args: &[&str], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.to_string())
}

/// A spawned `inferloopd`. Dropping it stops the process.
pub struct Daemon {
    child: Mutex<Child>,
    ep: Mutex<Option<Endpoint>>,
    log: Arc<Mutex<String>>,
    reader: Mutex<Option<JoinHandle<()>>>,
    pub argv: Vec<String>,
    pub api_key: Option<String>,
    pub spawned_at: Instant,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.lock().map(|c| c.id()).unwrap_or(0)
    }

    /// The address from the log; panics-free: a daemon that never bound has none.
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.ep.lock().ok().and_then(|e| e.clone())
    }

    /// A client for this daemon, with its API key.
    pub fn target(&self) -> Target {
        Target::new(
            self.endpoint()
                .unwrap_or_else(|| Endpoint::parse("http://127.0.0.1:9").expect("static URL")),
            self.api_key.clone(),
        )
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until the reader has drained stderr (call after the exit), so the log is
    /// complete.
    pub fn join_log(&self) {
        let handle = self.reader.lock().ok().and_then(|mut r| r.take());
        if let Some(h) = handle {
            if h.join().is_err() {
                eprintln!("qual: log reader thread panicked");
            }
        }
    }

    /// Parses the `listening on http://ADDR` line, waiting for it.
    pub fn wait_address(&self, timeout: Duration) -> Result<Endpoint, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ep) = listening_address(&self.log()) {
                if let Ok(mut slot) = self.ep.lock() {
                    *slot = Some(ep.clone());
                }
                return Ok(ep);
            }
            if let Some(status) = self.try_wait() {
                self.join_log();
                return Err(format!(
                    "daemon exited during start-up ({status}); log tail:\n{}",
                    self.log_tail(20)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no `listening on` line within {timeout:?}; log tail:\n{}",
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Polls `/readyz` until 200.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let ep = self.endpoint().ok_or("no address yet")?;
        let deadline = Instant::now() + timeout;
        loop {
            if http::probe_status(&ep, "/readyz", Duration::from_secs(5)) == Some(200) {
                return Ok(());
            }
            if let Some(status) = self.try_wait() {
                self.join_log();
                return Err(format!(
                    "daemon exited before ready ({status}); log tail:\n{}",
                    self.log_tail(20)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "/readyz not 200 within {timeout:?}; log tail:\n{}",
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn try_wait(&self) -> Option<ExitStatus> {
        self.child.lock().ok()?.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `sig` to the daemon; an already exited daemon is fine.
    pub fn signal(&self, sig: libc::c_int) -> Result<(), String> {
        let Ok(mut child) = self.child.lock() else {
            return Err("child lock poisoned".into());
        };
        // Reaped children keep their status in `Child`, so the pid cannot be reused by then.
        if matches!(child.try_wait(), Ok(Some(_))) {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(child.id()).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our unreaped child
        // (we hold its `Child`), so it names no other process.
        if unsafe { libc::kill(pid, sig) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(()),
            _ => Err(format!("kill({pid}, {sig}): {err}")),
        }
    }

    pub fn sigterm(&self) -> Result<(), String> {
        self.signal(libc::SIGTERM)
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after a grace period) and returns its status.
    pub fn stop(&self) -> Option<ExitStatus> {
        if let Some(s) = self.try_wait() {
            return Some(s);
        }
        if self.sigterm().is_ok() {
            if let Some(s) = self.wait_exit(STOP_GRACE) {
                return Some(s);
            }
        }
        let mut child = self.child.lock().ok()?;
        if let Err(e) = child.kill() {
            eprintln!("qual: cannot kill daemon {}: {e}", child.id());
        }
        child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The address of the daemon's `listening on http://ADDR` line; a wildcard bind is reached
/// through loopback.
pub fn listening_address(log: &str) -> Option<Endpoint> {
    // An HTTPS daemon's line says https://; the address is the same.
    let rest = log
        .split("listening on http://")
        .nth(1)
        .or_else(|| log.split("listening on https://").nth(1))?;
    let token = rest.split_whitespace().next()?;
    let mut addr: std::net::SocketAddr = token.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    Some(Endpoint::from_addr(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_gives_the_address_and_wildcards_become_loopback() {
        let log = "2026 INFO inferloopd::server: listening on http://0.0.0.0:4242\n";
        assert_eq!(
            listening_address(log),
            Some(Endpoint {
                host: "127.0.0.1".into(),
                port: 4242,
                tls: None,
            })
        );
        assert_eq!(listening_address("nothing yet"), None);
    }

    #[test]
    fn serve_argv_keeps_caller_flags_over_defaults() {
        let cfg = SpawnCfg {
            bin: "inferloopd".into(),
            model: "m.gguf".into(),
            threads: 2,
            serve_args: vec![],
        };
        let argv = cfg.serve_argv(&["--host", "0.0.0.0", "--slots", "1"]);
        assert_eq!(argv.iter().filter(|a| *a == "--host").count(), 1);
        assert!(argv.windows(2).any(|w| w == ["--model", "m.gguf"]));
        assert!(argv.windows(2).any(|w| w == ["--host", "0.0.0.0"]));
    }

    #[test]
    fn serve_args_reach_every_daemon_unless_a_case_sets_the_flag() {
        let cfg = SpawnCfg {
            bin: "inferloopd".into(),
            model: "m.gguf".into(),
            threads: 2,
            serve_args: ["--backend", "native", "--slots=2", "--insecure-no-auth"]
                .map(String::from)
                .to_vec(),
        };
        let argv = cfg.serve_argv(&["--slots", "1"]);
        assert!(argv.windows(2).any(|w| w == ["--backend", "native"]));
        assert!(argv.contains(&"--insecure-no-auth".to_string()));
        assert!(!argv.contains(&"--slots=2".to_string()), "{argv:?}");
        assert!(argv.windows(2).any(|w| w == ["--slots", "1"]));
    }
}
