//! Prometheus metrics of the reconciler.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Label set of the failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// [`crate::Error::metric_label`] of the failure.
    pub error: &'static str,
}

/// Counters the reconciler updates.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Reconciles started.
    pub reconciliations: Counter,
    /// Reconciles that failed, by error kind.
    pub failures: Family<FailureLabels, Counter>,
}

impl Metrics {
    /// Registers the counters under `infergate_operator_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("infergate_operator");
        sub.register(
            "reconciliations",
            "Reconciles started",
            self.reconciliations.clone(),
        );
        sub.register(
            "reconcile_failures",
            "Reconciles that failed, by error kind",
            self.failures.clone(),
        );
    }

    /// Counts a failure.
    pub fn failed(&self, error: &crate::Error) {
        self.failures
            .get_or_create(&FailureLabels {
                error: error.metric_label(),
            })
            .inc();
    }

    /// Failures counted so far with `label`.
    pub fn failures_with(&self, label: &'static str) -> u64 {
        self.failures
            .get_or_create(&FailureLabels { error: label })
            .get()
    }
}

/// Serves `GET /metrics` (Prometheus text) and `GET /healthz` on `listener` until `shutdown`.
///
/// A deliberately small HTTP/1.1 responder: one request per connection, which is all a scraper
/// or a kubelet probe sends.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: std::sync::Arc<Registry>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => a,
        };
        let Ok((stream, _)) = accepted else { continue };
        let registry = registry.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &registry).await {
                tracing::debug!(error = %e, "metrics connection");
            }
        });
    }
}

async fn answer(mut stream: tokio::net::TcpStream, registry: &Registry) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 1024];
    let n = stream.read(&mut buf).await?;
    let head = std::str::from_utf8(&buf[..n]).unwrap_or("");
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, ctype, body) = match path {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".to_owned(),
                ),
            }
        }
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_counters_and_health() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.reconciliations.inc();
        metrics.failed(&crate::Error::MissingMetadata("uid"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, Arc::new(registry), async {
            let _ = rx.await;
        }));
        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("infergate_operator_reconciliations_total 1"),
            "{body}"
        );
        assert!(
            body.contains(
                "infergate_operator_reconcile_failures_total{error=\"missing_metadata\"} 1"
            ),
            "{body}"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tx.send(()).unwrap();
        server.await.unwrap();
    }
}
