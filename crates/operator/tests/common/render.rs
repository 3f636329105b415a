//! Helpers shared by the operator's integration tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers"
)]

use std::path::{Path, PathBuf};

use infergate_api::InferenceGatewayConfig;
use infergate_operator::render::{Child, RenderOptions, render};

/// Fixed uid so owner references in golden files are stable.
pub const UID: &str = "0b9e0e8c-5d6f-4a53-9d3e-1f2a3b4c5d6e";

/// The repository's `deploy/examples` folder.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples")
}

/// Valid example files, sorted.
pub fn example_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Loads an example as the API server would hand it over: defaulted, with uid and generation.
pub fn load(path: &Path) -> InferenceGatewayConfig {
    let text = std::fs::read_to_string(path).unwrap();
    let mut cfg: InferenceGatewayConfig = serde_yaml::from_str(&text).unwrap();
    cfg.metadata.uid = Some(UID.to_owned());
    cfg.metadata.generation = Some(1);
    cfg
}

/// Loads an example by file name.
pub fn example(name: &str) -> InferenceGatewayConfig {
    load(&examples_dir().join(name))
}

/// Options with a fixed image.
pub fn opts() -> RenderOptions {
    RenderOptions {
        image: "ghcr.io/infergate/infergate:test".to_owned(),
        ..RenderOptions::default()
    }
}

/// Renders with [`opts`].
pub fn children(cfg: &InferenceGatewayConfig) -> Vec<Child> {
    render(cfg, &opts()).unwrap()
}

/// Every `(group, resource, verb)` the RBAC `rules` (a Role's or ClusterRole's) grant.
pub fn granted_by(
    rules: &serde_json::Value,
) -> std::collections::BTreeSet<(String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for rule in rules.as_array().unwrap() {
        let strs = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default()
        };
        for g in strs("apiGroups") {
            for r in strs("resources") {
                for v in strs("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}
