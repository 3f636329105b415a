//! Connections to a cluster: TCP (`timeouts.connectMs`, no delay), then, for an `https://`
//! URL, a TLS handshake bounded by the same limit, ALPN `http/1.1`.
//!
//! Each cluster has its own [`Connector`] (its own trust roots and server name) and so its own
//! clients and connection pools ([`Clients`]). The certificate is verified against the system
//! roots, or only against the cluster's `tls.caFile` when it has one (as the gateway's
//! `models[].tls` does), and must carry the URL's host, or `tls.serverName`. With
//! `tls.certFile` and `tls.keyFile` the router presents that certificate when the cluster asks
//! for one (mutual TLS: a gateway with `tls.clientCaFile`). A `tls.caFile` or client
//! certificate rotated on disk gives the cluster new [`Clients`] ([`Clients::with_ca`],
//! [`Clients::with_identity`]): a connection made under the old one serves no new request.
//!
//! A handshake that fails (an unknown CA, a wrong name, a plaintext server) or does not finish
//! in time is a connect failure of the cluster, as a refused TCP connection is: the request
//! moves on to the next cluster, and [`failure`] is the one place that says so. So is a cluster
//! refusing the router's client certificate: with TLS 1.3 the router's side of the handshake
//! is over before the cluster has verified it, so the refusal is the alert that fails the
//! request's first read, before any answer (the cluster has read no request).

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use http::uri::Scheme;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::Client;
use crate::config::{ClusterConfig, is_loopback, parse_url, port_of};

/// A connection to a cluster, plain or TLS.
pub(crate) type Conn = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Why a connection to a cluster could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The TCP connection (refused, unreachable, `timeouts.connectMs`, DNS).
    #[error("TCP connect failed")]
    Tcp(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The TLS handshake failed; rustls' reason is the source (`invalid peer certificate:
    /// UnknownIssuer`, `received corrupt message` from a plaintext server, …).
    #[error("TLS handshake failed")]
    Tls(#[source] io::Error),
    /// The server accepted the TCP connection but did not finish the handshake in time.
    #[error("TLS handshake not completed within {} ms", .0.as_millis())]
    TlsTimeout(Duration),
    /// The URL's host cannot be verified as a TLS server name.
    #[error("`{0}` is not a TLS server name: set tls.serverName")]
    ServerName(String),
}

/// Why the TLS settings of a cluster cannot be built at start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// The `tls.caFile` bundle.
    #[error(transparent)]
    CaFile(#[from] infergate_pool::tls::TlsError),
    /// The client certificate (`tls.certFile`, `tls.keyFile`).
    #[error("the client certificate (tls.certFile, tls.keyFile)")]
    ClientCertificate(#[source] infergate_pool::tls::TlsError),
    /// rustls refused the configuration.
    #[error("TLS configuration refused")]
    Config(#[source] rustls::Error),
}

/// Opens connections to one cluster.
#[derive(Clone)]
pub(crate) struct Connector {
    http: HttpConnector,
    /// Built from `roots` and `identity`.
    tls: Arc<rustls::ClientConfig>,
    /// What the cluster's certificates are verified against (`tls.caFile`, or the system's).
    roots: Arc<RootCertStore>,
    /// The client certificate presented (`tls.certFile`, `tls.keyFile`).
    identity: Option<Arc<CertifiedKey>>,
    /// `tls.serverName`, else the URL's host.
    server_name: Option<ServerName<'static>>,
    handshake_timeout: Duration,
}

/// The system's trust roots, loaded once for every cluster without a `tls.caFile`.
pub(crate) struct SystemRoots(Option<Arc<RootCertStore>>);

impl SystemRoots {
    /// Nothing loaded yet: loaded on the first cluster that needs them.
    pub(crate) fn new() -> Self {
        SystemRoots(None)
    }

    fn roots(&mut self) -> Arc<RootCertStore> {
        if let Some(r) = &self.0 {
            return Arc::clone(r);
        }
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "cannot load some of the system's root certificates");
        }
        // A broken system certificate is skipped, as every client does.
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            tracing::warn!(
                "no system root certificate found: https:// clusters without tls.caFile will \
                 fail their handshakes (install ca-certificates, or give tls.caFile)"
            );
        }
        let roots = Arc::new(roots);
        self.0 = Some(Arc::clone(&roots));
        roots
    }
}

