//! Serving functions: the ext_proc gRPC port and the gRPC health port.
//!
//! Servers are built by plain functions that take a bound listener and a shutdown future, so
//! tests call them directly on 127.0.0.1 port 0.

use std::future::Future;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
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

/// Serves an ext_proc service (the picker or the body-based router) on `listener` until
/// `shutdown` completes.
pub async fn serve_ext_proc<S>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    S: ExternalProcessor,
{
    Server::builder()
        .tcp_nodelay(true)
        .add_service(ExternalProcessorServer::new(service))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
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
