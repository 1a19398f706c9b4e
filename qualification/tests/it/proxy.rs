//! A deliberately broken daemon: a proxy in front of the real one that forwards every
//! request and answer but drops the `data: [DONE]` frame from streams.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use inferloop_qual::http::{read_response, Endpoint};

pub struct Proxy {
    pub addr: SocketAddr,
}

impl Proxy {
    /// Listens on a free port and forwards to `upstream`, dropping `data: [DONE]\n\n`.
    pub fn drop_done(upstream: Endpoint) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let upstream = upstream.clone();
                std::thread::spawn(move || {
                    if let Err(e) = forward(client, &upstream) {
                        eprintln!("proxy: {e}");
                    }
                });
            }
        });
        Proxy { addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// One exchange: the request as sent (head and Content-Length body), the answer re-framed
/// as a close-delimited body with `[DONE]` cut out.
fn forward(client: TcpStream, upstream: &Endpoint) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let method = text.split(' ').next().unwrap_or("GET").to_string();
    let length = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;

    let mut up = upstream.connect(Duration::from_secs(10))?;
    up.write_all(&head)?;
    up.write_all(&body)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let (resp, mut stream) = read_response(BufReader::new(up), &method, deadline)?;

    let mut out = client;
    let mut h = format!("{} {} {}\r\n", resp.version, resp.status, resp.reason);
    for (k, v) in &resp.headers {
        let k_l = k.to_ascii_lowercase();
        if k_l == "transfer-encoding" || k_l == "content-length" || k_l == "connection" {
            continue;
        }
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("Connection: close\r\n\r\n");
    out.write_all(h.as_bytes())?;
    while let Some(piece) = stream.next_piece()? {
        let cleaned = cut(&piece, b"data: [DONE]\n\n");
        out.write_all(&cleaned)?;
        out.flush()?;
    }
    Ok(())
}

fn cut(haystack: &[u8], needle: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}
