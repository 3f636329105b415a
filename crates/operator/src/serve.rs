//! The `infergate operator` process: client, leader election, controller, shutdown on signal.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tracing::info;

use crate::Error;
use crate::leader::Elector;
use crate::metrics::Metrics;
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
    /// Where to serve `/metrics` and `/healthz`; nowhere when `None`.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Runs the operator until SIGTERM / Ctrl-C, or until leadership is lost (an error, so the
/// process exits and its pod restarts as a follower).
pub async fn serve(opts: ServeOptions) -> Result<(), Error> {
    let client = Client::try_default().await?;
    let metrics = Metrics::default();
    let ctx = Arc::new(Context::new(
        client.clone(),
        opts.render.clone(),
        metrics.clone(),
    ));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = tx.send(());
        let _ = stop_metrics.send(());
    });
    if let Some(addr) = opts.metrics_addr {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(Error::Io)?;
        info!(%addr, "serving /metrics and /healthz");
        tokio::spawn(crate::metrics::serve_http(
            listener,
            Arc::new(registry),
            async move {
                let _ = metrics_stopped.await;
            },
        ));
    }
    let shutdown = async move {
        let _ = rx.await;
    };
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

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
