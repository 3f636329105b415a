//! Starting the gateway: the front-door accept loops (HTTP/1.1 and h2c on one port), the admin
//! server, configuration reloads, and graceful shutdown.
//!
//! Two ways to run the front door, on the same request path:
//! - [`serve_workers`] — what `infergate gateway` runs: thread per core, like nginx's worker
//!   processes. Each worker thread has a single-threaded tokio runtime, its own `SO_REUSEPORT`
//!   listener on the front-door address (the kernel spreads connections across them) and its own
//!   upstream connections; a request is served start to end on the thread that accepted its
//!   connection, so nothing on the request path wakes another thread. The workers share only
//!   the configuration state (models and their `LivePool`s), whose scrapers, the admin server
//!   and the reload watcher run on the caller's runtime.
//! - [`serve`] — one accept loop on the caller's runtime (tests, embedding).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use infergate_pool::tls::{ServerTls, accept_tls};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::GatewayConfig;
use crate::error::Error;
use crate::graceful::Graceful;
use crate::proxy::{Shared, Worker, handle};
use crate::state::State;
use crate::telemetry::Telemetry;

/// The sockets the gateway serves on. Bind them first (port 0 in tests) and pass them in.
#[derive(Debug)]
pub struct Listeners {
    /// The OpenAI-compatible front door.
    pub http: TcpListener,
    /// `/metrics`, `/healthz`, `/readyz`; `None` serves no admin port.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses the configuration names (`listen`, `admin`).
    pub async fn bind(config: &GatewayConfig) -> Result<Self, Error> {
        Ok(Listeners {
            http: TcpListener::bind(config.listen).await?,
            admin: Some(TcpListener::bind(config.admin).await?),
        })
    }
}

/// A running gateway.
pub struct Gateway {
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    handle: Handle,
    task: JoinHandle<()>,
}

impl Gateway {
    /// Where the front door listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where the admin server listens, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// A handle for reloading the configuration.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Waits until the gateway has shut down: the shutdown future completed, the listeners
    /// stopped accepting, every open connection finished its requests, this replica left those
    /// sharing `quotas:` through Redis (at most [`LEAVE_TIMEOUT`](infergate_pool::quota::LEAVE_TIMEOUT)
    /// and one round's timeouts), and the access-log lines are written (at most
    /// [`access_log::FLUSH_AT_SHUTDOWN`](crate::access_log::FLUSH_AT_SHUTDOWN)).
    pub async fn wait(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "gateway task ended abnormally");
        }
        // The other replicas count this one out at their next round, not two presence periods
        // after its runtime has ended.
        let quotas = self.handle.shared.state.load().quotas.clone();
        if let Some(q) = quotas {
            q.leave().await;
        }
        // Every request has ended: its access-log line is written before the process may exit.
        if let Some(log) = self.handle.shared.state.load().access_log.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                log.flush(crate::access_log::FLUSH_AT_SHUTDOWN)
            })
            .await;
        }
    }
}

/// Reloads the configuration of a running gateway. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    // Reloads are rare and must not interleave (each builds on the state before it).
    reload_lock: Arc<Mutex<()>>,
}

impl Handle {
    /// Replaces the configuration. On error nothing changes and the old configuration keeps
    /// serving. Requests already running finish on the configuration they started with.
    ///
    /// `listen` and `admin` are read only at start; a changed value there is ignored (and logged).
    pub fn reload(&self, config: GatewayConfig) -> Result<(), Error> {
        let _serial = self
            .reload_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.shared.state.load_full();
        if old.config.listen != config.listen
            || old.config.admin != config.admin
            || old.config.tls != config.tls
            || old.config.admin_tls != config.admin_tls
        {
            // (The certificate files themselves are reloaded when they change: see `tls`.)
            tracing::warn!(
                "`listen`, `admin`, `tls` and `adminTls` changes take effect only after a restart"
            );
        }
        match State::build(config, Some(&old), &self.shared.telemetry) {
            Ok(state) => {
                self.shared.state.store(Arc::new(state));
                self.shared.telemetry.reloaded(true);
                Ok(())
            }
            Err(e) => {
                self.shared.telemetry.reloaded(false);
                Err(e)
            }
        }
    }

    /// Reads `path` and reloads from it. A file that does not parse or validate is rejected with
    /// an error naming the field and line, and the running configuration stays.
    pub fn reload_file(&self, path: &Path) -> Result<(), Error> {
        match GatewayConfig::from_file(path) {
            Ok(c) => self.reload(c),
            Err(e) => {
                self.shared.telemetry.reloaded(false);
                Err(e.into())
            }
        }
    }

