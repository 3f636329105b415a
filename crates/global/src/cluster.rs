//! One cluster at run time: what its heartbeats and the router's own requests say about it, and
//! the task that polls it.
//!
//! The poller fetches the heartbeat every `heartbeat.intervalMs` (timed: the fetch's duration is
//! the measured round trip) and the cluster's `/v1/models` every `heartbeat.discoveryIntervalMs`
//! (unless `models:` is configured). A cluster without `heartbeatUrl` is judged by its
//! `/v1/models`, fetched at the heartbeat interval instead. Each `/v1/models` fetch's outcome is
//! kept ([`Discovery`]: what a client is told while no cluster has listed a model), counted, and
//! a refusal of the router's token warned of at once. Each model's [`Health`] decides its
//! share; requests that cannot connect count as failed fetches, so a dead gateway under load is
//! drained on the first refused connections rather than at the next poll.
//!
//! Its bearer token and its clients (connector and pools) sit behind atomic swaps, read once per
//! request without a lock: a rotated `credentials.bearerTokenFile` or `tls.caFile` replaces them
//! ([`Cluster::check_files`], `crate::rotation`) while everything else about the cluster stays.
//!
//! The requests the router sent to the cluster and that have no first token yet are counted
//! per model ([`Cluster::pending`]): one slot of two atomics per model the cluster serves,
//! created when a heartbeat, its `/v1/models` or its `models:` first names the model, and found
//! by name in a map behind an atomic swap — a request takes no lock and allocates nothing to be
//! counted. A model's estimate adds the slots of every model served by the same pods, since its
//! requests queue there: its own, and, where the heartbeat names them, its LoRA adapters' (or,
//! for an adapter, its base model's and the other adapters'). Models on other pods are not
//! counted: their requests queue elsewhere.
//!
//! Each slot also holds the handle of its `infergate_global_model_requests{model, cluster}`
//! counter, made with the slot: a request routed to the cluster first counts there through the
//! lookup that finds its slot. What the cluster serves, and which of it is routed on now, is
//! reported to `infergate_global_model_clusters` ([`crate::telemetry::ModelClusters`]) when it
//! changes: at a tick (a heartbeat, a discovery, a drain or return, the end of an ejection) and
//! at an ejection.
//!
//! The router's own requests also feed the cluster's outlier detection ([`crate::outlier`]): its
//! gateway failures in a row are counted on an atomic (no lock on the request path), and the
//! rare request that completes a run takes the ejection decision ([`eject`]), which reads every
//! cluster's ejection to hold `outlierDetection.maxEjectionPercent`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http::{HeaderValue, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use infergate_pool::heartbeat::Heartbeat;
use infergate_pool::tls::unix_now;

use crate::config::{ClusterConfig, GlobalConfig};
use crate::connect::{self, Clients, Connector, SetupError, SystemRoots};
use crate::correction::Correction;
use crate::error::{Error, TokenError};
use crate::expiry;
use crate::health::{Health, State};
use crate::outlier::{self, Consecutive, Ejection, Trigger, Verdict, Window};
use crate::rotation::Seen;
use crate::telemetry::{ClusterLabel, ClusterReason, ModelCluster, Serving, Telemetry};
use crate::{Client, now};

/// The largest heartbeat or `/v1/models` answer read.
const MAX_POLL_BODY: usize = 1 << 20;

/// Weight of a new sample in the smoothed round trip.
const EWMA_ALPHA: f64 = 0.2;

/// A measured TTFT older than this many heartbeat intervals no longer corrects the estimate: a
/// cluster that stopped receiving traffic because it was slow is judged by its heartbeat alone
/// again.
const OBSERVED_TTFT_INTERVALS: u32 = 3;

/// What is known of one model on one cluster.
#[derive(Debug)]
pub(crate) struct ModelEntry {
    pub(crate) health: Health,
    /// The heartbeat's estimated TTFT, ms.
    pub(crate) estimate_ms: Option<f64>,
    /// The heartbeat's typical prefill alone, ms, and its ready pods.
    prefill_ms: Option<f64>,
    /// Of that, the fixed cost per request, ms (absent from a gateway that predates it, or
    /// before it learned one).
    fixed_cost_ms: Option<f64>,
    /// The heartbeat's wait before a new request's own prefill, its queue counted at the
    /// prompts it holds, ms (absent from a gateway that predates it; a negative one, or one that
    /// is not a number, is ignored: the estimate is then made as without it).
    wait_ms: Option<f64>,
    ready_pods: u32,
    /// The pending slots ([`Cluster::pending`]) of every model served by its pods, its own
    /// included: a model and its LoRA adapters as the heartbeat names them, else itself alone.
    /// Their requests queue on the same engines, so its estimate counts them all.
    pods_pending: Arc<[Arc<PendingSlot>]>,
    /// Whether it was up at the last tick, and whether it ever was (to count drains and
    /// returns once each).
    up: bool,
    seen_up: bool,
}

impl ModelEntry {
    fn new(health: Health, pods_pending: Arc<[Arc<PendingSlot>]>) -> Self {
        ModelEntry {
            health,
            estimate_ms: None,
            prefill_ms: None,
            fixed_cost_ms: None,
            wait_ms: None,
            ready_pods: 0,
            pods_pending,
            up: false,
            seen_up: false,
        }
    }
}

/// A cluster as one request sees it ([`Cluster::view`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct View {
    /// Its share: 1 up, 0–1 ramping, 0 drained or ejected.
    pub(crate) weight: f64,
    /// The estimated TTFT, ms: the heartbeat-based one corrected by the router's own recent
    /// measurements.
    pub(crate) ttft_ms: f64,
    /// The heartbeat-based estimate alone (scaled to the prompt, round trip and pending
    /// requests included), ms: what this request's measured TTFT is compared with.
    pub(crate) heartbeat_ttft_ms: f64,
}

/// The mutable part, behind one short lock.
#[derive(Debug, Default)]
pub(crate) struct ClusterState {
    pub(crate) models: HashMap<String, ModelEntry>,
    /// Smoothed heartbeat round trip, ms.
    pub(crate) rtt_ms: Option<f64>,
    /// The router's measured TTFT of streamed answers (and first-byte timeouts) against what
    /// the heartbeat-based estimate said for each: the correction of the next estimates.
    pub(crate) correction: Correction,
    /// Discovered (or configured) model names.
    pub(crate) served: Vec<String>,
    /// Its ejections by outlier detection, and whether it was ejected at the last tick (to log
    /// a readmission once).
    ejection: Ejection,
    was_ejected: bool,
    /// What its last `/v1/models` fetch gave (`Listed` from the start with `models:`).
    pub(crate) discovery: Discovery,
    /// Why its last heartbeat failed (or, without `heartbeatUrl`, the `/v1/models` fetch that
    /// stands for it), in the words of the log; `None` after a good one. A cluster that cannot
    /// be read now may serve a model no other lists.
    pub(crate) heartbeat_failure: Option<Arc<str>>,
    /// What it last reported to `infergate_global_model_clusters`: reported again only when
    /// it changes.
    reported: Serving,
}

/// What a cluster's last `/v1/models` fetch (discovery) gave: what the router tells a client
/// when no cluster has reported a model yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Discovery {
    /// None has completed yet.
    #[default]
    Pending,
    /// A model list was read, or `models:` is configured.
    Listed,
    /// The last one failed: why (the status and what it means, or the cause), as it is logged.
    Failed(Arc<str>),
}

impl ClusterState {
    /// Whether the cluster serves `model` (as [`Cluster::view`] sees it: named by a heartbeat,
    /// configured or discovered).
    fn serves(&self, model: &str) -> bool {
        self.models.contains_key(model) || self.served.iter().any(|m| m == model)
    }
}

