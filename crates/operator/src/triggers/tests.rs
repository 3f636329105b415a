#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use infergate_api::InferenceGatewayConfig;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use super::{ConfigRef, PodIndex, configs_selecting};

fn example(file: &str) -> Arc<InferenceGatewayConfig> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples")
        .join(file);
    Arc::new(serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn pod(ns: &str, name: &str, l: &[(&str, &str)]) -> PartialObjectMeta<Pod> {
    PartialObjectMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some(labels(l)),
            ..ObjectMeta::default()
        },
        _phantom: Default::default(),
    }
}

fn fleet() -> ConfigRef {
    ObjectRef::new("fleet").within("inference")
}

fn refs(r: &[ConfigRef]) -> HashSet<ConfigRef> {
    r.iter().cloned().collect()
}

#[test]
fn a_pod_concerns_the_configs_of_its_namespace_whose_selector_it_matches() {
    let configs = [example("multi-model.yaml"), example("tgi-tls-secret.yaml")];
    let qwen = labels(&[("app", "sglang-qwen"), ("pod-template-hash", "x")]);
    assert_eq!(
        configs_selecting(&configs, "inference", &qwen),
        refs(&[fleet()])
    );
    assert!(configs_selecting(&configs, "other", &qwen).is_empty());
    assert!(configs_selecting(&configs, "inference", &labels(&[("app", "x")])).is_empty());
}

#[test]
fn the_index_remembers_matching_pods_only_and_reports_the_config_a_pod_left() {
    let configs = [example("multi-model.yaml")];
    let mut index = PodIndex::default();
    let qwen = [("app", "sglang-qwen")];
    // A pod of no config is not kept.
    assert!(
        index
            .apply(
                Event::Apply(pod("inference", "web", &[("app", "web")])),
                &configs
            )
            .is_empty()
    );
    assert!(index.is_empty());
    assert_eq!(
        index.apply(Event::Apply(pod("inference", "q", &qwen)), &configs),
        refs(&[fleet()])
    );
    assert_eq!(index.len(), 1);
    // Relabelled out of the selector: its labels match nothing now, the config it left is told.
    assert_eq!(
        index.apply(
            Event::Apply(pod("inference", "q", &[("app", "debug")])),
            &configs
        ),
        refs(&[fleet()])
    );
    assert!(index.is_empty());
    index.apply(Event::Apply(pod("inference", "q", &qwen)), &configs);
    assert_eq!(
        index.apply(Event::Delete(pod("inference", "q", &qwen)), &configs),
        refs(&[fleet()])
    );
    assert!(index.is_empty());
}

#[test]
fn a_relist_reports_the_configs_of_pods_deleted_while_the_watch_was_down() {
    let configs = [example("multi-model.yaml")];
    let mut index = PodIndex::default();
    index.apply(
        Event::Apply(pod("inference", "q", &[("app", "sglang-qwen")])),
        &configs,
    );
    index.apply(
        Event::Apply(pod("inference", "l", &[("app", "vllm-llama-70b")])),
        &configs,
    );
    assert!(index.apply(Event::Init, &configs).is_empty());
    index.apply(
        Event::InitApply(pod("inference", "l", &[("app", "vllm-llama-70b")])),
        &configs,
    );
    assert_eq!(index.apply(Event::InitDone, &configs), refs(&[fleet()]));
    assert_eq!(index.len(), 1);
}
