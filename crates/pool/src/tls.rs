//! TLS for every infergate server port that speaks it (the gateway's front door, the picker's and
//! the BBR's ext_proc ports), and the client side to model servers built from files.
//!
//! Server side, a [`ServerTls`] holds a rustls acceptor whose certificate is chosen per handshake
//! by a resolver that reads an [`ArcSwap`]: a certificate replaced on disk is loaded by a poller
//! (every [`DEFAULT_RELOAD_INTERVAL`] by default) and swapped in, so new handshakes get the new
//! certificate while running connections keep theirs, with no restart. A pair that does not load
//! (a half-written file, a key that does not match) is logged and counted, and the previous
//! certificate stays. The certificate comes from PEM files ([`Certificate::Files`]) or is
//! generated at start ([`Certificate::SelfSigned`], for a peer that does not verify, as Envoy AI
//! Gateway's connection to an endpoint picker does not).
//!
//! A handshake has a deadline ([`DEFAULT_HANDSHAKE_TIMEOUT`]): a plaintext client, or one that
//! sends nothing, is closed when its bytes are not a TLS ClientHello or when the deadline passes.
//! Failures are logged at debug level and counted
//! (`infergate_tls_handshake_failures_total{reason}`). A connection closed before its first byte
//! (a TCP liveness probe, a load balancer's health check, a port scanner's connect) is not a
//! failed handshake: [`accept_tls`] counts it apart
//! (`infergate_tls_connections_closed_before_handshake_total`) and logs it at debug level only,
//! so that an alert on the failures is not set off by every probe.
//!
//! With [`ServerTlsOptions::client_ca`] the port is mutual TLS: every client must present a
//! certificate chained to that CA bundle (rustls' `WebPkiClientVerifier`), else its handshake
//! fails (counted with reason `client_certificate`) and a warning names the port
//! ([`ServerTlsOptions::port`]), the client's address and rustls' reason — at most one line per
//! [`REFUSAL_LOG_INTERVAL`] per port, carrying the number of refusals it stands for, so that a
//! client with an expired certificate retrying in a loop is seen at info level without flooding
//! the log. The bundle is polled with the certificate
//! files; a new one that loads gives new handshakes a new rustls configuration (an [`ArcSwap`]
//! of it: the verifier is fixed in a configuration, and a new one also drops the sessions
//! resumable under the old bundle), one that does not keeps the last good one.
//!
//! Client side, [`client_tls`] reads a CA bundle and builds an
//! [`infergate_metrics::ClientTls`], which the scraper and the gateway's upstream connections use;
//! [`ca_roots`] and [`load_pair`] are the same PEM loading for a client that builds its own
//! configuration (the global router's, with a client certificate).
//!
//! Only the ring crypto provider is used.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use infergate_metrics::ClientTls;
use infergate_metrics::tls::MaybeTls;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, VerifierBuilderError, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How often certificate and key files are checked for changes.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// How long a client has to complete the TLS handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// ALPN of an HTTP front door: HTTP/2 first, then HTTP/1.1.
pub const ALPN_HTTP: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// ALPN of a gRPC port: HTTP/2 only.
pub const ALPN_GRPC: [&[u8]; 1] = [b"h2"];
/// At most one warning per this interval, per port, for clients refused for their certificate
/// (mutual TLS): the first is logged at once, the next ones summed into the line that ends the
/// pause.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The names of the ports that serve TLS, as [`ServerTlsOptions::port`] and log lines give them.
/// `admin` and `metrics` are also the `port` label the series of those ports carry (the others'
/// series are unlabelled).
pub mod port {
    /// The gateway's front door (`tls`).
    pub const FRONT: &str = "front";
    /// The global router's port (`tls`).
    pub const ROUTER: &str = "router";
    /// The picker's or the BBR's ext_proc port (`--tls-*`).
    pub const EXT_PROC: &str = "ext_proc";
    /// The gateway's admin port (`adminTls`).
    pub const ADMIN: &str = "admin";
    /// The metrics port of the picker, the BBR (`--metrics-tls-*`) or the operator.
    pub const METRICS: &str = "metrics";
}

