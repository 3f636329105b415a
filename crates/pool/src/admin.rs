//! The admin HTTP server: `/metrics` (Prometheus text format), `/healthz` (also `/livez`),
//! `/readyz`, and for the gateway and the picker `/heartbeat` (the JSON status the global router
//! polls, [`crate::heartbeat`]); any other path is 404, any method but `GET` and `HEAD` 405.
//!
//! It is the one admin server of every infergate process: the picker and the BBR
//! (`infergate_extproc::run`), the standalone gateway (`infergate_proxy`, with `/metrics` merged
//! over its pools' registries at each scrape) and the operator (`infergate_operator::serve`) call
//! [`serve`] or [`serve_with`] with their listener, their readiness and their shutdown future.
//! It lives here because every shell already depends on this crate.
//!
//! It runs on its own port, apart from the traffic it describes, so that a scrape of the gateway's
//! metrics never queues behind model requests.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn respond<M, R, H>(
    req: &Request<Incoming>,
    metrics: &M,
    ready: &R,
    heartbeat: &H,
) -> Response<Full<Bytes>>
where
    M: Fn() -> Result<String, std::fmt::Error>,
    R: Fn() -> bool,
    H: Fn() -> Option<String>,
{
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let Ok(out) = metrics() else {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "metrics encoding failed\n",
                );
            };
            let mut r = Response::new(Full::new(Bytes::from(out)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        }
        crate::heartbeat::PATH => match heartbeat() {
            Some(doc) => {
                let mut r = Response::new(Full::new(Bytes::from(doc)));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                r.headers_mut().insert(
                    header::CACHE_CONTROL,
                    header::HeaderValue::from_static("no-store"),
                );
                r
            }
            None => text(StatusCode::NOT_FOUND, "no heartbeat on this process\n"),
        },
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if ready() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: this port serves /metrics, /healthz (also /livez), /readyz and, on the \
             gateway and the picker, /heartbeat\n",
        ),
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` completes, with `/metrics` encoding
/// `registry`.
///
/// `ready` answers `/readyz` (for a pool: [`LivePool::is_ready`](crate::LivePool::is_ready)).
pub async fn serve<R>(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: R,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    R: Fn() -> bool + Send + Sync + 'static,
{
    let metrics = move || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    };
    serve_with(listener, metrics, ready, shutdown).await
}

/// As [`serve`], with `/metrics` answered by `metrics` at each scrape: for a server whose set of
/// registries changes while it runs (the gateway's pools come and go with its configuration).
pub async fn serve_with<M, R>(
    listener: TcpListener,
    metrics: M,
    ready: R,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> Result<String, std::fmt::Error> + Send + Sync + 'static,
    R: Fn() -> bool + Send + Sync + 'static,
{
    serve_with_heartbeat(listener, metrics, ready, || None, shutdown).await
}

/// As [`serve_with`], with `/heartbeat` answered by `heartbeat` (the JSON document of
/// [`crate::heartbeat`]; `None` answers 404).
pub async fn serve_with_heartbeat<M, R, H>(
    listener: TcpListener,
    metrics: M,
    ready: R,
    heartbeat: H,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> Result<String, std::fmt::Error> + Send + Sync + 'static,
    R: Fn() -> bool + Send + Sync + 'static,
    H: Fn() -> Option<String> + Send + Sync + 'static,
{
    let handlers = Arc::new((metrics, ready, heartbeat));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving once it passes.
                    tracing::warn!(error = %e, "admin server accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let handlers = Arc::clone(&handlers);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let r = respond(&req, &handlers.0, &handlers.1, &handlers.2);
                async move { Ok::<_, Infallible>(r) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
}
