//! `infergate picker`: the Envoy ext_proc endpoint picker for one InferencePool.
//!
//! The picker runs on a runtime of its own, on a thread of its own: by default a current-thread
//! runtime (`--threads 1`), which costs about 10% less CPU per request than a one-worker
//! multi-thread runtime and about 30% less than the two workers the binary's default runtime has
//! on a 2-core node (`docs/benchmarks.md`, ext_proc section); `--threads N` gives it a
//! multi-thread runtime with N workers. Metric scrapes have a thread of their own either way.

use anyhow::Context as _;
use infergate_extproc::args::MetricsTlsFiles;
use infergate_extproc::canary::{RELOAD_INTERVAL, RewriteTable};
use infergate_extproc::discovery::kubernetes::membership;
use infergate_extproc::discovery::static_file::EndpointsFile;
use infergate_extproc::picker::PickerConfig;
use infergate_extproc::run::{
    Membership, PickerListeners, PoolConfig, SchedulerConfig, ext_proc_tls, load_scheduler_config,
    metrics_tls, run_picker,
};

use std::time::Duration;

use infergate_extproc::args::{PEER_PORT, socket_addr};
use infergate_pool::peers::wire::MIN_KEY_LEN;
use infergate_pool::peers::{DEFAULT_KEEPALIVE, PeerKey, PeerSettings, PeerTarget};

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
        Some(path) => {
            load_scheduler_config(path).with_context(|| format!("--config {}", path.display()))?
        }
        None => SchedulerConfig::default(),
    };
    let membership = match &args.endpoints_file {
        Some(path) => Membership::Static(
            EndpointsFile::load(path, args.default_engine.as_deref())
                .with_context(|| format!("--endpoints-file {}", path.display()))?,
        ),
        None => membership(
            args.pool_namespace.clone(),
            args.pool_name.clone(),
            args.default_engine.clone(),
        )
        .await
        .context("Kubernetes discovery needs cluster access (or pass --endpoints-file)")?,
    };
    let tls = tls_from_flags(args.tls(), args.tls_flags.tls_client_ca_file.as_deref())?;
    let metrics_tls = metrics_tls_from_flags(args.metrics_tls())?;
    let listeners = PickerListeners {
        grpc: bind_port(args.listen_address, "--grpc-port", args.grpc_port).await?,
        health: bind_port(
            args.listen_address,
            "--grpc-health-port",
            args.grpc_health_port,
        )
        .await?,
        metrics: bind_port(args.listen_address, "--metrics-port", args.metrics_port).await?,
        tls,
        metrics_tls,
        peers: peer_settings(&args)?,
    };
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
            let table = RewriteTable::new(
                RewriteTable::read_file(path)
                    .with_context(|| format!("--rewrites {}", path.display()))?,
            );
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
    let precise = args.precise();
    let picker = PickerConfig {
        pool_name: args.pool_name,
        model_rewrites,
        quotas,
        flow_control,
        rewrites,
        max_body_bytes: args.max_body_bytes,
        explain_header: args.explain_header,
        precise,
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

/// Binds `port` (the value of `flag`) on `host`; the error names the flag, and for a port
/// already taken says how to choose another (the picker and the body-based router both default
/// to `--metrics-port 9090`).
pub(super) async fn bind_port(
    host: Option<std::net::IpAddr>,
    flag: &str,
    port: u16,
) -> anyhow::Result<tokio::net::TcpListener> {
    bind(host, port).await.map_err(|e| {
        let in_use = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse);
        if in_use {
            e.context(format!(
                "{flag} {port}: another process listens on this port: stop it, or pass another \
                 {flag} (or another --listen-address)"
            ))
        } else {
            e.context(format!("{flag} {port}"))
        }
    })
}

