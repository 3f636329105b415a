//! The `infergate operator` process: client, admin port, leader election, controller; it stops
//! when the caller's shutdown future completes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use infergate_pool::admin;
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

/// Settings of the operator process.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Render settings (the image the BBR and pickers run).
    pub render: RenderOptions,
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
}

/// Runs the operator until `shutdown` completes (the CLI passes SIGTERM / Ctrl-C), or until
/// leadership is lost (an error, so the process exits and its pod restarts as a follower).
///
/// On `admin`, when given, `/metrics`, `/healthz` and `/readyz` are served by the admin server
/// every infergate process shares ([`infergate_pool::admin`]), until `shutdown`; `/metrics` only
/// to callers `opts.metrics_auth` lets in ([`serve_admin`]). The operator is ready as soon as it
/// serves: a follower waiting for the Lease is as ready as the leader.
pub async fn serve(
    opts: ServeOptions,
    admin: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let shutdown = shutdown.shared();
    let client = Client::try_default()
        .await
        .map_err(|cause| Error::NoCluster { cause })?;
    reconcile::preflight(&client).await?;
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
        let auth = match opts.metrics_auth {
            MetricsAuth::Kubernetes => {
                info!(%addr, "serving /healthz and /readyz, and /metrics to bearer tokens allowed to get it");
                let auth = ScrapeAuthorizer::new(client.clone());
                auth.register(&mut registry);
                Some(Arc::new(auth))
            }
            MetricsAuth::None => {
                warn!(%addr, "serving /metrics without authentication (--metrics-auth=none)");
                None
            }
        };
        let server = serve_admin(listener, Arc::new(registry), auth, shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!(error = %e, "admin server stopped");
            }
        });
    }
    let controller = reconcile::run(client.clone(), ctx, shutdown);
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
/// without it (`--metrics-auth=none`).
pub async fn serve_admin(
    listener: TcpListener,
    registry: Arc<Registry>,
    auth: Option<Arc<ScrapeAuthorizer>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    match auth {
        Some(auth) => {
            admin::serve_guarded(listener, registry, || true, auth.guard(), shutdown).await
        }
        None => admin::serve(listener, registry, || true, shutdown).await,
    }
}
