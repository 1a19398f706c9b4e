//! A small blocking HTTP/1.1 client over `TcpStream` (or TLS over it): exact control of the
//! bytes sent (bad UTF-8, partial headers, stalled bodies) and the arrival time of every body
//! chunk, which a general-purpose client hides.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use serde_json::Value;

/// Largest response head accepted; a daemon sending more is broken.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// `host:port` of a daemon, from a base URL such as `http://127.0.0.1:8080`, and the TLS
/// client settings when it serves HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: Option<TlsClient>,
}

/// How to reach an HTTPS daemon: rustls trusting the CA of `--ca-file`.
#[derive(Clone)]
pub struct TlsClient(Arc<rustls::ClientConfig>);

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsClient")
    }
}

impl PartialEq for TlsClient {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TlsClient {}

impl TlsClient {
    /// Trusts the PEM certificates in `ca_file`, and nothing else.
    pub fn from_ca_file(ca_file: &Path) -> Result<TlsClient, String> {
        let why = |e: &dyn fmt::Display| format!("--ca-file {}: {e}", ca_file.display());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| why(&e))? {
            roots.add(cert.map_err(|e| why(&e))?).map_err(|e| why(&e))?;
        }
        if roots.is_empty() {
            return Err(why(&"no PEM certificate in it"));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| why(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(TlsClient(Arc::new(config)))
    }
}

/// A connection to the daemon: plain TCP, or TLS over it (the handshake happens on the
/// first read or write, within the socket's timeouts).
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(d)
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.tcp().set_write_timeout(d)
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

impl Endpoint {
    /// Parses `http://HOST:PORT` (a trailing `/` is allowed; paths are not). `https://` needs
    /// `ca_file`, the CA that signed the daemon's certificate.
    pub fn parse_with_ca(url: &str, ca_file: Option<&Path>) -> Result<Endpoint, String> {
        match (url.strip_prefix("https://"), ca_file) {
            (Some(_), None) => Err(format!(
                "base URL {url:?} is HTTPS: name the CA that signed its certificate with --ca-file"
            )),
            (Some(rest), Some(ca)) => {
                let mut ep = Endpoint::parse(&format!("http://{rest}"))?;
                if !url.contains(&format!(":{}", ep.port)) {
                    ep.port = 443;
                }
                ep.tls = Some(TlsClient::from_ca_file(ca)?);
                Ok(ep)
            }
            (None, Some(_)) => Err(format!(
                "--ca-file is for an https:// base URL, not {url:?}"
            )),
            (None, None) => Endpoint::parse(url),
        }
    }

    /// Parses `http://HOST:PORT` (a trailing `/` is allowed; paths and TLS are not).
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("base URL {url:?} must start with http://"))?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') {
            return Err(format!(
                "base URL {url:?} must not have a path (the suite adds /v1/...)"
            ));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|e| format!("base URL {url:?}: bad port {p:?}: {e}"))?;
                (h, port)
            }
            _ => (rest, 80),
        };
        if host.is_empty() {
            return Err(format!("base URL {url:?} has no host"));
        }
        Ok(Endpoint {
            host: host.trim_start_matches('[').trim_end_matches(']').into(),
            port,
            tls: None,
        })
    }

    pub fn from_addr(addr: SocketAddr) -> Endpoint {
        Endpoint {
            host: addr.ip().to_string(),
            port: addr.port(),
            tls: None,
        }
    }

    /// The first address the host resolves to.
    pub fn addr(&self) -> io::Result<SocketAddr> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "host resolves to nothing"))
    }

    pub fn connect(&self, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&self.addr()?, timeout)?;
        stream.set_nodelay(true).ok();
        let Some(TlsClient(config)) = &self.tls else {
            return Ok(Conn::Plain(stream));
        };
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
        Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(tls, stream))))
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{self}{path}")
    }

    /// Whether the daemon runs on this machine (its sysfs is ours).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.addr().is_ok_and(|a| a.ip().is_loopback())
    }

    fn host_header(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One request, as bytes on the wire.
/// A request's deadline unless it sets its own (`inferloop-qual --request-timeout` replaces it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// Send the body with `Transfer-Encoding: chunked` in 1 KiB chunks, no Content-Length.
    pub chunked: bool,
    /// Whole-exchange deadline.
    pub timeout: Duration,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            body: None,
            chunked: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn post(path: &str) -> Request {
        Request::new("POST", path)
    }

    /// A JSON body with `Content-Type: application/json`.
    pub fn json(self, v: &Value) -> Request {
        let bytes = serde_json::to_vec(v).unwrap_or_default();
        self.body(bytes, Some("application/json"))
    }

    /// A raw body, with a Content-Type when given.
    pub fn body(mut self, bytes: Vec<u8>, content_type: Option<&str>) -> Request {
        if let Some(ct) = content_type {
            self = self.header("Content-Type", ct);
        }
        self.body = Some(bytes);
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(name))
    }

    pub fn timeout(mut self, d: Duration) -> Request {
        self.timeout = d;
        self
    }

    pub fn chunked(mut self) -> Request {
        self.chunked = true;
        self
    }

    /// The request head and body as sent; `Connection: close` unless the caller set one.
    pub fn encode(&self, ep: &Endpoint) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self.has_header("host") {
            head.push_str(&format!("Host: {}\r\n", ep.host_header()));
        }
        if !self.has_header("connection") {
            head.push_str("Connection: close\r\n");
        }
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let mut out;
        match &self.body {
            Some(body) if self.chunked => {
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                out = head.into_bytes();
                for piece in body.chunks(1024) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            Some(body) => {
                head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
                out = head.into_bytes();
                out.extend_from_slice(body);
            }
            None => {
                if self.method == "POST" || self.method == "PUT" {
                    head.push_str("Content-Length: 0\r\n");
                }
                head.push_str("\r\n");
                out = head.into_bytes();
            }
        }
        out
    }
}

