//! `infergate bbr`: the Envoy ext_proc body-based router.

use anyhow::Context as _;
use infergate_extproc::bbr::{BbrConfig, ModelsFile};
use infergate_extproc::run::run_bbr;

use super::picker::{bind_port, metrics_tls_from_flags, tls_from_flags};
use super::shutdown_signal;

/// Arguments of `infergate bbr` (shared with the operator that renders them).
pub use infergate_extproc::args::BbrArgs as Args;

/// Runs `infergate bbr`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let router = ModelsFile::load(&args.models)
        .and_then(|m| m.router())
        .with_context(|| format!("--models {}", args.models.display()))?;
    let grpc = bind_port(args.listen_address, "--grpc-port", args.grpc_port).await?;
    let health = match args.grpc_health_port {
        0 => None,
        p => Some(bind_port(args.listen_address, "--grpc-health-port", p).await?),
    };
    let metrics = match args.metrics_port {
        0 => None,
        p => Some(bind_port(args.listen_address, "--metrics-port", p).await?),
    };
    let tls = tls_from_flags(args.tls(), args.tls_flags.tls_client_ca_file.as_deref())?;
    let metrics_files = args.metrics_tls();
    if metrics.is_none() && metrics_files.is_some() {
        anyhow::bail!(
            "--metrics-tls-cert-file: the metrics port is off (--metrics-port 0); give it a port \
             or drop the --metrics-tls-* flags"
        );
    }
    let metrics_tls = metrics_tls_from_flags(metrics_files)?;
    // The addresses bound, as the picker's start line gives them (`off`: port 0).
    let addr = |l: &Option<tokio::net::TcpListener>| {
        l.as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or_else(|| "off".to_owned(), |a| a.to_string())
    };
    tracing::info!(
        tls = tls.is_some(),
        metrics_tls = metrics_tls.is_some(),
        grpc = %grpc.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        health = %addr(&health),
        metrics = %addr(&metrics),
        "body-based router listening"
    );
    let config = BbrConfig {
        max_body_bytes: args.max_body_bytes,
        ..BbrConfig::default()
    };
    run_bbr(
        grpc,
        tls,
        health,
        metrics,
        metrics_tls,
        config,
        router,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}
