//! Boot gates: the memory ledger on the real model, refusal and admission inside real
//! cgroups, runtime KV-cell admission, and weights checked against a manifest.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{self, Daemon, COUNTING};

const MIB: u64 = 1 << 20;

fn model_path() -> PathBuf {
    std::env::var_os("INFERLOOP_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        })
}

fn check_json(args: &[&str]) -> (i32, Value) {
    let model = model_path();
    let out = Command::new(env!("CARGO_BIN_EXE_inferloopd"))
        .arg("check")
        .arg("--model")
        .arg(&model)
        .args(args)
        .arg("--json")
        .output()
        .expect("run inferloopd check");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json printed no JSON ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

fn term(decision: &Value, name: &str) -> u64 {
    decision["ledger"]["terms"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .and_then(|t| t["bytes"].as_u64())
        .unwrap_or_else(|| panic!("no term {name} in {decision}"))
}

#[test]
fn check_reads_the_real_gguf_header_without_loading_weights() {
    let (code, d) = check_json(&["--slots", "4", "--ctx", "2048"]);
    assert_eq!(code, 0, "{d}");
    // llama.cpp's own figures for this model: model size 96,576,768 B, KV 180 MiB.
    assert_eq!(d["shape"]["tensor_bytes"], 96_576_768);
    assert_eq!(d["shape"]["n_layer"], 30);
    assert_eq!(d["shape"]["n_head_kv"], 3);
    assert_eq!(d["shape"]["n_vocab"], 49152);
    assert_eq!(term(&d, "weights"), 96_576_768);
    assert_eq!(term(&d, "kv"), 180 * MIB);
    assert!(d["fits"].as_bool().expect("fits"));
    let total: u64 = [
        "weights",
        "kv",
        "compute",
        "overhead",
        "constraint",
        "embeddings",
        "prompt_cache",
        "connections",
        "margin",
    ]
    .iter()
    .map(|t| term(&d, t))
    .sum();
    assert_eq!(d["required_bytes"].as_u64(), Some(total));
}

#[test]
fn check_refuses_with_exit_1_under_a_small_budget() {
    let (code, d) = check_json(&["--slots", "1", "--ctx", "1024", "--memory-budget-mb", "100"]);
    assert_eq!(code, 1);
    assert_eq!(d["fits"], false);
    assert_eq!(d["limit"]["source"], "memory-budget");
    assert_eq!(d["limit"]["bytes"].as_u64(), Some(100 * MIB));
}

/// Regression: `--proc-root` and `--sysfs-root` reached board detection but not the ledger,
/// which read the limits under the real `/proc` and `/sys`.
#[test]
fn check_reads_the_limits_under_the_proc_and_sysfs_roots() {
    let proc_dir = tempfile::tempdir().expect("tempdir");
    let sys_dir = tempfile::tempdir().expect("tempdir");
    let write = |dir: &Path, rel: &str, text: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write fixture");
    };
    write(proc_dir.path(), "self/cgroup", "0::/box.slice\n");
    write(
        proc_dir.path(),
        "self/mountinfo",
        "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    write(
        proc_dir.path(),
        "meminfo",
        "MemTotal: 4000000 kB\nMemAvailable: 3000000 kB\n",
    );
    write(
        sys_dir.path(),
        "fs/cgroup/box.slice/memory.max",
        "104857600\n",
    );
    let (code, d) = check_json(&[
        "--slots",
        "1",
        "--ctx",
        "1024",
        "--proc-root",
        proc_dir.path().to_str().expect("utf8"),
        "--sysfs-root",
        sys_dir.path().to_str().expect("utf8"),
    ]);
    assert_eq!(code, 1, "{d}");
    assert_eq!(d["limit"]["source"], "cgroup-v2", "{d}");
    assert_eq!(d["limit"]["bytes"].as_u64(), Some(100 * MIB));
    assert_eq!(d["limit"]["from"], "/sys/fs/cgroup/box.slice/memory.max");
    let avail = d["limits"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["source"] == "mem-available"))
        .and_then(|l| l["bytes"].as_u64());
    assert_eq!(avail, Some(3_000_000 * 1024), "{d}");
}

#[test]
fn serve_refuses_a_budget_below_the_ledger_before_binding() {
    let (status, log) = Daemon::run_to_exit(
        &["--slots", "1", "--ctx", "1024", "--memory-budget-mb", "100"],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(1), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("memory admission rejected"))
        .unwrap_or_else(|| panic!("no rejection line in:\n{log}"));
    for key in [
        "reason=memory-budget",
        "requiredMB=",
        "limitMB=100.0",
        "weightsMB=92.1",
        "kvMB=22.5",
        "computeMB=",
        "overheadMB=",
        "marginMB=",
    ] {
        assert!(line.contains(key), "{key} missing in: {line}");
    }
    assert!(!log.contains("listening on"), "{log}");
}

#[tokio::test]
async fn ledger_and_rss_are_exposed_as_metrics_and_status() {
    let d = harness::shared();
    let status = d.status().await;
    let mem = &status["memory"];
    assert!(mem["fits"].as_bool().expect("fits"));
    let rss = mem["rss_bytes"].as_u64().expect("rss");
    let expected = mem["expected_peak_bytes"].as_u64().expect("expected");
    assert!(
        rss > 50 * MIB && rss < 2 * expected,
        "rss {rss}, expected {expected}"
    );
    let text = d.metrics().await;
    for series in [
        "inferloop_memory_required_bytes{term=\"weights\"}",
        "inferloop_memory_required_bytes{term=\"kv\"}",
        "inferloop_memory_required_bytes{term=\"total\"}",
        "inferloop_memory_limit_bytes{source=\"mem-available\"}",
        "inferloop_memory_rss_bytes",
    ] {
        assert!(harness::metric(&text, series) > 0.0, "{series}");
    }
}

/// `words` of varied text (a fixed vocabulary in a seeded order, some words numbered), so the
/// tokenizer gives ~1.85 tokens per word and each seed a different prompt.
fn varied_prompt(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 30] = [
        "alpha", "river", "stone", "cloud", "market", "engine", "silver", "garden", "winter",
        "planet", "copper", "signal", "harbor", "violet", "quiet", "number", "system", "bridge",
        "forest", "method", "theory", "ocean", "candle", "mirror", "rocket", "butter", "sugar",
        "piano", "tiger", "yellow",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = String::new();
    for _ in 0..words {
        let r = next();
        out.push_str(VOCAB[(r % 30) as usize]);
        if r % 10 < 3 {
            out.push_str(&((r >> 32) % 1000).to_string());
        }
        out.push(' ');
    }
    out
}

#[tokio::test]
async fn worst_case_peak_rss_stays_within_the_ledger_without_its_margin() {
    // Issue 10's worst case: every slot nearly full, prompts prefilled in 512-token
    // micro-batches next to the decode steps of the slots already generating. The issue's
    // 4 x 2048 (VmHWM 325.9 MiB against an expected 320.2 before the fix, now 332.4) takes
    // 35-100 s of prefill on 2 busy cores; 4 x 1024 has the same shape at half the tokens
    // and failed the same way (233.7 MiB against 229.2). 2 threads as in a default
    // deployment on this box, not the suite's 1.
    let d = Daemon::start(&["--slots", "4", "--ctx", "1024", "--threads", "2"]);
    let status = d.status().await;
    // The worst case here is unconstrained, embeds nothing and evicts no prompt: the
    // `constraint` term (structured output's parsers), the `embeddings` term (the
    // embeddings context) and the `prompt_cache` term (saved prefixes) stay untouched, so
    // the bound it must meet leaves them out.
    let term = |name: &str| {
        status["memory"]["terms"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == name))
            .and_then(|t| t["bytes"].as_u64())
            .unwrap_or_else(|| panic!("a {name} term"))
    };
    let expected = status["memory"]["expected_peak_bytes"]
        .as_u64()
        .expect("expected_peak_bytes")
        - term("constraint")
        - term("embeddings")
        - term("prompt_cache");
    let required = status["memory"]["required_bytes"]
        .as_u64()
        .expect("required_bytes");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .expect("client");
    let reqs: Vec<_> = (0..4)
        .map(|i| {
            let (client, url) = (client.clone(), d.url("/v1/completions"));
            let body = json!({"prompt": varied_prompt(i, 500), "max_tokens": 16, "temperature": 0});
            tokio::spawn(async move { client.post(url).json(&body).send().await })
        })
        .collect();
    for r in reqs {
        let resp = r.await.expect("join").expect("send");
        let code = resp.status();
        let v: Value = resp.json().await.expect("json");
        assert_eq!(code, 200, "{v}");
        let prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
        assert!(
            (900..=1024 - 16).contains(&prompt),
            "each slot must be nearly full: {prompt} prompt tokens"
        );
        assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
    }
    let status = d.status().await;
    let peak = status["memory"]["peak_rss_bytes"]
        .as_u64()
        .expect("peak_rss_bytes");
    let mib = |b: u64| b as f64 / MIB as f64;
    eprintln!(
        "worst case 4 x 1024: peak {:.1} MiB, expected {:.1} MiB (ratio {:.3}), required {:.1} MiB",
        mib(peak),
        mib(expected),
        peak as f64 / expected as f64,
        mib(required)
    );
    assert!(
        peak <= expected,
        "peak RSS {:.1} MiB above the ledger's expected peak {:.1} MiB (required with margin \
         {:.1} MiB): {}",
        mib(peak),
        mib(expected),
        mib(required),
        status["memory"]
    );
    // Honest, not padded: the ledger stays within 10% of what the worst case reaches.
    assert!(
        peak as f64 / expected as f64 > 0.9,
        "expected peak {:.1} MiB is far above the measured {:.1} MiB",
        mib(expected),
        mib(peak)
    );
}

