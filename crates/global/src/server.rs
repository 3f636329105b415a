//! The front door: connections, authentication, limits, the route and the retries across
//! clusters.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use infergate_openai::{
    ApiError, ApiKind, Route, check_content_encoding, check_transfer_encoding, model_id,
    parse_request,
};
use infergate_pool::hop::strip_hop_by_hop;
use infergate_pool::lifecycle::{self, MAX_USAGE_BODY, ResponseWatch};
use infergate_pool::tls::ServerTls;
use infergate_proxy::BodyRead;
use infergate_proxy::auth::ModelAccess;
use infergate_proxy::request_id::{REQUEST_ID_HEADER, RequestIds};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::access_log::{Outcome, Record};
use crate::body::{Observed, RouterBody};
use crate::cluster::{self, Discovery};
use crate::config::GlobalConfig;
use crate::connect::{self, Failure};
use crate::error::Error;
use crate::now;
use crate::outlier::{self, Verdict};
use crate::rotation;
use crate::route::{self, Candidate, MAX_CLUSTERS};
use crate::state::State;
use crate::telemetry::{ClusterCode, ClusterReason, ReasonLabel, Telemetry};

/// The request id: the client's, or one the router makes up; passed to the clusters (whose
/// gateways keep it), returned, and logged (`accessLog:`).
const X_REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// The response header naming the cluster that answered.
pub const CLUSTER_HEADER: &str = "x-infergate-cluster";

/// The router's bound sockets.
pub struct Listeners {
    /// The front door.
    pub http: TcpListener,
    /// The admin port (`/metrics`, `/healthz`, `/readyz`), if any.
    pub admin: Option<TcpListener>,
}

/// A running global router.
pub struct Router {
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    handle: Handle,
    task: JoinHandle<()>,
}

impl Router {
    /// The front door's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The admin port's address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// A handle for reloading the configuration.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Waits until the router has stopped: its shutdown future completed, the front door
    /// closed, and every connection open then ended (each is asked to finish: HTTP/1.1
    /// keep-alive off, HTTP/2 GOAWAY; running requests, streams included, complete).
    ///
    /// Then it leaves the replicas sharing `quotas:` through Redis (at most
    /// [`LEAVE_TIMEOUT`](infergate_pool::quota::LEAVE_TIMEOUT) and one round's timeouts), so
    /// the others count it out at their next round rather than two presence periods after the
    /// process has exited.
    pub async fn wait(self) {
        let _ = self.task.await;
        let quotas = self.handle.shared.state.load().quotas.clone();
        if let Some(q) = quotas {
            q.leave().await;
        }
        // Every request has ended: its access-log line is written before the process may exit.
        if let Some(log) = self.handle.shared.state.load().access_log.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                log.flush(infergate_proxy::access_log::FLUSH_AT_SHUTDOWN)
            })
            .await;
        }
    }
}

/// Reloads the configuration of a running router. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    /// `--listen` and `--admin`, put over each file read (else every reload would see the
    /// file's addresses as a change).
    addresses: (Option<SocketAddr>, Option<SocketAddr>),
}

impl Handle {
    /// This handle, with `listen` and `admin` (when given) put over every file it reads.
    pub fn with_addresses(mut self, listen: Option<SocketAddr>, admin: Option<SocketAddr>) -> Self {
        self.addresses = (listen, admin);
        self
    }

    /// Replaces the configuration. On error nothing changes and the old configuration keeps
    /// serving, with the error the start would have stopped on. Requests already running finish
    /// on the configuration they started with; unchanged clusters keep their state (see
    /// `state`).
    ///
    /// `listen`, `admin` and `tls` are read only at start; a change there is ignored (and
    /// logged).
    pub fn reload(&self, mut config: GlobalConfig) -> Result<(), Error> {
        let shared = &self.shared;
        let _serial = shared
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = shared.state.load_full();
        // The values in force stay in the new configuration, so that a file changed back to
        // them is no change and the next reload compares with what runs, not with the last
        // file. (The certificate files themselves are reloaded when they change.)
        let mut kept = Vec::new();
        if old.config.listen != config.listen {
            kept.push(format!(
                "listen {} (in force: {})",
                config.listen, old.config.listen
            ));
            config.listen = old.config.listen;
        }
        if old.config.admin != config.admin {
            kept.push(format!(
                "admin {} (in force: {})",
                config.admin, old.config.admin
            ));
            config.admin = old.config.admin;
        }
        if old.config.tls != config.tls {
            kept.push("tls".to_owned());
            config.tls.clone_from(&old.config.tls);
        }
        if !kept.is_empty() {
            tracing::warn!(
                changed = %kept.join(", "),
                "`listen`, `admin` and `tls` changes take effect only after a restart; the rest of the file applies"
            );
        }
        let reseed = (old.config.seed != config.seed).then_some(config.seed);
        match State::build(config, Some(&old), &shared.telemetry) {
            Ok(state) => {
                let state = Arc::new(state);
                shared.state.store(Arc::clone(&state));
                if let Some(seed) = reseed {
                    shared.rng.store(seed, Ordering::Relaxed);
                }
                crate::state::retire(&old, &state, &shared.telemetry);
                shared.telemetry.reloaded(true);
                Ok(())
            }
            Err(e) => {
                shared.telemetry.reloaded(false);
                Err(e)
            }
        }
    }

