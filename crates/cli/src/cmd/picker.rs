//! `infergate picker`: the Envoy ext_proc endpoint picker for one InferencePool.
//!
//! The picker runs on a runtime of its own, on a thread of its own: by default a current-thread
//! runtime (`--threads 1`), which costs about 10% less CPU per request than a one-worker
//! multi-thread runtime and about 30% less than the two workers the binary's default runtime has
//! on a 2-core node (`docs/benchmarks.md`, ext_proc section); `--threads N` gives it a
//! multi-thread runtime with N workers. Metric scrapes have a thread of their own either way.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use infergate_extproc::discovery::kubernetes::membership;
use infergate_extproc::discovery::static_file::EndpointsFile;
use infergate_extproc::picker::{DEFAULT_MAX_BODY_BYTES, PickerConfig};
use infergate_extproc::run::{
    Membership, PickerListeners, PoolConfig, SchedulerConfig, load_scheduler_config, run_picker,
};
use tokio::net::TcpListener;

/// Arguments of `infergate picker`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The InferencePool this picker serves.
    #[arg(long, env = "POOL_NAME", default_value = "default")]
    pub pool_name: String,
    /// The InferencePool's namespace.
    #[arg(long, env = "POOL_NAMESPACE", default_value = "default")]
    pub pool_namespace: String,
    /// Scheduler configuration (YAML: `preset: infergate`, or explicit weights).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Static discovery: a YAML list of endpoints. Without it, pods are discovered in Kubernetes.
    #[arg(long)]
    pub endpoints_file: Option<PathBuf>,
    /// ext_proc gRPC port.
    #[arg(long, default_value_t = 9002)]
    pub grpc_port: u16,
    /// gRPC health port (`liveness`, `readiness`, and the ext_proc service).
    #[arg(long, default_value_t = 9003)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, default_value_t = 9090)]
    pub metrics_port: u16,
    /// Largest request body accepted (bytes); larger bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Rewrite a model name on the way in, `REQUESTED=SERVED` (repeatable); responses get the
    /// requested name back.
    #[arg(long = "model-rewrite", value_name = "REQUESTED=SERVED")]
    pub model_rewrites: Vec<String>,
    /// Engine of pods without the `inference.networking.k8s.io/engine-type` label.
    #[arg(long)]
    pub default_engine: Option<String>,
    /// Seed of the scheduler's tie-breaking random generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads serving ext_proc: 1 is a single-threaded runtime (the cheapest per request); more
    /// give a multi-thread runtime with that many workers.
    #[arg(long, env = "INFERGATE_PICKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
}

/// The name of the picker's runtime threads.
const PICKER_THREAD: &str = "infergate-picker";

async fn bind(port: u16) -> anyhow::Result<TcpListener> {
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
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

/// Runs `infergate picker` on its own runtime (see the module documentation) until it stops.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let runtime = match args.threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
    }
    .enable_all()
    .thread_name(PICKER_THREAD)
    .build()
    .context("cannot start the picker's runtime")?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(PICKER_THREAD.to_owned())
        .spawn(move || {
            let _ = done.send(runtime.block_on(serve(args)));
        })
        .context("cannot start the picker's thread")?;
    finished.await.context("the picker's thread stopped")?
}

/// Everything the picker does, on the runtime `run` gives it.
async fn serve(args: Args) -> anyhow::Result<()> {
    let scheduler = match &args.config {
        Some(path) => load_scheduler_config(path)?,
        None => SchedulerConfig::default(),
    };
    let membership = match &args.endpoints_file {
        Some(path) => Membership::Static(EndpointsFile::load(path)?),
        None => membership(
            args.pool_namespace.clone(),
            args.pool_name.clone(),
            args.default_engine.clone(),
        )
        .await
        .context("Kubernetes discovery needs cluster access (or pass --endpoints-file)")?,
    };
    let listeners = PickerListeners {
        grpc: bind(args.grpc_port).await?,
        health: bind(args.grpc_health_port).await?,
        metrics: bind(args.metrics_port).await?,
    };
    tracing::info!(
        pool = %args.pool_name,
        grpc = args.grpc_port,
        health = args.grpc_health_port,
        metrics = args.metrics_port,
        "endpoint picker listening"
    );
    let mut model_rewrites = std::collections::HashMap::new();
    for r in &args.model_rewrites {
        let (from, to) = r
            .split_once('=')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty())
            .with_context(|| format!("--model-rewrite `{r}`: expected REQUESTED=SERVED"))?;
        model_rewrites.insert(from.to_owned(), to.to_owned());
    }
    let picker = PickerConfig {
        pool_name: args.pool_name,
        model_rewrites,
        max_body_bytes: args.max_body_bytes,
        ..PickerConfig::default()
    };
    let pool = PoolConfig {
        scheduler,
        seed: args.seed,
        ..PoolConfig::default()
    };
    run_picker(listeners, picker, pool, membership, shutdown_signal()).await?;
    Ok(())
}
