//! `infergate global`: the global router over several clusters' gateways (`infergate_global`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use infergate_global::{GlobalConfig, Listeners};

use super::shutdown_signal;

/// Arguments of `infergate global`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file (YAML): clusters with their URLs, regions, costs and heartbeats;
    /// routing objective and policy; `auth`. Polled for changes (`reloadIntervalMs`) and
    /// reloaded; a file that does not validate is refused and the running configuration stays.
    #[arg(long, short, env = "INFERGATE_GLOBAL_CONFIG")]
    config: PathBuf,
    /// Front-door address; overrides `listen` in the file.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin address (`/metrics`, `/healthz`, `/readyz`); overrides `admin` in the file.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Check the configuration file and exit: every field parsed and validated (the error names
    /// the field), environment variables it names included (`quotas.redis.passwordEnv`), and
    /// that `accessLog.path` can be appended to (nothing is written). Files it names (keys,
    /// tokens, certificates) are not read and nothing is contacted, so a file rendered for a pod
    /// (e.g. by the Helm chart) can be checked anywhere.
    #[arg(long)]
    check: bool,
}

/// Runs `infergate global`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut config = GlobalConfig::from_file(&args.config).with_context(|| {
        format!(
            "invalid global router configuration {}",
            args.config.display()
        )
    })?;
    config
        .set_addresses(args.listen, args.admin)
        .context("--listen/--admin")?;
    if args.check {
        infergate_global::check_files(&config)?;
        tracing::info!(
            clusters = config.clusters.len(),
            "{} is valid",
            args.config.display()
        );
        return Ok(());
    }
    let http = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the front door on {}", config.listen))?;
    let admin = tokio::net::TcpListener::bind(config.admin)
        .await
        .with_context(|| format!("binding the admin port on {}", config.admin))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await.is_ok();
        }
    };
    let router = infergate_global::serve(
        config,
        Listeners {
            http,
            admin: Some(admin),
        },
        stopped(),
    )
    .await
    .context("starting the global router")?;
    if let Some(admin) = router.admin_addr() {
        tracing::info!(listen = %router.http_addr(), %admin, "global router serving");
    }
    // The file is polled for changes (`reloadIntervalMs`); `--listen`/`--admin` stay over it.
    let watcher = router
        .handle()
        .with_addresses(args.listen, args.admin)
        .watch_file(args.config.clone(), stopped());
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    router.wait().await;
    watcher.await.context("configuration watcher")?;
    Ok(())
}
