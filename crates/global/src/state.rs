//! The configuration in force: built at start and by each reload, swapped in whole.
//!
//! A reload builds a new [`State`] next to the old one ([`State::build`]) and the front door
//! swaps it in atomically; a request works on the state it loaded first, so requests already
//! running finish on the configuration they started with. What a reload keeps:
//! - a cluster whose entry is unchanged but for its `cost` and `region` ([`same_cluster`]: the
//!   state's prices and region ranks, which the requests read from the state in force), as long
//!   as the settings its state is judged by are unchanged too ([`judged_alike`]: `heartbeat:`,
//!   `outlierDetection:`, `timeouts.connectMs`):
//!   its `Arc<Cluster>` (heartbeat and model health, measured TTFT, ejection and run of
//!   failures, its clients and connection pools, its token) and its poller. Any other cluster
//!   starts afresh, its files read as at start;
//! - the authenticator (and its cached keys) when `auth:` is unchanged, the quota service (and
//!   its counts) when `quotas:` is unchanged — as the gateway does.
//!
//! A cluster's files rotated on disk under an unchanged entry are not a reload's business: the
//! cluster itself swaps in the new token or CA bundle (`crate::rotation`).
//!
//! A poller runs while some state holds its cluster: the last state to drop it aborts it, and a
//! reload aborts those of removed or replaced clusters at once ([`retire`]).

use std::sync::Arc;

use http::HeaderName;
use infergate_pool::quota::Quotas;
use infergate_pool::tenant::Tenancy;
use infergate_proxy::auth::Authenticator;
use tokio::task::JoinHandle;

use crate::access_log::Log;
use crate::cluster::{self, Cluster};
use crate::config::{ClusterConfig, GlobalConfig};
use crate::connect::{self, SystemRoots};
use crate::error::{ConfigError, Error};
use crate::telemetry::Telemetry;

/// What one configuration needs at run time.
pub(crate) struct State {
    pub(crate) config: GlobalConfig,
    pub(crate) clusters: Vec<Arc<Cluster>>,
    /// Each cluster's place in `routing.regionPreference`, by index: a routing setting, kept
    /// out of the cluster so that changing the preference, or a cluster's region, keeps the
    /// clusters' state.
    pub(crate) region_ranks: Vec<usize>,
    /// Each cluster's price of one input and one output token, by index: kept out of the
    /// cluster so that a new price (a spot rate, a new contract) keeps the cluster's state.
    pub(crate) prices: Vec<(f64, f64)>,
    /// Each cluster's poller, by index (shared with the states that keep the cluster).
    pollers: Vec<Arc<Poller>>,
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) quotas: Option<Quotas>,
    pub(crate) tenancy: Tenancy,
    pub(crate) objective_header: HeaderName,
    /// The access log (`accessLog:`), kept across reloads that leave its path unchanged.
    pub(crate) access_log: Option<Arc<Log>>,
}

/// A cluster's poller task, aborted when the last state holding it is dropped.
struct Poller(JoinHandle<()>);