/// Why a certificate, key or CA bundle could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: io::Error,
    },
    /// A file is not valid PEM.
    #[error("`{}` is not valid PEM", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A certificate file holds no `CERTIFICATE` block.
    #[error("`{}` holds no PEM certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A key file holds no private key block (PKCS#8, PKCS#1 or SEC1).
    #[error("`{}` holds no PEM private key", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// The private key is not one rustls can sign with (RSA, ECDSA P-256/P-384, Ed25519).
    #[error("the private key in `{}` is not usable", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
    /// The private key is not the certificate's.
    #[error("the private key in `{}` does not match the certificate in `{}`", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The first certificate of the chain could not be parsed.
    #[error("the certificate in `{}` is not a valid X.509 certificate", path.display())]
    Certificate {
        /// The certificate file.
        path: PathBuf,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
    /// A CA certificate could not be added to the trust roots.
    #[error("the CA certificate in `{}` is not usable", path.display())]
    CaCertificate {
        /// The CA file.
        path: PathBuf,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
    /// A client CA bundle could not be made into a client certificate verifier.
    #[error("the client CA bundle `{}` is not usable", path.display())]
    ClientCa {
        /// The CA file.
        path: PathBuf,
        /// rustls' reason.
        #[source]
        source: VerifierBuilderError,
    },
    /// `serverName` is neither a DNS name nor an IP address.
    #[error("`{name}` is not a valid TLS server name")]
    ServerName {
        /// The name as given.
        name: String,
        /// Why it is not valid.
        #[source]
        source: rustls_pki_types::InvalidDnsNameError,
    },
    /// A self-signed certificate could not be generated.
    #[error("cannot generate a self-signed certificate")]
    SelfSigned(#[source] rcgen::Error),
    /// rustls refused the configuration (protocol versions of the provider).
    #[error("TLS configuration refused")]
    Config(#[source] rustls::Error),
    /// Reloading certificate files needs a tokio runtime to poll them on.
    #[error("certificate files are watched on a tokio runtime; none is running")]
    NoRuntime,
}

/// Why one TLS handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The client did not finish the handshake in time.
    #[error("TLS handshake not completed within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The handshake failed: not TLS at all (a plaintext client), no shared protocol, a reset.
    #[error("TLS handshake failed")]
    Failed(#[source] io::Error),
    /// A port with a client CA: the client presented no certificate, or one that does not chain
    /// to the bundle (or is expired, or not for client authentication).
    #[error("TLS client certificate refused")]
    ClientCertificate(#[source] io::Error),
    /// The client closed the connection (or reset it) before sending a byte: a TCP probe or a
    /// port scan, not a failed handshake. Counted apart from the failures.
    #[error("connection closed before the TLS handshake began")]
    ClosedBeforeHandshake,
}

impl HandshakeError {
    /// Every value [`Self::metric_label`] returns.
    pub const METRIC_LABELS: [&'static str; 3] = ["timeout", "error", "client_certificate"];

    /// A short label for the `reason` of the failure counter; `None` for
    /// [`Self::ClosedBeforeHandshake`], which is no failure (it has its own counter).
    pub const fn metric_label(&self) -> Option<&'static str> {
        match self {
            HandshakeError::Timeout(_) => Some("timeout"),
            HandshakeError::Failed(_) => Some("error"),
            HandshakeError::ClientCertificate(_) => Some("client_certificate"),
            HandshakeError::ClosedBeforeHandshake => None,
        }
    }

    /// A failed handshake, told apart by rustls' reason: what the server said of the client's
    /// certificate (missing, or not verified), or anything else.
    fn failed(e: io::Error) -> HandshakeError {
        let refused = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|r| {
                // On the server side a certificate is only ever the client's.
                matches!(
                    r,
                    rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_)
                )
            });
        if refused {
            HandshakeError::ClientCertificate(e)
        } else {
            HandshakeError::Failed(e)
        }
    }
}

/// Where a server's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Certificate {
    /// A PEM certificate chain (leaf first) and its PEM private key, reloaded when they change.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
    /// A certificate generated at start for these subject alternative names (DNS names or IP
    /// addresses), signed by its own key. For peers that do not verify certificates.
    SelfSigned {
        /// The names the certificate carries.
        names: Vec<String>,
    },
}

/// How a [`ServerTls`] serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsOptions {
    /// The port's name in log lines (one of [`port`]), so that an operator reading a refusal
    /// knows which port's client CA to look at.
    pub port: &'static str,
    /// ALPN protocols offered, in order of preference ([`ALPN_HTTP`], [`ALPN_GRPC`]).
    pub alpn: Vec<Vec<u8>>,
    /// How often certificate files are checked for changes.
    pub reload_interval: Duration,
    /// How long a client has to complete the handshake.
    pub handshake_timeout: Duration,
    /// A PEM CA bundle every client's certificate must chain to (mutual TLS), polled with the
    /// certificate files; `None`: no client certificate is asked for.
    pub client_ca: Option<PathBuf>,
}

