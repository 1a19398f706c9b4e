//! Thermal-aware serving, driven through the real sysfs reader: each daemon reads a copy of
//! the Orin NX (JetPack 6) fixture tree whose `gpu-thermal` temperature the test rewrites.
//! Plus the `board` and `thermal` subcommands on the fixture trees.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{
    assert_error, chat_body, counting_body, header, http, metric, read_sse, stream_finish_reason,
    stream_text, usage_adds_up, Daemon, SETTLE,
};

const THERMAL_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../thermal/tests/fixtures");
const BOARD_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../board/tests/fixtures");
/// The fixture's `gpu-thermal` zone.
const GPU_ZONE: &str = "sys/devices/virtual/thermal/thermal_zone1";
/// Thresholds the daemons run with: hot at 70 °C, critical at 90 °C, 5 °C hysteresis.
const HOT: &str = "70";
const CRITICAL: &str = "90";

/// A private copy of the Orin NX fixture tree, removed on drop.
struct Board {
    dir: tempfile::TempDir,
}

impl Board {
    fn orin() -> Board {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_tree(&Path::new(THERMAL_FIXTURES).join("orin-nx-jp6"), dir.path());
        let board = Board { dir };
        let zone_type = std::fs::read_to_string(board.dir.path().join(GPU_ZONE).join("type"))
            .expect("zone type");
        assert_eq!(zone_type.trim(), "gpu-thermal", "fixture layout changed");
        board
    }

    fn sys(&self) -> String {
        self.dir.path().join("sys").to_string_lossy().into_owned()
    }

    /// Rewrites the GPU zone's temperature. Written beside and renamed over, so the sampler
    /// never reads a truncated file (which would drop the zone for one reading).
    fn set_gpu_celsius(&self, celsius: f64) {
        let zone = self.dir.path().join(GPU_ZONE);
        let tmp = zone.join("temp.new");
        std::fs::write(&tmp, format!("{}\n", (celsius * 1000.0).round() as i64))
            .expect("write temp");
        std::fs::rename(&tmp, zone.join("temp")).expect("rename temp");
    }

    /// A two-slot daemon reading this tree every 100 ms.
    fn serve(&self) -> Daemon {
        let sys = self.sys();
        Daemon::start(&[
            "--slots",
            "2",
            "--ctx",
            "1024",
            "--board",
            "jetson-orin-nx-16gb",
            "--sysfs-root",
            &sys,
            "--thermal-interval-ms",
            "100",
            "--hot-celsius",
            HOT,
            "--critical-celsius",
            CRITICAL,
        ])
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy fixture file");
        }
    }
}

/// The temperature of `zone` in a snapshot, if present.
fn zone_celsius(snapshot: &Value, zone: &str) -> Option<f64> {
    snapshot["zones"]
        .as_array()?
        .iter()
        .find(|z| z["name"] == zone)?["celsius"]
        .as_f64()
}

/// Waits until the daemon has read `celsius` on the GPU zone and applied the admission cap
/// that goes with the resulting state, which must be `state`. Returns that `/v1/status`.
async fn wait_reading(d: &Daemon, celsius: f64, state: &str, max_active: u64) -> Value {
    let status = d
        .wait_status(SETTLE, &format!("GPU zone read at {celsius} °C"), |s| {
            zone_celsius(&s["thermal"]["snapshot"], "gpu-thermal") == Some(celsius)
                && s["slots"]["max_active"] == max_active
        })
        .await;
    assert_eq!(
        status["thermal"]["snapshot"]["thermal_state"], state,
        "at {celsius} °C: {}",
        status["thermal"]
    );
    status
}

/// Starts a streaming request that holds a slot until dropped; returns once it has one.
async fn occupy_slot(d: &Daemon) -> reqwest::Response {
    let resp = d.post("/v1/completions", &counting_body(900, true)).await;
    assert_eq!(resp.status(), 200, "{}", d.log_tail());
    resp
}

