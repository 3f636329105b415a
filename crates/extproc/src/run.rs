//! Whole processes: the picker and the body-based router with all their ports, as functions the
//! `infergate` binary calls and tests can call on 127.0.0.1.

use std::borrow::Cow;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
pub use infergate_metrics::ScraperConfig;
use infergate_openai::ModelRouter;
use infergate_pool::tls::{ALPN_GRPC, ALPN_HTTP, ServerTlsOptions, port};
pub use infergate_pool::tls::{Certificate, ServerTls};
pub use infergate_pool::{LivePool, PoolConfig};
pub use infergate_scheduler::{EndpointMeta, SchedulerConfig};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::args::MetricsTlsFiles;
use crate::bbr::{BbrConfig, BodyRouter};
use crate::error::Error;
use crate::picker::{EndpointPicker, PickerConfig};
use crate::server::{serve_ext_proc_tls, serve_health};
use crate::telemetry::{BbrTelemetry, PoolTelemetry, Telemetry};

/// How often the ready/stale pod gauges are refreshed.
pub const POD_GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// The listeners of a picker process.
#[derive(Debug)]
pub struct PickerListeners {
    /// ext_proc gRPC (default port 9002).
    pub grpc: TcpListener,
    /// gRPC health (default port 9003).
    pub health: TcpListener,
    /// Prometheus `/metrics`, `/healthz`, `/readyz`, `/heartbeat` (default port 9090).
    pub metrics: TcpListener,
    /// TLS on the ext_proc port (`None`: plaintext h2c). gRPC health stays plaintext.
    pub tls: Option<ServerTls>,
    /// TLS on the metrics port ([`metrics_tls`]; `None`: plain HTTP). Its series carry
    /// `port="metrics"`.
    pub metrics_tls: Option<ServerTls>,
    /// The load exchange with the pool's other picker replicas (`None`: a single picker, or
    /// replicas that do not share; `--peer-key-file`). It binds its own port at start.
    pub peers: Option<infergate_pool::peers::PeerSettings>,
}

/// Where the picker's endpoints come from.
pub enum Membership {
    /// A fixed list (static file).
    Static(Vec<EndpointMeta>),
    /// A task that keeps the pool's membership current (e.g. the Kubernetes watch); it is given
    /// the pool and runs until shutdown.
    Dynamic(Box<dyn FnOnce(LivePool) -> futures_util::future::BoxFuture<'static, ()> + Send>),
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Membership::Static(v) => f.debug_tuple("Static").field(&v.len()).finish(),
            Membership::Dynamic(_) => f.write_str("Dynamic"),
        }
    }
}

/// The ext_proc port's TLS for `certificate` (from `--tls-cert-file`/`--tls-key-file` or
/// `--tls-self-signed`; `None`: plaintext): ALPN `h2`, files polled every second, handshakes
/// bounded to 10 s. With `client_ca` (`--tls-client-ca-file`) the port is mutual TLS: a client
/// must present a certificate chained to that PEM bundle, which is polled with the certificate
/// files. A client CA without a certificate is refused: there would be no TLS to ask in. Must
/// run inside a tokio runtime.
pub fn ext_proc_tls(
    certificate: Option<Certificate>,
    client_ca: Option<&Path>,
) -> Result<Option<ServerTls>, Error> {
    let Some(certificate) = certificate else {
        return match client_ca {
            Some(path) => Err(Error::ClientCaWithoutTls {
                path: path.to_owned(),
            }),
            None => Ok(None),
        };
    };
    let options = ServerTlsOptions {
        client_ca: client_ca.map(Path::to_owned),
        ..ServerTlsOptions::new(port::EXT_PROC, &ALPN_GRPC)
    };
    Ok(Some(ServerTls::new(&certificate, &options)?))
}