impl ServerTlsOptions {
    /// The defaults for the port named `port` (one of [`port`]) with `alpn`: no client
    /// certificate.
    pub fn new(port: &'static str, alpn: &[&[u8]]) -> Self {
        ServerTlsOptions {
            port,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            client_ca: None,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Default)]
struct TlsMetrics {
    handshake_failures: Family<ReasonLabels, Counter>,
    /// Connections closed before their first byte: probes, not failures.
    closed_before_handshake: Counter,
    reloads: Family<ResultLabels, Counter>,
    /// The served certificate's `notAfter`, Unix seconds (0 when it could not be read).
    not_after: Gauge,
}

impl TlsMetrics {
    /// Reads the validity of `chain`'s leaf, the certificate served from now on (`from`: its
    /// file, or none for a generated one): sets the expiry gauge, and warns when the
    /// certificate is already expired or not yet valid — it is served anyway (a client decides),
    /// but every verifying client will refuse it.
    fn served(&self, chain: &[CertificateDer<'_>], from: Option<&Path>) {
        let Some(v) = chain.first().and_then(|leaf| Validity::of(leaf)) else {
            self.not_after.set(0);
            tracing::debug!(
                cert = from.map(|p| p.display().to_string()),
                "TLS certificate: validity not read; infergate_tls_certificate_not_after_timestamp_seconds is 0"
            );
            return;
        };
        self.not_after.set(v.not_after);
        let file = from.map_or_else(|| "(generated)".to_owned(), |p| p.display().to_string());
        match v.outside(unix_now()) {
            Some(Outside::Expired { seconds_ago }) => tracing::warn!(
                cert = %file,
                expired_seconds_ago = seconds_ago,
                "TLS certificate expired: clients that verify it refuse every handshake; replace the file (it is reloaded)"
            ),
            Some(Outside::NotYetValid { in_seconds }) => tracing::warn!(
                cert = %file,
                valid_in_seconds = in_seconds,
                "TLS certificate not valid yet (notBefore is in the future; check this host's clock): clients that verify it refuse every handshake"
            ),
            None => {}
        }
    }
}

/// The resolver rustls asks for a certificate at each handshake: whatever is current.
#[derive(Debug)]
struct Current(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// What new handshakes are served with: the rustls configuration (replaced when the client CA
/// bundle changes) and the certificate resolver inside it (whose certificate is replaced when
/// the certificate files change).
struct Live {
    config: ArcSwap<rustls::ServerConfig>,
    current: Arc<Current>,
}

/// A server port's TLS: its configuration, its reloading certificate (and client CA) and its
/// counters. Cheap to clone; the file poller runs as long as a clone is alive.
#[derive(Clone)]
pub struct ServerTls {
    live: Arc<Live>,
    handshake_timeout: Duration,
    metrics: TlsMetrics,
    /// The port's name, for its log lines.
    port: &'static str,
    /// The port's refused clients since its last warning: one rate limit per port.
    refusals: Arc<Mutex<Refusals>>,
    /// The client CA bundle's file, named in a refusal's warning.
    client_ca: Option<Arc<Path>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("port", &self.port)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration serving `current`'s certificate, asking clients for one when
/// `verifier` is set.
fn server_config(
    provider: &Arc<CryptoProvider>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    current: &Arc<Current>,
    alpn: &[Vec<u8>],
) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::clone(current) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

impl ServerTls {
    /// Loads `certificate` (and `options.client_ca`) and builds the configuration. With
    /// [`Certificate::Files`] or a client CA the files are polled every
    /// `options.reload_interval` on the current tokio runtime (so this must be called inside
    /// one).
    pub fn new(certificate: &Certificate, options: &ServerTlsOptions) -> Result<Self, TlsError> {
        let provider = provider();
        // The files as loaded: the poller compares against these bytes, so a change made right
        // after this call is seen as a change.
        let mut loaded = None;
        let key = match certificate {
            Certificate::Files { cert, key } => {
                let (cert_pem, key_pem) = (read(cert)?, read(key)?);
                let pair = pair_from_pem(&cert_pem, &key_pem, cert, key, &provider)?;
                loaded = Some((Some(cert_pem), Some(key_pem)));
                pair
            }
            Certificate::SelfSigned { names } => self_signed(names, &provider)?,
        };
        let metrics = TlsMetrics::default();
        metrics.served(
            &key.cert,
            match certificate {
                Certificate::Files { cert, .. } => Some(cert.as_path()),
                Certificate::SelfSigned { .. } => None,
            },
        );
        let current = Arc::new(Current(ArcSwap::from_pointee(key)));
        let mut client_ca = None;
        let verifier = match &options.client_ca {
            Some(path) => {
                let pem = read(path)?;
                let verifier = verifier_from_pem(&pem, path, &provider)?;
                client_ca = Some(pem);
                Some(verifier)
            }
            None => None,
        };
        let config = server_config(&provider, verifier, &current, &options.alpn)?;
        let tls = ServerTls {
            live: Arc::new(Live {
                config: ArcSwap::from_pointee(config),
                current,
            }),
            handshake_timeout: options.handshake_timeout,
            metrics,
            port: options.port,
            refusals: Arc::default(),
            client_ca: options.client_ca.as_deref().map(Arc::from),
        };
        if options.reload_interval.is_zero() || (loaded.is_none() && client_ca.is_none()) {
            return Ok(tls);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| TlsError::NoRuntime)?;
        if let (Certificate::Files { cert, key }, Some(last)) = (certificate, loaded) {
            runtime.spawn(watch(
                Arc::downgrade(&tls.live.current),
                tls.metrics.clone(),
                last,
                cert.clone(),
                key.clone(),
                options.reload_interval,
                Arc::clone(&provider),
            ));
        }
        if let (Some(path), Some(last)) = (&options.client_ca, client_ca) {
            runtime.spawn(watch_client_ca(
                Arc::downgrade(&tls.live),
                tls.metrics.clone(),
                ClientCaFile {
                    path: path.clone(),
                    last,
                    alpn: options.alpn.clone(),
                },
                options.reload_interval,
                provider,
            ));
        }
        Ok(tls)
    }

    /// [`Self::register`] with every series labelled `port=<this port's name>` (`admin`,
    /// `metrics`): for a port whose series share their families with another TLS port's.
    pub fn register_labelled(&self, registry: &mut Registry) {
        self.register(registry.sub_registry_with_label(("port".into(), self.port.into())));
    }

    /// Registers `infergate_tls_handshake_failures_total{reason}`,
    /// `infergate_tls_connections_closed_before_handshake_total`,
    /// `infergate_tls_certificate_reloads_total{result}` and
    /// `infergate_tls_certificate_not_after_timestamp_seconds` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        // Every label value exported from the start, at 0: an alert on `rate(...)` of a result
        // or reason that has not happened yet still has a series to read.
        for reason in HandshakeError::METRIC_LABELS {
            let _ = self
                .metrics
                .handshake_failures
                .get_or_create(&ReasonLabels { reason });
        }
        for result in ["ok", "error"] {
            let _ = self.metrics.reloads.get_or_create(&ResultLabels { result });
        }
        registry.register(
            "infergate_tls_handshake_failures",
            "TLS handshakes that failed (reason: timeout, error, client_certificate)",
            self.metrics.handshake_failures.clone(),
        );
        registry.register(
            "infergate_tls_connections_closed_before_handshake",
            "Connections closed (or reset) before sending a byte: TCP probes and port scans, not handshake failures",
            self.metrics.closed_before_handshake.clone(),
        );
        registry.register(
            "infergate_tls_certificate_reloads",
            "Certificate and client CA reloads after the files changed (result: ok, error)",
            self.metrics.reloads.clone(),
        );
        registry.register(
            "infergate_tls_certificate_not_after_timestamp_seconds",
            "The served certificate's notAfter, Unix seconds (0: not read); alert on it minus time()",
            self.metrics.not_after.clone(),
        );
    }

    /// The certificate chain new handshakes are served (leaf first).
    pub fn certificate_chain(&self) -> Vec<CertificateDer<'static>> {
        self.live.current.0.load().cert.clone()
    }

    /// Runs the server side of the handshake on `stream` within the handshake timeout. A
    /// failure is logged at debug level and counted; a refused client certificate is also
    /// warned of (see [`REFUSAL_LOG_INTERVAL`]).
    pub async fn accept<S>(&self, stream: S) -> Result<TlsStream<S>, HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let deadline = Instant::now() + self.handshake_timeout;
        self.handshake(stream, deadline, None).await
    }