#[tokio::test]
async fn hot_board_admits_one_of_two_slots_until_it_cools_past_the_hysteresis() {
    let board = Board::orin();
    let d = board.serve();
    wait_reading(&d, 45.8, "normal", 2).await;
    let served = d.complete(&counting_body(4, false)).await;
    usage_adds_up(&served, 4);

    board.set_gpu_celsius(75.0);
    let status = wait_reading(&d, 75.0, "hot", 1).await;
    assert_eq!(status["thermal"]["state"], "hot", "{}", status["thermal"]);

    let first = occupy_slot(&d).await;
    let second = tokio::spawn({
        let url = d.url("/v1/completions");
        async move {
            http()
                .post(url)
                .json(&counting_body(900, true))
                .send()
                .await
        }
    });
    d.wait_status(SETTLE, "second request queued behind the hot cap", |s| {
        s["slots"]["active"] == 1 && s["queue"]["depth"] == 1
    })
    .await;

    // 67 °C is below the hot threshold but not below it minus the hysteresis (65 °C).
    board.set_gpu_celsius(67.0);
    let status = wait_reading(&d, 67.0, "hot", 1).await;
    assert_eq!(
        (&status["slots"]["active"], &status["queue"]["depth"]),
        (&Value::from(1), &Value::from(1)),
        "still one slot while within the hysteresis: {status}"
    );

    board.set_gpu_celsius(60.0);
    wait_reading(&d, 60.0, "normal", 2).await;
    d.wait_status(SETTLE, "the waiter takes the second slot", |s| {
        s["slots"]["active"] == 2 && s["queue"]["depth"] == 0
    })
    .await;
    let second = second.await.expect("task").expect("second request");
    assert_eq!(second.status(), 200);
    drop((first, second));
}