/// One configured cluster.
pub(crate) struct Cluster {
    /// Its entry as the cluster was built from it. A reload that changes only its `cost` or
    /// `region` keeps the cluster (`state::same_cluster`), so those two are read from the state
    /// in force (`State::prices`, `State::region_ranks`), never from here.
    pub(crate) config: ClusterConfig,
    /// `scheme://authority` and the path prefix (without a trailing slash).
    pub(crate) authority: http::uri::Authority,
    /// `http` or `https` (the connector adds TLS for the latter).
    pub(crate) scheme: http::uri::Scheme,
    pub(crate) prefix: String,
    pub(crate) heartbeat: Option<Uri>,
    pub(crate) label: ClusterLabel,
    /// Its key in `infergate_global_model_clusters` ([`crate::telemetry::ModelClusters`]):
    /// unique to this cluster, so that a cluster a reload replaced, still ticked by a request
    /// on the old state, cannot report for its successor.
    pub(crate) id: u64,
    /// `infergate_global_model_requests`, whose handles its pending slots hold.
    model_requests: prometheus_client::metrics::family::Family<
        ModelCluster,
        prometheus_client::metrics::counter::Counter,
    >,
    /// `Authorization` sent to the cluster, from `credentials.bearerTokenFile`; swapped when
    /// the file is rotated, loaded once per request.
    token: ArcSwapOption<HeaderValue>,
    /// Its connector and clients (the request pool, the poller's); swapped whole when
    /// `tls.caFile` is rotated, loaded once per request.
    clients: ArcSwap<Clients>,
    /// Its credential files as last read, compared at each check: locked by the check alone.
    files: Mutex<Files>,
    state: Mutex<ClusterState>,
    /// This router's requests sent to the cluster and still without their first token, per
    /// model: read once per request without a lock, replaced (under the state lock) only when
    /// a model is named for the first time. Slots are never removed, so a request counted in
    /// one is taken out of the same one. Each [`ModelEntry`] holds the slots its estimate
    /// sums (those of the models on its pods).
    pending: ArcSwap<HashMap<Arc<str>, Arc<PendingSlot>>>,
    /// Where a request for a model without a slot is counted (none is served without one being
    /// made first, so none should be): in no estimate, and in no series (its counter is in no
    /// family).
    unlisted: Arc<PendingSlot>,
    /// Whether a refusal of the router's credentials was logged since the last answer the
    /// cluster accepted them for (one warning per episode, not one per request).
    refusal_logged: AtomicBool,
    /// Whether a failed TLS handshake of a routed request was warned of since the last answer
    /// (one warning per episode; the others at debug level).
    pub(crate) tls_failure_logged: AtomicBool,
    /// Served tokens and their cost, for the cost-per-million gauge.
    tokens: AtomicU64,
    cost_nanos: AtomicU64,
    settings: Settings,
    /// Gateway failures of routed requests in a row (outlier detection).
    consecutive: Consecutive,
    /// Routed requests' successes and gateway failures over the interval under way
    /// (`outlierDetection.failurePercentage`; unused without it).
    window: Window,
    /// Whether its heartbeat had some model up (or ramping) at the last tick: failures of a
    /// cluster the heartbeat has drained are the heartbeat's business, not outlier detection's.
    heartbeat_up: AtomicBool,
    /// When its current ejection ends, in nanoseconds since `epoch` (0: not ejected), read
    /// without the state lock (the state's [`Ejection`] is the record): the failures of requests
    /// sent before it was ejected and failing during the ejection start no new run.
    ejected_until: AtomicU64,
    epoch: Instant,
    outlier: outlier::Settings,
}

/// The requests this router sent for one model of a cluster and that have no first token yet.
#[derive(Debug, Default)]
pub(crate) struct PendingSlot {
    requests: AtomicUsize,
    /// Their estimated prompt tokens (each at least 1), summed: their turn in real terms.
    tokens: AtomicU64,
    /// The model's `infergate_global_model_requests{model, cluster}` (a handle on the family's
    /// counter, so that counting a request is one atomic add).
    routed: prometheus_client::metrics::counter::Counter,
}

/// The ids of [`Cluster::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What a cluster's credential files held at the last read (`None`: it names no such file).
#[derive(Debug, Default)]
struct Files {
    token: Option<Seen>,
    ca: Option<Seen>,
    /// `tls.certFile` and `tls.keyFile`: a change of either loads the pair.
    client_certificate: Option<(Seen, Seen)>,
    /// The `notAfter` of the client certificate and of the CA bundle in force, Unix seconds
    /// (`crate::expiry`; `None`: no such file).
    client_certificate_not_after: Option<i64>,
    ca_not_after: Option<i64>,
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    stale_after: Duration,
    failures_to_drain: u32,
    slow_start: Duration,
    interval: Duration,
}

fn lock(m: &Mutex<ClusterState>) -> MutexGuard<'_, ClusterState> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a cluster's files gave, read as the start reads them ([`Loaded::read`]): the error the
/// start stops on and `infergate global --check` refuses the file with.
pub(crate) struct Loaded {
    token: Option<HeaderValue>,
    connector: Connector,
    files: Files,
}

impl Loaded {
    /// Reads the files of the cluster at `index` of `config`: its `credentials.bearerTokenFile`,
    /// its client certificate (`tls.certFile`, `tls.keyFile`) and its trust roots (`tls.caFile`,
    /// else the system's for an `https://` cluster). A token or a bundle that cannot be used is
    /// an error naming the cluster, the field and the file, since requests would reach the
    /// cluster without credentials, or fail every handshake.
    pub(crate) fn read(
        config: &GlobalConfig,
        index: usize,
        system: &mut SystemRoots,
    ) -> Result<Loaded, Error> {
        let c = &config.clusters[index];
        let mut files = Files::default();
        let token = match &c.credentials {
            None => None,
            Some(credentials) => {
                let path = &credentials.bearer_token_file;
                let read = std::fs::read(path);
                files.token = Some(Seen::new(&read));
                let token = read
                    .map_err(TokenError::Read)
                    .and_then(|bytes| token_header(&bytes))
                    .map_err(|source| Error::Credentials {
                        cluster: c.name.clone(),
                        path: path.clone(),
                        source,
                    })?;
                Some(token)
            }
        };
        // Read before the connector reads it: a bundle rewritten in between differs from what
        // is recorded here, and the next check loads it again. The same for the client
        // certificate.
        let ca = connect::ca_file(c).map(|path| {
            let read = std::fs::read(&path);
            (path, read)
        });
        files.ca = ca.as_ref().map(|(_, read)| Seen::new(read));
        files.client_certificate = connect::client_certificate_files(c).map(|(cert, key)| {
            (
                Seen::new(&std::fs::read(cert)),
                Seen::new(&std::fs::read(key)),
            )
        });
        let identity = connect::client_certificate(c)
            .transpose()
            .map_err(|source| Error::ClusterCertificate {
                cluster: c.name.clone(),
                source: Box::new(source),
            })?;
        files.client_certificate_not_after = identity
            .as_ref()
            .zip(connect::client_certificate_files(c))
            .map(|(identity, (cert, _))| {
                expiry::client_certificate(&c.name, cert, &identity.cert, unix_now())
            });
        let connect_timeout = Duration::from_millis(config.timeouts.connect_ms);
        let connector = Connector::new(c, connect_timeout, system, identity).map_err(|e| {
            Error::ClusterTls {
                cluster: c.name.clone(),
                path: connect::ca_file(c),
                source: Box::new(e),
            }
        })?;
        // The bundle the connector read, unless it was rewritten in between (then the next
        // check loads it again, and dates it).
        files.ca_not_after =
            ca.map(|(path, read)| read.map_or(0, |pem| expiry::bundle(&c.name, &path, &pem)));
        Ok(Loaded {
            token,
            connector,
            files,
        })
    }
}

impl Cluster {
    /// The cluster at `index` of `config`, its files read now ([`Loaded::read`]).
    pub(crate) fn load(
        config: &GlobalConfig,
        index: usize,
        system: &mut SystemRoots,
        telemetry: &Telemetry,
    ) -> Result<Cluster, Error> {
        let Loaded {
            token,
            connector,
            files,
        } = Loaded::read(config, index, system)?;
        Ok(Cluster::new(
            config,
            index,
            token,
            Clients::new(connector),
            files,
            telemetry,
        ))
    }