    /// [`Self::accept`] of an accepted TCP connection, which is first waited on for its first
    /// byte: one closed (or reset) before sending any is counted in
    /// `infergate_tls_connections_closed_before_handshake_total`, not as a failure.
    async fn accept_tcp(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, HandshakeError> {
        let deadline = Instant::now() + self.handshake_timeout;
        let peer = stream.peer_addr().ok();
        let mut first = [0u8; 1];
        // Only an end before any byte is told apart: a timeout here is the handshake's (it
        // fails at once below, with the same deadline), and any other error is met again by
        // the handshake.
        let closed = match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(0)) => true,
            Ok(Err(e)) => e.kind() == io::ErrorKind::ConnectionReset,
            Ok(Ok(_)) | Err(_) => false,
        };
        if closed {
            self.metrics.closed_before_handshake.inc();
            tracing::debug!(
                port = self.port,
                peer = peer.map(tracing::field::display),
                "connection closed before the TLS handshake began (a TCP probe?)"
            );
            return Err(HandshakeError::ClosedBeforeHandshake);
        }
        self.handshake(stream, deadline, peer).await
    }

    /// The handshake on `stream` until `deadline`, logged and counted; `peer` names the client
    /// in a refusal's warning.
    async fn handshake<S>(
        &self,
        stream: S,
        deadline: Instant,
        peer: Option<SocketAddr>,
    ) -> Result<TlsStream<S>, HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        // The configuration in force now: a client CA replaced during the handshake applies
        // from the next one.
        let acceptor = TlsAcceptor::from(self.live.config.load_full());
        let result = match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
            Err(_elapsed) => Err(HandshakeError::Timeout(self.handshake_timeout)),
            Ok(Err(e)) => Err(HandshakeError::failed(e)),
            Ok(Ok(s)) => Ok(s),
        };
        if let Err(e) = &result {
            tracing::debug!(port = self.port, error = %crate::ErrorChain(e), "TLS handshake failed");
            if let Some(reason) = e.metric_label() {
                self.metrics
                    .handshake_failures
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
            if let HandshakeError::ClientCertificate(_) = e {
                self.warn_refused(peer, e);
            }
        }
        result
    }

    /// Warns that `peer` was refused for its certificate (`error`, rustls' reason in its chain),
    /// unless this port logged such a line less than [`REFUSAL_LOG_INTERVAL`] ago: a client
    /// without a certificate retrying in a loop gives one line a minute, not one per attempt.
    /// Every refusal is counted in `infergate_tls_handshake_failures_total{reason="client_certificate"}`.
    fn warn_refused(&self, peer: Option<SocketAddr>, error: &HandshakeError) {
        let logged = self
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(Instant::now());
        if let Some(refused) = logged {
            let bundle = self
                .client_ca
                .as_deref()
                .map_or_else(String::new, |p| format!(" `{}`", p.display()));
            tracing::warn!(
                port = self.port,
                peer = peer.map(tracing::field::display),
                error = %crate::ErrorChain(error),
                refused,
                "{} client refused: it presented no certificate, or one that does not chain to \
                 the port's client CA bundle{bundle} (`refused`: clients refused on this port \
                 since the last such line; at most one line a minute)",
                self.port,
            );
        }
    }
}

