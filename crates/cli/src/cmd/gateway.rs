//! `infergate gateway`: the standalone OpenAI-compatible gateway (`infergate_proxy`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use infergate_proxy::{GatewayConfig, Listeners};
use tokio::net::TcpListener;

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
    /// Admin address (`/metrics`, `/healthz`, `/readyz`); overrides `admin` in the file.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Check the configuration file and exit.
    #[arg(long)]
    check: bool,
}

/// Runs `infergate gateway`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut config = GatewayConfig::from_file(&args.config)
        .with_context(|| format!("invalid gateway configuration {}", args.config.display()))?;
    if args.check {
        tracing::info!(
            models = config.models.len(),
            "{} is valid",
            args.config.display()
        );
        return Ok(());
    }
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(a) = args.admin {
        config.admin = a;
    }
    let listeners = Listeners {
        http: TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding the front door on {}", config.listen))?,
        admin: Some(
            TcpListener::bind(config.admin)
                .await
                .with_context(|| format!("binding the admin port on {}", config.admin))?,
        ),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let gateway = infergate_proxy::serve(config, listeners, {
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

/// Ctrl-C, or SIGTERM on Unix (what Kubernetes and systemd send).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