    /// Reads `path` and reloads from it. A file that does not parse or validate is refused with
    /// the error naming the field, and the running configuration stays.
    pub fn reload_file(&self, path: &Path) -> Result<(), Error> {
        let read = GlobalConfig::from_file(path).and_then(|mut c| {
            c.set_addresses(self.addresses.0, self.addresses.1)?;
            Ok(c)
        });
        match read {
            Ok(c) => self.reload(c),
            Err(e) => {
                self.shared.telemetry.reloaded(false);
                Err(e.into())
            }
        }
    }

    /// Watches `path` and reloads when its contents change, every `reloadIntervalMs` of the
    /// configuration in force (the gateway's watch, `infergate_pool::watch`), until
    /// `shutdown` completes. Errors are logged; the running configuration stays.
    pub fn watch_file(
        &self,
        path: PathBuf,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        let (interval, reload) = (self.clone(), self.clone());
        infergate_pool::watch::watch_file(
            path,
            "configuration",
            move || Duration::from_millis(interval.shared.state.load().config.reload_interval_ms),
            move |path| reload.reload_file(path),
            shutdown,
        )
    }
}

/// What lives as long as the process, across reloads; the configuration in force is `state`.
pub(crate) struct Shared {
    state: ArcSwap<State>,
    telemetry: Arc<Telemetry>,
    inflight: Arc<AtomicUsize>,
    /// Bytes of request bodies held now, every connection together
    /// (`limits.maxBufferedRequestBytes`).
    buffered: Gauge,
    /// Open client connections (`limits.maxConnections`, read at each accept).
    connections: Arc<AtomicUsize>,
    rng: AtomicU64,
    /// Request ids for requests that come without one (`x-request-id`).
    ids: RequestIds,
    /// Held while an ejection is decided (`cluster::eject`): rare, never on a request that
    /// does not complete a cluster's run of gateway failures.
    ejecting: std::sync::Mutex<()>,
    /// Reloads are rare and must not interleave (each builds on the state before it).
    reloading: std::sync::Mutex<()>,
}

