//! A fake DDI server on 127.0.0.1:0 (axum, over HTTP or HTTPS): scripted replies, recorded
//! requests, a token it may insist on, and an artifact served with HTTP Range support that
//! can cut the connection half-way. Also a fake RAUC and a capture of the agent's log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use inferloop_ota::rauc::{InstallProgress, Installer, Slot, Slots};
use inferloop_ota::OtaError;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Default)]
pub struct Script {
    /// The poll reply; `None` answers garbage.
    pub base: Option<Value>,
    pub deployment: Value,
    pub cancel: Value,
    pub artifact: Vec<u8>,
    /// Serve at most this many bytes of the artifact, then drop the connection (once).
    pub cut_after: Option<usize>,
    /// `Some(header)`: any request whose `Authorization` differs gets a 401.
    pub require_auth: Option<String>,
    pub log: Vec<Logged>,
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
    pub body: Value,
}

#[derive(Clone)]
pub struct Fake {
    pub script: Arc<Mutex<Script>>,
    pub url: String,
}

impl Fake {
    pub async fn start(script: Script) -> Self {
        let script = Arc::new(Mutex::new(script));
        let app = Router::new().fallback(handle).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self { script, url }
    }

    /// The same server over HTTPS only, with `tls`'s certificate and key.
    pub async fn start_tls(script: Script, tls: &TlsFiles) -> Self {
        let script = Arc::new(Mutex::new(script));
        let app = Router::new().fallback(handle).with_state(script.clone());
        let listener = TlsListener::bind(tls).await;
        let url = format!("https://{}", listener.addr);
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self { script, url }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Script) -> R) -> R {
        f(&mut self.script.lock().expect("lock"))
    }

    /// Recorded requests whose path ends with `suffix`, as (method, body).
    pub fn requests(&self, suffix: &str) -> Vec<(String, Value)> {
        self.with(|s| {
            s.log
                .iter()
                .filter(|r| r.path.ends_with(suffix))
                .map(|r| (r.method.clone(), r.body.clone()))
                .collect()
        })
    }

    pub fn log(&self) -> Vec<Logged> {
        self.with(|s| s.log.clone())
    }

    /// Feedback bodies posted to deploymentBase/{id}/feedback.
    pub fn feedback(&self) -> Vec<Value> {
        self.requests("/feedback")
            .into_iter()
            .filter(|(m, _)| m == "POST")
            .map(|(_, b)| b)
            .collect()
    }
}

async fn handle(State(script): State<Arc<Mutex<Script>>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let headers: HeaderMap = req.headers().clone();
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut s = script.lock().expect("lock");
    s.log.push(Logged {
        method: method.to_string(),
        path: path.clone(),
        range: range.clone(),
        authorization: authorization.clone(),
        body: json,
    });
    if let Some(want) = &s.require_auth {
        if authorization.as_ref() != Some(want) {
            // goosebit's words for it in strict mode.
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(
                    serde_json::json!({"detail": "Device authentication token does not match."}),
                ),
            )
                .into_response();
        }
    }
    if path == "/artifact" {
        return artifact(&mut s, range);
    }
    if method == Method::GET && path.contains("/deploymentBase/") {
        return axum::Json(s.deployment.clone()).into_response();
    }
    if method == Method::GET && path.contains("/cancelAction/") {
        return axum::Json(s.cancel.clone()).into_response();
    }
    if method == Method::GET && path.starts_with("/DEFAULT/controller/v1/") {
        return match &s.base {
            Some(b) => axum::Json(b.clone()).into_response(),
            None => (StatusCode::OK, "<html>proxy error</html>").into_response(),
        };
    }
    if method == Method::PUT || method == Method::POST {
        return axum::Json(serde_json::json!({})).into_response();
    }
    StatusCode::NOT_FOUND.into_response()
}

fn artifact(s: &mut Script, range: Option<String>) -> Response {
    let total = s.artifact.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
    let (status, from) = match start {
        Some(n) if n >= total => {
            return (StatusCode::RANGE_NOT_SATISFIABLE, "").into_response();
        }
        Some(n) => (StatusCode::PARTIAL_CONTENT, n),
        None => (StatusCode::OK, 0),
    };
    let bytes = s.artifact[from..].to_vec();
    let mut builder = Response::builder()
        .status(status)
        .header("content-length", bytes.len());
    if status == StatusCode::PARTIAL_CONTENT {
        builder = builder.header(
            "content-range",
            format!("bytes {from}-{}/{total}", total - 1),
        );
    }
    let body = match s.cut_after.take() {
        Some(cut) => {
            let head = bytes[..cut.min(bytes.len())].to_vec();
            // The head goes out, then (after hyper flushed it) the connection breaks.
            let stream = futures::stream::unfold(0u8, move |step| {
                let head = head.clone();
                async move {
                    match step {
                        0 => Some((Ok(axum::body::Bytes::from(head)), 1)),
                        1 => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            Some((Err(std::io::Error::other("cut")), 2))
                        }
                        _ => None,
                    }
                }
            });
            Body::from_stream(stream)
        }
        None => Body::from(bytes),
    };
    builder.body(body).expect("response")
}

