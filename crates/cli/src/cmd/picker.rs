//! `infergate picker`: the Envoy ext_proc endpoint picker for one InferencePool.
//!
//! The picker runs on a runtime of its own, on a thread of its own: by default a current-thread
//! runtime (`--threads 1`), which costs about 10% less CPU per request than a one-worker
//! multi-thread runtime and about 30% less than the two workers the binary's default runtime has
//! on a 2-core node (`docs/benchmarks.md`, ext_proc section); `--threads N` gives it a
//! multi-thread runtime with N workers. Metric scrapes have a thread of their own either way.

use anyhow::Context as _;
use infergate_extproc::canary::{RELOAD_INTERVAL, RewriteTable};
use infergate_extproc::discovery::kubernetes::membership;
use infergate_extproc::discovery::static_file::EndpointsFile;
use infergate_extproc::picker::PickerConfig;
use infergate_extproc::run::{
    Membership, PickerListeners, PoolConfig, SchedulerConfig, ext_proc_tls, load_scheduler_config,
    run_picker,
};

use super::{bind, shutdown_signal};

/// Arguments of `infergate picker` (shared with the operator that renders them).
pub use infergate_extproc::args::PickerArgs as Args;

/// The name of the picker's runtime threads.
const PICKER_THREAD: &str = "infergate-picker";

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
    let tls = ext_proc_tls(args.tls()).context("the ext_proc port's TLS certificate")?;
    let listeners = PickerListeners {
        grpc: bind(args.listen_address, args.grpc_port).await?,
        health: bind(args.listen_address, args.grpc_health_port).await?,
        metrics: bind(args.listen_address, args.metrics_port).await?,
        tls,
    };
    tracing::info!(
        pool = %args.pool_name,
        tls = listeners.tls.is_some(),
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
    // Read once before serving (a bad file stops the start), then followed for changes.
    let rewrites = match &args.rewrites {
        Some(path) => {
            let table = RewriteTable::new(RewriteTable::read_file(path)?);
            table.watch(path.clone(), RELOAD_INTERVAL, std::future::pending());
            table
        }
        None => RewriteTable::default(),
    };
    let quotas = match &args.quotas {
        Some(path) => Some(
            infergate_extproc::run::load_quotas(path)
                .with_context(|| format!("--quotas {}", path.display()))?,
        ),
        None => None,
    };
    let flow_control = match &args.flow_control {
        Some(path) => Some(
            infergate_extproc::run::load_flow_settings(path)
                .with_context(|| format!("--flow-control {}", path.display()))?,
        ),
        None => None,
    };
    let picker = PickerConfig {
        pool_name: args.pool_name,
        model_rewrites,
        quotas,
        flow_control,
        rewrites,
        max_body_bytes: args.max_body_bytes,
        explain_header: args.explain_header,
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