// ---- runtime KV-cell admission ----

fn counting(max_tokens: u32) -> Value {
    json!({"prompt": COUNTING, "max_tokens": max_tokens, "temperature": 0})
}

#[tokio::test]
async fn request_waits_for_kv_cells_when_the_shared_pool_is_short() {
    // Two slots share 256 cells; each request reserves ~140 (prompt + max_tokens), so the
    // second must wait for the first to finish even though a slot is free.
    let d = Daemon::start(&["--slots", "2", "--ctx", "256", "--kv-cells", "256"]);
    let first = tokio::spawn({
        let url = d.url("/v1/completions");
        async move { harness::http().post(url).json(&counting(100)).send().await }
    });
    d.wait_status(harness::SETTLE, "first request running", |s| {
        s["slots"]["active"] == 1
    })
    .await;
    let second = tokio::spawn({
        let url = d.url("/v1/completions");
        async move { harness::http().post(url).json(&counting(100)).send().await }
    });
    let s = d
        .wait_status(harness::SETTLE, "second request queued for cells", |s| {
            s["queue"]["depth"] == 1
        })
        .await;
    assert_eq!(
        s["slots"]["active"], 1,
        "a slot is free but the cells are not: {s}"
    );
    assert!(s["kv"]["reserved"].as_u64().expect("reserved") > 100, "{s}");
    assert_eq!(s["kv"]["shared"], true);
    let a: Value = first
        .await
        .expect("join")
        .expect("send")
        .json()
        .await
        .expect("json");
    let b: Value = second
        .await
        .expect("join")
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(a["usage"]["completion_tokens"], 100, "{a}");
    assert_eq!(b["usage"]["completion_tokens"], 100, "{b}");
    assert!(
        b["timings"]["queue_ms"].as_f64().expect("queue_ms") > 100.0,
        "the second request must have waited: {b}"
    );
}