/// The metrics port's TLS for `files` (`--metrics-tls-cert-file`, `--metrics-tls-key-file`,
/// `--metrics-tls-client-ca-file`): ALPN `h2` and `http/1.1`, files polled every second,
/// handshakes bounded to 10 s; with a client CA every client, probes included, must present a
/// certificate chained to it. Must run inside a tokio runtime.
pub fn metrics_tls(files: &MetricsTlsFiles) -> Result<ServerTls, Error> {
    let options = ServerTlsOptions {
        client_ca: files.client_ca.clone(),
        ..ServerTlsOptions::new(port::METRICS, &ALPN_HTTP)
    };
    let certificate = Certificate::Files {
        cert: files.cert.clone(),
        key: files.key.clone(),
    };
    ServerTls::new(&certificate, &options).map_err(Error::MetricsTls)
}

/// Reads a scheduler configuration file (`preset: infergate`, or explicit weights; every key
/// optional).
pub fn load_scheduler_config(path: &Path) -> Result<SchedulerConfig, Error> {
    read_yaml(path)
}

/// Reads and parses a YAML file, naming the file in either error. An empty file is refused:
/// read as YAML it is every default, which is never what a mounted file with a wrong key or a
/// file caught while being written means.
fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    if text.trim().is_empty() {
        return Err(invalid_in(
            path,
            "the file is empty (write `{}` for every default)".to_owned(),
        ));
    }
    serde_yaml::from_str(&text).map_err(|source| Error::Yaml {
        path: path.to_owned(),
        source,
    })
}

/// A checked value of a file that parsed, refused: a YAML error naming the file.
pub(crate) fn invalid_in(path: &Path, reason: String) -> Error {
    Error::Yaml {
        path: path.to_owned(),
        source: <serde_yaml::Error as serde::de::Error>::custom(reason),
    }
}

/// Reads a flow-control file (`flowControl:` and `tenancy:`, as in the gateway's file) and checks
/// it.
pub fn load_flow_settings(path: &Path) -> Result<infergate_pool::flow::FlowSettings, Error> {
    let invalid = |e: String| invalid_in(path, e);
    let settings: infergate_pool::flow::FlowSettings = read_yaml(path)?;
    settings
        .flow_control
        .validate()
        .map_err(|e| invalid(e.to_string()))?;
    settings
        .check_for_picker()
        .map_err(|e| invalid(e.to_string()))?;
    infergate_pool::tenant::Tenancy::new(&settings.tenancy).map_err(|e| invalid(e.to_string()))?;
    Ok(settings)
}

/// Reads a quota file (the gateway's `quotas:` fields) and starts the quota service, sharing
/// through Redis when the file says so. Must run inside a tokio runtime.
pub fn load_quotas(path: &Path) -> Result<infergate_pool::quota::Quotas, Error> {
    let invalid = |e: String| invalid_in(path, e);
    let spec: infergate_pool::quota::QuotasSpec =
        read_yaml(path).map_err(|e| quotas_key_hint(path, e))?;
    let config = spec.to_config().map_err(invalid)?;
    infergate_pool::quota::Quotas::start_with_registry(config).map_err(|e| invalid(e.to_string()))
}

/// A quota file that failed to parse because it was copied from a gateway file with its
/// `quotas:` key (the picker's file holds that section's fields at the top level): says so,
/// rather than `unknown field `quotas``. Any other error is returned as it was.
fn quotas_key_hint(path: &Path, e: Error) -> Error {
    let wrapped = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_yaml::from_str::<serde_yaml::Mapping>(&text).ok())
        .is_some_and(|m| m.contains_key("quotas"));
    if !wrapped {
        return e;
    }
    invalid_in(
        path,
        "`quotas:` is the gateway file's key: the picker's --quotas file holds that section's \
         fields at the top level (`default:`, `tenants:`, `windowSeconds:`, `redis:` ...); remove \
         the `quotas:` line and un-indent what it held"
            .to_owned(),
    )
}