/// A throwaway PKI made with the `openssl` CLI: a CA, a server certificate it signed for
/// 127.0.0.1 and localhost, and a second CA that signed nothing the server has.
pub struct TlsFiles {
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsFiles {
    /// `None` (and a line saying why) when there is no `openssl` to make them.
    pub fn generate() -> Option<Self> {
        if std::process::Command::new("openssl")
            .arg("version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no `openssl` on PATH to make test certificates");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let openssl = |args: &str| {
            // No argument below has a space inside it.
            let args: Vec<&str> = args.split_whitespace().collect();
            let out = std::process::Command::new("openssl")
                .args(&args)
                .current_dir(d)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        for (name, cn) in [("ca", "InferLoop-test-CA"), ("other-ca", "Some-other-CA")] {
            openssl(&format!(
                "req -x509 {ec} -keyout {name}.key -out {name}.pem -days 2 -subj /CN={cn} \
                 -addext basicConstraints=critical,CA:TRUE \
                 -addext keyUsage=critical,keyCertSign,cRLSign"
            ));
        }
        openssl(&format!(
            "req {ec} -keyout server.key -out server.csr -subj /CN=localhost"
        ));
        std::fs::write(
            d.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write ext");
        openssl(
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
             -extfile server.ext -out server.pem",
        );
        Some(Self {
            ca: d.join("ca.pem"),
            other_ca: d.join("other-ca.pem"),
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            _dir: dir,
        })
    }
}

/// Accepts TCP, does the TLS handshake in a task of its own (a client that rejects the
/// certificate must not hold up the next one) and hands axum the finished streams.
struct TlsListener {
    addr: std::net::SocketAddr,
    ready: mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        std::net::SocketAddr,
    )>,
}

impl TlsListener {
    async fn bind(files: &TlsFiles) -> Self {
        let pem = std::fs::read(&files.cert).expect("read cert");
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .expect("cert PEM");
        let key = PrivateKeyDer::from_pem_slice(&std::fs::read(&files.key).expect("read key"))
            .expect("key PEM");
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let (tx, ready) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok((stream, peer)) = tcp.accept().await {
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    // A failed handshake is the client's verdict on our certificate: the
                    // tests read it from the client's side.
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        Self { addr, ready }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ended (the runtime is going away): never return.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[derive(Default)]
pub struct Rauc {
    pub operation: String,
    /// `Some(message)`: the install fails with this LastError.
    pub refuse: Option<String>,
    pub installs: Vec<PathBuf>,
    pub booted: String,
    pub primary: String,
    pub b_status: String,
}

/// RAUC with slots A (rootfs.0) and B (rootfs.1), booted from A.
#[derive(Clone)]
pub struct FakeRauc(Arc<Mutex<Rauc>>);

impl FakeRauc {
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Rauc {
            operation: "idle".into(),
            booted: "A".into(),
            primary: "rootfs.0".into(),
            b_status: "good".into(),
            ..Rauc::default()
        })))
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Rauc) -> R) -> R {
        f(&mut self.0.lock().expect("lock"))
    }
}

impl Installer for FakeRauc {
    async fn operation(&self) -> Result<String, OtaError> {
        Ok(self.with(|r| r.operation.clone()))
    }

    async fn install(
        &self,
        bundle: &Path,
        progress: mpsc::Sender<InstallProgress>,
    ) -> Result<(), OtaError> {
        let _ = progress
            .send(InstallProgress {
                percentage: 40,
                message: "Checking bundle done.".into(),
            })
            .await;
        self.with(|r| {
            r.installs.push(bundle.to_path_buf());
            match &r.refuse {
                Some(e) => Err(OtaError::InstallFailed {
                    code: 1,
                    last_error: e.clone(),
                }),
                None => {
                    r.primary = "rootfs.1".into();
                    Ok(())
                }
            }
        })
    }

    async fn slots(&self) -> Result<Slots, OtaError> {
        Ok(self.with(|r| Slots {
            booted: r.booted.clone(),
            primary: Some(r.primary.clone()),
            slots: vec![
                Slot {
                    name: "rootfs.0".into(),
                    bootname: Some("A".into()),
                    state: None,
                    boot_status: Some("good".into()),
                },
                Slot {
                    name: "rootfs.1".into(),
                    bootname: Some("B".into()),
                    state: None,
                    boot_status: Some(r.b_status.clone()),
                },
            ],
        }))
    }

    async fn booted(&self) -> Result<String, OtaError> {
        Ok(self.with(|r| r.booted.clone()))
    }

    async fn compatible(&self) -> Result<String, OtaError> {
        Ok("inferloop-test-board".into())
    }
}

/// The agent's log lines while the guard lives (this thread's; `#[tokio::test]` runs the
/// agent on it).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || LogWriter(sink.0.clone()))
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