    /// Requests in flight to `model`'s pool as its scheduler counts them (`None` for a name
    /// that is not served).
    pub fn inflight(&self, model: &str) -> Option<usize> {
        let state = self.shared.state.load();
        state
            .router
            .resolve(model)
            .ok()
            .map(|r| r.target.backend.pool.inflight())
    }

    /// Whether every model has at least one endpoint with fresh metrics and, when JWTs are the
    /// only credential accepted, a key set has been fetched (what `/readyz` answers).
    pub fn is_ready(&self) -> bool {
        self.shared.state.load().is_ready()
    }

    /// Watches `path` and reloads when its contents change, every `reloadIntervalMs` of the
    /// configuration in force, until `shutdown` completes. Errors are logged; the running
    /// configuration stays.
    pub fn watch_file(
        &self,
        path: PathBuf,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        let (interval, reload) = (self.clone(), self.clone());
        infergate_pool::watch::watch_file(
            path,
            "configuration",
            move || interval.shared.state.load().config.reload_interval,
            move |path| reload.reload_file(path),
            shutdown,
        )
    }
}

/// The sockets of a thread-per-core gateway ([`serve_workers`]): one front-door listener per
/// worker, all on the same address, plus the admin listener.
#[derive(Debug)]
pub struct WorkerListeners {
    /// One listener per worker thread, bound to one address with `SO_REUSEPORT`.
    pub http: Vec<std::net::TcpListener>,
    /// `/metrics`, `/healthz`, `/readyz`; `None` serves no admin port.
    pub admin: Option<std::net::TcpListener>,
}

impl WorkerListeners {
    /// Binds `workers` front-door listeners on `http` (port 0 picks one free port for all of
    /// them) and the admin listener on `admin`.
    pub fn bind(
        http: SocketAddr,
        admin: Option<SocketAddr>,
        workers: usize,
    ) -> Result<Self, Error> {
        if http.port() != 0 {
            refuse_if_served(http)?;
        }
        let first = reuseport_listener(http)?;
        // Port 0 in `http` bound a free port: the other workers join that one.
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..workers.max(1) {
            listeners.push(reuseport_listener(addr)?);
        }
        let admin = match admin {
            Some(a) => {
                let l = std::net::TcpListener::bind(a)?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        Ok(WorkerListeners {
            http: listeners,
            admin,
        })
    }
}

/// The number of worker threads [`serve_workers`] is meant to run by default: one per core.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Fails (`AddrInUse`) when another socket holds `addr`. The workers' `SO_REUSEPORT` would
/// otherwise join the listeners of any other process of the same user on that port — a second
/// gateway started on a port already served would take a share of its connections, silently.
/// A socket without `SO_REUSEPORT` cannot be bound where anyone listens; it is closed at once.
fn refuse_if_served(addr: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            std::io::Error::new(
                e.kind(),
                format!("{addr} is already in use (by another gateway or another program)"),
            )
        } else {
            e
        }
    })
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    // As deep as nginx's `backlog=4096`: bursts of new connections wait instead of failing.
    socket.listen(4096)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Loads every file `config` names, as a start would and with the same errors, in the same
/// order: the front door's certificate and key (and that they belong together), each model's
/// `tls.caFile` and `precisePrefix.tokenizer`, the JWKS `caFile` and the API key file. Binds no
/// port, starts no pool and fetches no key set: what `infergate gateway --check` runs after the
/// file itself validated, so that a file it calls valid does not stop the gateway at start.
pub fn check_files(config: &GatewayConfig) -> Result<(), Error> {
    crate::tls::check_listener_tls(config.tls.as_ref())?;
    crate::tls::check_admin_tls(config.admin_tls.as_ref())?;
    for m in &config.models {
        crate::backend::check_files(m)?;
    }
    crate::auth::Authenticator::check(&config.auth)?;
    crate::access_log::check(config.access_log.as_ref())?;
    Ok(())
}

/// What both ways of serving set up on the caller's runtime: state, metrics, admin, handle.
struct Control {
    shared: Arc<Shared>,
    handle: Handle,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    admin_task: Option<JoinHandle<std::io::Result<()>>>,
    admin_addr: Option<SocketAddr>,
    /// The front door's TLS, when `tls` is configured.
    tls: Option<ServerTls>,
    /// Whether the admin port serves HTTPS (`adminTls`).
    admin_https: bool,
}