impl Drop for Poller {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether the cluster built from `old` may serve the entry `new`: every field the same but
/// `cost` and `region`, which the state holds ([`State::prices`], [`State::region_ranks`]).
/// (The files it names may have changed on disk: the cluster follows them itself.)
fn same_cluster(old: &ClusterConfig, new: &ClusterConfig) -> bool {
    let ClusterConfig {
        name,
        url,
        heartbeat_url,
        region: _,
        cost: _,
        credentials,
        models,
        tls,
    } = new;
    old.name == *name
        && old.url == *url
        && old.heartbeat_url == *heartbeat_url
        && old.credentials == *credentials
        && old.models == *models
        && old.tls == *tls
}

/// Whether a cluster's state, judged under `old`, may be kept under `new`: its heartbeat
/// health, ejection and poller were made with `heartbeat:` and `outlierDetection:`, and its
/// connections with `timeouts.connectMs`. A change to any of them rebuilds every cluster rather
/// than leaving the kept ones half under the old settings (a change there is rare and
/// deliberate; a few heartbeats bring the clusters back).
fn judged_alike(old: &GlobalConfig, new: &GlobalConfig) -> bool {
    old.heartbeat == new.heartbeat
        && old.outlier_detection == new.outlier_detection
        && old.timeouts.connect_ms == new.timeouts.connect_ms
}

impl State {
    /// Builds the state of `config`, keeping from `previous` what it may (see the module
    /// documentation). Starts the pollers of the new clusters, once nothing can fail any more.
    pub(crate) fn build(
        config: GlobalConfig,
        previous: Option<&State>,
        telemetry: &Arc<Telemetry>,
    ) -> Result<State, Error> {
        let auth = match previous.filter(|p| p.auth.serves(&config.auth)) {
            Some(p) => Arc::clone(&p.auth),
            None => {
                Arc::new(Authenticator::new(&config.auth).map_err(|e| Error::Auth(Box::new(e)))?)
            }
        };
        let tenancy = Tenancy::new(&config.tenancy).map_err(|e| Error::Config(e.into()))?;
        let keep = previous.filter(|p| judged_alike(&p.config, &config));
        let mut system_roots = SystemRoots::new();
        // A kept cluster's poller; the indices of the new clusters.
        let mut kept = Vec::with_capacity(config.clusters.len());
        let mut fresh = Vec::new();
        let mut clusters = Vec::with_capacity(config.clusters.len());
        for (i, c) in config.clusters.iter().enumerate() {
            let same = keep.and_then(|p| {
                p.clusters
                    .iter()
                    .position(|old| same_cluster(&old.config, c))
                    .map(|at| (p, at))
            });
            if let Some((p, at)) = same {
                clusters.push(Arc::clone(&p.clusters[at]));
                kept.push(Some(Arc::clone(&p.pollers[at])));
                continue;
            }
            let cluster = Arc::new(Cluster::load(&config, i, &mut system_roots, telemetry)?);
            connect::warn_of(c);
            fresh.push(i);
            clusters.push(cluster);
            kept.push(None);
        }
        let quotas = match (&config.quotas, previous) {
            (None, _) => None,
            (Some(spec), Some(p)) if p.config.quotas.as_ref() == Some(spec) => p.quotas.clone(),
            (Some(spec), _) => {
                let q = spec
                    .to_config()
                    .map_err(|reason| Error::Config(ConfigError::Quotas { reason }))?;
                Some(Quotas::start_with_registry(q).map_err(|e| Error::Quota(Box::new(e)))?)
            }
        };
        let access_log = Log::reloaded(
            config.access_log.as_ref(),
            previous.and_then(|p| p.access_log.as_ref()),
            &telemetry.access_log,
        )?;
        // Nothing fails past this point: the new clusters' pollers start.
        let hb = &config.heartbeat;
        for i in fresh {
            connect::log_cluster(&config.clusters[i]);
            // Before its poller: its first report finds it in force.
            clusters[i].join_model_clusters(telemetry);
            telemetry.credential_files(&clusters[i].label, &clusters[i].rotated_files());
            if config.clusters[i].models.is_none() {
                telemetry.discovering(&clusters[i].label);
            }
            clusters[i].export_tls_expiry(telemetry);
            kept[i] = Some(Arc::new(Poller(tokio::spawn(cluster::poll(
                Arc::clone(&clusters[i]),
                (**telemetry).clone(),
                hb.interval(),
                hb.discovery_interval(),
                hb.timeout(),
            )))));
        }
        let pollers = kept.into_iter().flatten().collect();
        let preference = &config.routing.region_preference;
        let region_ranks = config
            .clusters
            .iter()
            .map(|c| {
                preference
                    .iter()
                    .position(|r| *r == c.region)
                    .unwrap_or(preference.len())
            })
            .collect();
        let prices = config.clusters.iter().map(|c| c.cost.per_token()).collect();
        // Validated with the configuration.
        let objective_header = HeaderName::from_bytes(config.routing.objective_header.as_bytes())
            .unwrap_or_else(|_| HeaderName::from_static(crate::config::DEFAULT_OBJECTIVE_HEADER));
        Ok(State {
            config,
            clusters,
            region_ranks,
            prices,
            pollers,
            auth,
            quotas,
            tenancy,
            objective_header,
            access_log,
        })
    }

    /// Stops every poller (at shutdown, once the last request has ended).
    pub(crate) fn stop_polling(&self) {
        for p in &self.pollers {
            p.0.abort();
        }
    }
}

/// After `new` replaced `old`: logs what changed, stops the pollers of the clusters `new` no
/// longer has (a request still holding `old` finishes without them: its clusters' state stops
/// moving, which a running request does not need) and drops their gauges (a replaced cluster's
/// come back from its new poller's first tick, a removed one's do not; the dates of a
/// replacement's TLS files are exported again here, for the files it names). The clusters it
/// dropped leave `infergate_global_model_clusters`, and the models no cluster in force serves
/// lose their series there.
pub(crate) fn retire(old: &State, new: &State, telemetry: &Telemetry) {
    let mut gone = Vec::new();
    for (at, c) in old.clusters.iter().enumerate() {
        if new.clusters.iter().any(|n| Arc::ptr_eq(n, c)) {
            continue;
        }
        old.pollers[at].0.abort();
        telemetry.forget_gauges(&c.label);
        gone.push((
            c.id,
            new.config.clusters.iter().any(|n| n.name == c.config.name),
        ));
        let name = &c.config.name;
        if let Some(entry) = new.config.clusters.iter().find(|n| n.name == *name) {
            // Its entry unchanged: rebuilt because the settings every cluster is judged by
            // changed (`judged_alike`), which the log says rather than a change the user did
            // not make to the cluster.
            if same_cluster(&c.config, entry) {
                tracing::info!(
                    cluster = %name,
                    "cluster started afresh by the reload: `heartbeat`, `outlierDetection` or `timeouts.connectMs` changed, which every cluster is judged by"
                );
            } else {
                tracing::info!(cluster = %name, "cluster changed by the reload: its state starts afresh");
            }
        } else {
            tracing::info!(cluster = %name, "cluster removed by the reload");
        }
    }
    for c in &new.clusters {
        if !old.clusters.iter().any(|o| Arc::ptr_eq(o, c)) {
            c.export_tls_expiry(telemetry);
        }
        if !old.config.clusters.iter().any(|o| o.name == c.config.name) {
            tracing::info!(cluster = %c.config.name, "cluster added by the reload");
        }
    }
    // Their counts go; so do the series of the models no cluster in force serves.
    telemetry.model_clusters.reloaded(gone);
}
