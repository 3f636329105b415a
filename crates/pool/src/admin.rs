//! The admin HTTP server: `/metrics` (Prometheus text format), `/healthz` (also `/livez`),
//! `/readyz` (503 when not ready, the body saying why: [`crate::readiness`]), and for the gateway
//! and the picker `/heartbeat` (the JSON status the global router
//! polls, [`crate::heartbeat`]); any other path is 404, any method but `GET` and `HEAD` 405.
//!
//! It is the one admin server of every infergate process: the picker and the BBR
//! (`infergate_extproc::run`), the standalone gateway (`infergate_proxy`, with `/metrics` merged
//! over its pools' registries at each scrape) and the operator (`infergate_operator::serve`) call
//! [`serve`] or [`serve_with`] with their listener, their readiness and their shutdown future;
//! the operator calls [`serve_guarded`], whose guard checks each scrape's bearer token (the
//! probes stay open), over TLS when given a [`ServerTls`] (so that token never crosses the
//! network in clear). It lives here because every shell already depends on this crate.
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

use crate::readiness::Readiness;
use crate::tls::{ServerTls, accept_tls};

mod families;

/// The content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn respond<M, R, T, H>(
    req: &Request<Incoming>,
    metrics: &M,
    ready: &R,
    heartbeat: &H,
) -> Response<Full<Bytes>>
where
    M: Fn() -> Result<String, std::fmt::Error>,
    R: Fn() -> T,
    T: Into<Readiness>,
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
            let mut r = Response::new(Full::new(Bytes::from(merge_families(&out))));
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
            let readiness: Readiness = ready().into();
            let status = if readiness.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, readiness.to_string())
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: this port serves /metrics, /healthz (also /livez), /readyz and, on the \
             gateway and the picker, /heartbeat\n",
        ),
    }
}

/// `page` (the exposition format) with every metric family once: a family that appears again
/// further down (from another registry, or the same registry's second TLS port, whose series
/// carry `port`) keeps its first `# HELP`/`# TYPE`/`# UNIT` and gains the later samples, in
/// order of first appearance; the page ends with `# EOF`. Every `/metrics` answer of the admin
/// server goes through it, once per scrape, off the request path.
pub fn merge_families(page: &str) -> String {
    let mut merged = families::Families::default();
    merged.add(page);
    let mut out = merged.into_text();
    out.push_str("# EOF\n");
    out
}

/// Serves the admin endpoints on `listener` until `shutdown` completes, with `/metrics` encoding
/// `registry`.
///
/// `ready` answers `/readyz`: a `bool` (for a pool: [`LivePool::is_ready`](crate::LivePool::is_ready)),
/// or a [`Readiness`] that says what is not ready.
pub async fn serve<R, T>(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: R,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    R: Fn() -> T + Send + Sync + 'static,
    T: Into<Readiness>,
{
    serve_with(listener, encoder(registry), ready, shutdown).await
}

/// The answer of a [`serve_guarded`] guard that refuses a scrape (`401`, `403`, ...).
pub type Refusal = Response<String>;

/// As [`serve`], with each `GET` or `HEAD` of `/metrics` first passed to `guard` with the
/// request's headers: `Ok(())` serves it, `Err(refusal)` answers `refusal` instead. The other
/// paths are never guarded: the kubelet's probes carry no credentials.
///
/// With `tls`, every connection is TLS (HTTP/1.1 or h2 by ALPN), probes included: a client
/// that does not complete the handshake gets no HTTP answer (logged and counted by `tls`).
pub async fn serve_guarded<R, T, G, F>(
    listener: TcpListener,
    tls: Option<ServerTls>,
    registry: Arc<Registry>,
    ready: R,
    guard: G,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    R: Fn() -> T + Send + Sync + 'static,
    T: Into<Readiness>,
    G: Fn(&http::HeaderMap) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), Refusal>> + Send + 'static,
{
    let handlers = (encoder(registry), ready, || None, guard);
    run(listener, tls, handlers, shutdown).await
}

fn encoder(registry: Arc<Registry>) -> impl Fn() -> Result<String, std::fmt::Error> {
    move || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The guard of the servers whose `/metrics` is open.
fn open(_: &http::HeaderMap) -> std::future::Ready<Result<(), Refusal>> {
    std::future::ready(Ok(()))
}

/// As [`serve`], with `/metrics` answered by `metrics` at each scrape: for a server whose set of
/// registries changes while it runs (the gateway's pools come and go with its configuration).
pub async fn serve_with<M, R, T>(
    listener: TcpListener,
    metrics: M,
    ready: R,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> Result<String, std::fmt::Error> + Send + Sync + 'static,
    R: Fn() -> T + Send + Sync + 'static,
    T: Into<Readiness>,
{
    serve_tls_with_heartbeat(listener, None, metrics, ready, || None, shutdown).await
}

/// As [`serve_with`], with `/heartbeat` answered by `heartbeat` (the JSON document of
/// [`crate::heartbeat`]; `None` answers 404), and every connection TLS when `tls` is given
/// (HTTP/1.1 or h2 by ALPN), probes included; with a client CA in `tls` every client must
/// present a certificate it verifies. The gateway's `adminTls` and the picker's and the BBR's
/// `--metrics-tls-*`, for a heartbeat or a scrape that crosses a network.
pub async fn serve_tls_with_heartbeat<M, R, T, H>(
    listener: TcpListener,
    tls: Option<ServerTls>,
    metrics: M,
    ready: R,
    heartbeat: H,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> Result<String, std::fmt::Error> + Send + Sync + 'static,
    R: Fn() -> T + Send + Sync + 'static,
    T: Into<Readiness>,
    H: Fn() -> Option<String> + Send + Sync + 'static,
{
    run(listener, tls, (metrics, ready, heartbeat, open), shutdown).await
}

/// The accept loop; `handlers` are the metrics encoder, the readiness, the heartbeat and the
/// scrape guard.
async fn run<M, R, T, H, G, F>(
    listener: TcpListener,
    tls: Option<ServerTls>,
    handlers: (M, R, H, G),
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> Result<String, std::fmt::Error> + Send + Sync + 'static,
    R: Fn() -> T + Send + Sync + 'static,
    T: Into<Readiness>,
    H: Fn() -> Option<String> + Send + Sync + 'static,
    G: Fn(&http::HeaderMap) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), Refusal>> + Send + 'static,
{
    let handlers = Arc::new(handlers);
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
        let tls = tls.clone();
        tokio::spawn(async move {
            // In the connection's task, so that a slow handshake holds up no other client; a
            // failed one is logged and counted by `accept_tls`.
            let Ok(stream) = accept_tls(tls.as_ref(), stream).await else {
                return;
            };
            let service = service_fn(move |req: Request<Incoming>| {
                let handlers = Arc::clone(&handlers);
                async move {
                    let scrape = req.uri().path() == "/metrics"
                        && (req.method() == Method::GET || req.method() == Method::HEAD);
                    if scrape && let Err(refusal) = (handlers.3)(req.headers()).await {
                        return Ok::<_, Infallible>(refusal.map(|b| Full::new(Bytes::from(b))));
                    }
                    Ok(respond(&req, &handlers.0, &handlers.1, &handlers.2))
                }
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
