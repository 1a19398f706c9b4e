//! Device authentication: the token on every request, a bad token file stops the agent at
//! start, and a server refusing the token is logged and backed off.

use std::path::Path;
use std::time::Duration;

use inferloop_ota::config::ConfigFile;
use inferloop_ota::OtaError;
use serde_json::json;

use crate::agent::{agent_on, base_with, executions, Setup};
use crate::fake::{Fake, Logs, Script};

/// A fake that accepts only `header`, offering deployment 5 after a configData round.
async fn guarded(header: &str, adjust: impl FnOnce(&mut ConfigFile)) -> Setup {
    let fake = Fake::start(Script {
        require_auth: Some(header.into()),
        ..Script::default()
    })
    .await;
    agent_on(fake, None, false, adjust).expect("agent")
}

/// configData, then the whole deployment: every kind of DDI request the agent makes.
async fn configure_and_deploy(t: &mut Setup) {
    let url = t.fake.url.clone();
    t.fake.with(|s| {
        s.base = Some(json!({"_links": {"configData":
            {"href": format!("{url}/DEFAULT/controller/v1/box/configData")}}}))
    });
    assert_eq!(t.agent.step().await, Duration::ZERO, "configData sent");
    t.fake
        .with(|s| s.base = Some(base_with(&url, "deploymentBase", "5")));
    t.agent.step().await;
    assert_eq!(t.rauc.with(|r| r.installs.len()), 1, "{:#?}", t.fake.log());
}

fn assert_every_request_carries(t: &Setup, header: &str) {
    let log = t.fake.log();
    for want in [
        ("GET", "/DEFAULT/controller/v1/box"),
        ("PUT", "/configData"),
        ("GET", "/deploymentBase/5"),
        ("GET", "/artifact"),
        ("POST", "/deploymentBase/5/feedback"),
    ] {
        assert!(
            log.iter()
                .any(|r| r.method == want.0 && r.path.ends_with(want.1)),
            "no {want:?} in {log:#?}"
        );
    }
    for r in &log {
        assert_eq!(
            r.authorization.as_deref(),
            Some(header),
            "{} {}",
            r.method,
            r.path
        );
    }
}

fn token_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write token");
    p
}

#[tokio::test]
async fn a_target_token_goes_on_poll_config_data_feedback_and_download() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Written the way `echo token > file` writes it.
    let file = token_file(dir.path(), "token", "s3cret-target-token\n");
    let mut t = guarded("TargetToken s3cret-target-token", |f| {
        f.target_token_file = Some(file)
    })
    .await;
    configure_and_deploy(&mut t).await;
    assert_every_request_carries(&t, "TargetToken s3cret-target-token");
}

#[tokio::test]
async fn a_gateway_token_is_sent_as_gateway_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = token_file(dir.path(), "gw", "  gw-0123456789abcdef \r\n");
    let mut t = guarded("GatewayToken gw-0123456789abcdef", |f| {
        f.gateway_token_file = Some(file)
    })
    .await;
    configure_and_deploy(&mut t).await;
    assert_every_request_carries(&t, "GatewayToken gw-0123456789abcdef");
}

#[tokio::test]
async fn a_missing_empty_or_unreadable_token_file_is_a_config_error_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (dir.path().join("missing"), "cannot be read"),
        (token_file(dir.path(), "empty", "\n"), "is empty"),
        // A directory cannot be read as a file, even by root.
        (dir.path().to_path_buf(), "cannot be read"),
        (
            token_file(dir.path(), "two", "one\ntwo\n"),
            "without spaces",
        ),
        (
            token_file(dir.path(), "binary", "\u{0}\u{1}"),
            "without spaces",
        ),
    ];
    for gateway in [false, true] {
        for (path, why) in &cases {
            let fake = Fake::start(Script::default()).await;
            let err = match agent_on(fake.clone(), None, false, |f| {
                if gateway {
                    f.gateway_token_file = Some(path.clone());
                } else {
                    f.target_token_file = Some(path.clone());
                }
            }) {
                Ok(_) => panic!("{path:?} accepted"),
                Err(e) => e,
            };
            let setting = if gateway {
                "`gateway_token_file`"
            } else {
                "`target_token_file`"
            };
            match &err {
                OtaError::Config { path: p, message } => {
                    assert_eq!(p, path);
                    assert!(
                        message.contains(setting) && message.contains(why),
                        "{message}"
                    );
                }
                other => panic!("expected a config error for {path:?}, got {other:?}"),
            }
            assert!(fake.log().is_empty(), "polled without its token");
        }
    }
}

#[tokio::test]
async fn the_binary_exits_on_a_missing_token_file_without_polling() {
    let fake = Fake::start(Script::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("ota.toml");
    std::fs::write(
        &conf,
        format!(
            "server = {:?}\ncontroller_id = \"box\"\ntarget_token_file = {:?}\n\
             download_dir = {:?}\nstate_file = {:?}\n",
            fake.url,
            dir.path().join("no-token"),
            dir.path().join("ota"),
            dir.path().join("ota/state.json"),
        ),
    )
    .expect("write config");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_inferloop-ota"))
        .args(["agent", "--once", "--config"])
        .arg(&conf)
        .output()
        .await
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("`target_token_file` cannot be read") && stderr.contains("no-token"),
        "{stderr}"
    );
    assert!(fake.log().is_empty(), "{:#?}", fake.log());
}

#[tokio::test]
async fn a_401_is_logged_as_refused_credentials_and_backed_off_until_the_server_agrees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = token_file(dir.path(), "token", "wrong-token\n");
    let mut t = guarded("TargetToken right-token", |f| {
        f.target_token_file = Some(file)
    })
    .await;
    let (logs, _guard) = Logs::capture();
    let first = t.agent.step().await;
    let second = t.agent.step().await;
    // retry_min_s 1 doubling, minus up to a quarter of jitter.
    assert!(
        first <= Duration::from_secs(1) && first >= Duration::from_millis(750),
        "{first:?}"
    );
    assert!(
        second <= Duration::from_secs(2) && second >= Duration::from_millis(1500),
        "{second:?}"
    );
    let text = logs.text();
    assert!(
        text.contains("ERROR")
            && text.contains("kind=\"unauthorized\"")
            && text.contains("server refused the box's credentials: 401 to GET")
            && text.contains("Device authentication token does not match")
            && text.contains("cycle failed; retrying"),
        "{text}"
    );
    assert!(t.rauc.with(|r| r.installs.is_empty()));
    assert!(t.fake.feedback().is_empty());

    // The operator gives the server the box's token: the next cycle goes through.
    t.fake
        .with(|s| s.require_auth = Some("TargetToken wrong-token".into()));
    t.agent.step().await;
    assert_eq!(t.rauc.with(|r| r.installs.len()), 1);
    assert!(logs.text().contains("server reachable again"));
    assert!(executions(&t.fake.feedback()).contains(&"proceeding/none".to_string()));
}