#[tokio::test]
async fn critical_board_refuses_new_requests_with_503_while_running_ones_finish() {
    let board = Board::orin();
    let d = board.serve();
    wait_reading(&d, 45.8, "normal", 2).await;
    // Long enough to still be decoding when the board turns critical (a few samples later),
    // short enough to read to the end afterwards.
    let running = d.post("/v1/completions", &counting_body(120, true)).await;
    assert_eq!(running.status(), 200, "{}", d.log_tail());

    board.set_gpu_celsius(95.0);
    let status = wait_reading(&d, 95.0, "critical", 1).await;
    assert_eq!(
        status["slots"]["active"], 1,
        "the request admitted before the board turned critical is still decoding: {status}"
    );
    let refused = d.post("/v1/completions", &counting_body(4, false)).await;
    assert_eq!(
        header(&refused, "retry-after"),
        "10",
        "{:?}",
        refused.headers()
    );
    let err = assert_error(refused, 503, None, Some("overheated")).await;
    assert_eq!(err["type"], "server_error");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("95.0 °C") && message.contains("90.0 °C"),
        "{message}"
    );
    let refused_chat = d.post("/v1/chat/completions", &chat_body("hi", 4)).await;
    assert_error(refused_chat, 503, None, Some("overheated")).await;
    // Readiness says the same, so a router or load balancer sends the work elsewhere.
    for path in ["/readyz", "/health"] {
        let r = d.get(path).await;
        assert_eq!(r.status(), 503, "{path}");
        assert_eq!(header(&r, "retry-after"), "10", "{path}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["status"], "overheated", "{path}: {v}");
        assert_eq!(v["critical_celsius"], 90.0, "{path}: {v}");
    }
    // A stream is refused before its headers, so it too gets a plain 503.
    let refused_stream = d.post("/v1/completions", &counting_body(4, true)).await;
    assert_error(refused_stream, 503, None, Some("overheated")).await;

    let chunks = read_sse(running).await;
    assert_eq!(stream_finish_reason(&chunks), "length");
    assert!(
        !stream_text(&chunks).is_empty(),
        "the running request kept streaming"
    );

    // 87 °C: below critical, not below critical minus the hysteresis (85 °C).
    board.set_gpu_celsius(87.0);
    wait_reading(&d, 87.0, "critical", 1).await;
    let still = d.post("/v1/completions", &counting_body(4, false)).await;
    assert_error(still, 503, None, Some("overheated")).await;

    board.set_gpu_celsius(80.0);
    wait_reading(&d, 80.0, "hot", 1).await;
    assert_eq!(
        d.get("/health").await.status(),
        200,
        "ready again once not critical"
    );
    let served = d.complete(&counting_body(4, false)).await;
    usage_adds_up(&served, 4);

    let metrics = d.metrics().await;
    assert!(
        metric(
            &metrics,
            "inferloop_requests_total{route=\"/v1/completions\",code=\"503\"}"
        ) >= 3.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn metrics_status_and_history_report_the_fixture() {
    let board = Board::orin();
    let d = board.serve();
    wait_reading(&d, 45.8, "normal", 2).await;

    let text = d.metrics().await;
    for family in [
        "inferloop_temperature_celsius",
        "inferloop_clock_hz",
        "inferloop_power_watts",
        "inferloop_throttled",
        "inferloop_thermal_state",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} "))
                && text.contains(&format!("# TYPE {family} gauge\n")),
            "{family} lacks HELP/TYPE:\n{text}"
        );
    }
    let series = |s: &str| metric(&text, s);
    assert_eq!(
        series("inferloop_temperature_celsius{zone=\"gpu-thermal\"}"),
        45.8
    );
    assert_eq!(
        series("inferloop_temperature_celsius{zone=\"tj-thermal\"}"),
        47.6
    );
    assert_eq!(series("inferloop_clock_hz{domain=\"gpu\"}"), 306e6);
    assert_eq!(series("inferloop_clock_hz{domain=\"cpu0\"}"), 729.6e6);
    // 1024 mA at 5080 mV.
    let vdd_in = series("inferloop_power_watts{rail=\"VDD_IN\"}");
    assert!((vdd_in - 5.20192).abs() < 1e-9, "{vdd_in}");
    assert_eq!(series("inferloop_throttled{cause=\"thermal\"}"), 0.0);
    assert_eq!(series("inferloop_throttled{cause=\"power\"}"), 0.0);
    assert_eq!(series("inferloop_thermal_state"), 0.0);
    assert!(
        !text.contains("cv0-thermal"),
        "offline zones must not be exported:\n{text}"
    );

    let status = d.status().await;
    assert_eq!(status["board"]["name"], "jetson-orin-nx-16gb", "{status}");
    assert_eq!(status["board"]["rule"], "override", "{status}");
    assert!(
        status["board"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("--board jetson-orin-nx-16gb")),
        "{status}"
    );
    let thermal = &status["thermal"];
    assert_eq!(thermal["state"], "normal", "{thermal}");
    assert_eq!(thermal["hot_celsius"], 70.0, "{thermal}");
    assert_eq!(thermal["critical_celsius"], 90.0, "{thermal}");
    assert_eq!(thermal["snapshot"]["source"], "jetson-sysfs", "{thermal}");
    assert_eq!(zone_celsius(&thermal["snapshot"], "cv0-thermal"), None);

    let history = d.get_ok("/v1/thermal").await;
    assert_eq!(history["interval_ms"], 100, "{history}");
    let readings = history["history"].as_array().expect("history array");
    assert!(!readings.is_empty(), "{history}");
    let stamps: Vec<u64> = readings
        .iter()
        .map(|r| r["timestamp_ms"].as_u64().expect("timestamp"))
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {stamps:?}"
    );
    assert_eq!(
        zone_celsius(readings.last().expect("one reading"), "gpu-thermal"),
        Some(45.8)
    );

    board.set_gpu_celsius(75.0);
    d.wait_metrics(SETTLE, "hot state exported", |m| {
        m.contains("inferloop_thermal_state 1\n")
            // prometheus-client writes a whole float with its `.0`.
            && m.contains("inferloop_temperature_celsius{zone=\"gpu-thermal\"} 75.0\n")
    })
    .await;
}

