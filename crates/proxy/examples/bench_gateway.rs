//! The gateway for benchmarks: the same thread-per-core `infergate_proxy::serve_workers` that
//! `infergate gateway` runs, on a configuration file, without the rest of the `infergate` binary
//! (which builds every other role too).
//!
//! `cargo run --release -p infergate-proxy --example bench_gateway -- gateway.yaml [WORKERS] [--shared]`
//!
//! WORKERS is the number of worker threads (default: one per core). `--shared` instead runs
//! `infergate_proxy::serve`, one accept loop on a multi-threaded tokio runtime with WORKERS
//! threads, to compare the two designs on the same request path.
#![allow(clippy::print_stdout, reason = "a command-line tool")]

use std::path::PathBuf;

use infergate_proxy::{GatewayConfig, Listeners, WorkerListeners, default_workers};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut path = None;
    let mut workers = None;
    let mut shared = false;
    for a in std::env::args().skip(1) {
        if a == "--shared" {
            shared = true;
        } else if path.is_none() {
            path = Some(PathBuf::from(a));
        } else {
            workers = Some(a.parse::<usize>()?);
        }
    }
    let path = path.ok_or("usage: bench_gateway CONFIG.yaml [WORKERS] [--shared]")?;
    let workers = workers.unwrap_or_else(default_workers).max(1);
    let config = GatewayConfig::from_file(&path)?;
    if shared {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?;
        return runtime.block_on(async {
            let listeners = Listeners::bind(&config).await?;
            let gw = infergate_proxy::serve(config, listeners, ctrl_c()).await?;
            println!(
                "gateway (one shared runtime, {workers} threads) on {}",
                gw.http_addr()
            );
            gw.wait().await;
            Ok(())
        });
    }
    // As `infergate gateway`: the workers run their own runtimes; this one runs the control
    // plane (scrapers, admin server).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listeners = WorkerListeners::bind(config.listen, Some(config.admin), workers)?;
        let gw = infergate_proxy::serve_workers(config, listeners, ctrl_c()).await?;
        println!("gateway ({workers} workers) on {}", gw.http_addr());
        gw.wait().await;
        Ok(())
    })
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}
