//! The `infergate operator` process: client, admin port, leader election, controller; it stops
//! when the caller's shutdown future completes.
//!
//! The admin port speaks HTTPS whenever `/metrics` is behind a token ([`MetricsTls`]), so the
//! scraper's bearer token never crosses the pod network in clear: with a certificate from files
//! (a Secret, e.g. cert-manager's, reloaded when it changes) or, without one, a self-signed
//! certificate made at start, as controller-runtime's secure metrics serve.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use infergate_pool::admin;
use infergate_pool::tls::{ALPN_HTTP, Certificate, ServerTls, ServerTlsOptions, port};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::Error;
use crate::leader::Elector;
use crate::metrics::Metrics;
use crate::metrics_auth::{MetricsAuth, ScrapeAuthorizer};
use crate::reconcile::{self, Context};
use crate::render::RenderOptions;
use crate::scope::WatchScope;

/// Settings of the operator process.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Render settings (the image the BBR and pickers run).
    pub render: RenderOptions,
    /// Every namespace, or only those of `--watch-namespaces`.
    pub scope: WatchScope,
    /// Elect a leader through a Lease; off only for a single replica during development.
    pub leader_election: bool,
    /// Namespace of the Lease (the operator's own namespace).
    pub lease_namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// Lease duration; the leader renews every third of it.
    pub lease_duration: Duration,
    /// Who may read `/metrics` on the admin port.
    pub metrics_auth: MetricsAuth,
    /// Whether the admin port speaks HTTPS, and with which certificate.
    pub metrics_tls: MetricsTls,
}

/// How the admin port speaks (`--metrics-tls`, `--metrics-tls-cert-file`,
/// `--metrics-tls-key-file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsTls {
    /// Plain HTTP: `--metrics-auth=none` without a certificate, or `--metrics-tls=false`.
    Plain,
    /// HTTPS (HTTP/1.1 or h2 by ALPN) with this certificate: files reloaded when they change,
    /// or a self-signed one made at start.
    Https(Certificate),
}

impl MetricsTls {
    /// What the flags ask for. `tls` is `--metrics-tls` when given; `files` the certificate
    /// chain and key files; `names` the subject alternative names of a self-signed certificate.
    ///
    /// Certificate files mean HTTPS with them. Without them, HTTPS with a self-signed
    /// certificate when `--metrics-tls=true`, or when unset with `--metrics-auth=kubernetes`
    /// (scrapes carry a bearer token, which must not travel in clear); plain HTTP when
    /// `--metrics-tls=false`, or when unset with `--metrics-auth=none` (nothing secret is
    /// sent). Files with `--metrics-tls=false` are refused rather than one of them ignored.
    pub fn choose(
        auth: MetricsAuth,
        tls: Option<bool>,
        files: Option<(PathBuf, PathBuf)>,
        names: Vec<String>,
    ) -> Result<Self, Error> {
        match (tls, files) {
            (Some(false), Some(_)) => Err(Error::MetricsTlsConflict),
            (Some(false), None) => Ok(Self::Plain),
            (_, Some((cert, key))) => Ok(Self::Https(Certificate::Files { cert, key })),
            (Some(true), None) => Ok(Self::Https(Certificate::SelfSigned { names })),
            (None, None) => Ok(match auth {
                MetricsAuth::Kubernetes => Self::Https(Certificate::SelfSigned { names }),
                MetricsAuth::None => Self::Plain,
            }),
        }
    }

    /// The names a self-signed certificate carries: `localhost`, this replica's identity (its
    /// pod name) and the address the port is bound to unless it is every interface. A scraper
    /// of a self-signed certificate does not verify it; one that verifies is given a
    /// certificate (`--metrics-tls-cert-file`) for the Service's DNS name.
    pub fn self_signed_names(identity: &str, addr: SocketAddr) -> Vec<String> {
        let mut names = vec!["localhost".to_owned()];
        if !identity.is_empty() && identity != "localhost" {
            names.push(identity.to_owned());
        }
        if !addr.ip().is_unspecified() {
            names.push(addr.ip().to_string());
        }
        names
    }