#[tokio::test]
async fn requests_that_fit_the_shared_pool_run_together() {
    // Two requests of ~120 cells each fit 256 shared cells together.
    let d = Daemon::start(&["--slots", "2", "--ctx", "256", "--kv-cells", "256"]);
    let reqs: Vec<_> = (0..2)
        .map(|_| {
            let url = d.url("/v1/completions");
            tokio::spawn(async move { harness::http().post(url).json(&counting(80)).send().await })
        })
        .collect();
    d.wait_status(harness::SETTLE, "both running", |s| {
        s["slots"]["active"] == 2
    })
    .await;
    for r in reqs {
        let v: Value = r
            .await
            .expect("join")
            .expect("send")
            .json()
            .await
            .expect("json");
        assert_eq!(v["usage"]["completion_tokens"], 80, "{v}");
    }
}

#[test]
fn kv_cells_outside_ctx_and_slots_times_ctx_is_a_usage_error() {
    let (status, log) = Daemon::run_to_exit(
        &["--slots", "2", "--ctx", "1024", "--kv-cells", "512"],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("kv_cells"), "{log}");
}

// ---- weights against a manifest ----

pub(crate) fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

#[tokio::test]
async fn unpinned_weights_are_hashed_after_start_and_reported() {
    let d = harness::shared();
    let want = sha256_of(&model_path());
    // The hash runs in the background after the listener is up; 94 MiB takes well under 10 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    let observed = loop {
        let status = d.status().await;
        assert!(status["integrity"]["weights_sha256"].is_null(), "{status}");
        if let Some(sha) = status["integrity"]["weights_sha256_observed"].as_str() {
            break sha.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no observed SHA-256 after 60 s: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(observed, want);
}

/// A copy of the model and a manifest pinning the original.
fn pinned_copy(dir: &Path) -> (PathBuf, PathBuf, String) {
    let model = model_path();
    let copy = dir.join("model.gguf");
    std::fs::copy(&model, &copy).expect("copy model");
    let sha = sha256_of(&model);
    let size = std::fs::metadata(&model).expect("stat").len();
    let manifest = dir.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::to_vec_pretty(&json!({
            "schema": 1,
            "model": {"path": "model.gguf", "sha256": sha, "size": size}
        }))
        .expect("json"),
    )
    .expect("write manifest");
    (copy, manifest, sha)
}

