//! Serving functions: the ext_proc gRPC port and the gRPC health port.
//!
//! Servers are built by plain functions that take a bound listener and a shutdown future, so
//! tests call them directly on 127.0.0.1 port 0.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use infergate_pool::tls::{HandshakeError, ServerTls, accept_tls};
use tokio::net::TcpListener;
use tokio::time::Instant;
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
/// At most one warning per this interval for clients refused for their certificate (mutual
/// TLS): the first is logged at once, the next ones summed into the line that ends the pause.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

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
    let refusals = Arc::new(Mutex::new(Refusals::default()));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
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
        let (tls, refusals) = (tls.clone(), Arc::clone(&refusals));
        tokio::spawn(async move {
            // A failed handshake is logged (debug) and counted by `accept_tls`; a refused client
            // certificate is also warned of here, a few times an hour at most.
            let stream = match accept_tls(tls.as_ref(), stream).await {
                Ok(stream) => stream,
                Err(e) => {
                    if let HandshakeError::ClientCertificate(_) = e {
                        warn_refused(&refusals, peer, &e);
                    }
                    return;
                }
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

/// Clients of one port refused for their certificate since the last warning, and when that
/// warning was logged.
#[derive(Debug, Default)]
struct Refusals {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl Refusals {
    /// Counts a refusal at `now`. `Some(n)` when it is to be logged — the first ever, or the
    /// first [`REFUSAL_LOG_INTERVAL`] or more after the last line — with `n` the refusals the
    /// line stands for (this one and those left unlogged since the last line).
    fn record(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self
            .last_logged
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL)
        {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// Warns that `peer` was refused for its certificate (`error`, rustls' reason in its chain),
/// unless another such line was logged less than [`REFUSAL_LOG_INTERVAL`] ago: a client without
/// a certificate retrying in a loop gives one line a minute, not one per attempt. Every refusal
/// is counted in `infergate_tls_handshake_failures_total{reason="client_certificate"}`.
fn warn_refused(refusals: &Mutex<Refusals>, peer: SocketAddr, error: &HandshakeError) {
    let logged = refusals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .record(Instant::now());
    if let Some(refused) = logged {
        tracing::warn!(
            %peer,
            error = %infergate_pool::ErrorChain(error),
            refused,
            "ext_proc client refused: it presented no certificate, or one that does not chain to \
             --tls-client-ca-file (`refused`: clients refused since the last such line; at most \
             one line a minute)"
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The first refusal is logged at once; the next ones within the interval are not, and are
    /// counted into the first line after it; the interval then runs from that line.
    #[test]
    fn refusals_are_logged_at_most_once_per_interval_with_the_ones_left_out() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut r = Refusals::default();
        assert_eq!(r.record(at(0)), Some(1));
        assert_eq!(r.record(at(1)), None);
        assert_eq!(r.record(at(59)), None);
        assert_eq!(r.record(at(60)), Some(3));
        assert_eq!(r.record(at(61)), None);
        assert_eq!(r.record(at(119)), None);
        assert_eq!(r.record(at(120)), Some(3));
        assert_eq!(r.record(at(1000)), Some(1));
    }
}
