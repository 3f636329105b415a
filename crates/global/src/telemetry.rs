//! The fleet-level series on the global router's admin port (`infergate_global_*`).
//!
//! Labels are bounded by the configuration: `cluster` is a configured cluster's name (shared,
//! so that labelling a request's series copies no string), `reason` and `code` come from fixed
//! sets. With `quotas:` configured, the quota service's
//! `infergate_quota_*` series (per-tenant admitted and rejected counts, Redis state, replicas
//! seen) are on the same page; a refusal also counts in `infergate_global_rejections` under
//! `quota_exceeded`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// `cluster`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterLabel {
    pub(crate) cluster: Arc<str>,
}

/// `cluster`, `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterReason {
    pub(crate) cluster: Arc<str>,
    pub(crate) reason: &'static str,
}

/// `cluster`, `code` ([`status_class`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterCode {
    pub(crate) cluster: Arc<str>,
    pub(crate) code: &'static str,
}

/// `cluster`, `kind` (`input`, `output`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterKind {
    pub(crate) cluster: Arc<str>,
    pub(crate) kind: &'static str,
}

/// `cluster`, `file` (`token`, `ca`), `result` (`ok`, `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterFileResult {
    pub(crate) cluster: Arc<str>,
    pub(crate) file: &'static str,
    pub(crate) result: &'static str,
}

/// `cluster`, `result` (of a `/v1/models` fetch: `ok`, `refused`, `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterResult {
    pub(crate) cluster: Arc<str>,
    pub(crate) result: &'static str,
}

/// `cluster`, `file` (`client_cert`, `ca`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterFile {
    pub(crate) cluster: Arc<str>,
    pub(crate) file: &'static str,
}

/// `reason` (an `ApiError` metric label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

/// Every series.
#[derive(Clone)]
pub(crate) struct Telemetry {
    pub(crate) decisions: Family<ClusterReason, Counter>,
    pub(crate) retries: Family<ClusterReason, Counter>,
    pub(crate) drains: Family<ClusterReason, Counter>,
    pub(crate) returns: Family<ClusterLabel, Counter>,
    pub(crate) responses: Family<ClusterCode, Counter>,
    pub(crate) rejections: Family<ReasonLabel, Counter>,
    pub(crate) tokens: Family<ClusterKind, Counter>,
    pub(crate) cost: Family<ClusterLabel, Counter<f64, AtomicU64>>,
    pub(crate) cost_per_million: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) heartbeat_age: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) rtt: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) weight: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) estimated_ttft: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) ttft: Family<ClusterLabel, Histogram>,
    pub(crate) ejections: Family<ClusterLabel, Counter>,
    pub(crate) ejections_held_back: Family<ClusterLabel, Counter>,
    pub(crate) ejected: Family<ClusterLabel, Gauge>,
    pub(crate) failure_percent: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    pub(crate) reloads: Family<ResultLabel, Counter>,
    pub(crate) credential_reloads: Family<ClusterFileResult, Counter>,
    /// Each discovering cluster's `/v1/models` fetches, by result: a cluster refusing the
    /// router's token shows here, where the model list only stays empty.
    pub(crate) discoveries: Family<ClusterResult, Counter>,
    /// The `notAfter` of each cluster's client certificate and CA bundle in force
    /// (`crate::expiry`), Unix seconds.
    pub(crate) tls_not_after: Family<ClusterFile, Gauge>,
    /// The access log's lines and reopens, by result (`accessLog:`; the gateway's writer).
    pub(crate) access_log: infergate_proxy::access_log::LineCounters,
}

/// `result` of a configuration reload (`ok`, `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    pub(crate) result: &'static str,
}

