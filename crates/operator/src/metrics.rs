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