/// The ext_proc port's TLS for `certificate`, mutual with `client_ca` (`--tls-client-ca-file`);
/// an error names the flags it came from: the client CA bundle's own when it is the bundle that
/// cannot be used.
pub(super) fn tls_from_flags(
    certificate: Option<infergate_extproc::run::Certificate>,
    client_ca: Option<&std::path::Path>,
) -> anyhow::Result<Option<infergate_extproc::run::ServerTls>> {
    use infergate_extproc::run::Certificate;
    let flags = match &certificate {
        Some(Certificate::Files { cert, key }) => format!(
            "--tls-cert-file {}, --tls-key-file {}",
            cert.display(),
            key.display()
        ),
        Some(Certificate::SelfSigned { .. }) => "--tls-self-signed".to_owned(),
        // Plaintext; a client CA alone is refused (clap refuses it first on the command line).
        None => return ext_proc_tls(None, client_ca).context("--tls-client-ca-file"),
    };
    if let Some(ca) = client_ca {
        // Read first, so that an unusable bundle is named by its own flag.
        infergate_pool::tls::client_verifier(ca).with_context(|| {
            format!(
                "--tls-client-ca-file {}: the ext_proc port's client CA bundle cannot be used",
                ca.display()
            )
        })?;
    }
    let tls = ext_proc_tls(certificate, client_ca)
        .with_context(|| format!("{flags}: the ext_proc port's TLS certificate cannot be used"))?;
    if let Some(ca) = client_ca {
        tracing::info!(
            client_ca = %ca.display(),
            "ext_proc port: mutual TLS, every client must present a certificate of this CA bundle"
        );
    }
    Ok(tls)
}

/// The metrics port's TLS for `files` (`None`: plain HTTP); an error names the flags it came
/// from: `--metrics-tls-client-ca-file` when it is the bundle that cannot be used, the
/// certificate's and key's otherwise.
pub(super) fn metrics_tls_from_flags(
    files: Option<MetricsTlsFiles>,
) -> anyhow::Result<Option<infergate_extproc::run::ServerTls>> {
    let Some(files) = files else {
        return Ok(None);
    };
    if let Some(ca) = &files.client_ca {
        // Read first, so that an unusable bundle is named by its own flag.
        infergate_pool::tls::client_verifier(ca).with_context(|| {
            format!(
                "--metrics-tls-client-ca-file {}: the metrics port's client CA bundle cannot be \
                 used",
                ca.display()
            )
        })?;
    }
    let tls = metrics_tls(&files).with_context(|| {
        format!(
            "--metrics-tls-cert-file {}, --metrics-tls-key-file {}: the metrics port's TLS \
             certificate cannot be used",
            files.cert.display(),
            files.key.display()
        )
    })?;
    match &files.client_ca {
        Some(ca) => tracing::info!(
            client_ca = %ca.display(),
            "metrics port: mutual TLS, every client (probes included) must present a certificate \
             of this CA bundle"
        ),
        None => tracing::info!(cert = %files.cert.display(), "metrics port: HTTPS"),
    }
    Ok(Some(tls))
}

/// The load exchange with the other replicas, from `--peer-key-file`, `--peer`, `--peer-port`,
/// `--peer-interval-ms` and `--replica-name` (`None` without a key file).
fn peer_settings(args: &Args) -> anyhow::Result<Option<PeerSettings>> {
    let Some(path) = &args.peer_key_file else {
        return Ok(None);
    };
    let bytes = std::fs::read(path)
        .with_context(|| format!("--peer-key-file {}: cannot read it", path.display()))?;
    let key = PeerKey::from_bytes(&bytes).with_context(|| {
        format!(
            "--peer-key-file {}: the key must be at least {MIN_KEY_LEN} bytes",
            path.display()
        )
    })?;
    let replica = match &args.replica_name {
        Some(name) => name.clone(),
        None => std::env::var("HOSTNAME").context(
            "--replica-name (or POD_NAME) is needed with --peer-key-file: $HOSTNAME is not set",
        )?,
    };
    let targets = args
        .peers
        .iter()
        .map(|p| {
            p.parse::<PeerTarget>()
                .map_err(|e| anyhow::anyhow!("--peer {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let listen = socket_addr(args.listen_address, args.peer_port.unwrap_or(PEER_PORT));
    let mut settings = PeerSettings::new(replica, &args.pool_name, Some(listen), targets, key);
    if let Some(ms) = args.peer_interval_ms {
        settings.interval = Duration::from_millis(ms);
        // A report at least every 50 intervals, and never less often than the default.
        settings.keepalive = settings
            .interval
            .max(DEFAULT_KEEPALIVE.min(settings.interval * 50));
        settings.expire_after = settings.expire_after.max(settings.keepalive * 6);
    }
    settings.validate()?;
    Ok(Some(settings))
}
