//! The admin HTTP server: `/metrics` (Prometheus text format), `/healthz`, `/readyz`.
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

fn respond<R: Fn() -> bool>(
    req: &Request<Incoming>,
    registry: &Registry,
    ready: &R,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut out = String::new();
            if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "metrics encoding failed\n",
                );
            }
            let mut r = Response::new(Full::new(Bytes::from(out)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        }
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
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` completes.
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
    let ready = Arc::new(ready);
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
        let registry = Arc::clone(&registry);
        let ready = Arc::clone(&ready);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let r = respond(&req, &registry, &*ready);
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
