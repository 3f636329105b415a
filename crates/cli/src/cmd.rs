//! One module per subcommand. Each exposes `Args` (clap) and `async fn run(Args)`.

pub mod bbr;
pub mod bench;
pub mod crdgen;
pub mod delete_configs;
pub mod demo;
pub mod gateway;
pub mod global;
pub mod hash_key;
pub mod operator;
pub mod picker;
pub mod render;
pub mod sim;
pub mod tokenize;

use std::net::IpAddr;

use anyhow::Context as _;
use infergate_extproc::args::socket_addr;
use tokio::net::TcpListener;

/// Binds `port` on `host` (all interfaces when unset).
pub async fn bind(host: Option<IpAddr>, port: u16) -> anyhow::Result<TcpListener> {
    let addr = socket_addr(host, port);
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Resolves on Ctrl-C or SIGTERM (how Kubernetes stops a pod).
pub async fn shutdown_signal() {
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