/// Runs an endpoint picker until `shutdown` completes: the live pool, the ext_proc server, gRPC
/// health and the metrics server.
pub async fn run_picker(
    listeners: PickerListeners,
    picker: PickerConfig,
    pool: PoolConfig,
    membership: Membership,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut registry = Registry::default();
    // The pool's series (pick latency, scrapes, per-pod gauges) carry the pool's name, so that
    // dashboards over several pickers tell their pods apart.
    let live = LivePool::start(
        pool,
        Some(registry.sub_registry_with_label((
            Cow::Borrowed("pool"),
            Cow::Owned(picker.pool_name.clone()),
        ))),
    )?;
    if let Some(cfg) = &picker.precise {
        let precise = infergate_pool::precise::Precise::new(
            cfg,
            Some(registry.sub_registry_with_label((
                Cow::Borrowed("pool"),
                Cow::Owned(picker.pool_name.clone()),
            ))),
        )?;
        // A fresh pool: the first call always takes.
        let _ = live.enable_precise(precise);
        tracing::info!(tokenizer = %cfg.tokenizer.display(), events_port = cfg.events_port,
            replay_port = ?cfg.replay_port, "precise prefix routing on");
    }
    let telemetry = Telemetry::register(&mut registry);
    // Active-active: the exchange shares this pool's series' `pool` label.
    let _peers = match listeners.peers {
        Some(settings) => Some(
            infergate_pool::peers::PeerExchange::start(
                live.clone(),
                settings,
                Some(registry.sub_registry_with_label((
                    Cow::Borrowed("pool"),
                    Cow::Owned(picker.pool_name.clone()),
                ))),
            )
            .await?,
        ),
        None => None,
    };
    let mut picker = picker;
    if picker.flow.is_none()
        && let Some(s) = picker
            .flow_control
            .as_ref()
            .filter(|s| s.flow_control.enabled)
    {
        // Checked when the file was read (`load_flow_settings`).
        let tenancy = infergate_pool::tenant::Tenancy::new(&s.tenancy).unwrap_or_default();
        // `infergate_flow_*`, the names the gateway's queues have too.
        let metrics = infergate_pool::flow::FlowMetrics::register(&mut registry);
        picker.flow = Some(infergate_pool::flow::FlowController::new(
            &picker.pool_name,
            s.flow_control,
            tenancy,
            live.clock(),
            &metrics,
        ));
    }
    if let Some(tls) = &listeners.tls {
        tls.register(&mut registry);
    }
    if let Some(tls) = &listeners.metrics_tls {
        // `port="metrics"`: apart from the ext_proc port's series, which are unlabelled.
        tls.register_labelled(&mut registry);
    }
    let registry = Arc::new(registry);
    let membership_task = match membership {
        Membership::Static(endpoints) => {
            live.set_endpoints(endpoints)?;
            None
        }
        Membership::Dynamic(task) => Some(tokio::spawn(task(live.clone()))),
    };
    // Logged once everything that can stop the start has been set up (files, tokenizer, peer
    // exchange, the static endpoints): a refused start never says it was listening.
    let addr = |l: &TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(
        pool = %picker.pool_name,
        tls = listeners.tls.is_some(),
        metrics_tls = listeners.metrics_tls.is_some(),
        grpc = %addr(&listeners.grpc),
        health = %addr(&listeners.health),
        metrics = %addr(&listeners.metrics),
        "endpoint picker listening"
    );
    let gauges = tokio::spawn(report_pods(
        live.clone(),
        telemetry.for_pool(&picker.pool_name),
    ));
    let shutdown = shutdown.shared();
    let ready_pool = live.clone();
    let (heartbeat_pool, heartbeat_name) = (live.clone(), picker.pool_name.clone());
    let heartbeat_flow = picker.flow.clone();
    let heartbeats = infergate_pool::heartbeat::Heartbeats::new();
    let quotas = picker.quotas.clone();
    let departing = picker.quotas.clone();
    let admin = infergate_pool::admin::serve_tls_with_heartbeat(
        listeners.metrics,
        listeners.metrics_tls,
        move || {
            use prometheus_client::encoding::text::{encode_eof, encode_registry};
            let mut out = String::new();
            encode_registry(&mut out, &registry)?;
            // The quota service's series (`infergate_quota_*`) live in its own registry.
            if let Some(r) = quotas.as_ref().and_then(|q| q.registry()) {
                encode_registry(&mut out, r)?;
            }
            encode_eof(&mut out)?;
            Ok(out)
        },
        move || ready_pool.is_ready(),
        move || {
            let queued = heartbeat_flow.as_ref().map_or(0, |f| f.queued());
            // No adapters: the body-based router in front maps them to the pool's model.
            Some(
                heartbeats.render(std::iter::once(infergate_pool::heartbeat::Entry {
                    name: heartbeat_name.as_str(),
                    adapters: Vec::new(),
                    pool: &heartbeat_pool,
                    flow_queue: queued,
                })),
            )
        },
        shutdown.clone(),
    );
    let health_pool = live.clone();
    let health = serve_health(
        listeners.health,
        move || health_pool.is_ready(),
        shutdown.clone(),
    );
    let service = EndpointPicker::new(picker, live.clone(), telemetry);
    let grpc = serve_ext_proc_tls(listeners.grpc, service, listeners.tls, shutdown.clone());
    let (admin, health, grpc) = tokio::join!(admin, health, grpc);
    gauges.abort();
    if let Some(t) = membership_task {
        t.abort();
    }
    live.shutdown();
    // Out of the replicas sharing the quotas before the process exits, so the others count it
    // out at their next round (at most `LEAVE_TIMEOUT` and a round's timeouts).
    if let Some(q) = departing {
        q.leave().await;
    }
    admin?;
    health?;
    grpc
}

