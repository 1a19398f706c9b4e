//! The suite over HTTPS: a daemon serving `--tls-cert`/`--tls-key` (a throwaway CA made with
//! `openssl`) qualified with `--base-url https://… --ca-file`, the same cases passing as over
//! plain HTTP; without the CA the suite cannot start.

use std::path::Path;
use std::time::{Duration, Instant};

use inferloop_qual::case::Status;
use inferloop_qual::http::{probe_status, Endpoint};
use inferloop_qual::{Options, TargetSpec, SHARED_ARGS};

use crate::broken::spawn_cfg;

fn openssl(dir: &Path, args: &str) {
    let out = std::process::Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The API and streaming cases (80): what a client sees of the protocol.
const FILTER: &str = "api,stream";

#[test]
fn the_suite_runs_over_https_with_the_ca_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    openssl(
        d,
        &format!(
            "req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=qual-CA \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign"
        ),
    );
    std::fs::write(
        d.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
    )
    .expect("ext");
    openssl(
        d,
        &format!("req {ec} -keyout server.key -out server.csr -subj /CN=box"),
    );
    openssl(
        d,
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
         -extfile server.ext -out server.pem",
    );
    let cert = d.join("server.pem");
    let key = d.join("server.key");
    let mut extra: Vec<&str> = SHARED_ARGS.to_vec();
    extra.extend([
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
    ]);
    let cfg = spawn_cfg();
    let daemon = cfg
        .spawn(cfg.serve_argv(&extra), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let plain = daemon
        .wait_address(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("https://{plain}");
    let ca = d.join("ca.pem");
    let ep = Endpoint::parse_with_ca(&url, Some(&ca)).expect("https endpoint");
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe_status(&ep, "/readyz", Duration::from_secs(5)) != Some(200) {
        assert!(Instant::now() < deadline, "not ready:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    let run = |ca_file: Option<&Path>| {
        inferloop_qual::run(Options {
            target: TargetSpec::Attach {
                base_url: url.clone(),
                api_key: None,
                ca_file: ca_file.map(Path::to_path_buf),
            },
            filter: vec![FILTER.to_string()],
            jobs: 4,
            timeout: None,
            request_timeout: None,
            report_dir: None,
            progress: false,
        })
    };
    let e = run(None).expect_err("https without a CA cannot run");
    assert!(e.contains("--ca-file"), "{e}");

    let report = run(Some(&ca)).unwrap_or_else(|e| panic!("the suite did not run: {e}"));
    let failed: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.status == Status::Failed)
        .map(|c| format!("{}: {}", c.id, c.observation))
        .collect();
    let passed = report
        .cases
        .iter()
        .filter(|c| c.status == Status::Passed)
        .count();
    assert!(failed.is_empty(), "failed over HTTPS: {failed:#?}");
    assert!(passed >= 40, "only {passed} cases passed over HTTPS");
}
