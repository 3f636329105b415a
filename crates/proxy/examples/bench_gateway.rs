//! The gateway for benchmarks: `infergate_proxy::serve` on a configuration file, without the
//! rest of the `infergate` binary (which builds every other role too).
//!
//! `cargo run --release -p infergate-proxy --example bench_gateway -- gateway.yaml [WORKERS]`
//!
//! WORKERS is the number of tokio worker threads (default: one per core); `1` runs a
//! single-threaded runtime, like one nginx worker process.
#![allow(clippy::print_stdout, reason = "a command-line tool")]

use std::path::PathBuf;

use infergate_proxy::{GatewayConfig, Listeners, serve};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path: PathBuf = args
        .next()
        .ok_or("usage: bench_gateway CONFIG.yaml [WORKERS]")?
        .into();
    let workers: usize = match args.next() {
        Some(w) => w.parse()?,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let runtime = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?
    };
    runtime.block_on(run(path))
}

async fn run(path: PathBuf) -> Result<(), Box<dyn std::error::Error>> {
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
