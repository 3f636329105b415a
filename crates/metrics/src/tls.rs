//! Client-side TLS to model servers: what the scraper (and the gateway's upstream connections)
//! need to speak HTTPS to a pod.
//!
//! A [`ClientTls`] is a rustls client configuration (its trust roots, usually one private CA) and
//! the name checked against the server's certificate. Building one from files lives in
//! `infergate_pool::tls`; this crate only connects with it. [`Stream`] is a connection that is
//! either plain TCP or TLS over TCP, so one HTTP/1.1 client serves both.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How to open TLS to a model server: the client configuration and the server name to verify.
/// Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl ClientTls {
    /// TLS with `config`, verifying the certificate against `server_name`, or, when `None`,
    /// against the IP address connected to (the certificate then needs that IP as a SAN).
    pub fn new(
        config: Arc<rustls::ClientConfig>,
        server_name: Option<ServerName<'static>>,
    ) -> Self {
        ClientTls {
            config,
            server_name,
        }
    }

    /// The name the certificate of the server at `addr` must carry.
    pub fn server_name(&self, addr: SocketAddr) -> ServerName<'static> {
        self.server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }

    /// The client configuration.
    pub fn config(&self) -> &Arc<rustls::ClientConfig> {
        &self.config
    }

    /// Runs the TLS handshake on `tcp`, a connection to `addr`.
    pub async fn connect(&self, addr: SocketAddr, tcp: TcpStream) -> io::Result<Stream> {
        let tls = TlsConnector::from(Arc::clone(&self.config))
            .connect(self.server_name(addr), tcp)
            .await?;
        Ok(MaybeTls::Tls(Box::new(tls)))
    }
}

/// Two `ClientTls` are equal when they share one client configuration (the same `Arc`) and
/// verify the same name: a reload that rebuilt the configuration is a change.
impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

impl Eq for ClientTls {}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("alpn", &self.config.alpn_protocols)
            .finish_non_exhaustive()
    }
}

/// A TCP connection, plain or with TLS over it: `T` is the client's or the server's TLS stream
/// (`Stream` here, `infergate_pool::tls::ServerStream` on the serving side), so one HTTP stack
/// serves both cases.
#[derive(Debug)]
pub enum MaybeTls<T> {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS (boxed: the TLS state is large and the plain case is the common one).
    Tls(Box<T>),
}

/// A connection to a model server: plain TCP or TLS over TCP.
pub type Stream = MaybeTls<TlsStream<TcpStream>>;

impl Stream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            MaybeTls::Plain(s) => s,
            MaybeTls::Tls(s) => s.get_ref().0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
