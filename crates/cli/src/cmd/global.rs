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
    #[arg(long, value_parser = address)]
    listen: Option<SocketAddr>,
    /// Admin address (`/metrics`, `/healthz`, `/readyz`); overrides `admin` in the file.
    #[arg(long, value_parser = address)]
    admin: Option<SocketAddr>,
    /// Check the configuration file and exit: every field parsed and validated (the error names
    /// the field), environment variables it names included (`quotas.redis.passwordEnv`), and
    /// every file it names read as the start reads it — the front door's `tls` certificate, key
    /// and client CA bundle, the API key file, each cluster's token, `tls.caFile`,
    /// `tls.certFile` and `tls.keyFile` — and `accessLog.path` opened for appending (nothing is
    /// written). Nothing is contacted.
    #[arg(long)]
    check: bool,
    /// With `--check`: read none of the files the configuration names (certificates, keys, CA
    /// bundles, tokens, API keys, the access log), for a file rendered for a pod whose Secrets
    /// are not mounted where it is checked (the Helm chart's check).
    #[arg(long, requires = "check")]
    no_files: bool,
}

/// `--listen` and `--admin` read as the file's `listen` and `admin` are: a port alone or a host
/// name is refused saying what to write, where clap said only "invalid socket address syntax".
fn address(text: &str) -> Result<SocketAddr, serde::de::value::Error> {
    use serde::de::IntoDeserializer;
    infergate_pool::address::deserialize(text.into_deserializer())
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
        // The start's warnings, and the files read as the start reads them, refused with the
        // start's own error: a file called valid here does not stop the router at start.
        infergate_global::check(&config, !args.no_files)?;
        let unread = if args.no_files {
            " (--no-files: the files it names were not read)"
        } else {
            ""
        };
        tracing::info!(
            clusters = config.clusters.len(),
            "{} is valid{unread}",
            args.config.display()
        );
        return Ok(());
    }
    let http = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| {
            format!(
                "binding the front door on {} (`listen`, or --listen)",
                config.listen
            )
        })?;
    let admin = tokio::net::TcpListener::bind(config.admin)
        .await
        .with_context(|| {
            format!(
                "binding the admin port on {} (`admin`, or --admin)",
                config.admin
            )
        })?;
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