    fn new(
        config: &GlobalConfig,
        index: usize,
        token: Option<HeaderValue>,
        clients: Clients,
        files: Files,
        telemetry: &Telemetry,
    ) -> Cluster {
        let c = config.clusters[index].clone();
        // Validated: the URL parses, has an authority and is http or https.
        let uri = crate::config::parse_url(&c.url).unwrap_or_default();
        let authority = uri
            .authority()
            .cloned()
            .unwrap_or_else(|| http::uri::Authority::from_static("invalid"));
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
        let heartbeat = c
            .heartbeat_url
            .as_deref()
            .and_then(|h| crate::config::parse_url(h).ok());
        let hb = &config.heartbeat;
        let settings = Settings {
            stale_after: hb.stale_after(),
            failures_to_drain: hb.failures_to_drain,
            slow_start: hb.slow_start(),
            interval: hb.interval(),
        };
        let mut state = ClusterState::default();
        let mut pending = HashMap::new();
        let label = ClusterLabel {
            cluster: Arc::from(c.name.as_str()),
        };
        if let Some(models) = &c.models {
            state.served.clone_from(models);
            state.discovery = Discovery::Listed;
            for m in models {
                let model = Arc::from(m.as_str());
                let slot = new_slot(&telemetry.model_requests, &model, &label);
                pending.insert(model, slot);
            }
        }
        Cluster {
            label,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            model_requests: telemetry.model_requests.clone(),
            token: ArcSwapOption::from_pointee(token),
            clients: ArcSwap::from_pointee(clients),
            files: Mutex::new(files),
            config: c,
            authority,
            scheme,
            prefix,
            heartbeat,
            state: Mutex::new(state),
            pending: ArcSwap::from_pointee(pending),
            unlisted: Arc::default(),
            refusal_logged: AtomicBool::new(false),
            tls_failure_logged: AtomicBool::new(false),
            tokens: AtomicU64::new(0),
            cost_nanos: AtomicU64::new(0),
            settings,
            consecutive: Consecutive::default(),
            window: Window::default(),
            heartbeat_up: AtomicBool::new(false),
            ejected_until: AtomicU64::new(0),
            epoch: now(),
            outlier: outlier::Settings::new(&config.outlier_detection, hb.slow_start()),
        }
    }

    /// The `Authorization` value sent to the cluster, if it has a token (one atomic load).
    pub(crate) fn token(&self) -> Option<HeaderValue> {
        self.token.load().as_deref().cloned()
    }

    /// Its clients in force (one atomic load): a request holds them to its end, so a rotated
    /// CA bundle does not cut it.
    pub(crate) fn clients(&self) -> Arc<Clients> {
        self.clients.load_full()
    }

