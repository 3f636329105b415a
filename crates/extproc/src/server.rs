//! Serving functions: the ext_proc gRPC port and the gRPC health port.
//!
//! Servers are built by plain functions that take a bound listener and a shutdown future, so
//! tests call them directly on 127.0.0.1 port 0.

use std::future::Future;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use infergate_pool::tls::{ServerTls, accept_tls};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use crate::error::Error;

/// The gRPC service name Envoy and health checkers know the processor by.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// Health service reporting that the process is alive.
pub const LIVENESS: &str = "liveness";
/// Health service reporting that the pool can route (discovery synced, fresh metrics).
pub const READINESS: &str = "readiness";
/// How often readiness is re-evaluated for the health service.
pub const READINESS_POLL: Duration = Duration::from_millis(500);
/// HTTP/2 stream and connection receive windows of the ext_proc port (bytes).
pub const RECEIVE_WINDOW: u32 = 1 << 20;
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Serves an ext_proc service (the picker or the body-based router) on `listener` until
/// `shutdown` completes, then lets open streams finish.
///
/// Each connection is served by hyper's HTTP/2 server with the generated gRPC service as its
/// only service: ext_proc has one method, so tonic's router (path matching, boxed futures and
/// per-request extensions) would be pure per-request cost. Settings: `TCP_NODELAY` (answers are
/// small and latency-bound), no limit on concurrent streams (Envoy multiplexes every in-flight
/// request on few connections, and a stream lives as long as its response), and 1 MiB receive
/// windows so bodies do not wait for window updates.
pub async fn serve_ext_proc<S>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    S: ExternalProcessor,
{
    serve_ext_proc_tls(listener, service, None, shutdown).await
}

/// [`serve_ext_proc`], over TLS when `tls` is set: each accepted connection first completes the
/// handshake (bounded by the handshake timeout, in the connection's own task so a slow client
/// holds up nobody), then is served as HTTP/2. A certificate replaced on disk is served to new
/// connections; open ones keep theirs.
pub async fn serve_ext_proc_tls<S>(
    listener: TcpListener,
    service: S,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    S: ExternalProcessor,
{
    let service = ExternalProcessorServer::new(service);
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .max_concurrent_streams(None)
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(RECEIVE_WINDOW);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the listener itself is fine.
                    tracing::warn!(error = %e, "ext_proc accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let (builder, service, watcher) = (builder.clone(), service.clone(), graceful.watcher());
        let tls = tls.clone();
        tokio::spawn(async move {
            // A failed handshake is logged and counted by `accept_tls`, a refused client
            // certificate warned of there (a few times an hour at most).
            let Ok(stream) = accept_tls(tls.as_ref(), stream).await else {
                return;
            };
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, "ext_proc connection ended");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// Serves gRPC health on `listener`: `liveness` is always serving; `readiness` and the ext_proc
/// service name follow `ready`, polled every [`READINESS_POLL`].
pub async fn serve_health<R>(
    listener: TcpListener,
    ready: R,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    R: Fn() -> bool + Send + 'static,
{
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    let status = |ok: bool| {
        if ok {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    };
    let poller = {
        let reporter = reporter.clone();
        async move {
            let mut last = None;
            let mut tick = tokio::time::interval(READINESS_POLL);
            loop {
                tick.tick().await;
                let now = ready();
                if last != Some(now) {
                    last = Some(now);
                    for name in [READINESS, EXT_PROC_SERVICE, ""] {
                        reporter.set_service_status(name, status(now)).await;
                    }
                }
            }
        }
    };
    let poller = tokio::spawn(poller);
    let served = Server::builder()
        .add_service(health)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    poller.abort();
    served?;
    Ok(())
}