/// The TLS configuration of connections to a cluster: verified against `roots`, presenting
/// `identity` when asked for a client certificate; ALPN `http/1.1`.
fn client_config(
    roots: &Arc<RootCertStore>,
    identity: Option<&Arc<CertifiedKey>>,
) -> Result<Arc<rustls::ClientConfig>, SetupError> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(SetupError::Config)?
    .with_root_certificates(Arc::clone(roots));
    let mut config = match identity {
        Some(pair) => {
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(pair))))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Connector {
    /// The connector of `cluster`, presenting `identity` (its `tls.certFile` and `tls.keyFile`,
    /// see [`client_certificate`]): its `tls.caFile` is read now (an error names the file).
    pub(crate) fn new(
        cluster: &ClusterConfig,
        connect_timeout: Duration,
        system: &mut SystemRoots,
        identity: Option<Arc<CertifiedKey>>,
    ) -> Result<Connector, SetupError> {
        let tls = cluster.tls.as_ref();
        let server_name = tls
            .and_then(|t| t.server_name.as_deref())
            .and_then(|n| ServerName::try_from(n.to_owned()).ok());
        let roots = match tls.and_then(|t| t.ca_file.as_deref()) {
            Some(ca) => Arc::new(infergate_pool::tls::ca_roots(ca)?),
            None if uses_https(cluster) => system.roots(),
            // Never used: an http:// cluster opens no TLS.
            None => Arc::new(RootCertStore::empty()),
        };
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        // https:// URIs come here too; TLS is added below.
        http.enforce_http(false);
        Ok(Connector {
            http,
            tls: client_config(&roots, identity.as_ref())?,
            roots,
            identity,
            server_name,
            handshake_timeout: connect_timeout,
        })
    }

    /// This connector, its trust roots read again from `ca` (a rotated `tls.caFile`).
    fn with_ca(&self, ca: &Path) -> Result<Connector, SetupError> {
        let roots = Arc::new(infergate_pool::tls::ca_roots(ca)?);
        Ok(Connector {
            tls: client_config(&roots, self.identity.as_ref())?,
            roots,
            ..self.clone()
        })
    }

    /// This connector presenting `identity` (a rotated `tls.certFile` and `tls.keyFile`).
    fn with_identity(&self, identity: Arc<CertifiedKey>) -> Result<Connector, SetupError> {
        Ok(Connector {
            tls: client_config(&self.roots, Some(&identity))?,
            identity: Some(identity),
            ..self.clone()
        })
    }

    /// The cluster's clients: for requests (pooled keep-alive connections), and for its
    /// heartbeat and `/v1/models` fetches.
    pub(crate) fn clients(self) -> (Client, Client) {
        let client =
            hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(self.clone());
        // Heartbeats go over a new connection each time: a gateway whose listeners are gone
        // but whose open connections still answer (a process half way through dying) must fail
        // its heartbeat, and the fetch then times a real round trip, connect (and handshake)
        // included.
        let poll = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(self);
        (client, poll)
    }
}

/// A cluster's connector and the clients built on it, replaced together when its `tls.caFile`
/// is rotated (each client owns its connection pool: new clients, no connection made under the
/// old bundle).
pub(crate) struct Clients {
    /// Requests: pooled keep-alive connections.
    pub(crate) request: Client,
    /// Heartbeat and `/v1/models` fetches: a new connection each time.
    pub(crate) poll: Client,
    connector: Connector,
}

impl Clients {
    /// The clients of `connector`.
    pub(crate) fn new(connector: Connector) -> Clients {
        let (request, poll) = connector.clone().clients();
        Clients {
            request,
            poll,
            connector,
        }
    }

    /// New clients, with empty pools, whose connections are verified against the bundle in
    /// `ca` (read now); the other settings (timeouts, server name) stay.
    pub(crate) fn with_ca(&self, ca: &Path) -> Result<Clients, SetupError> {
        Ok(Clients::new(self.connector.with_ca(ca)?))
    }

    /// New clients, with empty pools, presenting `identity` as their client certificate; the
    /// other settings stay.
    pub(crate) fn with_identity(&self, identity: Arc<CertifiedKey>) -> Result<Clients, SetupError> {
        Ok(Clients::new(self.connector.with_identity(identity)?))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Conn;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        self.http
            .poll_ready(cx)
            .map_err(|e| ConnectError::Tcp(Box::new(e)))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let https = dst.scheme() == Some(&Scheme::HTTPS);
        let name = match (&self.server_name, https) {
            (Some(n), _) => Ok(n.clone()),
            (None, true) => server_name(&dst),
            // Not used.
            (None, false) => Ok(ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())),
        };
        let tcp = self.http.call(dst);
        let tls = TlsConnector::from(Arc::clone(&self.tls));
        let limit = self.handshake_timeout;
        Box::pin(async move {
            let tcp = tcp.await.map_err(|e| ConnectError::Tcp(Box::new(e)))?;
            if !https {
                return Ok(MaybeHttpsStream::Http(tcp));
            }
            let handshake = tls.connect(name?, TokioIo::new(tcp));
            match tokio::time::timeout(limit, handshake).await {
                Err(_) => Err(ConnectError::TlsTimeout(limit)),
                Ok(Err(e)) => Err(ConnectError::Tls(e)),
                Ok(Ok(stream)) => Ok(MaybeHttpsStream::from(stream)),
            }
        })
    }
}