    /// The values of the `file` label its credential files are counted under
    /// (`infergate_global_credential_reloads_total`).
    pub(crate) fn rotated_files(&self) -> Vec<&'static str> {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        [
            (files.token.is_some(), "token"),
            (files.ca.is_some(), "ca"),
            (files.client_certificate.is_some(), "client_cert"),
        ]
        .into_iter()
        .filter_map(|(named, file)| named.then_some(file))
        .collect()
    }

    /// Reads its `credentials.bearerTokenFile`, `tls.caFile`, `tls.certFile` and `tls.keyFile`
    /// again and applies those that changed since the last read (`crate::rotation`): a new
    /// token is sent from the next request on, over the same pool; a new bundle, or a new
    /// client certificate, gives the cluster new clients, whose connections verify or present
    /// it. A file changed into something unusable (for the client certificate: a pair that does
    /// not load, its key not the certificate's) leaves the last good value in force; each change
    /// is logged and counted once. Never on the request path.
    pub(crate) fn check_files(&self, telemetry: &Telemetry) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if let (Some(c), Some(seen)) = (&self.config.credentials, files.token.as_mut()) {
            let path = &c.bearer_token_file;
            if let Some(read) = seen.changed(std::fs::read(path)) {
                let loaded = read
                    .map_err(TokenError::Read)
                    .and_then(|bytes| token_header(&bytes));
                let result = loaded.map(|token| self.token.store(Some(Arc::new(token))));
                self.rotated(
                    "token",
                    "credentials.bearerTokenFile",
                    path,
                    result,
                    telemetry,
                );
            }
        }
        if let (Some(path), Some(seen)) = (self.ca_file(), files.ca.as_mut())
            && let Some(read) = seen.changed(std::fs::read(path))
        {
            let loaded = match read {
                Err(source) => Err(SetupError::CaFile(infergate_pool::tls::TlsError::Read {
                    path: path.to_owned(),
                    source,
                })),
                Ok(pem) => self
                    .clients
                    .load()
                    .with_ca(path)
                    .map(|clients| (clients, pem)),
            };
            let result = loaded.map(|(clients, pem)| {
                self.clients.store(Arc::new(clients));
                pem
            });
            if let Some(pem) = self.rotated(expiry::CA, "tls.caFile", path, result, telemetry) {
                let not_after = expiry::bundle(&self.config.name, path, &pem);
                files.ca_not_after = Some(not_after);
                telemetry.tls_expiry(&self.label, expiry::CA, not_after);
            }
        }
        if let (Some((cert, key)), Some((seen_cert, seen_key))) = (
            connect::client_certificate_files(&self.config),
            files.client_certificate.as_mut(),
        ) {
            // Both read at every check: a change of either is one change of the pair.
            let cert_changed = seen_cert.changed(std::fs::read(cert)).is_some();
            let key_changed = seen_key.changed(std::fs::read(key)).is_some();
            if cert_changed || key_changed {
                let loaded = match connect::client_certificate(&self.config) {
                    Some(Ok(identity)) => self
                        .clients
                        .load()
                        .with_identity(Arc::clone(&identity))
                        .map(|clients| (clients, identity)),
                    Some(Err(e)) => Err(SetupError::ClientCertificate(e)),
                    None => return,
                };
                let result = loaded.map(|(clients, identity)| {
                    self.clients.store(Arc::new(clients));
                    identity
                });
                let field = "tls.certFile/tls.keyFile";
                if let Some(identity) =
                    self.rotated(expiry::CLIENT_CERT, field, cert, result, telemetry)
                {
                    let not_after = expiry::client_certificate(
                        &self.config.name,
                        cert,
                        &identity.cert,
                        unix_now(),
                    );
                    files.client_certificate_not_after = Some(not_after);
                    telemetry.tls_expiry(&self.label, expiry::CLIENT_CERT, not_after);
                }
            }
        }
    }

    fn ca_file(&self) -> Option<&Path> {
        self.config.tls.as_ref().and_then(|t| t.ca_file.as_deref())
    }

    /// Logs and counts a changed credential file's load; what it loaded, when it is in force.
    fn rotated<T, E: std::error::Error + 'static>(
        &self,
        file: &'static str,
        field: &str,
        path: &Path,
        result: Result<T, E>,
        telemetry: &Telemetry,
    ) -> Option<T> {
        let name = &self.config.name;
        match &result {
            Ok(_) => tracing::info!(
                cluster = %name,
                file = %path.display(),
                "{field} changed: in force from the next request, the cluster's state kept"
            ),
            Err(e) => tracing::warn!(
                cluster = %name,
                file = %path.display(),
                error = %infergate_pool::ErrorChain(e),
                "{field} changed but cannot be used; the last good one stays in force (logged \
                 again at its next change)"
            ),
        }
        telemetry.credential_reloaded(&self.label, file, result.is_ok());
        result.ok()
    }

    /// Exports the `notAfter` of its client certificate and CA bundle in force, for those it
    /// names (`infergate_global_cluster_tls_not_after_timestamp_seconds`).
    pub(crate) fn export_tls_expiry(&self, telemetry: &Telemetry) {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        for (file, not_after) in [
            (expiry::CLIENT_CERT, files.client_certificate_not_after),
            (expiry::CA, files.ca_not_after),
        ] {
            if let Some(not_after) = not_after {
                telemetry.tls_expiry(&self.label, file, not_after);
            }
        }
    }

    /// The upstream URI for a request path (and query).
    pub(crate) fn uri(&self, path_and_query: &str) -> Option<Uri> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.prefix, path_and_query))
            .build()
            .ok()
    }

    fn new_health(&self) -> Health {
        Health::new(
            self.settings.stale_after,
            self.settings.failures_to_drain,
            self.settings.slow_start,
        )
    }

    /// What routing needs for `model` at `now`, for a request of `prompt_tokens`: `None` when
    /// the cluster does not serve it; else its share and estimates.
    ///
    /// With the heartbeat's `waitMs` (the pod's queue in real terms), the estimate is that wait
    /// plus this request's own prefill, the heartbeat's `prefillMs` for a typical request of
    /// [`TYPICAL_PROMPT_TOKENS`](infergate_pool::heartbeat::TYPICAL_PROMPT_TOKENS) scaled to its
    /// prompt by [`prompt_scale`] (the fixed cost per request is paid whatever the prompt, the
    /// rest grows with it): the queue ahead does not grow with this request's prompt. The
    /// requests this router sent since count at their own prompts too. From a gateway before
    /// the field, the heartbeat's whole estimate, queue included, is scaled to the prompt, as
    /// the queue then counts typical requests. The router's own measurements of streamed
    /// answers from the cluster in the last few heartbeat intervals, when there are any, correct
    /// it ([`Correction`]): they see what the heartbeat cannot (the network, the gateway itself,
    /// the queue since the heartbeat), and what they add does not grow with the prompt. A
    /// cluster that stops getting traffic because it was slow is judged by its heartbeat alone
    /// again once its measurements have aged out.
    pub(crate) fn view(&self, model: &str, now: Instant, prompt_tokens: f64) -> Option<View> {
        let st = lock(&self.state);
        let Some(entry) = st.models.get(model) else {
            // Served (configured in `models:` or discovered) but without a good heartbeat yet:
            // drained `unknown`, still a last resort rather than a model nobody serves.
            let rtt = st.rtt_ms.unwrap_or(0.0);
            return st.served.iter().any(|m| m == model).then_some(View {
                weight: 0.0,
                ttft_ms: rtt,
                heartbeat_ttft_ms: rtt,
            });
        };
        let weight = match entry.health.state(now) {
            State::Up { weight } => weight,
            State::Drained(_) => 0.0,
        };
        // Ejected: ordered with the drained clusters; readmitted: ramping.
        let weight = weight.min(st.ejection.weight(now, self.outlier.slow_start));
        let rtt = st.rtt_ms.unwrap_or(0.0);
        let scale = prompt_scale(prompt_tokens, entry.prefill_ms, entry.fixed_cost_ms);
        // Requests sent since the heartbeat wait their turn too: each adds its prefill on one
        // of the ready pods. Without it, every request between two heartbeats would herd onto
        // the cluster that looked cheapest at the last one. Those of every model served by
        // this one's pods (its LoRA adapters, or an adapter's base model), each at its own
        // prompt: they queue on the same engines. Not another model's on other pods.
        let (pending, tokens) =
            entry
                .pods_pending
                .iter()
                .fold((0.0, 0.0), |(requests, tokens), s| {
                    (
                        requests + s.requests.load(Ordering::Relaxed) as f64,
                        tokens + s.tokens.load(Ordering::Relaxed) as f64,
                    )
                });
        let pods = f64::from(entry.ready_pods.max(1));
        let heartbeat_ttft_ms = match (entry.wait_ms, entry.prefill_ms) {
            (Some(wait), Some(prefill)) if entry.estimate_ms.is_some() && prefill >= 0.0 => {
                // Each pending request's own prefill at its prompt: `prompt_scale` is affine in
                // the prompt, so their sum is the fixed share per request plus the rest at
                // their summed tokens.
                let share = fixed_share(prefill, entry.fixed_cost_ms);
                let turns = pending * share
                    + (1.0 - share) * tokens / infergate_pool::heartbeat::TYPICAL_PROMPT_TOKENS;
                wait + prefill * scale + rtt + turns * prefill / pods
            }
            _ => {
                // Without a heartbeat estimate (no `heartbeatUrl`, or no ready pod), the round
                // trip alone: the correction then carries everything the measurements saw.
                let heartbeat = entry.estimate_ms.map_or(rtt, |e| e * scale + rtt);
                let queued = entry.prefill_ms.map_or(0.0, |p| pending / pods * p * scale);
                heartbeat + queued
            }
        };
        let window = self.settings.interval * OBSERVED_TTFT_INTERVALS;
        Some(View {
            weight,
            ttft_ms: st.correction.apply(heartbeat_ttft_ms, now, window),
            heartbeat_ttft_ms,
        })
    }

    /// Whether some model of it is routed on (up or ramping) at `at`.
    pub(crate) fn any_up(&self, at: Instant) -> bool {
        lock(&self.state)
            .models
            .values()
            .any(|m| matches!(m.health.state(at), State::Up { .. }))
    }

    /// The models it serves.
    pub(crate) fn served(&self) -> Vec<String> {
        lock(&self.state).served.clone()
    }

    /// The models it is routed to for (as [`Cluster::view`] sees them): those its `/v1/models`
    /// listed (or `models:` names), and those a heartbeat named — a cluster whose list cannot
    /// be read is still routed to for those, so the router's model list shows them too.
    pub(crate) fn known_models(&self) -> Vec<String> {
        let st = lock(&self.state);
        let mut all: Vec<String> = st.models.keys().cloned().collect();
        for m in &st.served {
            if !st.models.contains_key(m) {
                all.push(m.clone());
            }
        }
        all
    }

    /// Why its last heartbeat failed, while it does.
    pub(crate) fn heartbeat_failure(&self) -> Option<Arc<str>> {
        lock(&self.state).heartbeat_failure.clone()
    }

    /// What its last `/v1/models` fetch gave.
    pub(crate) fn discovery(&self) -> Discovery {
        lock(&self.state).discovery.clone()
    }

    /// A streamed answer's first generated token came `ttft` after its request was sent, whose
    /// heartbeat-based estimate was `estimated_ms` ([`View::heartbeat_ttft_ms`]).
    pub(crate) fn observe_ttft(&self, ttft: Duration, estimated_ms: f64, telemetry: &Telemetry) {
        self.correct(ttft, estimated_ms);
        telemetry
            .ttft
            .get_or_create(&self.label)
            .observe(ttft.as_secs_f64());
    }

    /// Whether its heartbeat had some model up at the last tick (failures count against it
    /// only then).
    pub(crate) fn heartbeat_up(&self) -> bool {
        self.heartbeat_up.load(Ordering::Relaxed)
    }

    /// A request sent to the cluster got a 2xx: its gateway failures in a row start again;
    /// `routed_on`: the cluster was routed on when the request's order was made (not a last
    /// resort), so the success counts in its interval (`failurePercentage`). Returns why the
    /// cluster is due an ejection when the success closed an interval that trips: the caller
    /// then runs [`eject`].
    pub(crate) fn observe_success(
        &self,
        routed_on: bool,
        telemetry: &Telemetry,
    ) -> Option<Trigger> {
        self.consecutive.succeed();
        // Without `failurePercentage` a success reads no clock.
        if routed_on && self.outlier.rate.is_some() {
            self.judge_interval(Verdict::Success, now(), telemetry)
        } else {
            None
        }
    }

    /// A request routed on the cluster failed at its gateway (502, 503, 504, or no response
    /// headers); `heartbeat_up`: its heartbeat had it up. Counted unless the heartbeat has
    /// drained it or it is ejected. Returns why the cluster is due an ejection when that
    /// completes a run of `outlierDetection.consecutiveGatewayFailures`, or closes an interval
    /// whose share of failures reached `failurePercentage.threshold`: the caller then runs
    /// [`eject`].
    pub(crate) fn observe_gateway_failure(
        &self,
        heartbeat_up: bool,
        telemetry: &Telemetry,
    ) -> Option<Trigger> {
        let at = now();
        if !heartbeat_up || self.ejected_at(at) {
            return None;
        }
        let run = self.consecutive.fail(self.outlier.threshold);
        let interval = self.judge_interval(Verdict::Failure, at, telemetry);
        if run {
            Some(Trigger::Consecutive)
        } else {
            interval
        }
    }

    /// Counts a routed request's verdict in its interval (with `failurePercentage`); when that
    /// closes the interval, exports its share of failures and says whether it trips.
    fn judge_interval(
        &self,
        verdict: Verdict,
        at: Instant,
        telemetry: &Telemetry,
    ) -> Option<Trigger> {
        let rate = self.outlier.rate?;
        let length = u64::try_from(rate.interval.as_nanos()).unwrap_or(u64::MAX);
        let closed = self.window.record(verdict, since(self.epoch, at), length)?;
        telemetry
            .failure_percent
            .get_or_create(&self.label)
            .set(closed.failure_percent());
        closed
            .trips(&rate)
            .then_some(Trigger::FailurePercentage(closed))
    }

    /// Whether it is ejected at `at` (without the state lock).
    fn ejected_at(&self, at: Instant) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && since(self.epoch, at) < until
    }

    /// A routed request whose heartbeat-based estimate was `estimated_ms` had no response
    /// headers after `waited` (`timeouts.firstByteMs`). The wait counts as a measured TTFT (the
    /// answer's first token would have come later still) and as a failed heartbeat, as a
    /// refused connection does: a cluster whose front door stopped answering while its
    /// heartbeat stays good is no longer preferred, rather than every request routed there
    /// waiting out its own timeout. The TTFT histogram is left to answers that came.
    ///
    /// Returns whether its heartbeat had it up before (as [`Cluster::observe_connect_failure`]).
    pub(crate) fn observe_timeout(
        &self,
        waited: Duration,
        estimated_ms: f64,
        telemetry: &Telemetry,
    ) -> bool {
        self.correct(waited, estimated_ms);
        self.observe_connect_failure(telemetry)
    }

    /// Smooths a measured TTFT (`ttft` after the request was sent, now) into the correction
    /// of the cluster's estimates.
    fn correct(&self, ttft: Duration, estimated_ms: f64) {
        let window = self.settings.interval * OBSERVED_TTFT_INTERVALS;
        let at = now();
        let sent = at.checked_sub(ttft).unwrap_or(at);
        lock(&self.state).correction.observe(
            ttft.as_secs_f64() * 1e3,
            estimated_ms,
            sent,
            at,
            window,
        );
    }

    /// The cluster answered 401 or 403 to the router's own credentials (its
    /// `credentials.bearerTokenFile`, or none): warned once until it accepts them again.
    pub(crate) fn observe_refused_credentials(&self, status: http::StatusCode) {
        if !self.refusal_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                cluster = %self.config.name,
                status = status.as_u16(),
                "the cluster refuses the router's credentials (credentials.bearerTokenFile); its requests go to the next cluster"
            );
        }
    }

    /// The cluster answered a request with the router's credentials otherwise than 401 or 403.
    pub(crate) fn observe_accepted_credentials(&self) {
        if self.refusal_logged.load(Ordering::Relaxed) {
            self.refusal_logged.store(false, Ordering::Relaxed);
        }
    }

    /// A routed request could not reach the cluster (or timed out before its response
    /// headers): counts as a failed heartbeat. Returns whether the heartbeat had some model up
    /// before this failure: the failures after the first `failuresToDrain` have drained it
    /// (requests already on their way when a gateway dies) add nothing for outlier detection,
    /// and the heartbeat, not an ejection, then decides when it is back.
    pub(crate) fn observe_connect_failure(&self, telemetry: &Telemetry) -> bool {
        let at = now();
        let mut st = lock(&self.state);
        let was_up = st
            .models
            .values()
            .any(|m| matches!(m.health.state(at), State::Up { .. }));
        for m in st.models.values_mut() {
            m.health.observe_failure(at);
        }
        drop(st);
        self.tick(at, telemetry);
        was_up
    }

    /// Tokens served and their cost at `price` (one input and one output token's), which it
    /// returns.
    pub(crate) fn observe_usage(
        &self,
        input: u64,
        output: u64,
        price: (f64, f64),
        telemetry: &Telemetry,
    ) -> f64 {
        let cost = input as f64 * price.0 + output as f64 * price.1;
        let kinds = [("input", input), ("output", output)];
        for (kind, n) in kinds {
            telemetry
                .tokens
                .get_or_create(&crate::telemetry::ClusterKind {
                    cluster: Arc::clone(&self.label.cluster),
                    kind,
                })
                .inc_by(n);
        }
        telemetry.cost.get_or_create(&self.label).inc_by(cost);
        let tokens = self.tokens.fetch_add(input + output, Ordering::Relaxed) + input + output;
        let nanos = self
            .cost_nanos
            .fetch_add((cost * 1e9) as u64, Ordering::Relaxed)
            + (cost * 1e9) as u64;
        if tokens > 0 {
            telemetry
                .cost_per_million
                .get_or_create(&self.label)
                .set(nanos as f64 / 1e9 / tokens as f64 * 1e6);
        }
        cost
    }

    /// Records drains and returns, and refreshes the gauges.
    fn tick(&self, at: Instant, telemetry: &Telemetry) {
        let mut st = lock(&self.state);
        let mut best_weight: f64 = 0.0;
        let mut age: Option<Duration> = None;
        let mut estimate: Option<f64> = None;
        let rtt = st.rtt_ms;
        let mut drained = None;
        let mut returned = false;
        let mut any_up = false;
        let ejected = st.ejection.is_ejected(at);
        let readmitted = st.was_ejected && !ejected;
        st.was_ejected = ejected;
        // Set under the state lock, as `eject` sets it: a tick that read the state just before
        // an ejection cannot overwrite the ejection's 1 with its 0.
        telemetry
            .ejected
            .get_or_create(&self.label)
            .set(i64::from(ejected));
        let ejection_weight = st.ejection.weight(at, self.outlier.slow_start);
        for m in st.models.values_mut() {
            m.health.tick(at);
            let state = m.health.state(at);
            let up = matches!(state, State::Up { .. });
            if m.up && !up {
                if let State::Drained(reason) = state {
                    drained = Some(reason);
                }
            } else if !m.up && up && m.seen_up {
                returned = true;
            }
            m.up = up;
            m.seen_up |= up;
            any_up |= up;
            if let State::Up { weight } = state {
                best_weight = best_weight.max(weight.min(ejection_weight));
            }
            if let Some(a) = m.health.age(at) {
                age = Some(age.map_or(a, |b| b.min(a)));
            }
            if let Some(e) = m.estimate_ms {
                estimate = Some(estimate.map_or(e, |b: f64| b.min(e)));
            }
        }
        // Under the state lock, as the ejection reports: two ticks cannot report out of order.
        self.report_serving(&mut st, at, telemetry);
        drop(st);
        if let Some(reason) = drained {
            tracing::warn!(cluster = %self.config.name, reason = reason.as_str(), "cluster drained");
            telemetry
                .drains
                .get_or_create(&ClusterReason {
                    cluster: Arc::clone(&self.label.cluster),
                    reason: reason.as_str(),
                })
                .inc();
        }
        if returned {
            tracing::info!(cluster = %self.config.name, "cluster back; ramping up");
            telemetry.returns.get_or_create(&self.label).inc();
        }
        self.heartbeat_up.store(any_up, Ordering::Relaxed);
        if readmitted {
            tracing::info!(cluster = %self.config.name, "cluster readmitted after its ejection; ramping up");
        }
        telemetry.weight.get_or_create(&self.label).set(best_weight);
        telemetry
            .heartbeat_age
            .get_or_create(&self.label)
            .set(age.map_or(-1.0, |a| a.as_secs_f64()));
        telemetry
            .rtt
            .get_or_create(&self.label)
            .set(rtt.map_or(-1.0, |r| r / 1e3));
        telemetry
            .estimated_ttft
            .get_or_create(&self.label)
            .set(estimate.map_or(-1.0, |e| (e + rtt.unwrap_or(0.0)) / 1e3));
    }

    /// The current weight of `model`.
    #[cfg(test)]
    pub(crate) fn weight(&self, model: &str, at: Instant) -> f64 {
        self.view(model, at, 1.0).map_or(0.0, |v| v.weight)
    }

    /// Applies a heartbeat fetched in `rtt`.
    fn apply_heartbeat(&self, hb: &Heartbeat, rtt: Duration, at: Instant) {
        let mut st = lock(&self.state);
        st.heartbeat_failure = None;
        let ms = rtt.as_secs_f64() * 1e3;
        st.rtt_ms = Some(st.rtt_ms.map_or(ms, |v| v + EWMA_ALPHA * (ms - v)));
        let any_ready = hb.models.iter().any(|m| m.ready_pods > 0);
        // The entry whose pods serve each name the heartbeat gives: an entry's own name, and
        // each of its `adapters` (a name given twice keeps the first entry, a model's own name
        // before any adapter list: a gateway refuses both, another document is not trusted).
        let mut pods_of: HashMap<&str, usize> = HashMap::new();
        for (i, m) in hb.models.iter().enumerate() {
            pods_of.entry(m.name.as_str()).or_insert(i);
        }
        for (i, m) in hb.models.iter().enumerate() {
            for a in &m.adapters {
                pods_of.entry(a.as_str()).or_insert(i);
            }
        }
        // Models named by the heartbeat (adapters included), plus those `/v1/models` lists
        // (an adapter the heartbeat does not name follows its cluster's readiness).
        let mut names: Vec<String> = hb.models.iter().map(|m| m.name.clone()).collect();
        for n in hb.models.iter().flat_map(|m| &m.adapters) {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        for s in &st.served {
            if !names.contains(s) {
                names.push(s.clone());
            }
        }
        self.add_pending_slots(&names);
        // The pending slots of each entry's pods: those of every name it serves.
        let slots = self.pending.load();
        let mut on_pods: Vec<Vec<Arc<PendingSlot>>> = vec![Vec::new(); hb.models.len()];
        for (name, &i) in &pods_of {
            if let (Some(group), Some(slot)) = (on_pods.get_mut(i), slots.get(*name)) {
                group.push(Arc::clone(slot));
            }
        }
        let on_pods: Vec<Arc<[Arc<PendingSlot>]>> = on_pods.into_iter().map(Arc::from).collect();
        for name in names {
            // An adapter the heartbeat names has its base model's figures: the same pods.
            let pods = pods_of.get(name.as_str()).copied();
            let status = pods.and_then(|i| hb.models.get(i));
            let pods_pending = pods
                .and_then(|i| on_pods.get(i))
                .cloned()
                .unwrap_or_else(|| own_slot(&slots, &name));
            let ready = status.map_or(any_ready, |m| m.ready_pods > 0);
            let estimate = status
                .and_then(|m| m.estimated_ttft_ms)
                .or_else(|| {
                    hb.models
                        .iter()
                        .filter_map(|m| m.estimated_ttft_ms)
                        .reduce(f64::min)
                })
                .filter(|_| ready);
            let fresh = self.new_health();
            let entry = st
                .models
                .entry(name)
                .or_insert_with(|| ModelEntry::new(fresh, Arc::clone(&pods_pending)));
            entry.pods_pending = pods_pending;
            entry.health.observe_ok(at, ready);
            entry.estimate_ms = estimate;
            entry.prefill_ms = status.and_then(|m| m.prefill_ms).filter(|_| ready);
            entry.fixed_cost_ms = status.and_then(|m| m.fixed_cost_ms).filter(|_| ready);
            entry.wait_ms = status
                .and_then(|m| m.wait_ms)
                .filter(|w| ready && w.is_finite() && *w >= 0.0);
            entry.ready_pods = status.map_or(0, |m| m.ready_pods);
        }
    }

    /// Applies a `/v1/models` answer used as the heartbeat (no `heartbeatUrl`).
    fn apply_models_as_heartbeat(&self, models: &[String], rtt: Duration, at: Instant) {
        let mut st = lock(&self.state);
        self.add_pending_slots(models);
        st.heartbeat_failure = None;
        let ms = rtt.as_secs_f64() * 1e3;
        st.rtt_ms = Some(st.rtt_ms.map_or(ms, |v| v + EWMA_ALPHA * (ms - v)));
        let slots = self.pending.load();
        for name in models {
            let fresh = self.new_health();
            let entry = st
                .models
                .entry(name.clone())
                .or_insert_with(|| ModelEntry::new(fresh, own_slot(&slots, name)));
            entry.health.observe_ok(at, true);
        }
    }

    /// Gives each of `models` a slot for its pending requests, if it has none. Called with the
    /// state lock held, so that two of these never race to replace the map; a request reads
    /// the map without it. Allocates only when a model is new.
    fn add_pending_slots(&self, models: &[String]) {
        let current = self.pending.load();
        if models.iter().all(|m| current.contains_key(m.as_str())) {
            return;
        }
        let mut next = HashMap::clone(&current);
        for m in models {
            if let Entry::Vacant(v) = next.entry(Arc::from(m.as_str())) {
                let slot = new_slot(&self.model_requests, v.key(), &self.label);
                v.insert(slot);
            }
        }
        self.pending.store(Arc::new(next));
    }

    /// What it serves at `at`, and which of it is routed on (weight above 0: up or ramping,
    /// and not ejected), as `infergate_global_model_clusters` counts it.
    fn serving(&self, st: &ClusterState, at: Instant) -> Serving {
        let ejection_weight = st.ejection.weight(at, self.outlier.slow_start);
        let mut serving = Serving {
            served: st.served.iter().cloned().collect(),
            routable: std::collections::BTreeSet::new(),
        };
        for (name, m) in &st.models {
            if !serving.served.contains(name) {
                serving.served.insert(name.clone());
            }
            if let State::Up { weight } = m.health.state(at)
                && weight.min(ejection_weight) > 0.0
            {
                serving.routable.insert(name.clone());
            }
        }
        serving
    }

    /// Reports what it serves to `infergate_global_model_clusters` if that changed since the
    /// last report. Called with the state lock held. Compared in place first: a tick that
    /// changes nothing (most of them, and those of a routed request's failed connection)
    /// allocates nothing.
    fn report_serving(&self, st: &mut ClusterState, at: Instant, telemetry: &Telemetry) {
        if self.still_reported(st, at) {
            return;
        }
        let serving = self.serving(st, at);
        telemetry.model_clusters.update(self.id, &serving);
        st.reported = serving;
    }

    /// Whether [`Cluster::serving`] at `at` is what was last reported.
    fn still_reported(&self, st: &ClusterState, at: Instant) -> bool {
        let reported = &st.reported;
        let ejection_weight = st.ejection.weight(at, self.outlier.slow_start);
        let models_alike = st.models.iter().all(|(name, m)| {
            let routable = matches!(m.health.state(at), State::Up { weight } if weight.min(ejection_weight) > 0.0);
            reported.served.contains(name) && reported.routable.contains(name) == routable
        });
        models_alike
            && st.served.iter().all(|m| reported.served.contains(m))
            && reported.served.iter().all(|m| st.serves(m))
            && reported.routable.iter().all(|m| st.models.contains_key(m))
    }

    /// Enters it in `infergate_global_model_clusters`: a state that holds it is in force (a
    /// fresh cluster, before its poller starts).
    pub(crate) fn join_model_clusters(&self, telemetry: &Telemetry) {
        let mut st = lock(&self.state);
        let serving = self.serving(&st, now());
        telemetry.model_clusters.join(self.id, serving.clone());
        st.reported = serving;
    }

    /// Its heartbeat fetch failed (`why`): every model counts a failure.
    fn heartbeat_failed(&self, at: Instant, why: &str) {
        let mut st = lock(&self.state);
        for m in st.models.values_mut() {
            m.health.observe_failure(at);
        }
        st.heartbeat_failure = Some(Arc::from(why));
    }

    fn set_served(&self, models: Vec<String>) {
        let mut st = lock(&self.state);
        self.add_pending_slots(&models);
        st.served = models;
        st.discovery = Discovery::Listed;
    }

    /// Its `/v1/models` fetch failed (`why`): the models last read are kept.
    fn discovery_failed(&self, why: &str) {
        lock(&self.state).discovery = Discovery::Failed(Arc::from(why));
    }

    /// Why a `/v1/models` fetch failed, in the words of the log and of the answer to a client
    /// (`ApiError::NoClusterReported`): a 401 or 403 says whose credentials were refused.
    fn discovery_error(&self, e: &FetchError) -> String {
        let chain = e.explain();
        if !e.refused_credentials() {
            return chain;
        }
        if self.config.credentials.is_some() {
            format!(
                "{chain}: the cluster refuses the router's token from credentials.bearerTokenFile"
            )
        } else {
            format!(
                "{chain}: the cluster asks for credentials and the router sends none: set credentials.bearerTokenFile"
            )
        }
    }
}

