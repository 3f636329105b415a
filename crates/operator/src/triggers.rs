//! Which configs an event on an object the controller does not own concerns: a model-server
//! pod (through a scheduler's `modelSelector`). Pure and synchronous, in the manner of linkerd's
//! kubert indexes: [`crate::reconcile::run`] feeds the watch streams in from outside.
//!
//! The status reads these objects on every pass; without a trigger a change would show only at
//! the next timed requeue (15 s while not ready, 300 s once ready), so a Ready config whose
//! model servers were all deleted would say Ready for up to five minutes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use infergate_api::InferenceGatewayConfig;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

/// A config to reconcile.
pub type ConfigRef = ObjectRef<InferenceGatewayConfig>;

/// The configs in `ns` with a scheduler whose `modelSelector` matches `labels` (every label of
/// the selector present with its value, as the status's pod list selects them).
pub fn configs_selecting(
    configs: &[Arc<InferenceGatewayConfig>],
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> HashSet<ConfigRef> {
    configs
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns))
        .filter(|c| {
            c.spec.schedulers.iter().any(|s| {
                s.model_selector
                    .iter()
                    .all(|(k, v)| labels.get(k) == Some(v))
            })
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The model-server pods some config's `modelSelector` matched when last seen, by
/// `namespace/name`, with those configs. A pod's event carries only its labels as they are
/// now: a pod relabelled out of a selector (taken out of service by hand) or gone while the
/// watch was down would otherwise trigger nothing for the config it left. Only matching pods
/// are kept, so its size is that of the model-server fleet, not of the cluster.
#[derive(Debug, Default)]
pub struct PodIndex {
    matched: HashMap<String, HashSet<ConfigRef>>,
    /// Pods listed since the watch (re)started, replacing `matched` when the list is done.
    relisting: Option<HashMap<String, HashSet<ConfigRef>>>,
}

impl PodIndex {
    /// The configs `event` concerns, given the configs that exist now: those that select the
    /// pod now and those that selected it before.
    pub fn apply(
        &mut self,
        event: Event<PartialObjectMeta<Pod>>,
        configs: &[Arc<InferenceGatewayConfig>],
    ) -> HashSet<ConfigRef> {
        match event {
            Event::Apply(pod) => self.seen(&pod, configs, false),
            Event::Delete(pod) => self.seen(&pod, configs, true),
            Event::Init => {
                self.relisting = Some(HashMap::new());
                HashSet::new()
            }
            Event::InitApply(pod) => {
                let key = pod_key(&pod);
                let now = configs_selecting(configs, &pod_ns(&pod), pod.labels());
                let mut out = now.clone();
                if let Some(before) = self.matched.get(&key) {
                    out.extend(before.iter().cloned());
                }
                if !now.is_empty() {
                    self.relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(key, now);
                }
                out
            }
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                // Pods deleted while the watch was down: their configs lost a server.
                let gone = self
                    .matched
                    .iter()
                    .filter(|(k, _)| !listed.contains_key(*k))
                    .flat_map(|(_, refs)| refs.iter().cloned())
                    .collect();
                self.matched = listed;
                gone
            }
        }
    }

    /// How many pods the index holds (those some config selected when last seen).
    pub fn len(&self) -> usize {
        self.matched.len()
    }

    /// Whether the index holds no pod.
    pub fn is_empty(&self) -> bool {
        self.matched.is_empty()
    }

    fn seen(
        &mut self,
        pod: &PartialObjectMeta<Pod>,
        configs: &[Arc<InferenceGatewayConfig>],
        deleted: bool,
    ) -> HashSet<ConfigRef> {
        let key = pod_key(pod);
        let now = configs_selecting(configs, &pod_ns(pod), pod.labels());
        let before = if deleted || now.is_empty() {
            self.matched.remove(&key)
        } else {
            self.matched.insert(key, now.clone())
        };
        let mut out = now;
        out.extend(before.into_iter().flatten());
        out
    }
}

fn pod_ns(pod: &PartialObjectMeta<Pod>) -> String {
    pod.namespace().unwrap_or_default()
}

fn pod_key(pod: &PartialObjectMeta<Pod>) -> String {
    format!("{}/{}", pod_ns(pod), pod.name_any())
}

#[cfg(test)]
mod tests;
