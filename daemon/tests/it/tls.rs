//! HTTPS: the daemon with `--tls-cert`/`--tls-key` from a throwaway CA (made with `openssl`),
//! reached by a client that trusts that CA; the pair reloaded on SIGHUP while a connection
//! made before it keeps working; bad settings refused at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::harness::{chat_body, Daemon};

/// A CA and two server certificates it signed (for 127.0.0.1), in a temporary directory.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn make() -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let openssl = |args: &str| {
            let out = std::process::Command::new("openssl")
                .args(args.split_whitespace())
                .current_dir(d)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        openssl(&format!(
            "req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=InferLoop-test-CA \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign"
        ));
        std::fs::write(
            d.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write ext");
        for name in ["one", "two"] {
            openssl(&format!(
                "req {ec} -keyout {name}.key -out {name}.csr -subj /CN={name}"
            ));
            openssl(&format!(
                "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
                 -extfile server.ext -out {name}.pem"
            ));
        }
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn der(pem: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(pem).expect("a PEM certificate")
}

/// The daemon on HTTPS with `cert`/`key`, once `/readyz` answers through the CA.
async fn start(certs: &Certs, extra: &[&str]) -> (Daemon, reqwest::Client) {
    let cert = certs.path("served.pem");
    let key = certs.path("served.key");
    let mut args = vec![
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
        "--slots",
        "1",
        "--ctx",
        "512",
    ];
    args.extend_from_slice(extra);
    let d = Daemon::start_listening_with_env(&args, &[]);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.path("ca.pem")).expect("ca"))
        .expect("CA");
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let url = format!("https://{}/readyz", d.addr());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client.get(&url).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not ready:\n{}", d.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (d, client)
}

/// A TLS connection of its own to the daemon, and the leaf certificate it was shown.
async fn handshake(
    d: &Daemon,
    ca: &Path,
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    CertificateDer<'static>,
) {
    let mut roots = RootCertStore::empty();
    roots.add(der(ca)).expect("CA");
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(d.addr())
        .await
        .expect("connect");
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let leaf = tls.get_ref().1.peer_certificates().expect("certs")[0].clone();
    (tls, leaf)
}

/// GET /healthz on a kept-alive connection; the status line.
async fn healthz(s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.expect("answer");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn https_serves_through_the_ca_and_a_sighup_reloads_the_pair_without_dropping_connections() {
    let certs = Certs::make();
    std::fs::copy(certs.path("one.pem"), certs.path("served.pem")).expect("cert");
    std::fs::copy(certs.path("one.key"), certs.path("served.key")).expect("key");
    let (d, client) = start(&certs, &[]).await;
    assert!(
        d.log().contains("listening on https://"),
        "{}",
        d.log_tail()
    );

    let v: serde_json::Value = client
        .post(format!("https://{}/v1/chat/completions", d.addr()))
        .json(&chat_body("Hi", 2))
        .send()
        .await
        .expect("chat over HTTPS")
        .json()
        .await
        .expect("json");
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");

    // Plain HTTP to the HTTPS port is no request.
    assert_eq!(crate::harness::raw_get_status(d.addr(), "/healthz"), None);

    let (mut before, leaf) = handshake(&d, &certs.path("ca.pem")).await;
    assert_eq!(leaf, der(&certs.path("one.pem")));
    assert_eq!(healthz(&mut before).await, "HTTP/1.1 200 OK");

    // A renewal writes the new pair; SIGHUP reloads it.
    std::fs::copy(certs.path("two.pem"), certs.path("served.pem")).expect("cert");
    std::fs::copy(certs.path("two.key"), certs.path("served.key")).expect("key");
    d.signal(libc::SIGHUP).expect("SIGHUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("TLS certificate and key reloaded") {
        assert!(Instant::now() < deadline, "{}", d.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, leaf) = handshake(&d, &certs.path("ca.pem")).await;
    assert_eq!(
        leaf,
        der(&certs.path("two.pem")),
        "new handshakes get the new pair"
    );
    assert_eq!(
        healthz(&mut before).await,
        "HTTP/1.1 200 OK",
        "the connection made before the reload goes on"
    );

    // A reload that fails (a key that is not the certificate's) keeps the pair in use.
    std::fs::copy(certs.path("one.key"), certs.path("served.key")).expect("key");
    d.signal(libc::SIGHUP).expect("SIGHUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("serving the previous pair") {
        assert!(Instant::now() < deadline, "{}", d.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, leaf) = handshake(&d, &certs.path("ca.pem")).await;
    assert_eq!(leaf, der(&certs.path("two.pem")));

    let m = client
        .get(format!("https://{}/metrics", d.addr()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        m.contains("inferloop_connections_closed_total{reason=\"tls_handshake\"} 1"),
        "the plain HTTP attempt counted:\n{m}"
    );
}

#[test]
fn tls_settings_that_cannot_work_exit_2_naming_them() {
    let certs = Certs::make();
    let one = certs.path("one.pem");
    let one = one.to_str().expect("utf-8");
    let (status, log) = Daemon::run_to_exit(&["--tls-cert", one], Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("tls_key"), "{log}");

    let missing = certs.path("missing.key");
    let (status, log) = Daemon::run_to_exit(
        &[
            "--tls-cert",
            one,
            "--tls-key",
            missing.to_str().expect("utf-8"),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("missing.key"), "{log}");

    let two_key = certs.path("two.key");
    let (status, log) = Daemon::run_to_exit(
        &[
            "--tls-cert",
            one,
            "--tls-key",
            two_key.to_str().expect("utf-8"),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("do not make a usable pair"), "{log}");
}

#[tokio::test]
async fn plain_http_with_an_api_key_off_loopback_warns_at_start() {
    let d = Daemon::start(&["--host", "0.0.0.0", "--api-key", "k1", "--slots", "1"]);
    assert!(
        d.log().contains("anyone on the network can read the key"),
        "{}",
        d.log_tail()
    );
    let d = Daemon::start(&["--api-key", "k1", "--slots", "1"]);
    assert!(
        !d.log().contains("anyone on the network"),
        "{}",
        d.log_tail()
    );
}
