//! `infergate gateway`: the standalone OpenAI-compatible gateway (`infergate_proxy`).
//!
//! It runs thread per core (`infergate_proxy::serve_workers`): `--workers` threads, each with its
//! own runtime, `SO_REUSEPORT` listener on the front-door address and upstream connections. The
//! runtime this command is called on carries the control plane: metrics scrapes, the admin port
//! and configuration reloads.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use infergate_proxy::{GatewayConfig, WorkerListeners, default_workers};

use super::shutdown_signal;

/// Arguments of `infergate gateway`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file (YAML): models, endpoints, scheduler presets, limits. It is watched
    /// and reloaded on change; a file that does not validate is rejected and the running
    /// configuration stays.
    #[arg(long, short, env = "INFERGATE_GATEWAY_CONFIG")]
    config: PathBuf,
    /// Front-door address; overrides `listen` in the file.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin address (`/metrics`, `/healthz`, `/readyz`, `/heartbeat`); overrides `admin` in the
    /// file.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Worker threads serving the front door (default: one per core).
    #[arg(long, env = "INFERGATE_GATEWAY_WORKERS", value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
    /// Check the configuration file and exit: every field, and every file it names (TLS
    /// certificate and key, CA files, the API key file, tokenizers) loaded as the start would,
    /// without binding a port or fetching the JWKS.
    #[arg(long)]
    check: bool,
}

/// Runs `infergate gateway`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut config = GatewayConfig::from_file(&args.config)
        .with_context(|| format!("invalid gateway configuration {}", args.config.display()))?;
    // Before `--check`, so that it checks the addresses the start would bind.
    config
        .set_addresses(args.listen, args.admin)
        .with_context(|| format!("invalid gateway configuration {}", args.config.display()))?;
    if args.check {
        // The files the configuration names too, read as the start reads them and refused with
        // the start's own error: a file called valid here does not stop the gateway at start.
        infergate_proxy::check_files(&config)?;
        tracing::info!(
            models = config.models.len(),
            "{} is valid",
            args.config.display()
        );
        return Ok(());
    }
    let workers = args.workers.map_or_else(default_workers, usize::from);
    let listeners = WorkerListeners::bind(config.listen, Some(config.admin), workers)
        .with_context(|| {
            format!(
                "binding the front door on {} ({workers} workers) and the admin port on {}",
                config.listen, config.admin
            )
        })?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let gateway = infergate_proxy::serve_workers(config, listeners, {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await.is_ok();
        }
    })
    .await?;
    let watcher = gateway.handle().watch_file(args.config.clone(), {
        let mut rx = stop_rx;
        async move {
            let _ = rx.wait_for(|s| *s).await.is_ok();
        }
    });
    shutdown_signal().await;
    tracing::info!("shutting down: no new connections; open requests finish");
    let _ = stop_tx.send(true);
    gateway.wait().await;
    watcher.await.context("configuration watcher")?;
    Ok(())
}
