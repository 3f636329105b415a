//! `infergate bbr`: the Envoy ext_proc body-based router.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use infergate_extproc::bbr::{BbrConfig, ModelsFile};
use infergate_extproc::picker::DEFAULT_MAX_BODY_BYTES;
use infergate_extproc::run::run_bbr;
use tokio::net::TcpListener;

use super::picker::shutdown_signal;

/// Arguments of `infergate bbr`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Served models and their LoRA adapters (YAML map: model → list of adapters).
    #[arg(long)]
    pub models: PathBuf,
    /// ext_proc gRPC port.
    #[arg(long, default_value_t = 9004)]
    pub grpc_port: u16,
    /// gRPC health port; 0 disables it.
    #[arg(long, default_value_t = 9005)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port; 0 disables it.
    #[arg(long, default_value_t = 9090)]
    pub metrics_port: u16,
    /// Largest request body accepted (bytes); larger bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

async fn bind(port: u16) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Runs `infergate bbr`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let router = ModelsFile::load(&args.models)?.router()?;
    let grpc = bind(args.grpc_port).await?;
    let health = match args.grpc_health_port {
        0 => None,
        p => Some(bind(p).await?),
    };
    let metrics = match args.metrics_port {
        0 => None,
        p => Some(bind(p).await?),
    };
    tracing::info!(grpc = args.grpc_port, "body-based router listening");
    let config = BbrConfig {
        max_body_bytes: args.max_body_bytes,
        ..BbrConfig::default()
    };
    run_bbr(grpc, health, metrics, config, router, shutdown_signal()).await?;
    Ok(())
}