impl Control {
    fn start(config: GatewayConfig, admin: Option<TcpListener>) -> Result<Control, Error> {
        let mut registry = Registry::default();
        let telemetry = Telemetry::register(&mut registry);
        let tls = crate::tls::listener_tls(config.tls.as_ref())?;
        if let Some(t) = &tls {
            t.register(&mut registry);
        }
        // Built only with an admin port to serve; its series carry `port="admin"`, in the same
        // families as the front door's.
        let admin_tls = match &admin {
            Some(_) => crate::tls::admin_tls(config.admin_tls.as_ref())?,
            None => None,
        };
        if let Some(t) = &admin_tls {
            t.register_labelled(&mut registry);
        }
        let admin_https = admin_tls.is_some();
        let seed = config.seed;
        let state = State::build(config, None, &telemetry)?;
        let shared = Arc::new(Shared::new(state, telemetry, seed));
        let registry = Arc::new(registry);
        let admin_addr = match &admin {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let handle = Handle {
            shared: Arc::clone(&shared),
            reload_lock: Arc::new(Mutex::new(())),
        };
        let admin_task = admin.map(|listener| {
            let mut rx = stop_rx.clone();
            let (metrics, ready) = (Arc::clone(&shared), Arc::clone(&shared));
            let heartbeat = Arc::clone(&shared);
            let heartbeats = infergate_pool::heartbeat::Heartbeats::new();
            tokio::spawn(infergate_pool::admin::serve_tls_with_heartbeat(
                listener,
                admin_tls,
                move || crate::admin::encode_metrics(&registry, &metrics),
                move || ready.state.load().readiness(),
                move || Some(crate::admin::encode_heartbeat(&heartbeats, &heartbeat)),
                async move { stopped(&mut rx).await },
            ))
        });
        Ok(Control {
            shared,
            handle,
            stop_tx,
            stop_rx,
            admin_task,
            admin_addr,
            tls,
            admin_https,
        })
    }

    /// The task that, once `shutdown` completes, stops everything and waits for `serving`.
    fn supervise(
        self,
        http_addr: SocketAddr,
        shutdown: impl Future<Output = ()> + Send + 'static,
        serving: impl Future<Output = ()> + Send + 'static,
    ) -> Gateway {
        let Control {
            handle,
            stop_tx,
            admin_task,
            admin_addr,
            tls,
            admin_https,
            ..
        } = self;
        let task = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
            serving.await;
            if let Some(t) = admin_task {
                match t.await {
                    Ok(Err(e)) => tracing::error!(error = %e, "admin server failed"),
                    Err(e) => tracing::error!(error = %e, "admin server ended abnormally"),
                    Ok(Ok(())) => {}
                }
            }
        });
        let scheme = if tls.is_some() { "https" } else { "http" };
        match admin_addr {
            Some(admin) => {
                let admin_scheme = if admin_https { "https" } else { "http" };
                tracing::info!(addr = %http_addr, scheme, %admin, admin_scheme, "gateway serving")
            }
            None => tracing::info!(addr = %http_addr, scheme, admin = "off", "gateway serving"),
        }
        Gateway {
            http_addr,
            admin_addr,
            handle,
            task,
        }
    }
}

