//! Starting the gateway: the front-door accept loop (HTTP/1.1 and h2c on one port), the admin
//! server, configuration reloads, and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::GatewayConfig;
use crate::error::Error;
use crate::proxy::{Shared, handle};
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
    /// stopped accepting, and every open connection finished its requests.
    pub async fn wait(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "gateway task ended abnormally");
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
        if old.config.listen != config.listen || old.config.admin != config.admin {
            tracing::warn!("`listen` and `admin` changes take effect only after a restart");
        }
        match State::build(config, Some(&old), &self.shared.telemetry, None) {
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

    /// Whether every model has at least one endpoint with fresh metrics.
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
        let handle = self.clone();
        // Read before returning, so a change made right after this call is seen as a change.
        // A config file is a few KB on a local disk: reading it inline is cheaper than a thread hop.
        let mut last = std::fs::read(&path).ok();
        tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            loop {
                let interval = handle.shared.state.load().config.reload_interval;
                if interval.is_zero() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = &mut shutdown => return,
                }
                let now = std::fs::read(&path).ok();
                if now.is_none() || now == last {
                    continue;
                }
                last = now;
                match handle.reload_file(&path) {
                    Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
                    Err(e) => tracing::error!(
                        path = %path.display(),
                        error = %e,
                        "configuration reload rejected; the previous configuration stays in force"
                    ),
                }
            }
        })
    }
}

/// Starts the gateway on `listeners` with `config` and returns once it is serving. It runs until
/// `shutdown` completes, then stops accepting and lets open connections finish.
///
/// Must be called inside a tokio runtime.
pub async fn serve(
    config: GatewayConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Gateway, Error> {
    let mut registry = Registry::default();
    let telemetry = Telemetry::register(&mut registry);
    let seed = config.seed;
    let state = State::build(config, None, &telemetry, Some(&mut registry))?;
    let shared = Arc::new(Shared::new(state, telemetry, seed));
    let registry = Arc::new(registry);

    let http_addr = listeners.http.local_addr()?;
    let admin_addr = match &listeners.admin {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let handle = Handle {
        shared: Arc::clone(&shared),
        reload_lock: Arc::new(Mutex::new(())),
    };

    let admin_task = listeners.admin.map(|listener| {
        let ready_handle = handle.clone();
        let mut rx = stop_rx.clone();
        tokio::spawn(infergate_pool::admin::serve(
            listener,
            registry,
            move || ready_handle.is_ready(),
            async move { stopped(&mut rx).await },
        ))
    });
    let accept = tokio::spawn(accept_loop(listeners.http, shared, stop_rx));
    let task = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        if let Err(e) = accept.await {
            tracing::error!(error = %e, "accept loop ended abnormally");
        }
        if let Some(t) = admin_task {
            match t.await {
                Ok(Err(e)) => tracing::error!(error = %e, "admin server failed"),
                Err(e) => tracing::error!(error = %e, "admin server ended abnormally"),
                Ok(Ok(())) => {}
            }
        }
    });
    tracing::info!(%http_addr, admin = ?admin_addr, "gateway serving");
    Ok(Gateway {
        http_addr,
        admin_addr,
        handle,
        task,
    })
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Some(std::time::Duration::from_secs(30)));
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    // Each connection holds a clone of this receiver; `closed()` on the sender below resolves
    // once every connection has finished.
    let (conns_tx, conns_rx) = watch::channel(());
    loop {
        let (stream, _peer) = tokio::select! {
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
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let builder = Arc::clone(&builder);
        let mut stop = stop.clone();
        let conn_guard = conns_rx.clone();
        tokio::spawn(async move {
            let service =
                service_fn(move |req: hyper::Request<Incoming>| handle(Arc::clone(&shared), req));
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(conn_guard);
        });
    }
    drop(listener);
    drop(conns_rx);
    conns_tx.closed().await;
}

/// Resolves once shutdown was signalled (or the signal's sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    // The guard returned by `wait_for` is not `Send`; drop it at once.
    let _ = rx.wait_for(|s| *s).await.is_ok();
}