impl Telemetry {
    pub(crate) fn register(r: &mut Registry) -> Self {
        let t = Telemetry {
            decisions: Family::default(),
            retries: Family::default(),
            drains: Family::default(),
            returns: Family::default(),
            responses: Family::default(),
            rejections: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            cost_per_million: Family::default(),
            heartbeat_age: Family::default(),
            rtt: Family::default(),
            weight: Family::default(),
            estimated_ttft: Family::default(),
            ttft: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.005, 2.0, 14,
                ))
            }),
            ejections: Family::default(),
            ejections_held_back: Family::default(),
            ejected: Family::default(),
            failure_percent: Family::default(),
            reloads: Family::default(),
            credential_reloads: Family::default(),
            discoveries: Family::default(),
            tls_not_after: Family::default(),
            access_log: infergate_proxy::access_log::LineCounters::default(),
        };
        // Both results exported from the start, at 0 (an alert on errors has a series to read).
        for result in ["ok", "error"] {
            let _ = t.reloads.get_or_create(&ResultLabel { result });
        }
        r.register(
            "infergate_global_config_reloads",
            "Configuration reloads, by result (ok, error)",
            t.reloads.clone(),
        );
        r.register(
            "infergate_global_credential_reloads",
            "Loads of a cluster's credential file after it changed on disk, by file (token: credentials.bearerTokenFile, ca: tls.caFile, client_cert: tls.certFile and tls.keyFile) and result (ok; error: unusable, the last good one stays in force)",
            t.credential_reloads.clone(),
        );
        r.register(
            "infergate_global_cluster_tls_not_after_timestamp_seconds",
            "The notAfter of the cluster's TLS file in force, Unix seconds, by file (client_cert: tls.certFile; ca: tls.caFile, its earliest certificate's), for the files configured (0: not read); alert on it minus time()",
            t.tls_not_after.clone(),
        );
        r.register(
            "infergate_global_discoveries",
            "Reads of a cluster's /v1/models (the models it serves; clusters without models: only), by result (ok; refused: 401 or 403, the cluster refuses the router's credentials; error: anything else, its models last read kept)",
            t.discoveries.clone(),
        );
        t.access_log.register(r, "infergate_global_access_log");
        r.register(
            "infergate_global_decisions",
            "Requests routed, by the cluster chosen first and why (cheapest_within_objective, fastest_over_objective, fastest, last_resort)",
            t.decisions.clone(),
        );
        r.register(
            "infergate_global_failovers",
            "Requests moved to the next cluster before their first byte, by the cluster that failed and how (connect, error, status_5xx, status_429, credentials)",
            t.retries.clone(),
        );
        r.register(
            "infergate_global_cluster_drains",
            "Times a cluster was drained from routing, by reason (stale, failing, no_ready_pods)",
            t.drains.clone(),
        );
        r.register(
            "infergate_global_cluster_returns",
            "Times a drained cluster came back (its slow start began)",
            t.returns.clone(),
        );
        r.register(
            "infergate_global_cluster_ejections",
            "Times outlier detection ejected a cluster: its routed requests failed at the gateway (502, 503, 504 or no response headers) outlierDetection.consecutiveGatewayFailures times in a row, or in an interval's share of outlierDetection.failurePercentage.threshold",
            t.ejections.clone(),
        );
        r.register(
            "infergate_global_cluster_failure_percent",
            "The share of the routed requests that failed at the gateway in the cluster's last interval judged (outlierDetection.failurePercentage; absent without it), percent",
            t.failure_percent.clone(),
        );
        r.register(
            "infergate_global_cluster_ejections_held_back",
            "Ejections due but held back: one more ejected cluster would be over outlierDetection.maxEjectionPercent of a model's clusters",
            t.ejections_held_back.clone(),
        );
        r.register(
            "infergate_global_cluster_ejected",
            "1 while outlier detection has the cluster ejected (ordered after the clusters routed on), else 0",
            t.ejected.clone(),
        );
        r.register(
            "infergate_global_responses",
            "Answers passed through from clusters, by status class",
            t.responses.clone(),
        );
        r.register(
            "infergate_global_rejections",
            "Requests the router answered with an error itself, by reason",
            t.rejections.clone(),
        );
        r.register(
            "infergate_global_tokens",
            "Tokens served, as the clusters' usage reports count them, by kind (input, output)",
            t.tokens.clone(),
        );
        r.register(
            "infergate_global_cost",
            "Cost of the tokens served, in the configuration's currency",
            t.cost.clone(),
        );
        r.register(
            "infergate_global_cost_per_million_tokens",
            "Cost per million tokens served so far (input and output together)",
            t.cost_per_million.clone(),
        );
        r.register(
            "infergate_global_heartbeat_age_seconds",
            "Time since the cluster's last good heartbeat (-1 before the first)",
            t.heartbeat_age.clone(),
        );
        r.register(
            "infergate_global_heartbeat_rtt_seconds",
            "Measured round trip of the heartbeat fetch (smoothed; -1 before the first)",
            t.rtt.clone(),
        );
        r.register(
            "infergate_global_cluster_weight",
            "The cluster's routing share: 1 up, between 0 and 1 ramping up (slow start), 0 drained or ejected (the best over its models)",
            t.weight.clone(),
        );
        r.register(
            "infergate_global_estimated_ttft_seconds",
            "The cluster's estimated time to first token for a typical request, round trip included (-1 unknown)",
            t.estimated_ttft.clone(),
        );
        r.register(
            "infergate_global_ttft_seconds",
            "Measured time from sending a streamed request to its first generated token, by cluster",
            t.ttft.clone(),
        );
        t
    }
}