/// The name `dst`'s certificate must carry: its host (a DNS name, or an IP address).
fn server_name(dst: &Uri) -> Result<ServerName<'static>, ConnectError> {
    let host = dst.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|_| ConnectError::ServerName(host.to_owned()))
}

/// Whether the cluster's URL or heartbeat is `https://`.
fn uses_https(cluster: &ClusterConfig) -> bool {
    std::iter::once(cluster.url.as_str())
        .chain(cluster.heartbeat_url.as_deref())
        .filter_map(|u| parse_url(u).ok())
        .any(|u| u.scheme() == Some(&Scheme::HTTPS))
}

/// Says at start how `cluster` is reached: the port (443 or 80 when the URL names none) and
/// what its certificate is verified against.
pub(crate) fn log_cluster(cluster: &ClusterConfig) {
    let Ok(url) = parse_url(&cluster.url) else {
        return;
    };
    let port = port_of(&url);
    if !uses_https(cluster) {
        tracing::info!(cluster = %cluster.name, url = %cluster.url, port, "cluster, plain HTTP");
        return;
    }
    let tls = cluster.tls.as_ref();
    let verified = match tls.and_then(|t| t.ca_file.as_deref()) {
        Some(ca) => format!("tls.caFile {}", ca.display()),
        None => "the system roots".to_owned(),
    };
    let presented = match client_certificate_files(cluster) {
        Some((cert, _)) => format!("tls.certFile {}", cert.display()),
        None => "none".to_owned(),
    };
    tracing::info!(
        cluster = %cluster.name,
        url = %cluster.url,
        port,
        server_name = tls.and_then(|t| t.server_name.as_deref()).unwrap_or("the URL's host"),
        verified_against = %verified,
        client_certificate = %presented,
        "cluster, HTTPS"
    );
}

/// Whether `cluster`'s bearer token would cross a network in plaintext: a token sent to an
/// `http://` URL whose host is not this machine.
pub(crate) fn token_in_plaintext(cluster: &ClusterConfig) -> bool {
    cluster.credentials.is_some()
        && parse_url(&cluster.url)
            .is_ok_and(|u| u.scheme() == Some(&Scheme::HTTP) && !is_loopback(&u))
}

/// Warns of what `cluster`'s entry exposes, as the start (or the reload that adds the cluster)
/// and `infergate global --check` both do: a bearer token sent in plaintext
/// ([`token_in_plaintext`]). Not refused: a private network or a mesh may encrypt it.
pub(crate) fn warn_of(cluster: &ClusterConfig) {
    if token_in_plaintext(cluster) {
        tracing::warn!(
            cluster = %cluster.name,
            url = %cluster.url,
            "credentials.bearerTokenFile is sent to an http:// URL off this machine: the token \
             (and every prompt and answer) crosses the network in plaintext; use https:// \
             unless the network or a mesh encrypts it"
        );
    }
}

/// What a failed request to a cluster says about it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection could be opened: TCP, or the TLS handshake (`tls` names why).
    Connect {
        /// The TLS failure and rustls' reason (`TLS handshake failed: invalid peer
        /// certificate: UnknownIssuer`), when it was TLS.
        tls: Option<String>,
    },
    /// The connection was open and the exchange failed before the response headers.
    Exchange,
}

/// Classifies a failed request: the one place that decides what counts as a connect failure
/// (fail over, count as a failed heartbeat and toward outlier detection).
pub(crate) fn failure(e: &hyper_util::client::legacy::Error) -> Failure {
    if !e.is_connect() {
        // A fatal TLS alert before the response headers: the cluster ended the handshake
        // after the router's side of it was over (TLS 1.3), refusing its client certificate
        // (`CertificateRequired`, `UnknownCA`, …). It read no request: a connect failure.
        return match rustls_error(e).filter(|r| matches!(r, rustls::Error::AlertReceived(_))) {
            Some(alert) => Failure::Connect {
                tls: Some(with_remedy(format!("TLS handshake failed: {alert}"), alert)),
            },
            None => Failure::Exchange,
        };
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            let tls = match c {
                ConnectError::Tcp(_) => None,
                other => {
                    let why = infergate_pool::ErrorChain(other).to_string();
                    Some(match rustls_error(other) {
                        Some(r) => with_remedy(why, r),
                        None => why,
                    })
                }
            };
            return Failure::Connect { tls };
        }
        source = s.source();
    }
    Failure::Connect { tls: None }
}

