//! Kubernetes discovery: the pods an InferencePool selects, watched (not polled), following the
//! InferencePool itself.
//!
//! [`pool_endpoints`] is the pure mapping — pods in, endpoints out — and is where the rules live:
//! a pod is a member while it is Ready, not terminating, has an IP and carries every label of the
//! pool's selector; it gives one endpoint per target port of the pool; its engine comes from the
//! `inference.networking.k8s.io/engine-type` label or the configured default.
//!
//! [`PoolTracker`] is the synchronous state both watches feed: the InferencePool's current
//! selection and the pods seen. [`watch_pool`] runs two `kube` runtime watchers — the
//! InferencePool (by name) and the pods its selector names — into the tracker and publishes the
//! endpoints to the live pool. When the pool's selector changes, the pod watch is restarted with
//! the new selector and the pods that no longer match are dropped at once; when only its target
//! ports change, the endpoints are recomputed from the pods already known; when the pool is
//! deleted, the picker has no endpoints until it comes back.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use infergate_api::upstream::inference_pool::InferencePool;
use infergate_metrics::engine_for;
use infergate_pool::{ErrorChain, LivePool};
use infergate_scheduler::EndpointMeta;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};

use crate::error::Error;

/// What the picker needs from its InferencePool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSelection {
    /// Namespace of the pool (and of its pods).
    pub namespace: String,
    /// `matchLabels` of the pool's selector.
    pub match_labels: BTreeMap<String, String>,
    /// The model servers' ports on each pod.
    pub target_ports: Vec<u16>,
}

impl PoolSelection {
    /// The selection an InferencePool describes. Ports outside 1..=65535 are an error.
    pub fn from_pool(namespace: &str, pool: &InferencePool) -> Result<Self, Error> {
        let mut target_ports = Vec::with_capacity(pool.spec.target_ports.len());
        for p in &pool.spec.target_ports {
            let port = u16::try_from(p.number)
                .ok()
                .filter(|p| *p > 0)
                .ok_or(Error::Endpoint {
                    endpoint: p.number.to_string(),
                    reason: "InferencePool targetPorts must be 1..=65535",
                })?;
            target_ports.push(port);
        }
        Ok(PoolSelection {
            namespace: namespace.to_owned(),
            match_labels: pool.spec.selector.match_labels.clone(),
            target_ports,
        })
    }

    /// Whether a pod with these labels is selected (carries every `matchLabels` entry).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    }

    /// The label selector string (`k=v,k2=v2`) for list and watch calls.
    pub fn label_selector(&self) -> String {
        self.match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Whether a pod may receive traffic: has an IP, is not terminating, and its `Ready` condition
/// is `True`.
pub fn pod_is_member(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(status) = &pod.status else {
        return false;
    };
    let has_ip = status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty());
    let ready = status
        .conditions
        .as_ref()
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    has_ip && ready
}

/// The endpoints of `pods` for `selection`: members only, one per target port, sorted by
/// address. A pod whose engine is missing or unknown is skipped with a warning (it cannot be
/// scraped), as is one whose IP does not parse.
pub fn pool_endpoints<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    selection: &PoolSelection,
    default_engine: Option<&str>,
) -> Vec<EndpointMeta> {
    let mut out = Vec::new();
    let no_labels = BTreeMap::new();
    for pod in pods {
        if !pod_is_member(pod)
            || !selection.selects(pod.metadata.labels.as_ref().unwrap_or(&no_labels))
        {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let Some(ip) = ip else {
            tracing::warn!(pod = %name, "pod IP does not parse; pod skipped");
            continue;
        };
        let engine = match engine_for(&name, &labels, default_engine) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(pod = %name, error = %infergate_pool::ErrorChain(&e), "pod skipped");
                continue;
            }
        };
        let gpu = labels.get("infergate.dev/gpu").cloned();
        for port in &selection.target_ports {
            out.push(EndpointMeta {
                namespace: selection.namespace.clone(),
                pod: name.clone(),
                addr: SocketAddr::new(ip, *port),
                engine,
                gpu: gpu.clone(),
                labels: labels.clone(),
            });
        }
    }
    out.sort_by_key(|e| e.addr);
    out.dedup_by_key(|e| e.addr);
    out
}

/// What a change of the InferencePool means for the pod watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolChange {
    /// The selection is the same: nothing to do.
    Unchanged,
    /// Only the target ports changed: the endpoints were recomputed from the known pods.
    Endpoints,
    /// The selector changed (or the pool appeared): watch the pods of this selection instead.
    /// The known pods that no longer match were dropped.
    Rewatch(PoolSelection),
    /// The pool does not exist (any more): stop watching pods; there are no endpoints.
    Gone,
}