/// One of `limits.maxRequestsInFlight`, held from the request head to the last response byte.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the router on `listeners` until `shutdown` completes. Must run inside a tokio runtime.
pub async fn serve(
    config: GlobalConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Router, Error> {
    let mut registry = Registry::default();
    let telemetry = Arc::new(Telemetry::register(&mut registry));
    let tls = match &config.tls {
        None => None,
        Some(t) => {
            // The gateway's front door TLS, `clientCaFile` (mutual TLS) included.
            let tls = t
                .server_tls(infergate_pool::tls::port::ROUTER)
                .map_err(|e| Error::Tls(Box::new(e)))?;
            tls.register(&mut registry);
            Some(tls)
        }
    };
    let seed = config.seed;
    let state = State::build(config, None, &telemetry)?;
    let shared = Arc::new(Shared {
        state: ArcSwap::from_pointee(state),
        telemetry: Arc::clone(&telemetry),
        inflight: Arc::new(AtomicUsize::new(0)),
        buffered: Gauge::default(),
        connections: Arc::new(AtomicUsize::new(0)),
        rng: AtomicU64::new(seed),
        ids: RequestIds::new(seed, 0),
        ejecting: std::sync::Mutex::new(()),
        reloading: std::sync::Mutex::new(()),
    });
    let http_addr = listeners.http.local_addr()?;
    let admin_addr = match &listeners.admin {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin = listeners.admin.map(|listener| {
        let registry = Arc::new(registry);
        let (metrics, ready) = (Arc::clone(&shared), Arc::clone(&shared));
        let mut rx = stop_rx.clone();
        tokio::spawn(infergate_pool::admin::serve_with(
            listener,
            move || {
                // The quota service's series are in a registry of its own: a reload that
                // changes `quotas:` starts another service, exported from its first scrape.
                let mut out = String::new();
                encode_registry(&mut out, &registry)?;
                let state = metrics.state.load();
                if let Some(r) = state.quotas.as_ref().and_then(|q| q.registry()) {
                    encode_registry(&mut out, r)?;
                }
                encode_eof(&mut out)?;
                Ok(out)
            },
            move || {
                // Somewhere to send traffic: some cluster routed on for some model, by its
                // heartbeat, whether or not its `/v1/models` could be read.
                let at = now();
                ready.state.load().clusters.iter().any(|c| c.any_up(at))
            },
            async move {
                let _ = rx.wait_for(|s| *s).await;
            },
        ))
    });
    let files = tokio::spawn(check_cluster_files(Arc::clone(&shared)));
    let accept = accept_loop(Arc::clone(&shared), listeners.http, tls, stop_rx);
    let handle = Handle {
        shared: Arc::clone(&shared),
        addresses: (None, None),
    };
    let task = tokio::spawn(async move {
        let accepting = tokio::spawn(accept);
        shutdown.await;
        let _ = stop_tx.send(true);
        // Returns once every connection has ended: running answers, streams included, finish.
        // The heartbeats keep being polled meanwhile, so the retries still fail over.
        let _ = accepting.await;
        files.abort();
        shared.state.load().stop_polling();
        if let Some(a) = admin {
            let _ = a.await;
        }
    });
    Ok(Router {
        http_addr,
        admin_addr,
        handle,
        task,
    })
}

/// What `infergate global --check` runs once the file itself validated: the warnings the start
/// gives about the configuration (a cluster's token sent over plain `http://`), then, with
/// `read_files` (not `--no-files`), [`check_files`] — which gives the start's warnings about
/// those files too (a client certificate outside its validity). A file called valid here
/// neither stops the router at start nor draws a warning there that this did not give.
pub fn check(config: &GlobalConfig, read_files: bool) -> Result<(), Error> {
    for c in &config.clusters {
        connect::warn_of(c);
    }
    if read_files {
        check_files(config)?;
    }
    Ok(())
}

/// What `infergate global --check` verifies beyond the file, writing nothing and contacting
/// nothing: every file the configuration names, read as [`serve`] reads it and refused with the
/// error the start would stop on — the front door's `tls` (certificate, key, client CA bundle),
/// the `auth.apiKeys.file` and `auth.jwt.remoteJWKS.caFile`, each cluster's
/// `credentials.bearerTokenFile`, `tls.caFile`, `tls.certFile` and `tls.keyFile` — and that
/// `accessLog.path` can be appended to (an existing file opened for appending, else its folder
/// present).
pub fn check_files(config: &GlobalConfig) -> Result<(), Error> {
    if let Some(tls) = &config.tls {
        tls.check().map_err(|e| Error::Tls(Box::new(e)))?;
    }
    infergate_proxy::auth::Authenticator::check(&config.auth)
        .map_err(|e| Error::Auth(Box::new(e)))?;
    let mut system_roots = connect::SystemRoots::new();
    for i in 0..config.clusters.len() {
        cluster::Loaded::read(config, i, &mut system_roots)?;
    }
    infergate_proxy::access_log::check(config.access_log.as_ref())?;
    Ok(())
}

/// Reads the clusters' credential files every `reloadIntervalMs` of the configuration in force
/// (`rotation::check_interval`) and applies those that changed (`Cluster::check_files`), until
/// aborted at shutdown, once the last request has ended.
async fn check_cluster_files(shared: Arc<Shared>) {
    loop {
        let every = rotation::check_interval(shared.state.load().config.reload_interval_ms);
        tokio::time::sleep(every).await;
        let state = shared.state.load_full();
        for cluster in &state.clusters {
            cluster.check_files(&shared.telemetry);
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Option<ServerTls>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let tls = tls.map(Arc::new);
    // Each connection's task holds a receiver: `closed()` resolves once the last one has ended.
    let (conns_tx, conns_rx) = tokio::sync::watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        // The connection's settings are the configuration's in force when it was accepted.
        let limits = shared.state.load().config.limits.clone();
        // Past `maxConnections` the connection is closed at once.
        let open = shared.connections.fetch_add(1, Ordering::AcqRel);
        let permit = Slot(Arc::clone(&shared.connections));
        if open >= limits.max_connections {
            drop(permit);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let tls = tls.clone();
        let mut stop = stop.clone();
        let open = conns_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _open = open;
            // A failed handshake is logged and counted by `accept_tls`, a refused client
            // certificate warned of there (a few times an hour at most).
            let Ok(stream) = infergate_pool::tls::accept_tls(tls.as_deref(), stream).await else {
                return;
            };
            let service = service_fn(move |req: Request<Incoming>| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(&shared, req, peer).await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout())
                .max_buf_size(limits.header_bytes());
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.http2.max_concurrent_streams)
                .max_header_list_size(u32::try_from(limits.header_bytes()).unwrap_or(u32::MAX));
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            // At shutdown the connection is asked to finish (HTTP/1.1 keep-alive off, HTTP/2
            // GOAWAY) and served until its running requests have ended.
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    drop(conns_rx);
    conns_tx.closed().await;
}

/// Resolves once shutdown was signalled (or the signal's sender is gone).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.is_ok();
}

/// Why a request got no cluster's answer.
enum Refused {
    /// The router's own error answer.
    Api(ApiError),
    /// The request body broke off (the client went away, or sent a malformed chunk): nobody to
    /// answer, nothing to count as the router's refusal.
    BodyBroken(hyper::Error),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Api(e)
    }
}

/// Serves one request. With `accessLog:` its [`Record`] is logged here when the router answered
/// itself, else by the response body when it is dropped.
async fn handle(
    shared: &Arc<Shared>,
    mut req: Request<Incoming>,
    client: SocketAddr,
) -> Response<RouterBody> {
    // The configuration in force when the request came: it is served on that one to the end.
    let state = shared.state.load_full();
    // One id from the client to the model server: the clusters' gateways keep it.
    let request_id = shared.ids.of(req.headers());
    req.headers_mut().insert(X_REQUEST_ID, request_id.clone());
    let mut record = state
        .access_log
        .as_ref()
        .map(|log| Record::new(log, client, req.method(), req.uri(), Some(&request_id)));
    let mut answer = respond(shared, state, req, &mut record).await;
    answer.headers_mut().insert(X_REQUEST_ID, request_id);
    // Still here: the router answered itself, or the client's body broke off.
    if let Some(mut record) = record {
        record.status = Some(answer.status().as_u16());
        record.done();
    }
    answer
}

async fn respond(
    shared: &Arc<Shared>,
    state: Arc<State>,
    req: Request<Incoming>,
    record: &mut Option<Box<Record>>,
) -> Response<RouterBody> {
    match route_request(shared, state, req, record).await {
        Ok(r) => r,
        Err(Refused::BodyBroken(e)) => {
            if let Some(r) = record.as_deref_mut() {
                r.outcome = Outcome::Cancelled;
            }
            tracing::debug!(error = %e, "the request body broke off");
            // Likely nobody reads it; HTTP/1.1 closes the connection after it anyway, the body
            // not having been read to its end.
            let mut r = Response::new(RouterBody::Full(Full::new(Bytes::new())));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r
        }
        Err(Refused::Api(e)) => {
            if let Some(r) = record.as_deref_mut() {
                r.error = Some(e.metric_label());
            }
            shared
                .telemetry
                .rejections
                .get_or_create(&ReasonLabel {
                    reason: e.metric_label(),
                })
                .inc();
            error_response(&e)
        }
    }
}

fn error_response(e: &ApiError) -> Response<RouterBody> {
    let mut r = Response::new(RouterBody::Full(Full::new(Bytes::from(e.to_json()))));
    *r.status_mut() = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(s) = e.retry_after_secs() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    // Why a refusal happened (`rejected-quota-requests`, `rejected-quota-tokens`), in the
    // header the gateway and the reference picker's clients read.
    if let Some(reason) = e.reason() {
        h.insert(
            HeaderName::from_static(infergate_openai::REASON_HEADER),
            HeaderValue::from_static(reason),
        );
    }
    if let Some(code) = e.overloaded() {
        h.insert(
            HeaderName::from_static(infergate_openai::OVERLOADED_HEADER),
            HeaderValue::from_static(code),
        );
    }
    if let Some(w) = e.www_authenticate() {
        h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(w));
    }
    if let Some(allow) = e.allow() {
        h.insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    r
}

/// Every model some cluster is routed to for that `access` allows, sorted: those listed by a
/// cluster's `/v1/models` (or its `models:`) and those a heartbeat names, as routing sees them
/// ([`crate::cluster::Cluster::known_models`]). A caller allowed only some models is not told of
/// the others (as on the gateway).
fn served_models(state: &State, access: &ModelAccess) -> Vec<String> {
    let mut all: Vec<String> = state
        .clusters
        .iter()
        .flat_map(|c| c.known_models())
        .filter(|m| access.allows(m, m))
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The answer to a request for `model`, which no cluster is routed to for: 404
/// `model_not_found` listing the models the caller may call, unless the model may well exist —
/// some cluster cannot be read now (its `/v1/models` or its heartbeat failing, or not answered
/// yet), or none has listed any model. Then a 503 to retry after the next read is due, saying
/// what the router knows of each cluster that could not be read: those whose `/v1/models`
/// failed and why, those whose heartbeat failed and why, those not read yet, and (when no
/// model is known at all) those that listed none.
fn unknown_model(state: &State, access: &ModelAccess, model: &str) -> ApiError {
    let known = served_models(state, access);
    let nothing_known = served_models(state, &ModelAccess::All).is_empty();
    let heartbeat = &state.config.heartbeat;
    let (mut failed, mut beats, mut pending, mut empty) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The soonest read that may change the answer.
    let mut retry_after: Option<Duration> = None;
    let mut due = |d: Duration| retry_after = Some(retry_after.map_or(d, |r| r.min(d)));
    for c in &state.clusters {
        let name = &c.config.name;
        let beat = c.heartbeat_failure();
        match c.discovery() {
            Discovery::Failed(why) => {
                failed.push(format!("`{name}` ({why})"));
                // Judged by a heartbeat that works, its list is read again at the next
                // discovery; else at the next poll.
                due(if c.heartbeat.is_some() && beat.is_none() {
                    heartbeat.discovery_interval()
                } else {
                    heartbeat.interval()
                });
            }
            Discovery::Pending => {
                pending.push(format!("`{name}`"));
                due(heartbeat.interval());
            }
            Discovery::Listed => match beat {
                Some(why) => {
                    beats.push(format!("`{name}` ({why})"));
                    due(heartbeat.interval());
                }
                None => empty.push(format!("`{name}`")),
            },
        }
    }
    let Some(retry_after) = retry_after.or(nothing_known.then(|| heartbeat.interval())) else {
        return ApiError::UnknownModel {
            model: model.to_owned(),
            known: known.join(", "),
            retrieve: false,
        };
    };
    let mut why = Vec::new();
    if !failed.is_empty() {
        why.push(format!("GET /v1/models failed on {}", failed.join(", ")));
    }
    if !beats.is_empty() {
        why.push(format!("the heartbeat failed on {}", beats.join(", ")));
    }
    if !pending.is_empty() {
        why.push(format!(
            "{} {} not answered it yet: retry shortly",
            pending.join(", "),
            if pending.len() == 1 { "has" } else { "have" }
        ));
    }
    if nothing_known && !empty.is_empty() {
        why.push(format!("{} listed no model", empty.join(", ")));
    }
    if !known.is_empty() {
        why.push(format!("the others serve {}", known.join(", ")));
    }
    ApiError::NoClusterReported {
        model: model.to_owned(),
        why: why.join("; "),
        retry_after,
    }
}

/// The model list; for `HEAD` (`head`) its headers, length included, and no body (HTTP/2 leaves
/// that to the server).
fn models_response(state: &State, access: &ModelAccess, head: bool) -> Response<RouterBody> {
    let data: Vec<serde_json::Value> = served_models(state, access)
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "infergate"}))
        .collect();
    let body = serde_json::json!({"object": "list", "data": data}).to_string();
    json_response(body, head)
}