/// A pending slot for `model` on the cluster `label`, with its request counter's handle (its
/// series made now, at 0).
fn new_slot(
    family: &prometheus_client::metrics::family::Family<
        ModelCluster,
        prometheus_client::metrics::counter::Counter,
    >,
    model: &Arc<str>,
    label: &ClusterLabel,
) -> Arc<PendingSlot> {
    let routed = family
        .get_or_create(&ModelCluster {
            model: Arc::clone(model),
            cluster: Arc::clone(&label.cluster),
        })
        .clone();
    Arc::new(PendingSlot {
        routed,
        ..PendingSlot::default()
    })
}

/// `model`'s own pending slot in `slots`, as the slots of its pods when nothing says which other
/// models share them (none if it has no slot, which [`Cluster::add_pending_slots`] prevents).
fn own_slot(slots: &HashMap<Arc<str>, Arc<PendingSlot>>, model: &str) -> Arc<[Arc<PendingSlot>]> {
    slots
        .get(model)
        .map_or_else(|| Arc::from([]), |s| Arc::from([Arc::clone(s)]))
}

/// How much of the heartbeat's estimate for a typical request
/// ([`TYPICAL_PROMPT_TOKENS`](infergate_pool::heartbeat::TYPICAL_PROMPT_TOKENS) prompt tokens) a
/// request of `prompt_tokens` takes. With the typical request's own prefill (`prefill_ms`) and
/// its fixed cost per request (`fixed_cost_ms`), the fixed share is paid whatever the prompt and
/// the rest grows with it: a seven-token prompt on a pod whose 512-token first token takes
/// 165 ms, 35 ms of it fixed, takes 22% of it (37 ms), not 1.4% (2 ms). Without the fixed cost
/// (a gateway that predates `fixedCostMs`, or one that has not learned it), in proportion to the
/// prompt, as before.
pub(crate) fn prompt_scale(
    prompt_tokens: f64,
    prefill_ms: Option<f64>,
    fixed_cost_ms: Option<f64>,
) -> f64 {
    let linear = prompt_tokens.max(1.0) / infergate_pool::heartbeat::TYPICAL_PROMPT_TOKENS;
    let share = prefill_ms.map_or(0.0, |prefill| fixed_share(prefill, fixed_cost_ms));
    share + (1.0 - share) * linear
}