#[test]
fn tampered_weights_exit_3_and_nothing_listens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (copy, manifest, sha) = pinned_copy(dir.path());
    let mut bytes = std::fs::read(&copy).expect("read copy");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&copy, &bytes).expect("write tampered");
    let (status, log) = Daemon::run_to_exit(
        &[
            "--manifest",
            manifest.to_str().expect("utf8"),
            "--model",
            copy.to_str().expect("utf8"),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("wrong SHA-256"), "{log}");
    assert!(log.contains(&format!("expected {sha}")), "{log}");
    assert!(!log.contains("listening on"), "{log}");
}

#[tokio::test]
async fn pinned_weights_serve_and_the_second_boot_hits_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_copy, manifest, sha) = pinned_copy(dir.path());
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("state dir");
    // No --model: the manifest's path (relative to it) is what gets served.
    let args = [
        "--manifest",
        manifest.to_str().expect("utf8"),
        "--state-dir",
        state.to_str().expect("utf8"),
        "--slots",
        "1",
        "--ctx",
        "512",
    ];
    let first = Daemon::start(&args);
    let status = first.status().await;
    assert_eq!(status["integrity"]["weights_sha256"], sha.as_str());
    assert_eq!(status["integrity"]["weights_sha256_observed"], sha.as_str());
    let reply = first.chat(&harness::chat_body("Say hi", 4)).await;
    assert!(reply["usage"]["completion_tokens"].as_u64() > Some(0));
    assert!(
        first.log().contains("weights match the manifest"),
        "{}",
        first.log()
    );
    drop(first);
    let second = Daemon::start(&args);
    assert!(
        second.log().contains("verified-cache hit"),
        "{}",
        second.log()
    );
}

#[test]
fn manifest_with_an_unknown_field_exits_3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("manifest.json");
    std::fs::write(
        &manifest,
        r#"{"schema":1,"model":{"path":"m.gguf","sha256":"00","size":1},"extra":true}"#,
    )
    .expect("write");
    let (status, log) = Daemon::run_to_exit(
        &["--manifest", manifest.to_str().expect("utf8")],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("unknown field `extra`"), "{log}");
}

