//! The suite must catch a broken daemon and only blame the right cases: through a proxy that
//! drops `data: [DONE]`, exactly the [DONE] cases of the stream checks fail; straight to the
//! same daemon, they pass.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::LazyLock;

use inferloop_qual::case::Status;
use inferloop_qual::daemon::{Daemon, SpawnCfg};
use inferloop_qual::{Options, TargetSpec, SHARED_ARGS};

use crate::proxy::Proxy;

pub(crate) fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The daemon binary and the model, or how to get them.
pub(crate) fn spawn_cfg() -> SpawnCfg {
    let bin = std::env::var_os("INFERLOOPD")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/inferloopd"));
    let model = std::env::var_os("INFERLOOP_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        bin.is_file(),
        "inferloopd not found at {}: build it (`cargo build --release -p inferloopd`) or set INFERLOOPD",
        bin.display()
    );
    assert!(
        model.is_file(),
        "test model not found at {}: run `make model` or set INFERLOOP_TEST_MODEL",
        model.display()
    );
    SpawnCfg {
        bin,
        model,
        threads: 2,
        serve_args: Vec::new(),
    }
}

/// One daemon for both tests, configured like the suite's own shared daemon.
static DAEMON: LazyLock<Daemon> = LazyLock::new(|| {
    spawn_cfg()
        .start(&SHARED_ARGS)
        .unwrap_or_else(|e| panic!("inferloopd did not start: {e}"))
});

/// The stream checks: the `stream` group and the legacy endpoint's stream framing.
const FILTER: &str = "stream,completions.stream.framing";

fn run_through(base_url: String) -> inferloop_qual::report::Report {
    inferloop_qual::run(Options {
        target: TargetSpec::Attach {
            base_url,
            api_key: None,
            ca_file: None,
        },
        filter: vec![FILTER.to_string()],
        jobs: 4,
        timeout: None,
        request_timeout: None,
        report_dir: None,
        progress: false,
    })
    .unwrap_or_else(|e| panic!("the suite did not run: {e}"))
}

fn ids(r: &inferloop_qual::report::Report, status: Status) -> BTreeSet<String> {
    r.cases
        .iter()
        .filter(|c| c.status == status)
        .map(|c| c.id.clone())
        .collect()
}

#[test]
fn a_daemon_that_drops_done_fails_exactly_the_done_cases() {
    let upstream = DAEMON.endpoint().expect("daemon address");
    let proxy = Proxy::drop_done(upstream);
    let report = run_through(proxy.url());
    let failed = ids(&report, Status::Failed);
    let want: BTreeSet<String> = [
        "stream.done_last",
        "stream.done_once",
        "completions.stream.framing",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(failed, want, "{}", report.summary_text());
    for c in report.cases.iter().filter(|c| c.status == Status::Failed) {
        eprintln!(
            "through the proxy: FAIL {}\n  expected: {}\n  observed: {}",
            c.id,
            c.expected.as_deref().unwrap_or_default(),
            c.observation
        );
        assert!(
            c.expected.as_deref().is_some_and(|e| e.contains("[DONE]")),
            "{c:?}"
        );
        assert!(
            !c.observation.is_empty(),
            "a failure says what it saw: {c:?}"
        );
    }
    // Attached through a proxy, the one case that needs its own daemon says why it skipped.
    let skipped = ids(&report, Status::Skipped);
    assert_eq!(
        skipped,
        BTreeSet::from(["stream.errors.queue_full_is_json".to_string()])
    );
    assert_eq!(report.totals.total, 41);
}

#[test]
fn the_same_daemon_without_the_proxy_passes_them() {
    let upstream = DAEMON.endpoint().expect("daemon address");
    let report = run_through(format!("http://{upstream}"));
    assert_eq!(
        ids(&report, Status::Failed),
        BTreeSet::new(),
        "{}",
        report.summary_text()
    );
    assert_eq!(report.totals.passed, 40);
}