/// The membership state that the InferencePool watch and the pod watch feed: synchronous, so the
/// rules are tested without an API server.
#[derive(Debug)]
pub struct PoolTracker {
    namespace: String,
    selection: Option<PoolSelection>,
    /// Pods by name, as of the last complete listing plus the changes since.
    known: BTreeMap<String, Pod>,
    /// A listing in progress (a (re)started pod watch), swapped in when complete.
    staging: BTreeMap<String, Pod>,
    /// Whether `known` is worth publishing (a listing completed for the current pool).
    synced: bool,
}

impl PoolTracker {
    /// A tracker for a pool in `namespace` that has not been seen yet.
    pub fn new(namespace: &str) -> Self {
        PoolTracker {
            namespace: namespace.to_owned(),
            selection: None,
            known: BTreeMap::new(),
            staging: BTreeMap::new(),
            synced: false,
        }
    }

    /// A tracker for a fixed selection (no InferencePool watch).
    pub fn with_selection(selection: PoolSelection) -> Self {
        PoolTracker {
            namespace: selection.namespace.clone(),
            selection: Some(selection),
            ..PoolTracker::new("")
        }
    }

    /// The current selection, if the pool exists.
    pub fn selection(&self) -> Option<&PoolSelection> {
        self.selection.as_ref()
    }

    /// Whether the endpoints are worth publishing: a pod listing has completed for the current
    /// pool, or the pool is gone (no endpoints is then the truth).
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Applies the InferencePool as now seen (`None`: it does not exist). A pool whose selection
    /// is invalid is an error and leaves the tracker as it was.
    pub fn set_pool(&mut self, pool: Option<&InferencePool>) -> Result<PoolChange, Error> {
        let next = pool
            .map(|p| PoolSelection::from_pool(&self.namespace, p))
            .transpose()?;
        if next == self.selection {
            return Ok(PoolChange::Unchanged);
        }
        let Some(next) = next else {
            self.selection = None;
            self.known.clear();
            self.staging.clear();
            // No pool, no endpoints: publishing the empty list is right straight away.
            self.synced = true;
            return Ok(PoolChange::Gone);
        };
        let rewatch = self
            .selection
            .as_ref()
            .is_none_or(|s| s.match_labels != next.match_labels);
        if self.selection.is_none() {
            // First sight (or back after deletion): nothing is known until the pods are listed.
            self.synced = false;
        }
        self.known
            .retain(|_, p| next.selects(p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())));
        self.staging.clear();
        self.selection = Some(next.clone());
        Ok(if rewatch {
            PoolChange::Rewatch(next)
        } else {
            PoolChange::Endpoints
        })
    }

    /// Applies one event of the pod watch; returns whether the endpoints should be published.
    pub fn on_pod_event(&mut self, event: Event<Pod>) -> bool {
        match event {
            Event::Init => {
                self.staging.clear();
                false
            }
            Event::InitApply(p) => {
                self.staging.insert(key(&p), p);
                false
            }
            Event::InitDone => {
                self.known = std::mem::take(&mut self.staging);
                self.synced = true;
                true
            }
            Event::Apply(p) => {
                self.known.insert(key(&p), p);
                self.synced
            }
            Event::Delete(p) => {
                self.known.remove(&key(&p));
                self.synced
            }
        }
    }

    /// The endpoints of the known pods for the current selection (none without a pool).
    pub fn endpoints(&self, default_engine: Option<&str>) -> Vec<EndpointMeta> {
        match &self.selection {
            Some(selection) => pool_endpoints(self.known.values(), selection, default_engine),
            None => Vec::new(),
        }
    }
}