/// The share of a typical request's prefill (`prefill_ms`) that is the fixed cost per request
/// (`fixed_cost_ms`), 0–1: 0 without one (or with figures that make none).
fn fixed_share(prefill_ms: f64, fixed_cost_ms: Option<f64>) -> f64 {
    match fixed_cost_ms {
        Some(fixed) if prefill_ms > 0.0 && fixed.is_finite() => {
            (fixed / prefill_ms).clamp(0.0, 1.0)
        }
        _ => 0.0,
    }
}

/// The cluster at `index` is due an ejection (`trigger`: it completed a run of
/// `outlierDetection.consecutiveGatewayFailures`, or an interval's share of failures reached
/// `failurePercentage.threshold`): ejects it, unless it is ejected already or one more ejected
/// would be over `maxEjectionPercent` of the clusters serving one of its models (held back;
/// tried again after as many failures more, or at the next interval). `deciding` makes the
/// decisions one at a time, so that two clusters due together cannot both pass the cap; it is
/// taken only here, as is each cluster's state lock in turn (never two at once).
pub(crate) fn eject(
    clusters: &[Arc<Cluster>],
    index: usize,
    trigger: Trigger,
    deciding: &Mutex<()>,
    telemetry: &Telemetry,
) {
    let Some(cluster) = clusters.get(index) else {
        return;
    };
    let _deciding = deciding.lock().unwrap_or_else(PoisonError::into_inner);
    let at = now();
    let models: Vec<String> = {
        let st = lock(&cluster.state);
        if st.ejection.is_ejected(at) {
            return;
        }
        let mut models: Vec<String> = st.models.keys().cloned().collect();
        for m in &st.served {
            if !models.contains(m) {
                models.push(m.clone());
            }
        }
        models
    };
    let per_model = models.iter().map(|model| {
        clusters.iter().fold((0, 0), |(serving, ejected), c| {
            let st = lock(&c.state);
            if st.serves(model) {
                (
                    serving + 1,
                    ejected + usize::from(st.ejection.is_ejected(at)),
                )
            } else {
                (serving, ejected)
            }
        })
    });
    if !outlier::may_eject(cluster.outlier.max_percent, per_model) {
        tracing::debug!(
            cluster = %cluster.config.name,
            ?trigger,
            max_percent = cluster.outlier.max_percent,
            "ejection held back: outlierDetection.maxEjectionPercent of a model's clusters are ejected"
        );
        telemetry
            .ejections_held_back
            .get_or_create(&cluster.label)
            .inc();
        return;
    }
    let (length, in_a_row) = {
        let mut st = lock(&cluster.state);
        let length = st.ejection.eject(at, &cluster.outlier);
        st.was_ejected = true;
        telemetry.ejected.get_or_create(&cluster.label).set(1);
        cluster.report_serving(&mut st, at, telemetry);
        (length, st.ejection.streak())
    };
    let until = since(cluster.epoch, at)
        .saturating_add(u64::try_from(length.as_nanos()).unwrap_or(u64::MAX));
    cluster.ejected_until.store(until.max(1), Ordering::Relaxed);
    cluster.consecutive.reset();
    cluster.window.reset(since(cluster.epoch, at));
    let ejection_ms = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
    match trigger {
        Trigger::Consecutive => tracing::warn!(
            cluster = %cluster.config.name,
            failures = cluster.outlier.threshold,
            ejection_ms,
            in_a_row,
            "cluster ejected: its routed requests failed at the gateway (502, 503, 504 or no response headers) this many times in a row"
        ),
        Trigger::FailurePercentage(interval) => tracing::warn!(
            cluster = %cluster.config.name,
            failures = interval.failures,
            successes = interval.successes,
            failure_percent = interval.failure_percent(),
            ejection_ms,
            in_a_row,
            "cluster ejected: this share of its routed requests failed at the gateway (502, 503, 504 or no response headers) over an interval (outlierDetection.failurePercentage)"
        ),
    }
    telemetry.ejections.get_or_create(&cluster.label).inc();
}

