//! `InferencePool` of the Gateway API Inference Extension, `inference.networking.k8s.io/v1`.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// A pool of model-server pods fronted by one endpoint picker.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Pods that are members of the pool (same namespace).
    pub selector: PoolSelector,
    /// Ports on each pod; every `podIP:port` is one endpoint.
    pub target_ports: Vec<PortNumber>,
    /// `http` or `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The endpoint picker Service.
    pub endpoint_picker_ref: EndpointPickerRef,
}

/// Label selector of an InferencePool (`matchLabels` only, as upstream).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolSelector {
    /// Labels every member pod carries.
    pub match_labels: BTreeMap<String, String>,
}

/// A port number.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortNumber {
    /// 1–65535.
    pub number: i32,
}

/// Reference to the endpoint picker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    /// API group; core (`""`) for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; `Service` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the Service.
    pub name: String,
    /// Service port of the ext_proc server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortNumber>,
    /// `FailOpen` or `FailClose`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<String>,
}