// ---- real cgroups ----

/// A memory cgroup this test may create, or why not.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn create(name: &str) -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (parent, is_v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), false)
        } else if std::fs::read_to_string(v2)
            .map(|c| c.split_whitespace().any(|x| x == "memory"))
            .unwrap_or(false)
        {
            (PathBuf::from("/sys/fs/cgroup"), true)
        } else {
            return Err("no cgroup memory controller".into());
        };
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self { dir, v2: is_v2 })
    }

    fn limit(&self, bytes: u64) {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.dir.join(file), bytes.to_string()).expect("set limit");
        if self.v2 {
            // Without this the kernel swaps instead of refusing; the box has no swap anyway.
            std::fs::write(self.dir.join("memory.swap.max"), "0").ok();
        }
    }

    /// `oom_kill` from memory.events (v2) or memory.oom_control (v1): the raw kernel counter.
    fn oom_kills(&self) -> (u64, String) {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        (n, text)
    }

    fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Starts `inferloopd serve ARGS` inside the cgroup (it joins between fork and exec).
    fn spawn(&self, args: &[&str]) -> std::process::Child {
        let procs = CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("no NUL in path");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferloopd"));
        cmd.arg("serve")
            .arg("--model")
            .arg(model_path())
            .args(["--host", "127.0.0.1", "--port", "0", "--threads", "2"])
            .args(args)
            .env("RUST_LOG", "info,llama-cpp-2=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: only open(2), write(2) and close(2) run between fork and exec, all
        // async-signal-safe; the path was allocated before the fork. Writing "0" moves the
        // writing process itself into the cgroup.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        cmd.spawn().expect("spawn inferloopd in cgroup")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The cgroup can only go once its processes have; they were waited for by now.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}

fn skip(reason: &str) {
    eprintln!(
        "SKIPPED (cgroup gate): {reason}; needs root and a writable cgroup memory controller"
    );
}

#[test]
fn reverse_gate_refuses_in_a_small_cgroup_without_the_oom_killer() {
    let cg = match Cgroup::create("inferloop-reverse") {
        Ok(cg) => cg,
        Err(reason) => return skip(&reason),
    };
    cg.limit(120 * MIB);
    let mut child = cg.spawn(&["--slots", "1", "--ctx", "1024"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "daemon did not exit in a 120 MiB cgroup"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut log)
        .expect("read log");
    let (kills, raw) = cg.oom_kills();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("memory admission rejected: reason=cgroup-limit")
            && log.contains("limitMB=120.0"),
        "{log}"
    );
    assert_eq!(kills, 0, "the OOM killer acted: {raw}");
    assert!(cg.peak() < 120 * MIB);
}

#[test]
fn forward_gate_serves_in_a_roomy_cgroup_under_its_limit() {
    let cg = match Cgroup::create("inferloop-forward") {
        Ok(cg) => cg,
        Err(reason) => return skip(&reason),
    };
    let limit = 512 * MIB;
    cg.limit(limit);
    let mut child = cg.spawn(&["--slots", "1", "--ctx", "1024"]);
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no listening line; log:\n{log}"));
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().expect("addr").to_string();
        }
    };
    assert!(
        log.contains("memory admission accepted: reason=cgroup-limit"),
        "{log}"
    );
    let base = format!("http://{addr}");
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .get(format!("{base}/readyz"))
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
        != 200
    {
        assert!(Instant::now() < deadline, "not ready; log:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let reply: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&harness::chat_body("What is 2+2?", 16))
        .send()
        .expect("chat")
        .json()
        .expect("json");
    assert!(
        reply["usage"]["completion_tokens"].as_u64() > Some(0),
        "{reply}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    let (kills, raw) = cg.oom_kills();
    assert_eq!(kills, 0, "{raw}");
    let peak = cg.peak();
    assert!(peak > 0 && peak < limit, "peak {peak} vs limit {limit}");
}
