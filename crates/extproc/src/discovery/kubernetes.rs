//! Kubernetes discovery: the pods an InferencePool selects, watched (not polled).
//!
//! [`pool_endpoints`] is the pure mapping — pods in, endpoints out — and is where the rules live:
//! a pod is a member while it is Ready, not terminating, and has an IP; it gives one endpoint per
//! target port of the pool; its engine comes from the `inference.networking.k8s.io/engine-type`
//! label or the configured default. [`watch_pool`] reads the InferencePool once, then feeds a
//! `kube` runtime watcher of the selected pods through that function into the live pool.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use infergate_api::upstream::inference_pool::InferencePool;
use infergate_metrics::engine_for;
use infergate_pool::LivePool;
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
    for pod in pods {
        if !pod_is_member(pod) {
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
                tracing::warn!(pod = %name, error = %e, "pod skipped");
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

/// Reads the InferencePool `name` in `namespace`, then keeps `pool`'s membership equal to the
/// pool's member pods until the future is dropped. Watch errors are retried with the watcher's
/// default backoff.
pub async fn watch_pool(
    client: kube::Client,
    namespace: &str,
    name: &str,
    default_engine: Option<String>,
    pool: LivePool,
) -> Result<(), Error> {
    let pools: Api<InferencePool> = Api::namespaced(client.clone(), namespace);
    let ip = pools.get(name).await?;
    let selection = PoolSelection::from_pool(namespace, &ip)?;
    watch_pods(client, selection, default_engine, pool).await;
    Ok(())
}

/// Membership for the picker process: connects with the in-cluster (or kubeconfig) credentials,
/// then runs [`watch_pool`] for as long as the picker runs. A pool that cannot be read is logged
/// and leaves the picker unready.
pub async fn membership(
    namespace: String,
    name: String,
    default_engine: Option<String>,
) -> Result<crate::run::Membership, Error> {
    let client = kube::Client::try_default().await?;
    Ok(crate::run::Membership::Dynamic(Box::new(move |pool| {
        Box::pin(async move {
            if let Err(e) = watch_pool(client, &namespace, &name, default_engine, pool).await {
                tracing::error!(error = %e, pool = %name, "InferencePool discovery stopped");
            }
        })
    })))
}

/// Watches the pods `selection` names and applies each change to `pool`.
pub async fn watch_pods(
    client: kube::Client,
    selection: PoolSelection,
    default_engine: Option<String>,
    pool: LivePool,
) {
    let pods: Api<Pod> = Api::namespaced(client, &selection.namespace);
    let config = watcher::Config::default().labels(&selection.label_selector());
    let stream = kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(pods, config));
    let mut stream = std::pin::pin!(stream);
    let mut known: BTreeMap<String, Pod> = BTreeMap::new();
    let mut staging: BTreeMap<String, Pod> = BTreeMap::new();
    let mut synced = false;
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(Event::Init) => {
                staging.clear();
                false
            }
            Ok(Event::InitApply(p)) => {
                staging.insert(key(&p), p);
                false
            }
            Ok(Event::InitDone) => {
                known = std::mem::take(&mut staging);
                synced = true;
                true
            }
            Ok(Event::Apply(p)) => {
                known.insert(key(&p), p);
                synced
            }
            Ok(Event::Delete(p)) => {
                known.remove(&key(&p));
                synced
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                false
            }
        };
        if changed {
            let endpoints = pool_endpoints(known.values(), &selection, default_engine.as_deref());
            tracing::info!(endpoints = endpoints.len(), "pool membership updated");
            if let Err(e) = pool.set_endpoints(endpoints) {
                tracing::warn!(error = %e, "pool membership update rejected");
            }
        }
    }
}

fn key(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests;