/// Clients of one port refused for their certificate since the last warning, and when that
/// warning was logged.
#[derive(Debug, Default)]
struct Refusals {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl Refusals {
    /// Counts a refusal at `now`. `Some(n)` when it is to be logged — the first ever, or the
    /// first [`REFUSAL_LOG_INTERVAL`] or more after the last line — with `n` the refusals the
    /// line stands for (this one and those left unlogged since the last line).
    fn record(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self
            .last_logged
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL)
        {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// A served connection: plain TCP, or TLS when the port has a [`ServerTls`].
pub type ServerStream = MaybeTls<TlsStream<TcpStream>>;

/// Runs the handshake on an accepted `stream` when `tls` is set; hands it back unchanged when
/// not. Failures are logged (refusals of a client certificate warned of) and counted by `tls`;
/// a connection closed before its first byte is [`HandshakeError::ClosedBeforeHandshake`],
/// counted apart.
pub async fn accept_tls(
    tls: Option<&ServerTls>,
    stream: TcpStream,
) -> Result<ServerStream, HandshakeError> {
    match tls {
        None => Ok(ServerStream::Plain(stream)),
        Some(tls) => Ok(ServerStream::Tls(Box::new(tls.accept_tcp(stream).await?))),
    }
}

/// Polls the files every `every` until the resolver is gone. A changed pair that loads is
/// swapped in; one that does not is logged once (per distinct content) and the old stays.
async fn watch(
    current: Weak<Current>,
    metrics: TlsMetrics,
    mut last: (Option<Vec<u8>>, Option<Vec<u8>>),
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    provider: Arc<CryptoProvider>,
) {
    // A certificate file is a few KB on a local disk: reading it inline is cheaper than a hop
    // to a blocking thread.
    loop {
        tokio::time::sleep(every).await;
        let Some(current) = current.upgrade() else {
            return;
        };
        let now = (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
        if now.0.is_none() || now.1.is_none() || now == last {
            continue;
        }
        let loaded = match (&now.0, &now.1) {
            (Some(c), Some(k)) => pair_from_pem(c, k, &cert, &key, &provider),
            _ => continue,
        };
        last = now;
        match loaded {
            Ok(pair) => {
                metrics.served(&pair.cert, Some(&cert));
                current.0.store(Arc::new(pair));
                metrics
                    .reloads
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                metrics
                    .reloads
                    .get_or_create(&ResultLabels { result: "error" })
                    .inc();
                tracing::warn!(
                    error = %crate::ErrorChain(&e),
                    "TLS certificate reload rejected; the previous certificate stays in force"
                );
            }
        }
    }
}

/// A client CA file being polled: its path, its bytes as last read, and the ALPN of the
/// configurations built with it.
struct ClientCaFile {
    path: PathBuf,
    last: Vec<u8>,
    alpn: Vec<Vec<u8>>,
}

/// Polls the client CA bundle every `every` until the port's TLS is gone. A changed bundle
/// that loads gives new handshakes a configuration verifying against it; one that does not is
/// logged once (per distinct content) and the old stays. Counted with the certificate reloads.
async fn watch_client_ca(
    live: Weak<Live>,
    metrics: TlsMetrics,
    mut file: ClientCaFile,
    every: Duration,
    provider: Arc<CryptoProvider>,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(live) = live.upgrade() else {
            return;
        };
        // A file missing or half replaced for a moment: wait for the next poll.
        let Ok(now) = std::fs::read(&file.path) else {
            continue;
        };
        if now == file.last {
            continue;
        }
        let loaded = verifier_from_pem(&now, &file.path, &provider).and_then(|verifier| {
            server_config(&provider, Some(verifier), &live.current, &file.alpn)
        });
        file.last = now;
        let result = match loaded {
            Ok(config) => {
                live.config.store(Arc::new(config));
                tracing::info!(client_ca = %file.path.display(), "TLS client CA bundle reloaded");
                "ok"
            }
            Err(e) => {
                tracing::warn!(
                    error = %crate::ErrorChain(&e),
                    "TLS client CA bundle reload rejected; the previous bundle stays in force"
                );
                "error"
            }
        };
        metrics
            .reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Loads a certificate chain and its key from PEM files, checking that they belong together.
pub fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    pair_from_pem(&read(cert)?, &read(key)?, cert, key, provider)
}

fn pair_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert_pem, cert)?;
    let der = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(k) => k,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => {
            return Err(TlsError::NoPrivateKey {
                path: key.to_owned(),
            });
        }
        Err(source) => {
            return Err(TlsError::Pem {
                path: key.to_owned(),
                source,
            });
        }
    };
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|source| TlsError::Key {
            path: key.to_owned(),
            source,
        })?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(pair)
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert: cert.to_owned(),
            key: key.to_owned(),
        }),
        Err(source) => Err(TlsError::Certificate {
            path: cert.to_owned(),
            source,
        }),
    }
}