#[tokio::test]
async fn thermal_history_needs_the_api_key() {
    let board = Board::orin();
    let sys = board.sys();
    let d = Daemon::start(&[
        "--slots",
        "1",
        "--ctx",
        "256",
        "--api-key",
        "sekrit",
        "--board",
        "jetson-orin-nx-16gb",
        "--sysfs-root",
        &sys,
    ]);
    let resp = d.get("/v1/thermal").await;
    assert_error(resp, 401, None, Some("invalid_api_key")).await;
    let resp = http()
        .get(d.url("/v1/thermal"))
        .bearer_auth("sekrit")
        .send()
        .await
        .expect("GET /v1/thermal");
    assert_eq!(resp.status(), 200);
}

#[test]
fn serve_with_an_unknown_board_exits_2_naming_the_known_ones() {
    let (status, log) = Daemon::run_to_exit(&["--board", "nope"], Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("unknown board `nope`"), "{log}");
    assert!(log.contains("jetson-orin-nx-16gb"), "{log}");
    assert!(
        !log.contains("listening on"),
        "must fail before binding:\n{log}"
    );
}

/// Runs `inferloopd ARGS` to completion with a clean environment.
fn inferloopd(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferloopd"));
    cmd.args(args).env("RUST_LOG", "warn");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("INFERLOOP_") {
            cmd.env_remove(key);
        }
    }
    cmd.output().expect("run inferloopd")
}

fn fixture(base: &str, name: &str, sub: &str) -> String {
    PathBuf::from(base)
        .join(name)
        .join(sub)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn board_subcommand_names_the_profile_and_the_matching_file() {
    let proc_root = fixture(BOARD_FIXTURES, "orin-nx-16gb", "proc");
    let sys_root = fixture(BOARD_FIXTURES, "orin-nx-16gb", "sys");
    let out = inferloopd(&[
        "board",
        "--proc-root",
        &proc_root,
        "--sysfs-root",
        &sys_root,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("board:       jetson-orin-nx-16gb"),
        "{stdout}"
    );
    let why = stdout
        .lines()
        .find(|l| l.starts_with("why:"))
        .unwrap_or_else(|| panic!("no why line: {stdout}"));
    assert!(
        why.contains(&format!("{proc_root}/device-tree/compatible"))
            && why.contains("nvidia,p3767-0000"),
        "{why}"
    );
}

#[test]
fn board_subcommand_with_an_unknown_board_exits_2() {
    let out = inferloopd(&["board", "--board", "nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains("unknown board `nope`") && stderr.contains("x86_64-cpu"),
        "{stderr}"
    );
}

#[test]
fn thermal_subcommand_prints_the_zones_without_offline_ones() {
    let sys = fixture(THERMAL_FIXTURES, "orin-nx-jp6", "sys");
    let out = inferloopd(&[
        "thermal",
        "--sysfs-root",
        &sys,
        "--board",
        "jetson-orin-nx-16gb",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("source: jetson-sysfs"), "{stdout}");
    assert!(stdout.contains("state: normal"), "{stdout}");
    let gpu = stdout
        .lines()
        .find(|l| l.starts_with("gpu-thermal "))
        .unwrap_or_else(|| panic!("no gpu-thermal row: {stdout}"));
    assert!(
        gpu.contains("45.8") && gpu.contains("99.0") && gpu.contains("104.5"),
        "{gpu}"
    );
    assert!(stdout.contains("tj-thermal "), "{stdout}");
    assert!(stdout.contains("VDD_IN"), "{stdout}");
    assert!(
        !stdout.contains("cv0-thermal"),
        "offline zone shown: {stdout}"
    );
    assert!(stdout.contains("throttling: none"), "{stdout}");
}

#[test]
fn thermal_subcommand_shows_throttling_and_hot_state_on_a_hot_board() {
    let sys = fixture(THERMAL_FIXTURES, "orin-nx-jp5", "sys");
    let out = inferloopd(&["thermal", "--sysfs-root", &sys]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("state: hot"), "{stdout}");
    assert!(stdout.contains("throttling: thermal"), "{stdout}");
}