    /// The port's TLS, loaded (`None` for plain HTTP): the files read and checked (then polled
    /// every [`infergate_pool::tls::DEFAULT_RELOAD_INTERVAL`], a changed pair served to new
    /// connections), or a certificate generated. Needs a tokio runtime for the polling.
    pub fn load(&self) -> Result<Option<ServerTls>, Error> {
        let Self::Https(certificate) = self else {
            return Ok(None);
        };
        let flags = match certificate {
            Certificate::Files { cert, key } => format!(
                "--metrics-tls-cert-file {}, --metrics-tls-key-file {}",
                cert.display(),
                key.display()
            ),
            Certificate::SelfSigned { names } => {
                format!("self-signed for {}", names.join(", "))
            }
        };
        ServerTls::new(
            certificate,
            &ServerTlsOptions::new(port::METRICS, &ALPN_HTTP),
        )
        .map(Some)
        .map_err(|source| Error::MetricsTls { flags, source })
    }
}

/// Runs the operator until `shutdown` completes (the CLI passes SIGTERM / Ctrl-C), or until
/// leadership is lost (an error, so the process exits and its pod restarts as a follower).
///
/// On `admin`, when given, `/metrics`, `/healthz` and `/readyz` are served by the admin server
/// every infergate process shares ([`infergate_pool::admin`]), until `shutdown`; `/metrics` only
/// to callers `opts.metrics_auth` lets in ([`serve_admin`]), over HTTPS as `opts.metrics_tls`
/// says. The port's certificate is loaded first: a bad file stops the start before anything is
/// asked of the cluster. The operator is ready as soon as it serves: a follower waiting for the
/// Lease is as ready as the leader.
pub async fn serve(
    opts: ServeOptions,
    admin: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let shutdown = shutdown.shared();
    let tls = match &admin {
        Some(_) => opts.metrics_tls.load()?,
        None => None,
    };
    let client = Client::try_default()
        .await
        .map_err(|cause| Error::NoCluster { cause })?;
    reconcile::preflight(&client, &opts.scope).await?;
    info!(scope = %opts.scope, "watching InferenceGatewayConfigs");
    let metrics = Metrics::default();
    let ctx = Arc::new(Context::new(
        client.clone(),
        opts.render.clone(),
        metrics.clone(),
    ));
    if let Some(listener) = admin {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let addr = listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        let scheme = match &opts.metrics_tls {
            MetricsTls::Plain => "http",
            MetricsTls::Https(Certificate::Files { .. }) => "https (certificate files)",
            MetricsTls::Https(Certificate::SelfSigned { .. }) => "https (self-signed)",
        };
        if let Some(tls) = &tls {
            tls.register(&mut registry);
        }
        let auth = match opts.metrics_auth {
            MetricsAuth::Kubernetes if tls.is_none() => {
                warn!(%addr, "serving /metrics over plain HTTP (--metrics-tls=false): scrapers' bearer tokens cross the network in clear");
                let auth = ScrapeAuthorizer::new(client.clone());
                auth.register(&mut registry);
                Some(Arc::new(auth))
            }
            MetricsAuth::Kubernetes => {
                info!(%addr, scheme, "serving /healthz and /readyz, and /metrics to bearer tokens allowed to get it");
                let auth = ScrapeAuthorizer::new(client.clone());
                auth.register(&mut registry);
                Some(Arc::new(auth))
            }
            MetricsAuth::None => {
                warn!(%addr, scheme, "serving /metrics without authentication (--metrics-auth=none)");
                None
            }
        };
        let server = serve_admin(listener, tls, Arc::new(registry), auth, shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!(error = %e, "admin server stopped");
            }
        });
    }
    let controller = reconcile::run(client.clone(), ctx, opts.scope.clone(), shutdown);
    if !opts.leader_election {
        controller.await;
        return Ok(());
    }
    let leases: Api<Lease> = Api::namespaced(client, &opts.lease_namespace);
    let elector = Elector::new(
        leases,
        &opts.lease_name,
        &opts.identity,
        opts.lease_duration,
    );
    info!(lease = %opts.lease_name, identity = %opts.identity, "waiting for leadership");
    elector.lead(controller, opts.lease_duration / 3).await
}

/// The operator's admin server on `listener` until `shutdown`: `/healthz` and `/readyz` open
/// (always ready), `/metrics` encoding `registry` for the callers `auth` lets in, or for anyone
/// without it (`--metrics-auth=none`); every path over TLS with `tls`, plain HTTP without.
pub async fn serve_admin(
    listener: TcpListener,
    tls: Option<ServerTls>,
    registry: Arc<Registry>,
    auth: Option<Arc<ScrapeAuthorizer>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    match auth {
        Some(auth) => {
            admin::serve_guarded(listener, tls, registry, || true, auth.guard(), shutdown).await
        }
        None => {
            let open = |_: &http::HeaderMap| std::future::ready(Ok(()));
            admin::serve_guarded(listener, tls, registry, || true, open, shutdown).await
        }
    }
}