/// Every `CERTIFICATE` block of a PEM file, in order; at least one.
fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn self_signed(names: &[String], provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let generated =
        rcgen::generate_simple_self_signed(names.to_vec()).map_err(TlsError::SelfSigned)?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(TlsError::Config)?;
    Ok(CertifiedKey::new(
        vec![generated.cert.der().clone()],
        signing,
    ))
}

/// The trust roots in `ca_file` (PEM, one or more certificates).
pub fn ca_roots(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    roots_from_pem(&read(ca_file)?, ca_file)
}

fn roots_from_pem(pem: &[u8], path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certificates(pem, path)? {
        roots.add(ca).map_err(|source| TlsError::CaCertificate {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(roots)
}

/// The verifier of client certificates chained to a CA in `ca_file` (PEM, one or more
/// certificates), as a port with [`ServerTlsOptions::client_ca`] uses it: a client must present
/// one. For checking the file without serving (`--check`).
pub fn client_verifier(ca_file: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    verifier_from_pem(&read(ca_file)?, ca_file, &provider())
}

fn verifier_from_pem(
    pem: &[u8],
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = roots_from_pem(pem, path)?;
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|source| TlsError::ClientCa {
            path: path.to_owned(),
            source,
        })
}

/// The TLS client configuration for model servers whose certificates are signed by a CA in
/// `ca_file` (PEM, one or more certificates), verifying `server_name` (a DNS name or an IP
/// address; `None`: the IP address connected to). ALPN offers `http/1.1` only: the gateway and
/// the scraper speak HTTP/1.1 to model servers.
pub fn client_tls(ca_file: &Path, server_name: Option<&str>) -> Result<ClientTls, TlsError> {
    let roots = ca_roots(ca_file)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = server_name
        .map(|n| {
            ServerName::try_from(n.to_owned()).map_err(|source| TlsError::ServerName {
                name: n.to_owned(),
                source,
            })
        })
        .transpose()?;
    Ok(ClientTls::new(Arc::new(config), name))
}

mod validity;

pub use validity::{Outside, Validity, unix_now};

#[cfg(test)]
mod tests;
