//! HTTPS for the API (rustls on ring; no OpenSSL): the certificate chain and key come from
//! PEM files (`--tls-cert`, `--tls-key`) and are read again on SIGHUP. A reload swaps the key
//! the next handshake is answered with: open connections keep theirs and are not dropped,
//! and a reload that fails (a file half-written by a renewal, a key that does not match)
//! keeps the previous pair and says why.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use super::conn::PeerIo;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS certificate chain {path}: {message}")]
    Cert { path: PathBuf, message: String },
    #[error("cannot read the TLS private key {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error("the TLS certificate {cert} and key {key} do not make a usable pair: {message}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
}

/// The server's certificate and key, and what accepts TLS connections with them.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Arc<RwLock<Arc<CertifiedKey>>>,
    acceptor: TlsAcceptor,
}

/// Hands every handshake the pair loaded last.
#[derive(Debug)]
struct Current(Arc<RwLock<Arc<CertifiedKey>>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

impl Tls {
    /// Reads the pair; a missing, empty or mismatched file is an error naming it.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(ring::default_provider());
        let pair = read_pair(cert, key, &provider)?;
        let current = Arc::new(RwLock::new(Arc::new(pair)));
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Pair {
                cert: cert.into(),
                key: key.into(),
                message: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Current(current.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(Self {
            cert: cert.into(),
            key: key.into(),
            provider,
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        }))
    }

    /// Reads the files again; on failure the pair in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let pair = read_pair(&self.cert, &self.key, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        Ok(())
    }

    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let cert_err = |message: String| TlsError::Cert {
        path: cert.into(),
        message,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate in it".into()));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.into(),
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, der, provider).map_err(|e| TlsError::Pair {
        cert: cert.into(),
        key: key.into(),
        message: e.to_string(),
    })
}

/// A connection's byte stream as hyper reads it: plain, or TLS over the same socket.
pub enum ServeIo {
    Plain(PeerIo),
    Tls(Box<tokio_rustls::server::TlsStream<PeerIo>>),
}

impl AsyncRead for ServeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServeIo::Plain(io) => Pin::new(io).poll_read(cx, buf),
            ServeIo::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServeIo::Plain(io) => Pin::new(io).poll_write(cx, buf),
            ServeIo::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServeIo::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            ServeIo::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServeIo::Plain(io) => io.is_write_vectored(),
            ServeIo::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServeIo::Plain(io) => Pin::new(io).poll_flush(cx),
            ServeIo::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServeIo::Plain(io) => Pin::new(io).poll_shutdown(cx),
            ServeIo::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}
