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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The operator's admin port is the shared admin server (`infergate_pool::admin`) over this
    /// registry, as `serve` starts it.
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
        let server = tokio::spawn(infergate_pool::admin::serve(
            listener,
            Arc::new(registry),
            || true,
            async {
                let _ = rx.await;
            },
        ));
        let r = infergate_testkit::get(addr, "/metrics").await;
        let body = r.text();
        assert_eq!(r.status, 200, "{body}");
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
        // The names docs/operator.md gives are the ones served.
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operator.md"),
        )
        .unwrap();
        for name in [
            "infergate_operator_reconciliations_total",
            "infergate_operator_reconcile_failures_total",
        ] {
            assert!(
                doc.contains(&format!("`{name}")),
                "docs/operator.md: {name}"
            );
            assert!(body.contains(name), "{body}");
        }
        assert_eq!(infergate_testkit::get(addr, "/healthz").await.status, 200);
        assert_eq!(infergate_testkit::get(addr, "/readyz").await.status, 200);
        assert_eq!(infergate_testkit::get(addr, "/nope").await.status, 404);
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