/// `GET /v1/models/{id}`: the entry of a model some cluster is routed to for and the caller may
/// call, as in the list; else the answer a request for it gets ([`unknown_model`]).
fn model_response(
    state: &State,
    access: &ModelAccess,
    id: &str,
    head: bool,
) -> Result<Response<RouterBody>, ApiError> {
    if !served_models(state, access).iter().any(|m| m == id) {
        return Err(unknown_model(state, access, id).for_retrieve());
    }
    let body =
        serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "infergate"})
            .to_string();
    Ok(json_response(body, head))
}

/// `204 No Content` with `Allow`: the answer to `OPTIONS` (`x-request-id` is added by
/// `handle`, as to every answer). No CORS headers: the router has no CORS setting, so a
/// browser's preflight gets no `Access-Control-Allow-Origin` and the browser keeps its page from
/// calling the API (docs/global.md).
fn options_response(allow: &'static str) -> Response<RouterBody> {
    let mut r = Response::new(RouterBody::Full(Full::new(Bytes::new())));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// A JSON answer; for `HEAD` (`head`) its headers, length included, and no body.
fn json_response(body: String, head: bool) -> Response<RouterBody> {
    let length = HeaderValue::from(body.len());
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(body)
    };
    let mut r = Response::new(RouterBody::Full(Full::new(body)));
    r.headers_mut().insert(header::CONTENT_LENGTH, length);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Uniform in `[0, 1)` from a counter (splitmix64): lock-free, reproducible from the seed.
fn draw(rng: &AtomicU64) -> f64 {
    let mut z = rng
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

async fn route_request(
    shared: &Arc<Shared>,
    state: Arc<State>,
    req: Request<Incoming>,
    record: &mut Option<Box<Record>>,
) -> Result<Response<RouterBody>, Refused> {
    // Before authentication: a browser's CORS preflight carries no credentials, and the answer
    // depends on the path alone (`Route::Options`), so it tells an anonymous caller nothing. An
    // `OPTIONS` on a path the router does not serve goes on as any other request (authenticated,
    // then 404).
    if req.method() == http::Method::OPTIONS
        && let Ok(Route::Options { allow }) = Route::of(req.method().as_str(), req.uri().path())
    {
        return Ok(options_response(allow));
    }
    let identity = state.auth.authenticate(req.headers()).await?;
    let authenticated = state.auth.is_enabled().then_some(&identity.tenant);
    let tenant = state.tenancy.gateway(authenticated, req.headers()).tenant;
    if let Some(r) = record.as_deref_mut() {
        r.tenant = Some(Arc::clone(&tenant));
    }
    let kind = match Route::of(req.method().as_str(), req.uri().path())? {
        Route::Api(kind) => kind,
        Route::Models => {
            let head = req.method() == http::Method::HEAD;
            return Ok(models_response(&state, &identity.models, head));
        }
        Route::Model => {
            let head = req.method() == http::Method::HEAD;
            let id = model_id(req.uri().path()).unwrap_or_default();
            return Ok(model_response(&state, &identity.models, &id, head)?);
        }
        // Answered above, before authentication; here so that every route has its answer.
        Route::Options { allow } => return Ok(options_response(allow)),
    };
    check_content_encoding(
        req.headers()
            .get(header::CONTENT_ENCODING)
            .map(|v| v.as_bytes()),
    )?;
    let limits = &state.config.limits;
    let running = shared.inflight.fetch_add(1, Ordering::AcqRel);
    let slot = Slot(Arc::clone(&shared.inflight));
    if running >= limits.max_requests_in_flight {
        return Err(ApiError::GatewayBusy {
            limit: limits.max_requests_in_flight,
            retry_after: Duration::from_secs(1),
        }
        .into());
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // As at the gateway: a body chunked under another coding is refused before it is read.
    if declared.is_none() {
        check_transfer_encoding(
            req.headers()
                .get(header::TRANSFER_ENCODING)
                .map(|v| v.as_bytes()),
        )?;
    }
    let (mut parts, body) = req.into_parts();
    // Read as the gateway reads it (`maxRequestBodyBytes`, `bodyReadTimeoutMs`, and the bytes
    // held charged to `maxBufferedRequestBytes`). `_held` keeps the charge while the body is kept
    // for the retries: to a cluster's response headers, or the refusal.
    let (body, _held) = match infergate_proxy::read_body(&shared.buffered, limits, declared, body)
        .await
        .map_err(Refused::BodyBroken)?
    {
        BodyRead::Read(body, held) => (body, held),
        BodyRead::Refused(e) => return Err(e.into()),
    };
    let mut parsed = parse_request(kind, &body)?;
    let model = parsed.model.as_ref();
    if let Some(r) = record.as_deref_mut() {
        r.model = Some(model.into());
        r.stream = parsed.stream;
    }
    // The caller's models (an API key's `models`, a JWT's `modelsClaim`). The router does not
    // know which base model a LoRA adapter belongs to, so an adapter is allowed only when it is
    // listed itself (or every model is): it fails closed where the gateway would look the base up.
    identity.may_call(model, model)?;
    let routing = &state.config.routing;
    if authenticated.is_some() {
        // The clusters see the tenant the router authenticated, not one the client named.
        state.tenancy.set_authenticated(&mut parts.headers, &tenant);
    }
    // A value the router cannot read is refused rather than ignored: the caller set the header
    // to be routed by it, and would otherwise be routed by another objective without a word.
    let requested_objective = match parts.headers.get(&state.objective_header) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| ApiError::InvalidField {
                    field: state.objective_header.as_str().to_owned(),
                    expected: "the request's time-to-first-token objective in milliseconds, a \
                               positive integer (the header routing.objectiveHeader names)",
                })?,
        ),
    };
    // Before a cluster is chosen: a tenant over its global quota costs no cluster anything.
    let mut quota = lifecycle::admit_quota(state.quotas.as_ref(), &tenant, &parsed)?;
    let objective_ms = requested_objective
        .or_else(|| routing.tenant_objectives.get(&*tenant).copied())
        .unwrap_or(routing.ttft_objective_ms) as f64;
    let prompt_tokens = parsed.estimated_prompt_tokens();
    let prompt = f64::from(prompt_tokens);
    let output = f64::from(
        parsed
            .max_output_tokens
            .unwrap_or(routing.default_output_tokens),
    );
    let at = now();
    let mut candidates: Vec<Candidate> = Vec::with_capacity(state.clusters.len());
    // Each cluster's heartbeat-based estimate for this request, by its index: what the
    // measured TTFT of the cluster that answers is compared with.
    let mut heartbeat_ttft_ms = [0.0; MAX_CLUSTERS];
    for (index, c) in state.clusters.iter().enumerate().take(MAX_CLUSTERS) {
        if let Some(view) = c.view(model, at, prompt) {
            heartbeat_ttft_ms[index] = view.heartbeat_ttft_ms;
            candidates.push(Candidate {
                index,
                weight: view.weight,
                ttft_ms: view.ttft_ms,
                cost: state.prices[index].0 * prompt + state.prices[index].1 * output,
                region_rank: state.region_ranks[index],
            });
        }
    }
    let Some(reason) = route::order(routing.policy, objective_ms, &mut candidates, || {
        draw(&shared.rng)
    }) else {
        // No cluster is routed to for it. While some cluster cannot be read, it may well
        // serve it: a 503 to retry rather than a 404.
        return Err(unknown_model(&state, &identity.models, model).into());
    };
    let stream = parsed.stream;
    // The model outlives the rest of the parse: its pending requests are counted per model.
    let model = std::mem::take(&mut parsed.model);
    drop(parsed);
    let first = &state.clusters[candidates[0].index];
    shared
        .telemetry
        .decisions
        .get_or_create(&ClusterReason {
            cluster: Arc::clone(&first.label.cluster),
            reason: reason.as_str(),
        })
        .inc();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let first_byte = Duration::from_millis(state.config.timeouts.first_byte_ms);
    let attempts = usize::from(state.config.retries.max_attempts).min(candidates.len());
    // What each cluster tried did, for the 502 when none answered: the last one's failure alone
    // would hide that an earlier one was reached and answered an error (a gateway with no ready
    // pod, say), or could not be reached either.
    let mut tried: Vec<String> = Vec::new();
    let mut last_error = None;
    for (n, cand) in candidates.iter().take(attempts).enumerate() {
        let cluster = &state.clusters[cand.index];
        let last = n + 1 == attempts;
        let Some(uri) = cluster.uri(&path_and_query) else {
            continue;
        };
        if let Some(r) = record.as_deref_mut() {
            r.cluster = Some(Arc::clone(cluster));
            r.clusters_tried = r.clusters_tried.saturating_add(1);
            r.estimated_ttft_ms = Some(cand.ttft_ms);
        }
        let mut up = Request::new(Full::new(body.clone()));
        *up.method_mut() = Method::POST;
        *up.uri_mut() = uri;
        let h = up.headers_mut();
        for (name, value) in &parts.headers {
            if name == header::HOST
                || name == header::CONTENT_LENGTH
                || (state.auth.is_enabled()
                    && (name == header::AUTHORIZATION || name.as_str() == "x-api-key"))
            {
                continue;
            }
            h.append(name.clone(), value.clone());
        }
        strip_hop_by_hop(h);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let token = cluster.token();
        // The credentials the cluster sees are the router's own (its token, or none because
        // the client's are not forwarded): a 401 or 403 then concerns the router, not the client.
        let own_credentials = token.is_some() || state.auth.is_enabled();
        if let Some(t) = token {
            h.insert(header::AUTHORIZATION, t);
        }
        let sent_at = tokio::time::Instant::now();
        let pending = cluster.pending(&model, prompt_tokens);
        if n == 0 {
            // Under the cluster chosen first, through the slot just found: one atomic add.
            pending.count_routed();
        }
        // A failure counts against the cluster only when it was routed on when the order was
        // made (not ejected, not drained: a last resort's failures are expected) and its
        // heartbeat still has it up.
        let routed_on = cand.weight > 0.0;
        let judged = |due: Option<outlier::Trigger>| {
            if let Some(trigger) = due {
                cluster::eject(
                    &state.clusters,
                    cand.index,
                    trigger,
                    &shared.ejecting,
                    &shared.telemetry,
                );
            }
        };
        let gateway_failure = |heartbeat_up: bool| {
            if routed_on {
                judged(cluster.observe_gateway_failure(heartbeat_up, &shared.telemetry));
            }
        };
        let failover = |reason: &'static str| {
            shared
                .telemetry
                .retries
                .get_or_create(&ClusterReason {
                    cluster: Arc::clone(&cluster.label.cluster),
                    reason,
                })
                .inc();
        };
        // The clients in force now (a rotated CA bundle's, if one was just swapped in).
        let clients = cluster.clients();
        match tokio::time::timeout(first_byte, clients.request.request(up)).await {
            Err(_) => {
                gateway_failure(cluster.observe_timeout(
                    first_byte,
                    heartbeat_ttft_ms[cand.index],
                    &shared.telemetry,
                ));
                tracing::debug!(cluster = %cluster.config.name, "no response headers within timeouts.firstByteMs");
                return Err(ApiError::ClusterTimeout {
                    cluster: cluster.config.name.clone(),
                    timeout: first_byte,
                }
                .into());
            }
            Ok(Err(e)) => {
                let failure = connect::failure(&e);
                let connect = matches!(failure, Failure::Connect { .. });
                gateway_failure(if connect {
                    cluster.observe_connect_failure(&shared.telemetry)
                } else {
                    cluster.heartbeat_up()
                });
                if !last {
                    failover(if connect { "connect" } else { "error" });
                }
                let name = &cluster.config.name;
                let reason = match failure {
                    // Said to the client too: a certificate the router does not trust is a
                    // configuration to fix, not a cluster that is down.
                    Failure::Connect { tls: Some(why) } => {
                        let error = infergate_pool::ErrorChain(&e);
                        if cluster.tls_failure_logged.swap(true, Ordering::Relaxed) {
                            tracing::debug!(cluster = %name, %error, "cannot connect to the cluster: {why}");
                        } else {
                            tracing::warn!(cluster = %name, %error, "cannot connect to the cluster: {why}; logged again only after an answer");
                        }
                        format!("cannot connect to cluster `{name}`: {why}")
                    }
                    Failure::Connect { tls: None } => {
                        tracing::debug!(cluster = %name, error = %infergate_pool::ErrorChain(&e), "cluster failed before the first byte");
                        format!("cannot connect to cluster `{name}`")
                    }
                    Failure::Exchange => {
                        tracing::debug!(cluster = %name, error = %infergate_pool::ErrorChain(&e), "cluster failed before the first byte");
                        format!("cluster `{name}` failed before answering")
                    }
                };
                tried.push(reason);
                last_error = Some(ApiError::UpstreamUnavailable {
                    reason: tried.join("; "),
                });
            }
            Ok(Ok(resp)) => {
                cluster.tls_failure_logged.store(false, Ordering::Relaxed);
                let status = resp.status();
                if own_credentials
                    && matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
                {
                    cluster.observe_refused_credentials(status);
                    if !last {
                        failover("credentials");
                    }
                    tried.push(format!(
                        "cluster `{}` refused the router's credentials ({})",
                        cluster.config.name,
                        status.as_u16()
                    ));
                    last_error = Some(ApiError::UpstreamUnavailable {
                        reason: tried.join("; "),
                    });
                    continue;
                }
                if own_credentials {
                    cluster.observe_accepted_credentials();
                }
                let overloaded = resp
                    .headers()
                    .contains_key(infergate_openai::OVERLOADED_HEADER);
                match outlier::verdict(status.as_u16(), overloaded) {
                    Verdict::Success => {
                        judged(cluster.observe_success(routed_on, &shared.telemetry));
                    }
                    Verdict::Failure => gateway_failure(cluster.heartbeat_up()),
                    Verdict::Neutral => {}
                }
                let retryable = status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS;
                if retryable && !last {
                    failover(if status.is_server_error() {
                        "status_5xx"
                    } else {
                        "status_429"
                    });
                    tried.push(format!(
                        "cluster `{}` answered {status}",
                        cluster.config.name
                    ));
                    continue;
                }
                let code = crate::telemetry::status_class(status.as_u16());
                shared
                    .telemetry
                    .responses
                    .get_or_create(&ClusterCode {
                        cluster: Arc::clone(&cluster.label.cluster),
                        code,
                    })
                    .inc();
                let sse = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("text/event-stream"))
                    || stream;
                let (mut rparts, inner) = resp.into_parts();
                strip_hop_by_hop(&mut rparts.headers);
                if let Ok(v) = HeaderValue::from_str(&cluster.config.name) {
                    rparts.headers.insert(CLUSTER_HEADER, v);
                }
                if let Some(r) = record.as_deref_mut() {
                    r.status = Some(status.as_u16());
                }
                let observed = Observed {
                    inner,
                    cluster: Arc::clone(cluster),
                    price: state.prices[cand.index],
                    telemetry: Arc::clone(&shared.telemetry),
                    watch: ResponseWatch::new(status.as_u16(), sse, MAX_USAGE_BODY),
                    sent_at,
                    heartbeat_ttft_ms: heartbeat_ttft_ms[cand.index],
                    first_token: false,
                    pending: Some(pending),
                    quota: quota.take().map(|q| q.commit()),
                    done: false,
                    record: record.take(),
                    _slot: slot,
                };
                return Ok(Response::from_parts(
                    rparts,
                    RouterBody::Upstream(Box::new(observed)),
                ));
            }
        }
    }
    Err(last_error
        .unwrap_or_else(|| ApiError::NoEndpoints {
            model: model_name(&body, kind),
            subset: false,
        })
        .into())
}

fn model_name(body: &[u8], kind: ApiKind) -> String {
    parse_request(kind, body).map_or_else(|_| String::new(), |p| p.model.into_owned())
}
