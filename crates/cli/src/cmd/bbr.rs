//! `infergate bbr`: the Envoy ext_proc body-based router.

use anyhow::Context as _;
use infergate_extproc::bbr::{BbrConfig, ModelsFile};
use infergate_extproc::run::{ext_proc_tls, run_bbr};

use super::{bind, shutdown_signal};

/// Arguments of `infergate bbr` (shared with the operator that renders them).
pub use infergate_extproc::args::BbrArgs as Args;

/// Runs `infergate bbr`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let router = ModelsFile::load(&args.models)?.router()?;
    let grpc = bind(args.listen_address, args.grpc_port).await?;
    let health = match args.grpc_health_port {
        0 => None,
        p => Some(bind(args.listen_address, p).await?),
    };
    let metrics = match args.metrics_port {
        0 => None,
        p => Some(bind(args.listen_address, p).await?),
    };
    let tls = ext_proc_tls(args.tls()).context("the ext_proc port's TLS certificate")?;
    tracing::info!(
        grpc = args.grpc_port,
        tls = tls.is_some(),
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
        config,
        router,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}