/// Starts the gateway on `listeners` with `config` and returns once it is serving. It runs until
/// `shutdown` completes, then stops accepting and lets open connections finish.
///
/// One accept loop on the caller's runtime serves every connection; [`serve_workers`] is the
/// thread-per-core form `infergate gateway` runs. Must be called inside a tokio runtime.
pub async fn serve(
    config: GatewayConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Gateway, Error> {
    let http_addr = listeners.http.local_addr()?;
    let control = Control::start(config, listeners.admin)?;
    let worker = Arc::new(Worker::new(Arc::clone(&control.shared), 0));
    let accept = tokio::spawn(accept_loop(
        listeners.http,
        worker,
        control.stop_rx.clone(),
        control.tls.clone(),
    ));
    let serving = async move {
        if let Err(e) = accept.await {
            tracing::error!(error = %e, "accept loop ended abnormally");
        }
    };
    Ok(control.supervise(http_addr, shutdown, serving))
}

/// Starts the gateway thread per core: one worker thread per front-door listener in
/// `listeners`, each with a single-threaded runtime, its own listener and its own upstream
/// connections (see the module documentation). Returns once every worker is accepting. It runs
/// until `shutdown` completes, then stops accepting and lets open connections finish.
///
/// Must be called inside a tokio runtime: the model pools' scrapers, the admin server and
/// reloads run there.
pub async fn serve_workers(
    config: GatewayConfig,
    listeners: WorkerListeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Gateway, Error> {
    let http_addr = match listeners.http.first() {
        Some(l) => l.local_addr()?,
        None => {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no front-door listener: at least one worker is needed",
            )));
        }
    };
    let admin = listeners.admin.map(TcpListener::from_std).transpose()?;
    let control = Control::start(config, admin)?;
    // Runtimes and listeners are set up here, so that any failure is returned, not logged.
    let mut workers = Vec::with_capacity(listeners.http.len());
    for listener in listeners.http {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        workers.push((runtime, listener));
    }
    let mut done = Vec::with_capacity(workers.len());
    for (i, (runtime, listener)) in workers.into_iter().enumerate() {
        let worker = Arc::new(Worker::new(Arc::clone(&control.shared), i));
        let stop = control.stop_rx.clone();
        let tls = control.tls.clone();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        // If spawning fails, dropping `control` below stops the workers already started.
        std::thread::Builder::new()
            .name(format!("infergate-gw-{i}"))
            .spawn(move || {
                runtime.block_on(accept_loop(listener, worker, stop, tls));
                drop(runtime);
                let _ = done_tx.send(());
            })?;
        done.push(done_rx);
    }
    let serving = async move {
        for d in done {
            if d.await.is_err() {
                tracing::error!("a gateway worker thread ended abnormally");
            }
        }
    };
    Ok(control.supervise(http_addr, shutdown, serving))
}

async fn accept_loop(
    listener: TcpListener,
    worker: Arc<Worker>,
    mut stop: watch::Receiver<bool>,
    tls: Option<ServerTls>,
) {
    // Connection settings follow `limits:`; rebuilt when a reload changes them.
    let mut conn_limits = worker.shared.state.load().config.limits.clone();
    let mut builder = Arc::new(crate::limits::http_builder(&conn_limits));
    // The worker's idle upstream connections are swept on the worker's own thread.
    let sweeper = tokio::spawn({
        let worker = Arc::clone(&worker);
        let mut stop = stop.clone();
        async move {
            loop {
                let pool_idle = worker.shared.state.load().config.timeouts.pool_idle;
                let every = (pool_idle / 2).clamp(
                    std::time::Duration::from_millis(100),
                    std::time::Duration::from_secs(30),
                );
                tokio::select! {
                    () = tokio::time::sleep(every) => worker.upstreams.sweep(pool_idle),
                    () = stopped(&mut stop) => return,
                }
            }
        }
    });
    // Each connection holds a clone of this receiver; `closed()` on the sender below resolves
    // once every connection has finished.
    let (conns_tx, conns_rx) = watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly and keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let counters = worker.shared.telemetry.limits.clone();
        let (slot, header_timeout) = {
            let state = worker.shared.state.load();
            let limits = &state.config.limits;
            if *limits != conn_limits {
                conn_limits = limits.clone();
                builder = Arc::new(crate::limits::http_builder(&conn_limits));
            }
            // Over `maxConnections`: closed at once (dropping the stream), counted.
            let Some(slot) = counters.open_connection(limits.max_connections) else {
                continue;
            };
            (slot, limits.header_read_timeout())
        };
        let _ = stream.set_nodelay(true);
        let worker = Arc::clone(&worker);
        let builder = Arc::clone(&builder);
        let mut stop = stop.clone();
        let conn_guard = conns_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            // With `tls`, the handshake first (bounded; a failure is logged and counted).
            let Ok(stream) = accept_tls(tls.as_ref(), stream).await else {
                return;
            };
            let first = crate::limits::FirstRequest::default();
            let seen = first.clone();
            let service = service_fn(move |req: hyper::Request<Incoming>| {
                seen.seen();
                handle(Arc::clone(&worker), req, peer)
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let conn = std::pin::pin!(conn);
            let stop = std::pin::pin!(stopped(&mut stop));
            let graceful = Graceful::new(conn, stop, |c| c.graceful_shutdown());
            // A connection with no complete request head in time is dropped (closed).
            let result = tokio::select! {
                r = graceful => Some(r),
                () = crate::limits::no_request_within(&first, header_timeout, &counters) => None,
            };
            if let Some(Err(e)) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
            drop(conn_guard);
        });
    }
    drop(listener);
    drop(conns_rx);
    conns_tx.closed().await;
    let _ = sweeper.await;
}

/// Resolves once shutdown was signalled (or the signal's sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    // The guard returned by `wait_for` is not `Send`; drop it at once.
    let _ = rx.wait_for(|s| *s).await.is_ok();
}
