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
    /// routing objective and policy; `auth`.
    #[arg(long, short, env = "INFERGATE_GLOBAL_CONFIG")]
    config: PathBuf,
    /// Front-door address; overrides `listen` in the file.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin address (`/metrics`, `/healthz`, `/readyz`); overrides `admin` in the file.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Check the configuration file and exit: every field parsed and validated (the error names
    /// the field), environment variables it names included (`quotas.redis.passwordEnv`). Files
    /// it names (keys, tokens, certificates) are not read and nothing is contacted, so a file
    /// rendered for a pod (e.g. by the Helm chart) can be checked anywhere.
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
    let router = infergate_global::serve(
        config,
        Listeners {
            http,
            admin: Some(admin),
        },
        shutdown_signal(),
    )
    .await
    .context("starting the global router")?;
    if let Some(admin) = router.admin_addr() {
        tracing::info!(listen = %router.http_addr(), %admin, "global router serving");
    }
    router.wait().await;
    Ok(())
}