/// What to change when the TLS handshake of a failed request was refused for a reason a
/// setting causes (see [`remedy`]): for the heartbeat's and `/v1/models`' messages, which name
/// the failure by its error chain rather than through [`failure`].
pub(crate) fn remedy_of(e: &hyper_util::client::legacy::Error) -> Option<&'static str> {
    rustls_error(e).and_then(remedy)
}

/// The rustls error somewhere in `e`'s causes (an IO error carrying it, or itself).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut source = Some(e);
    while let Some(s) = source {
        // An IO error's `source()` skips the error it carries: look into it.
        let inner = s
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if let Some(r) = inner.or_else(|| s.downcast_ref()) {
            return Some(r);
        }
        source = s.source();
    }
    None
}

/// `why`, followed by what to change when rustls' reason is one a configuration causes: the
/// 502 and the warning then say what to do, not only what failed.
fn with_remedy(why: String, e: &rustls::Error) -> String {
    match remedy(e) {
        Some(remedy) => format!("{why} ({remedy})"),
        None => why,
    }
}

/// What to change for a handshake refused for `e`, when a setting of the router or the
/// cluster's gateway causes it.
fn remedy(e: &rustls::Error) -> Option<&'static str> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error};
    Some(match e {
        Error::InvalidCertificate(Cert::UnknownIssuer) => {
            "the cluster's certificate is not issued by a CA the router trusts: put that CA in \
             the cluster's tls.caFile"
        }
        Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            "the cluster's certificate does not carry the URL's host: set the cluster's \
             tls.serverName to a name it carries"
        }
        Error::InvalidCertificate(
            Cert::Expired
            | Cert::ExpiredContext { .. }
            | Cert::NotValidYet
            | Cert::NotValidYetContext { .. },
        ) => "the cluster's certificate is outside its validity period: renew it",
        Error::AlertReceived(Alert::CertificateRequired) => {
            "the cluster asks for a client certificate: set the cluster's tls.certFile and \
             tls.keyFile"
        }
        Error::AlertReceived(Alert::UnknownCA | Alert::BadCertificate) => {
            "the cluster does not trust the router's client certificate: issue tls.certFile \
             from a CA in the gateway's tls.clientCaFile"
        }
        Error::AlertReceived(Alert::CertificateExpired) => {
            "the cluster refused the router's client certificate as expired: renew tls.certFile"
        }
        // The alert rustls sends for a certificate whose extended key usage does not allow its
        // use: a server's certificate presented as the router's, the usual mistake.
        Error::AlertReceived(Alert::UnsupportedCertificate) => {
            "the cluster does not accept the router's client certificate for client \
             authentication: issue tls.certFile with extendedKeyUsage clientAuth, or none, from \
             a CA in the gateway's tls.clientCaFile"
        }
        Error::InvalidCertificate(Cert::InvalidPurpose | Cert::InvalidPurposeContext { .. }) => {
            "the cluster's certificate is not issued for server authentication: reissue it with \
             extendedKeyUsage serverAuth, or none"
        }
        _ => return None,
    })
}

/// The cluster's `tls.certFile` and `tls.keyFile`, when it presents a client certificate.
pub(crate) fn client_certificate_files(cluster: &ClusterConfig) -> Option<(&Path, &Path)> {
    let tls = cluster.tls.as_ref()?;
    Some((tls.cert_file.as_deref()?, tls.key_file.as_deref()?))
}

/// Reads the cluster's client certificate and key (`None`: it presents none), checking that
/// they belong together.
pub(crate) fn client_certificate(
    cluster: &ClusterConfig,
) -> Option<Result<Arc<CertifiedKey>, infergate_pool::tls::TlsError>> {
    let (cert, key) = client_certificate_files(cluster)?;
    let provider = rustls::crypto::ring::default_provider();
    Some(infergate_pool::tls::load_pair(cert, key, &provider).map(Arc::new))
}

/// The cluster's `tls.caFile`, which [`crate::Error::ClusterTls`] names.
pub(crate) fn ca_file(cluster: &ClusterConfig) -> Option<PathBuf> {
    cluster.tls.as_ref().and_then(|t| t.ca_file.clone())
}

#[cfg(test)]
mod tests;
