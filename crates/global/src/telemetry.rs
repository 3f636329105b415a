//! The fleet-level series on the global router's admin port (`infergate_global_*`).
//!
//! Labels are bounded by the configuration: `cluster` is a configured cluster's name (shared,
//! so that labelling a request's series copies no string), `reason` and `code` come from fixed
//! sets. With `quotas:` configured, the quota service's
//! `infergate_quota_*` series (per-tenant admitted and rejected counts, Redis state, replicas
//! seen) are on the same page; a refusal also counts in `infergate_global_rejections` under
//! `quota_exceeded`.
//!
//! Two families are per model: `model` is a name some cluster serves (its `models:`, its
//! `/v1/models`, a model or adapter its heartbeat names), never a name a client sent and no
//! cluster serves. `infergate_global_model_clusters` is kept by [`ModelClusters`], updated when
//! a cluster's models or their routability change (not per request);
//! `infergate_global_model_requests` is counted through a handle each cluster keeps beside the
//! model's pending slot (`crate::cluster`), so a request builds no label and takes no lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

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

/// `model` (a model some cluster serves).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabel {
    pub(crate) model: Arc<str>,
}

/// `model` (a model the cluster serves), `cluster`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelCluster {
    pub(crate) model: Arc<str>,
    pub(crate) cluster: Arc<str>,
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
    /// Requests routed, by the model asked for and the cluster chosen first. Each cluster
    /// keeps its models' handles (`crate::cluster`); a series is made when a cluster first
    /// serves the model, at 0.
    pub(crate) model_requests: Family<ModelCluster, Counter>,
    /// The clusters that could take each model's requests now.
    pub(crate) model_clusters: Arc<ModelClusters>,
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
            model_requests: Family::default(),
            model_clusters: Arc::default(),
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
            "infergate_global_model_clusters",
            "The clusters that could take a request for the model now: serving it (models:, /v1/models, or named by a heartbeat) with a routing weight above 0 (not drained, not ejected); 0 while none can, until a reload finds no cluster serving it",
            t.model_clusters.gauge.clone(),
        );
        r.register(
            "infergate_global_model_requests",
            "Requests routed, by the model asked for and the cluster chosen first (failovers count under the first); only models some cluster serves",
            t.model_requests.clone(),
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

/// What one cluster serves, as [`ModelClusters`] counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Serving {
    /// Every model it serves: its `models:` or `/v1/models`, and the models and adapters its
    /// heartbeats named.
    pub(crate) served: BTreeSet<String>,
    /// Of those, the ones routed on now: weight above 0, not drained, not ejected.
    pub(crate) routable: BTreeSet<String>,
}

/// `infergate_global_model_clusters`: per model, how many clusters in force could take its
/// requests now. Each cluster reports what it serves when that changes ([`Self::update`]),
/// from its tick and its ejection; a reload adds its new clusters ([`Self::join`]) and removes
/// the ones it dropped ([`Self::reloaded`]). Never on the request path.
///
/// A model keeps its series while some cluster in force serves it. One that no cluster serves
/// any more (its only cluster stopped listing it) stays, at 0, so that an alert on `== 0` sees
/// it, until a reload: the reload drops the series of every model no cluster then serves
/// (those only a cluster it replaced served stay, for its replacement to report).
#[derive(Debug, Default)]
pub(crate) struct ModelClusters {
    gauge: Family<ModelLabel, Gauge>,
    index: Mutex<ModelIndex>,
}

#[derive(Debug, Default)]
struct ModelIndex {
    /// Each cluster in force, by its id (a replaced cluster's successor has another, so a late
    /// report of the old one changes nothing).
    clusters: HashMap<u64, Serving>,
    /// The models with a series.
    exported: BTreeSet<Arc<str>>,
}

impl ModelIndex {
    /// Adds `served` to the exported models.
    fn export(&mut self, serving: &Serving) {
        for m in &serving.served {
            if !self.exported.contains(m.as_str()) {
                self.exported.insert(Arc::from(m.as_str()));
            }
        }
    }