/// Status line and headers of a response.
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub version: String,
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The head as text, for evidence.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {} {}", self.version, self.status, self.reason);
        for (k, v) in &self.headers {
            s.push_str(&format!("\n{k}: {v}"));
        }
        s
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    pub head: Head,
    pub body: Vec<u8>,
    /// From the first byte sent to the last byte received.
    pub elapsed: Duration,
}

impl Response {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| {
            format!(
                "body is not JSON ({e}): {}",
                crate::case::snippet(&self.text(), 300)
            )
        })
    }

    /// Status line plus a bounded body, for evidence.
    pub fn describe(&self) -> String {
        format!(
            "HTTP {} {}\n{}",
            self.head.status,
            self.head.reason,
            crate::case::snippet(&self.text(), 1500)
        )
    }
}

enum Framing {
    Chunked,
    Length(u64),
    /// Until the server closes the connection.
    Close,
    Empty,
}

/// The body of a response being read, piece by piece as the server sends it.
pub struct BodyStream {
    reader: BufReader<Conn>,
    framing: Framing,
    deadline: Instant,
    done: bool,
}

impl BodyStream {
    fn arm(&mut self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "response not complete before the request deadline",
            ));
        }
        self.reader.get_ref().set_read_timeout(Some(left))
    }

    /// The next piece of the body as the server framed it (one HTTP chunk, or whatever one
    /// read returned); `None` at the end.
    pub fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        self.arm()?;
        match self.framing {
            Framing::Empty => {
                self.done = true;
                Ok(None)
            }
            Framing::Length(0) => {
                self.done = true;
                Ok(None)
            }
            Framing::Length(left) => {
                let mut buf = vec![0u8; left.min(64 * 1024) as usize];
                let n = self.reader.read(&mut buf)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("connection closed with {left} body bytes missing"),
                    ));
                }
                buf.truncate(n);
                self.framing = Framing::Length(left - n as u64);
                Ok(Some(buf))
            }
            Framing::Close => {
                let mut buf = vec![0u8; 64 * 1024];
                let n = self.reader.read(&mut buf)?;
                if n == 0 {
                    self.done = true;
                    return Ok(None);
                }
                buf.truncate(n);
                Ok(Some(buf))
            }
            Framing::Chunked => {
                let line = read_line(&mut self.reader)?;
                let size_text = line.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad chunk size line {line:?}"),
                    )
                })?;
                if size == 0 {
                    // Trailers, then the blank line.
                    loop {
                        if read_line(&mut self.reader)?.is_empty() {
                            break;
                        }
                    }
                    self.done = true;
                    return Ok(None);
                }
                let mut buf = vec![0u8; size];
                self.reader.read_exact(&mut buf)?;
                let crlf = read_line(&mut self.reader)?;
                if !crlf.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "chunk not followed by CRLF",
                    ));
                }
                Ok(Some(buf))
            }
        }
    }

    /// The connection, for the next request on a keep-alive connection (after the body was
    /// read to its end).
    pub fn into_reader(self) -> BufReader<Conn> {
        self.reader
    }

    /// Reads the rest of the body.
    pub fn read_all(&mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(piece) = self.next_piece()? {
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }
}

/// A request sent and its response head read; the body is still on the wire.
pub struct Exchange {
    pub head: Head,
    pub body: BodyStream,
    pub sent_at: Instant,
    pub head_at: Instant,
}

