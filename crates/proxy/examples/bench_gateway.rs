//! The gateway for benchmarks: `infergate_proxy::serve` on a configuration file, without the
//! rest of the `infergate` binary (which builds every other role too).
//!
//! `cargo run --release -p infergate-proxy --example bench_gateway -- gateway.yaml`
#![allow(clippy::print_stdout, reason = "a command-line tool")]

use std::path::PathBuf;

use infergate_proxy::{GatewayConfig, Listeners, serve};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path: PathBuf = std::env::args()
        .nth(1)
        .ok_or("usage: bench_gateway CONFIG.yaml")?
        .into();
    let config = GatewayConfig::from_file(&path)?;
    let listeners = Listeners::bind(&config).await?;
    let gw = serve(config, listeners, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    println!("gateway listening on {}", gw.http_addr());
    gw.wait().await;
    Ok(())
}
