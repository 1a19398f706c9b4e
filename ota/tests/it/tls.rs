//! TLS: the fake DDI server on HTTPS with a throwaway CA (made with `openssl`). With that CA
//! as `ca_file` the agent polls and downloads; without it, or with another CA, the
//! certificate is refused with a clear error and the agent backs off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inferloop_ota::client::DdiClient;
use inferloop_ota::config::{ConfigFile, Overrides, Settings};
use inferloop_ota::ddi::Hashes;
use inferloop_ota::download::{self, Request};
use inferloop_ota::OtaError;

use crate::agent::{agent_on, bundle};
use crate::fake::{Fake, Logs, Script, TlsFiles};

fn settings(url: &str, ca_file: Option<PathBuf>) -> Settings {
    let file = ConfigFile {
        server: Some(url.into()),
        controller_id: Some("box".into()),
        ca_file,
        ..ConfigFile::default()
    };
    Settings::from_file(file, &Overrides::default(), Path::new("test.toml")).expect("settings")
}

#[tokio::test]
async fn with_the_ca_file_the_agent_polls_and_downloads_over_https() {
    let Some(pki) = TlsFiles::generate() else {
        return;
    };
    let fake = Fake::start_tls(Script::default(), &pki).await;
    assert!(fake.url.starts_with("https://127.0.0.1:"), "{}", fake.url);
    let ca = pki.ca.clone();
    let mut t = agent_on(fake, None, false, |f| f.ca_file = Some(ca)).expect("agent");
    t.agent.step().await;
    // The fake speaks only TLS, so the artifact (an https:// link on it) came over TLS
    // verified against the same CA.
    let log = t.fake.log();
    assert!(
        log.iter().any(|r| r.path == "/artifact"),
        "no download: {log:#?}"
    );
    let installs = t.rauc.with(|r| r.installs.clone());
    assert_eq!(installs.len(), 1, "{log:#?}");
    assert!(t.state().pending.is_some());
}

#[tokio::test]
async fn without_the_ca_or_with_another_ca_the_certificate_is_refused_and_backed_off() {
    let Some(pki) = TlsFiles::generate() else {
        return;
    };
    let fake = Fake::start_tls(Script::default(), &pki).await;
    for ca in [None, Some(pki.other_ca.clone())] {
        let what = format!("ca_file {ca:?}");
        // The poll, as the client sees it.
        let client = DdiClient::new(&settings(&fake.url, ca.clone())).expect("client");
        match client.poll().await {
            Err(OtaError::Tls { url, message }) => {
                assert!(url.starts_with("https://127.0.0.1:"), "{url}");
                assert!(
                    message.contains("certificate") && message.contains("UnknownIssuer"),
                    "{what}: {message}"
                );
            }
            other => panic!("{what}: expected a TLS error, got {other:?}"),
        }
        // The artifact link, on the same server: a TLS error too, not an interruption
        // to resume.
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("{}/artifact", fake.url);
        let hashes = Hashes::default();
        let req = Request {
            url: &url,
            size: Some(bundle().len() as u64),
            hashes: &hashes,
            dest: dir.path().join("b.raucb"),
        };
        let err = download::fetch(client.http(), &req, |_, _| {})
            .await
            .expect_err("untrusted download");
        assert_eq!(err.kind(), "tls", "{what}: {err:?}");
        assert!(!download::partial_path(&req.dest).exists());

        // The agent: logged as an error naming the certificate, then backoff.
        let (logs, guard) = Logs::capture();
        let mut t = agent_on(fake.clone(), None, false, |f| f.ca_file = ca.clone()).expect("agent");
        let first = t.agent.step().await;
        let second = t.agent.step().await;
        drop(guard);
        assert!(
            first <= Duration::from_secs(1) && first >= Duration::from_millis(750),
            "{what}: {first:?}"
        );
        assert!(
            second <= Duration::from_secs(2) && second >= Duration::from_millis(1500),
            "{what}: {second:?}"
        );
        let text = logs.text();
        assert!(
            text.contains("ERROR")
                && text.contains("kind=\"tls\"")
                && text.contains("invalid peer certificate")
                && text.contains("is `ca_file` the CA that signed the server's certificate?"),
            "{what}: {text}"
        );
        assert!(t.rauc.with(|r| r.installs.is_empty()));
    }
    // No handshake succeeded, so no request ever reached the handler.
    assert!(fake.log().is_empty(), "{:#?}", fake.log());
}

#[tokio::test]
async fn a_ca_file_that_is_missing_or_holds_no_certificate_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_pem = dir.path().join("ca.txt");
    std::fs::write(&not_pem, "not a certificate\n").expect("write");
    for (path, why) in [
        (dir.path().join("missing.pem"), "`ca_file` cannot be read"),
        (not_pem, "`ca_file` holds no PEM certificate"),
    ] {
        match DdiClient::new(&settings("https://127.0.0.1:1", Some(path.clone()))) {
            Err(OtaError::Config { path: p, message }) => {
                assert_eq!(p, path);
                assert!(message.contains(why), "{message}");
            }
            other => panic!("{path:?}: expected a config error, got {other:?}"),
        }
    }
}
