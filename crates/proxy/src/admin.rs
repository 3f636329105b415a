//! The gateway's admin port: `/metrics`, `/healthz` (also `/livez`), `/readyz`.
//!
//! It answers like `infergate_pool::admin`, with one difference that is the reason it exists:
//! `/metrics` is put together at each scrape from the gateway's own registry *and* the registry
//! of every model pool in the configuration in force. A fixed registry would only ever show the
//! pools that existed at start; this way a pool started by a reload is exported from its first
//! scrape, and a removed one disappears.

use std::collections::HashMap;
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
///
/// Every pool registers the same metric families (told apart by their `model` label), and the
/// exposition format allows each family once, with all its samples together: the registries are
/// encoded one by one and their families merged by name, in order of first appearance.
pub(crate) fn encode_metrics(
    registry: &Registry,
    shared: &Shared,
) -> Result<String, std::fmt::Error> {
    let mut merged = Families::default();
    let mut text = String::new();
    encode_registry(&mut text, registry)?;
    merged.add(&text);
    let state = shared.state.load();
    for model in state.router.targets() {
        text.clear();
        encode_registry(&mut text, &model.backend.registry)?;
        merged.add(&text);
    }
    let mut out = merged.into_text();
    encode_eof(&mut out)?;
    Ok(out)
}

/// Metric families gathered from several encoded registries.
#[derive(Default)]
struct Families {
    /// Name, metadata lines (`# HELP`, `# TYPE`, `# UNIT`) and sample lines of each family, in
    /// order of first appearance.
    families: Vec<(String, String, String)>,
    index: HashMap<String, usize>,
}

impl Families {
    /// Adds the families of one encoded registry. A family seen before keeps its first metadata
    /// and gains these samples.
    fn add(&mut self, text: &str) {
        let mut current: Option<usize> = None;
        let mut keep_meta = false;
        for line in text.lines() {
            if line.is_empty() || line == "# EOF" {
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                // `# HELP name …`, `# TYPE name …`, `# UNIT name …`
                let name = meta.split(' ').nth(1).unwrap_or_default();
                if current.is_none_or(|i| self.families[i].0 != name) {
                    let i = match self.index.get(name) {
                        Some(&i) => {
                            keep_meta = false;
                            i
                        }
                        None => {
                            keep_meta = true;
                            self.families
                                .push((name.to_owned(), String::new(), String::new()));
                            self.index.insert(name.to_owned(), self.families.len() - 1);
                            self.families.len() - 1
                        }
                    };
                    current = Some(i);
                }
                if keep_meta && let Some(i) = current {
                    self.families[i].1.push_str(line);
                    self.families[i].1.push('\n');
                }
            } else {
                let i = match current {
                    Some(i) => i,
                    None => {
                        // Samples before any metadata (not produced by the encoder): keep them.
                        self.families
                            .push((String::new(), String::new(), String::new()));
                        let i = self.families.len() - 1;
                        current = Some(i);
                        i
                    }
                };
                self.families[i].2.push_str(line);
                self.families[i].2.push('\n');
            }
        }
    }

    fn into_text(self) -> String {
        let len = self
            .families
            .iter()
            .map(|(_, m, s)| m.len() + s.len())
            .sum::<usize>();
        let mut out = String::with_capacity(len + 8);
        for (_, meta, samples) in self.families {
            out.push_str(&meta);
            out.push_str(&samples);
        }
        out
    }
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

#[cfg(test)]
mod tests {
    use super::Families;

    #[test]
    fn families_from_several_registries_are_merged_once_each_in_first_order() {
        let mut f = Families::default();
        f.add(
            "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\"} 1\n\
             # HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"m\"} 2\n",
        );
        f.add(
            "# HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"n\"} 3\n\
             # HELP a_total A.\n# TYPE a_total counter\na_total{model=\"n\"} 4\n\
             # HELP c C.\n# TYPE c gauge\nc 5\n# EOF\n",
        );
        assert_eq!(
            f.into_text(),
            "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\"} 1\n\
             a_total{model=\"n\"} 4\n\
             # HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"m\"} 2\nb{model=\"n\"} 3\n\
             # HELP c C.\n# TYPE c gauge\nc 5\n"
        );
    }
}