/// Keeps `pool`'s membership equal to the member pods of the InferencePool `name` in
/// `namespace`, following changes of the pool's selector and target ports, until the future is
/// dropped. Watch errors are retried with the watcher's default backoff; a pool that does not
/// exist yet is waited for.
pub async fn watch_pool(
    client: kube::Client,
    namespace: &str,
    name: &str,
    default_engine: Option<String>,
    pool: LivePool,
) -> Result<(), Error> {
    let pools: Api<InferencePool> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let pool_events =
        kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(pools, config));
    let mut pool_events = std::pin::pin!(pool_events);
    let mut pods: Option<PodStream> = None;
    let mut tracker = PoolTracker::new(namespace);
    // The InferencePool of a listing in progress.
    let mut staged: Option<InferencePool> = None;
    loop {
        let publish = tokio::select! {
            event = pool_events.next() => {
                let Some(event) = event else { return Ok(()) };
                let seen = match event {
                    Ok(Event::Init) => {
                        staged = None;
                        continue;
                    }
                    Ok(Event::InitApply(p)) => {
                        staged = Some(p);
                        continue;
                    }
                    Ok(Event::InitDone) => staged.take(),
                    Ok(Event::Apply(p)) => Some(p),
                    Ok(Event::Delete(_)) => None,
                    Err(e) => {
                        tracing::warn!(error = %e, pool = %name, "InferencePool watch failed; retrying");
                        continue;
                    }
                };
                match tracker.set_pool(seen.as_ref()) {
                    Ok(PoolChange::Unchanged) => false,
                    Ok(PoolChange::Endpoints) => {
                        tracing::info!(pool = %name, "InferencePool target ports changed");
                        tracker.synced()
                    }
                    Ok(PoolChange::Rewatch(selection)) => {
                        tracing::info!(
                            pool = %name,
                            selector = %selection.label_selector(),
                            "watching the InferencePool's pods"
                        );
                        pods = Some(pod_stream(client.clone(), &selection));
                        tracker.synced()
                    }
                    Ok(PoolChange::Gone) => {
                        tracing::warn!(pool = %name, "InferencePool not found; no endpoints");
                        pods = None;
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pool = %name, "InferencePool change ignored");
                        false
                    }
                }
            }
            event = next_pod_event(&mut pods) => match event {
                Some(Ok(event)) => tracker.on_pod_event(event),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pod watch failed; retrying");
                    false
                }
                None => {
                    pods = None;
                    false
                }
            },
        };
        if publish {
            publish_endpoints(&pool, &tracker, default_engine.as_deref());
        }
    }
}

type PodStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Event<Pod>, watcher::Error>> + Send>>;

/// A watcher of the pods `selection` names.
fn pod_stream(client: kube::Client, selection: &PoolSelection) -> PodStream {
    let pods: Api<Pod> = Api::namespaced(client, &selection.namespace);
    let config = watcher::Config::default().labels(&selection.label_selector());
    Box::pin(kube::runtime::WatchStreamExt::default_backoff(
        watcher::watcher(pods, config),
    ))
}

/// The next pod event, or never when no pod watch runs.
async fn next_pod_event(
    pods: &mut Option<PodStream>,
) -> Option<Result<Event<Pod>, watcher::Error>> {
    match pods {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

fn publish_endpoints(pool: &LivePool, tracker: &PoolTracker, default_engine: Option<&str>) {
    let endpoints = tracker.endpoints(default_engine);
    tracing::info!(endpoints = endpoints.len(), "pool membership updated");
    if let Err(e) = pool.set_endpoints(endpoints) {
        tracing::warn!(error = %ErrorChain(&e), "pool membership update rejected");
    }
}

/// Membership for the picker process: connects with the in-cluster (or kubeconfig) credentials,
/// then runs [`watch_pool`] for as long as the picker runs. Until the InferencePool exists and its
/// pods are listed, the picker has no endpoints (and is not ready).
pub async fn membership(
    namespace: String,
    name: String,
    default_engine: Option<String>,
) -> Result<crate::run::Membership, Error> {
    let client = kube::Client::try_default()
        .await
        .map_err(|cause| Error::NoCluster { cause })?;
    Ok(crate::run::Membership::Dynamic(Box::new(move |pool| {
        Box::pin(async move {
            if let Err(e) = watch_pool(client, &namespace, &name, default_engine, pool).await {
                tracing::error!(
                    error = %ErrorChain(&e),
                    pool = %name,
                    "InferencePool discovery stopped"
                );
            }
        })
    })))
}

/// Watches the pods of a fixed `selection` and applies each change to `pool` (no InferencePool
/// watch: the selection never changes).
pub async fn watch_pods(
    client: kube::Client,
    selection: PoolSelection,
    default_engine: Option<String>,
    pool: LivePool,
) {
    let mut stream = pod_stream(client, &selection);
    let mut tracker = PoolTracker::with_selection(selection);
    while let Some(event) = stream.next().await {
        let publish = match event {
            Ok(event) => tracker.on_pod_event(event),
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                false
            }
        };
        if publish {
            publish_endpoints(&pool, &tracker, default_engine.as_deref());
        }
    }
}

fn key(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests;