/// Keeps the `infergate_extproc_pods{pool, state}` gauges current.
pub async fn report_pods(pool: LivePool, telemetry: PoolTelemetry) {
    let stale_after = pool.scheduler_config().max_metrics_age;
    let mut tick = tokio::time::interval(POD_GAUGE_INTERVAL);
    loop {
        tick.tick().await;
        let now = pool.clock().now();
        let (mut ready, mut stale) = (0_i64, 0_i64);
        for info in pool.endpoints_info() {
            // Late pods (alive, slow to answer `/metrics`) are routed on; failed ones are not.
            let fresh = match stale_after {
                Some(max) => infergate_pool::routable(&info, now, max) == Some(true),
                None => info.metrics.is_some(),
            };
            if fresh {
                ready += 1;
            } else {
                stale += 1;
            }
        }
        telemetry.set_pods(ready, stale);
    }
}

/// Runs a body-based router until `shutdown` completes: the ext_proc server (over TLS when `tls`
/// is set), gRPC health (always ready) and, when given, a metrics listener (over TLS when
/// `metrics_tls` is set, its series labelled `port="metrics"`).
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per port and per port's TLS, as the flags give them"
)]
pub async fn run_bbr(
    grpc: TcpListener,
    tls: Option<ServerTls>,
    health: Option<TcpListener>,
    metrics: Option<TcpListener>,
    metrics_tls: Option<ServerTls>,
    config: BbrConfig,
    router: ModelRouter<()>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut registry = Registry::default();
    let telemetry = BbrTelemetry::register(&mut registry);
    if let Some(tls) = &tls {
        tls.register(&mut registry);
    }
    if let Some(tls) = &metrics_tls {
        // `port="metrics"`: apart from the ext_proc port's series, which are unlabelled.
        tls.register_labelled(&mut registry);
    }
    let registry = Arc::new(registry);
    let shutdown = shutdown.shared();
    let health = async {
        match health {
            Some(l) => serve_health(l, || true, shutdown.clone()).await,
            None => Ok(()),
        }
    };
    let admin = async {
        match metrics {
            Some(l) => {
                let encode = move || {
                    let mut out = String::new();
                    prometheus_client::encoding::text::encode(&mut out, &registry)?;
                    Ok(out)
                };
                infergate_pool::admin::serve_tls_with_heartbeat(
                    l,
                    metrics_tls,
                    encode,
                    || true,
                    || None,
                    shutdown.clone(),
                )
                .await
                .map_err(Error::from)
            }
            None => Ok(()),
        }
    };
    let service = BodyRouter::new(config, router, telemetry);
    let grpc = serve_ext_proc_tls(grpc, service, tls, shutdown.clone());
    let (health, admin, grpc) = tokio::join!(health, admin, grpc);
    health?;
    admin?;
    grpc
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    /// Each of the picker's files refuses a missing file, garbage and a wrong type, naming the
    /// file; nothing is started from a file that did not parse.
    #[test]
    fn bad_picker_files_are_refused_naming_the_file() {
        let missing = Path::new("/nonexistent/infergate/picker.yaml");
        assert!(matches!(
            load_flow_settings(missing),
            Err(Error::Read { .. })
        ));
        assert!(matches!(load_quotas(missing), Err(Error::Read { .. })));
        assert!(matches!(
            load_scheduler_config(missing),
            Err(Error::Read { .. })
        ));
        for text in [
            ": : [\u{0}",
            "flowControl: 7",
            "flowControl: { enabled: maybe }",
        ] {
            let f = file(text);
            let e = load_flow_settings(f.path()).unwrap_err();
            assert!(matches!(e, Error::Yaml { .. }), "{text:?}: {e}");
            assert!(
                e.to_string().contains(&f.path().display().to_string()),
                "{e}"
            );
        }
        for empty in ["", "\n  \n"] {
            let f = file(empty);
            for e in [
                load_scheduler_config(f.path()).unwrap_err(),
                load_quotas(f.path()).unwrap_err(),
                load_flow_settings(f.path()).unwrap_err(),
            ] {
                assert!(matches!(e, Error::Yaml { .. }), "{empty:?}: {e}");
                let chain = infergate_pool::ErrorChain(&e).to_string();
                assert!(chain.contains("is empty"), "{chain}");
            }
        }
        for text in [
            ": : [",
            "tenants: 5",
            "tenants: { a: { requestsPerMinute: -1 } }",
        ] {
            let f = file(text);
            let e = load_quotas(f.path()).unwrap_err();
            assert!(matches!(e, Error::Yaml { .. }), "{text:?}: {e}");
            assert!(
                e.to_string().contains(&f.path().display().to_string()),
                "{e}"
            );
        }
    }

    /// A quota file copied from a gateway file, `quotas:` key and all, is refused saying to
    /// drop the key (it was `unknown field `quotas``, which did not say what to do).
    #[test]
    fn a_quota_file_with_the_gateway_s_quotas_key_says_to_remove_it() {
        let f = file("quotas:\n  default: { requestsPerMinute: 60 }\n");
        let e = load_quotas(f.path()).unwrap_err();
        let chain = infergate_pool::ErrorChain(&e).to_string();
        assert!(chain.contains(&f.path().display().to_string()), "{chain}");
        assert!(
            chain.contains("`quotas:` is the gateway file's key"),
            "{chain}"
        );
        assert!(chain.contains("remove the `quotas:` line"), "{chain}");
        // Other mistakes keep their own error.
        let f = file("default: { requestPerMinute: 60 }\n");
        let chain = infergate_pool::ErrorChain(&load_quotas(f.path()).unwrap_err()).to_string();
        assert!(
            chain.contains("unknown field `requestPerMinute`"),
            "{chain}"
        );
    }

    /// The gateway's tenant and priority headers are refused, not ignored.
    #[test]
    fn the_gateway_s_tenancy_headers_are_refused() {
        let f = file("tenancy: { tenantHeader: x-tenant }");
        let e = load_flow_settings(f.path()).unwrap_err();
        let chain = infergate_pool::ErrorChain(&e).to_string();
        assert!(
            chain.contains("`tenancy.tenantHeader` is read by the standalone gateway only"),
            "{chain}"
        );
    }

    /// A band limit of 0 is refused naming the limit, not only the band.
    #[test]
    fn a_zero_band_limit_names_the_limit() {
        for (text, field) in [
            (
                "flowControl: { bands: { standard: { maxBytes: 0 } } }",
                "flowControl.bands.standard.maxBytes",
            ),
            (
                "flowControl: { bands: { sheddable: { maxRequests: 0 } } }",
                "flowControl.bands.sheddable.maxRequests",
            ),
        ] {
            let f = file(text);
            let e = load_flow_settings(f.path()).unwrap_err();
            assert!(matches!(e, Error::Yaml { .. }), "{text:?}: {e}");
            let chain = infergate_pool::ErrorChain(&e).to_string();
            assert!(
                chain.contains(&format!("`{field}` must be at least 1")),
                "{text:?}: {chain}"
            );
        }
    }
}