    /// Sets every exported model's count.
    fn recount(&self, gauge: &Family<ModelLabel, Gauge>) {
        for model in &self.exported {
            let n = self
                .clusters
                .values()
                .filter(|s| s.routable.contains(&**model))
                .count();
            gauge
                .get_or_create(&ModelLabel {
                    model: Arc::clone(model),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

impl ModelClusters {
    fn index(&self) -> std::sync::MutexGuard<'_, ModelIndex> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cluster `id` is in force (a new state holds it), serving `serving`.
    pub(crate) fn join(&self, id: u64, serving: Serving) {
        let mut index = self.index();
        index.export(&serving);
        index.clusters.insert(id, serving);
        index.recount(&self.gauge);
    }

    /// Cluster `id` now serves `serving`. Nothing for a cluster not in force (one a reload
    /// dropped, ticked by a request still running on the old state).
    pub(crate) fn update(&self, id: u64, serving: &Serving) {
        let mut index = self.index();
        match index.clusters.get_mut(&id) {
            Some(s) if *s != *serving => serving.clone_into(s),
            _ => return,
        }
        index.export(serving);
        index.recount(&self.gauge);
    }

    /// The model's count, if it has a series.
    #[cfg(test)]
    pub(crate) fn count(&self, model: &str) -> Option<i64> {
        self.index().exported.contains(model).then(|| {
            self.gauge
                .get_or_create(&ModelLabel {
                    model: model.into(),
                })
                .get()
        })
    }

    /// A reload dropped the clusters `gone` (`true`: a cluster of the same name replaces it):
    /// their counts go, and so does the series of every model no cluster in force serves, but
    /// those a replaced cluster served (its successor reports its own soon).
    pub(crate) fn reloaded(&self, gone: impl IntoIterator<Item = (u64, bool)>) {
        let mut index = self.index();
        let mut replaced = BTreeSet::new();
        for (id, has_successor) in gone {
            if let Some(s) = index.clusters.remove(&id)
                && has_successor
            {
                replaced.extend(s.served);
            }
        }
        let ModelIndex { clusters, exported } = &mut *index;
        exported.retain(|m| {
            let served =
                replaced.contains(&**m) || clusters.values().any(|s| s.served.contains(&**m));
            if !served {
                self.gauge.remove(&ModelLabel {
                    model: Arc::clone(m),
                });
            }
            served
        });
        index.recount(&self.gauge);
    }
}

#[cfg(test)]
mod tests {
    use super::{ModelClusters, Serving, Telemetry, status_class};

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

    fn serving(served: &[&str], routable: &[&str]) -> Serving {
        Serving {
            served: served.iter().map(|m| (*m).to_owned()).collect(),
            routable: routable.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    fn count(c: &ModelClusters, model: &str) -> Option<i64> {
        c.count(model)
    }

    /// Counts follow each cluster's routable models; a model no cluster serves any more stays
    /// at 0 until a reload, which drops it unless only a replaced cluster served it; a late
    /// report of a dropped cluster changes nothing.
    #[test]
    fn model_clusters_count_routable_clusters_and_keep_zero_until_a_reload() {
        let c = ModelClusters::default();
        c.join(1, serving(&["m", "n"], &["m", "n"]));
        c.join(2, serving(&["m"], &[]));
        assert_eq!(count(&c, "m"), Some(1));
        c.update(2, &serving(&["m"], &["m"]));
        assert_eq!(count(&c, "m"), Some(2));
        assert_eq!(count(&c, "n"), Some(1));
        // Cluster 1 stops listing `n`: no cluster serves it, its series stays at 0.
        c.update(1, &serving(&["m"], &["m"]));
        assert_eq!(count(&c, "n"), Some(0));
        // A reload replacing cluster 2 (no report from its successor yet) and keeping 1: `n`
        // goes, `m` stays, counted by cluster 1 alone.
        c.reloaded([(2, true)]);
        assert_eq!(count(&c, "n"), None);
        assert_eq!(count(&c, "m"), Some(1));
        // The dropped cluster ticked by a request on the old state: nothing changes.
        c.update(2, &serving(&["m", "x"], &["m", "x"]));
        assert_eq!(count(&c, "m"), Some(1));
        assert_eq!(count(&c, "x"), None);
        // A reload removing cluster 1: `m` is served by none in force, its series goes.
        c.join(3, serving(&["o"], &[]));
        c.reloaded([(1, false)]);
        assert_eq!(count(&c, "m"), None);
        assert_eq!(count(&c, "o"), Some(0));
    }
}