/// The `result` of a `/v1/models` fetch: `ok`, `refused` (401 or 403: the cluster refuses the
/// router's credentials), `error` (anything else).
pub(crate) const DISCOVERY_RESULTS: [&str; 3] = ["ok", "refused", "error"];

/// The `code` label of an answer passed through: its status class. A redirect (a cluster URL
/// behind an HTTP-to-HTTPS redirect, say) is `3xx`, not counted with the server errors.
pub(crate) fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

impl Telemetry {
    /// Counts a configuration reload.
    pub(crate) fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }

    /// Exports a cluster's credential reload series at 0 (an alert on errors has a series to
    /// read before the first rotation).
    pub(crate) fn credential_files(&self, label: &ClusterLabel, files: &[&'static str]) {
        for &file in files {
            for result in ["ok", "error"] {
                let _ = self.credential_reloads.get_or_create(&ClusterFileResult {
                    cluster: Arc::clone(&label.cluster),
                    file,
                    result,
                });
            }
        }
    }

    /// Exports a discovering cluster's `/v1/models` series at 0 (an alert on refusals has a
    /// series to read before the first).
    pub(crate) fn discovering(&self, label: &ClusterLabel) {
        for result in DISCOVERY_RESULTS {
            let _ = self.discoveries.get_or_create(&ClusterResult {
                cluster: Arc::clone(&label.cluster),
                result,
            });
        }
    }

    /// Counts a `/v1/models` fetch of a cluster (`result`: one of [`DISCOVERY_RESULTS`]).
    pub(crate) fn discovered(&self, label: &ClusterLabel, result: &'static str) {
        self.discoveries
            .get_or_create(&ClusterResult {
                cluster: Arc::clone(&label.cluster),
                result,
            })
            .inc();
    }

    /// Counts a load of a cluster's changed credential `file` (`token`, `ca`, `client_cert`).
    pub(crate) fn credential_reloaded(&self, label: &ClusterLabel, file: &'static str, ok: bool) {
        self.credential_reloads
            .get_or_create(&ClusterFileResult {
                cluster: Arc::clone(&label.cluster),
                file,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// Sets the `notAfter` of a cluster's TLS `file` in force (`client_cert`, `ca`).
    pub(crate) fn tls_expiry(&self, label: &ClusterLabel, file: &'static str, not_after: i64) {
        self.tls_not_after
            .get_or_create(&ClusterFile {
                cluster: Arc::clone(&label.cluster),
                file,
            })
            .set(not_after);
    }

    /// Drops the gauges of a cluster a reload removed or replaced: a stale weight or ejection
    /// would read as a cluster still there, or as the replaced one's state. Its counters and
    /// histogram stay (totals that stop growing;
    /// removing them would look like a counter reset to `rate()`).
    pub(crate) fn forget_gauges(&self, label: &ClusterLabel) {
        self.cost_per_million.remove(label);
        self.heartbeat_age.remove(label);
        self.rtt.remove(label);
        self.weight.remove(label);
        self.estimated_ttft.remove(label);
        self.ejected.remove(label);
        for file in [crate::expiry::CLIENT_CERT, crate::expiry::CA] {
            self.tls_not_after.remove(&ClusterFile {
                cluster: Arc::clone(&label.cluster),
                file,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Telemetry, status_class};

    /// The TTFT histogram's help says what is measured: to the first generated token (the
    /// stream's first event, the role, does not count), not to the first body byte.
    #[test]
    fn the_ttft_help_names_the_first_token() {
        let mut registry = prometheus_client::registry::Registry::default();
        let t = Telemetry::register(&mut registry);
        t.ttft
            .get_or_create(&super::ClusterLabel {
                cluster: "a".into(),
            })
            .observe(0.1);
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap_or_default();
        let help = page
            .lines()
            .find(|l| l.starts_with("# HELP infergate_global_ttft_seconds "))
            .unwrap_or_default();
        assert!(help.contains("first generated token"), "{help}");
    }

    #[test]
    fn each_status_is_counted_in_its_own_class() {
        for (status, class) in [
            (101, "1xx"),
            (200, "2xx"),
            (204, "2xx"),
            (301, "3xx"),
            (307, "3xx"),
            (404, "4xx"),
            (429, "4xx"),
            (500, "5xx"),
            (503, "5xx"),
        ] {
            assert_eq!(status_class(status), class, "{status}");
        }
    }
}