/// Nanoseconds from `epoch` to `at` (0 before it).
fn since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// `Authorization: Bearer <a token file's content, trimmed>`, marked sensitive (kept out of
/// logs).
fn token_header(bytes: &[u8]) -> Result<HeaderValue, TokenError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| TokenError::Read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::Empty);
    }
    let mut v =
        HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| TokenError::NotAHeader)?;
    v.set_sensitive(true);
    Ok(v)
}

/// One request sent to a cluster and still without its first token (counted in its model's
/// slot while held), and its prompt tokens.
pub(crate) struct Pending(Arc<PendingSlot>, u64);

impl Cluster {
    /// Counts a request for `model` of `prompt_tokens` sent to this cluster until the guard is
    /// dropped: in the estimates of the models served by its pods ([`Cluster::view`]; the
    /// model itself, and its base model and their adapters where the heartbeat names them).
    /// The model's slot is found by name in a map read with one atomic load; no lock, no
    /// allocation.
    pub(crate) fn pending(&self, model: &str, prompt_tokens: u32) -> Pending {
        let tokens = u64::from(prompt_tokens.max(1));
        let slot = self
            .pending
            .load()
            .get(model)
            .map_or_else(|| Arc::clone(&self.unlisted), Arc::clone);
        slot.requests.fetch_add(1, Ordering::Relaxed);
        slot.tokens.fetch_add(tokens, Ordering::Relaxed);
        Pending(slot, tokens)
    }
}