fn read_line(r: &mut BufReader<Conn>) -> io::Result<String> {
    let mut line = Vec::new();
    let n = r.by_ref().take(8 * 1024).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-response",
        ));
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Reads a response head from `reader` and frames its body. `method` tells whether a body
/// follows (not after HEAD).
pub fn read_response(
    mut reader: BufReader<Conn>,
    method: &str,
    deadline: Instant,
) -> io::Result<(Head, BodyStream)> {
    let left = deadline.saturating_duration_since(Instant::now());
    reader
        .get_ref()
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    let status_line = read_line(&mut reader)?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default().to_string();
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line {status_line:?}"),
            )
        })?;
    let reason = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    let mut total = status_line.len();
    loop {
        let line = read_line(&mut reader)?;
        if line.is_empty() {
            break;
        }
        total += line.len();
        if total > MAX_HEAD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "response head too large",
            ));
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let head = Head {
        version,
        status,
        reason,
        headers,
    };
    let framing = if method == "HEAD" || status == 204 || status == 304 || status / 100 == 1 {
        Framing::Empty
    } else if head
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        Framing::Chunked
    } else if let Some(n) = head
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
    {
        Framing::Length(n)
    } else {
        Framing::Close
    };
    Ok((
        head,
        BodyStream {
            reader,
            framing,
            deadline,
            done: false,
        },
    ))
}

/// Sends `req` and reads the response head.
pub fn open(ep: &Endpoint, req: &Request) -> io::Result<Exchange> {
    let sent_at = Instant::now();
    let deadline = sent_at + req.timeout;
    let mut stream = ep.connect(req.timeout.min(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(req.timeout))?;
    stream.write_all(&req.encode(ep))?;
    stream.flush()?;
    let (head, body) = read_response(BufReader::new(stream), &req.method, deadline)?;
    Ok(Exchange {
        head,
        body,
        sent_at,
        head_at: Instant::now(),
    })
}

/// Sends `req` and reads the whole response.
pub fn send(ep: &Endpoint, req: &Request) -> io::Result<Response> {
    let mut ex = open(ep, req)?;
    let body = ex.body.read_all()?;
    Ok(Response {
        head: ex.head,
        body,
        elapsed: ex.sent_at.elapsed(),
    })
}

/// `GET path` status, or `None` when the exchange failed: for polling readiness.
pub fn probe_status(ep: &Endpoint, path: &str, timeout: Duration) -> Option<u16> {
    send(ep, &Request::get(path).timeout(timeout))
        .ok()
        .map(|r| r.status())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn serve_once(reply: &'static [u8]) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            s.write_all(reply).expect("write");
        });
        Endpoint::from_addr(addr)
    }

    #[test]
    fn base_urls_parse_with_and_without_port() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:8080/").expect("valid"),
            Endpoint {
                host: "127.0.0.1".into(),
                port: 8080,
                tls: None,
            }
        );
        assert_eq!(Endpoint::parse("http://box").expect("valid").port, 80);
        assert!(Endpoint::parse("https://box:1").is_err());
        let e = Endpoint::parse_with_ca("https://box:1", None).expect_err("no CA");
        assert!(e.contains("--ca-file"), "{e}");
        assert!(Endpoint::parse_with_ca("http://box:1", Some(Path::new("/ca.pem"))).is_err());
        assert!(Endpoint::parse("http://box:1/v1").is_err());
    }

    #[test]
    fn chunked_bodies_arrive_piece_by_piece() {
        let ep = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        );
        let mut ex = open(&ep, &Request::get("/")).expect("open");
        assert_eq!(ex.head.status, 200);
        assert_eq!(ex.body.next_piece().expect("read"), Some(b"hello".to_vec()));
        assert_eq!(
            ex.body.next_piece().expect("read"),
            Some(b" world".to_vec())
        );
        assert_eq!(ex.body.next_piece().expect("read"), None);
    }

    #[test]
    fn content_length_and_close_delimited_bodies_are_read_whole() {
        let ep = serve_once(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi");
        let r = send(&ep, &Request::get("/")).expect("send");
        assert_eq!((r.status(), r.text().as_str()), (404, "hi"));
        assert_eq!(r.header("x-a"), Some("b"));
        let ep = serve_once(b"HTTP/1.0 200 OK\r\n\r\nuntil close");
        assert_eq!(
            send(&ep, &Request::get("/")).expect("send").text(),
            "until close"
        );
    }

    #[test]
    fn requests_encode_length_or_chunks() {
        let ep = Endpoint::parse("http://h:1").expect("valid");
        let plain = String::from_utf8(Request::post("/x").body(b"abc".to_vec(), None).encode(&ep))
            .expect("utf8");
        assert!(plain.contains("Content-Length: 3\r\n\r\nabc"), "{plain}");
        let chunked = String::from_utf8(
            Request::post("/x")
                .body(b"abc".to_vec(), None)
                .chunked()
                .encode(&ep),
        )
        .expect("utf8");
        assert!(chunked.ends_with("3\r\nabc\r\n0\r\n\r\n"), "{chunked}");
        assert!(!chunked.contains("Content-Length"), "{chunked}");
    }
}
