//! The gateway's admin port: `/metrics`, `/healthz` (also `/livez`), `/readyz`.
//!
//! It answers like `infergate_pool::admin`, with one difference that is the reason it exists:
//! `/metrics` is put together at each scrape from the gateway's own registry *and* the registry
//! of every model pool in the configuration in force. A fixed registry would only ever show the
//! pools that existed at start; this way a pool started by a reload is exported from its first
//! scrape, and a removed one disappears.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::proxy::Shared;

/// The content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The gateway's series followed by each current pool's, then the end marker.
pub(crate) fn encode_metrics(
    registry: &Registry,
    shared: &Shared,
) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    encode_registry(&mut out, registry)?;
    let state = shared.state.load();
    for model in state.router.targets() {
        encode_registry(&mut out, &model.backend.registry)?;
    }
    encode_eof(&mut out)?;
    Ok(out)
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn respond(req: &Request<Incoming>, registry: &Registry, shared: &Shared) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match req.uri().path() {
        "/metrics" => match encode_metrics(registry, shared) {
            Ok(out) => {
                let mut r = Response::new(Full::new(Bytes::from(out)));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
                );
                r
            }
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics encoding failed\n",
            ),
        },
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if shared.state.load().is_ready() {
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
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
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
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let r = respond(&req, &registry, &shared);
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