impl Pending {
    /// Counts the request in `infergate_global_model_requests` under this slot's model and
    /// cluster: for the cluster chosen first. One atomic add; a request for a model the
    /// cluster has no slot for is counted in no series.
    pub(crate) fn count_routed(&self) {
        self.0.routed.inc();
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
        self.0.tokens.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// Why a heartbeat or `/v1/models` fetch failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// No complete answer within `heartbeat.timeoutMs`.
    #[error("no complete answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// Connecting or sending failed.
    #[error("the request failed")]
    Request(#[source] hyper_util::client::legacy::Error),
    /// A status other than 2xx.
    #[error("it answered {0}")]
    Status(http::StatusCode),
    /// The body broke off or passed [`MAX_POLL_BODY`].
    #[error("its body could not be read whole (at most 1 MiB)")]
    Body,
}

impl FetchError {
    /// The failure and its causes, followed, when a TLS setting of the router or the cluster's
    /// gateway caused it, by what to change (as a request's 502 says): a heartbeat refused for
    /// want of a client certificate says to set `tls.certFile` and `tls.keyFile`.
    pub(crate) fn explain(&self) -> String {
        let chain = infergate_pool::ErrorChain(self).to_string();
        match self {
            FetchError::Request(e) => match crate::connect::remedy_of(e) {
                Some(remedy) => format!("{chain} ({remedy})"),
                None => chain,
            },
            _ => chain,
        }
    }

    /// Whether the cluster answered 401 or 403: it refuses the router's credentials (its
    /// `credentials.bearerTokenFile`, or none).
    fn refused_credentials(&self) -> bool {
        matches!(
            self,
            FetchError::Status(s)
                if *s == http::StatusCode::UNAUTHORIZED || *s == http::StatusCode::FORBIDDEN
        )
    }
}

/// Fetches `uri` within `timeout`: the body and the time it took.
async fn fetch(
    client: &Client,
    uri: Uri,
    token: Option<HeaderValue>,
    timeout: Duration,
) -> Result<(Bytes, Duration), FetchError> {
    let start = tokio::time::Instant::now();
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = uri;
    if let Some(t) = token {
        req.headers_mut().insert(header::AUTHORIZATION, t);
    }
    let work = async {
        let resp = client.request(req).await.map_err(FetchError::Request)?;
        if !resp.status().is_success() {
            return Err(FetchError::Status(resp.status()));
        }
        Limited::new(resp.into_body(), MAX_POLL_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|_| FetchError::Body)
    };
    let body = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| FetchError::Timeout(timeout))??;
    Ok((body, start.elapsed()))
}

/// Model ids of an OpenAI `/v1/models` answer.
pub(crate) fn model_ids(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    Some(list.data.into_iter().map(|e| e.id).collect())
}

/// What the poller remembers between rounds for its warnings: each run of failures is warned
/// of once.
#[derive(Debug, Default)]
struct Runs {
    /// The last heartbeat fetch failed — or, without `heartbeatUrl`, the last `/v1/models`
    /// fetch, which stands for it.
    failing: bool,
    /// A failed `/v1/models` fetch of a cluster judged by its heartbeat was warned of since the
    /// last good one.
    discovery_warned: bool,
}

/// Polls `cluster` until the task is aborted, with its clients and token in force at each tick.
pub(crate) async fn poll(
    cluster: Arc<Cluster>,
    telemetry: Telemetry,
    interval: Duration,
    discovery: Duration,
    timeout: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_discovery = tokio::time::Instant::now();
    let models_uri = cluster.uri("/v1/models");
    let mut runs = Runs::default();
    loop {
        tick.tick().await;
        let round = poll_once(
            &cluster,
            &telemetry,
            models_uri.as_ref(),
            &mut next_discovery,
            &mut runs,
            discovery,
            timeout,
        );
        // A fetch may hang for `timeoutMs`, longer than the time left to `staleAfterMs`: the
        // state is ticked every interval meanwhile, so that the drain routing already applies
        // (it reads the heartbeat's age itself) is logged and exported when it happens, not
        // when the fetch gives up.
        tokio::pin!(round);
        let mut meanwhile =
            tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        meanwhile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut round => break,
                _ = meanwhile.tick() => cluster.tick(now(), &telemetry),
            }
        }
        cluster.tick(now(), &telemetry);
    }
}

/// One round of the poller: `/v1/models` when it is due (or stands for the heartbeat), then
/// the heartbeat.
async fn poll_once(
    cluster: &Cluster,
    telemetry: &Telemetry,
    models_uri: Option<&Uri>,
    next_discovery: &mut tokio::time::Instant,
    runs: &mut Runs,
    discovery: Duration,
    timeout: Duration,
) {
    let discover = cluster.config.models.is_none()
        && (cluster.heartbeat.is_none() || tokio::time::Instant::now() >= *next_discovery);
    let client = cluster.clients().poll.clone();
    let token = cluster.token();
    if discover {
        *next_discovery = tokio::time::Instant::now() + discovery;
        if let Some(uri) = models_uri.cloned() {
            let listed = match fetch(&client, uri.clone(), token.clone(), timeout).await {
                Ok((body, rtt)) => model_ids(&body)
                    .map(|ids| (ids, rtt))
                    .ok_or_else(|| ("it is not an OpenAI model list".to_owned(), false)),
                Err(e) => Err((cluster.discovery_error(&e), e.refused_credentials())),
            };
            let result = match &listed {
                Ok(_) => "ok",
                Err((_, true)) => "refused",
                Err(_) => "error",
            };
            telemetry.discovered(&cluster.label, result);
            match listed {
                Ok((ids, rtt)) => {
                    if std::mem::take(&mut runs.discovery_warned) {
                        tracing::info!(cluster = %cluster.config.name, models = ids.len(), "the cluster's /v1/models is read again");
                    }
                    if cluster.heartbeat.is_none() {
                        cluster.apply_models_as_heartbeat(&ids, rtt, now());
                        runs.failing = false;
                    }
                    cluster.set_served(ids);
                }
                Err((why, _)) if cluster.heartbeat.is_none() => {
                    cluster.discovery_failed(&why);
                    models_failed(cluster, &mut runs.failing, &uri, &why);
                }
                // Judged by its heartbeat: the models last read are kept, but a cluster that
                // refuses the router's token, or is up by its heartbeat, must not go unnoticed
                // (the router's /v1/models does not list what it could not read). One that is
                // down otherwise was warned of when it was drained.
                Err((why, refused)) => {
                    cluster.discovery_failed(&why);
                    if (refused || cluster.any_up(now()))
                        && !std::mem::replace(&mut runs.discovery_warned, true)
                    {
                        tracing::warn!(
                            cluster = %cluster.config.name,
                            models_url = %uri,
                            error = %why,
                            "cannot read the cluster's /v1/models: the router's /v1/models lists only the models last read from it (none before the first read) and those its heartbeat names; logged again only after a good read"
                        );
                    } else {
                        tracing::debug!(
                            cluster = %cluster.config.name,
                            models_url = %uri,
                            error = %why,
                            "cannot read the cluster's /v1/models"
                        );
                    }
                }
            }
        }
    } else if cluster.heartbeat.is_none() && cluster.config.models.is_some() {
        // Static models and no heartbeat: `/v1/models` answering is the heartbeat.
        if let Some(uri) = models_uri.cloned() {
            match fetch(&client, uri.clone(), token.clone(), timeout).await {
                Ok((_, rtt)) => {
                    let models = cluster.served();
                    cluster.apply_models_as_heartbeat(&models, rtt, now());
                    runs.failing = false;
                }
                Err(e) => models_failed(
                    cluster,
                    &mut runs.failing,
                    &uri,
                    &cluster.discovery_error(&e),
                ),
            }
        }
    }
    if let Some(uri) = cluster.heartbeat.clone() {
        let failure = match fetch(&client, uri.clone(), None, timeout).await {
            Ok((body, rtt)) => match serde_json::from_slice::<Heartbeat>(&body) {
                Ok(hb) => {
                    cluster.apply_heartbeat(&hb, rtt, now());
                    None
                }
                Err(e) => Some(format!("unreadable heartbeat: {e}")),
            },
            Err(e) => Some(e.explain()),
        };
        match failure {
            None => runs.failing = false,
            Some(why) => {
                cluster.heartbeat_failed(now(), &why);
                // Once per run of failures: a wrong URL (never up, so never drained) says
                // why at once, and a dead cluster does not repeat it every interval.
                if !std::mem::replace(&mut runs.failing, true) {
                    tracing::warn!(cluster = %cluster.config.name, heartbeat_url = %uri, error = %why, "heartbeat failed; logged again only after a good one");
                } else {
                    tracing::debug!(cluster = %cluster.config.name, heartbeat_url = %uri, error = %why, "heartbeat failed");
                }
            }
        }
    }
}

/// A cluster without `heartbeatUrl` whose `/v1/models` fetch, its heartbeat, failed: drained,
/// and warned of once per run of failures as a failed heartbeat is, naming the URL fetched (a
/// wrong `url`, never up and so never drained, said nothing at all).
fn models_failed(cluster: &Cluster, failing: &mut bool, uri: &Uri, why: &str) {
    cluster.heartbeat_failed(now(), why);
    if !std::mem::replace(failing, true) {
        tracing::warn!(cluster = %cluster.config.name, models_url = %uri, error = %why, "/v1/models failed (the cluster has no heartbeatUrl: this fetch is its heartbeat); logged again only after a good one");
    } else {
        tracing::debug!(cluster = %cluster.config.name, models_url = %uri, error = %why, "/v1/models failed");
    }
}

#[cfg(test)]
mod tests;
