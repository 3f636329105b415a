//! `spec.flowControl` and `spec.tenancy`: the endpoint pickers' queues, and how a request's
//! priority is found.
//!
//! The same shape as the gateway file's top-level `flowControl:` and `tenancy:` sections and
//! as the picker's `--flow-control` file (`infergate_pool::flow::FlowSettings`), so one block
//! of YAML moves between them. Unset fields take the picker's defaults (written beside each
//! field). As in the gateway file, the section applies to every model: each scheduler's picker
//! keeps its own queues with these limits. The operator writes both sections into each picker's
//! ConfigMap as `flow-control.yaml`.
//!
//! `tenancy` carries the fields the picker reads. The gateway file's `tenantHeader` and
//! `priorityHeader` have no place here: behind Envoy the tenant is the
//! `x-llm-d-inference-fairness-id` header and the priority the objective named by
//! `x-llm-d-inference-objective`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The queues requests wait in while every pod of a pool is saturated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowControlSpec {
    /// Queue requests while the pool is saturated (default `false`, as in the gateway file:
    /// a saturated pool then routes or sheds at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long a request may wait, in milliseconds (default 60000; 0 disables the TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400000))]
    pub request_ttl_ms: Option<u64>,
    /// Requests queued across all bands at most (default 3072; full: Sheddable requests are
    /// evicted for Critical and Standard ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_requests: Option<u32>,
    /// Request bytes queued across all bands at most (default 1000000000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_bytes: Option<u64>,
    /// Limits of each priority band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bands: Option<FlowBands>,
    /// Order between the tenants of a band (default `global-strict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FlowFairness>,
    /// Order within one tenant's requests (default `fcfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<FlowOrdering>,
    /// Token weights of attained service, for `least-attained-service` (default 1 and 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_weights: Option<FlowServiceWeights>,
    /// Pods kept clear of prefill work for the requests flow control protects (off by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom: Option<FlowHeadroom>,
}

/// Headroom reservation: requests that are not protected (Sheddable ones, and those of a tenant
/// served more than its fair share recently) may not take the last `reservedEndpoints` clear
/// pods (headroom, nothing waiting, no prefill of this picker's ahead), which stay for the
/// protected ones; held back, they wait in their queue.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowHeadroom {
    /// Pods with no prefill ahead that requests not protected must leave (default 0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub reserved_endpoints: Option<u16>,
    /// Half-life of the recent service a tenant's fair share is judged on, in milliseconds
    /// (default 10000; at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub share_half_life_ms: Option<u64>,
}

/// Per-band limits, by priority name.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowBands {
    /// The Critical band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critical: Option<FlowBandLimits>,
    /// The Standard band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standard: Option<FlowBandLimits>,
    /// The Sheddable band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sheddable: Option<FlowBandLimits>,
}

/// Bounds of one priority band.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowBandLimits {
    /// Requests queued in the band at most (default 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_requests: Option<u32>,
    /// Request bytes queued in the band at most (default 1000000000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_bytes: Option<u64>,
}

/// How the next tenant is chosen within a band.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FlowFairness {
    /// No fairness between tenants: first come, first served over the whole band.
    GlobalStrict,
    /// Tenants in turn, one request each.
    RoundRobin,
    /// The tenant served the fewest weighted tokens goes next.
    LeastAttainedService,
}

/// The order of one tenant's requests.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FlowOrdering {
    /// First come, first served.
    Fcfs,
    /// Earliest deadline (arrival plus the TTL) first.
    Edf,
}

/// Weights of prompt and generated tokens in a tenant's attained service.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowServiceWeights {
    /// Weight of one prompt token (default 1; a finite number ≥ 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub input: Option<f64>,
    /// Weight of one generated token (default 1; a finite number ≥ 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub output: Option<f64>,
}

/// How the endpoint pickers find a request's priority, and which tenants get their own
/// metric label.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenancySpec {
    /// Objective names (the value of `x-llm-d-inference-objective`) and their priority: a band
    /// name (`critical`, `standard`, `sheddable`) or the reference's integer priority (above 0
    /// Critical, 0 Standard, below 0 Sheddable).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    pub objectives: BTreeMap<String, ObjectivePriority>,
    /// The priority of a request that names no objective, or one not listed (default
    /// `standard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority: Option<PriorityBand>,
    /// Tenants given their own label on the flow-control metrics; every other tenant is
    /// counted as `other`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub metric_tenants: Vec<String>,
}

/// A priority band.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PriorityBand {
    /// Served first; never shed while capacity remains.
    Critical,
    /// The default.
    Standard,
    /// Served last, shed first and evicted for the other bands when the queue is full.
    Sheddable,
}

impl PriorityBand {
    /// The band named `name` (as written in configuration), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "critical" => Some(Self::Critical),
            "standard" => Some(Self::Standard),
            "sheddable" => Some(Self::Sheddable),
            _ => None,
        }
    }
}

/// An objective's priority: a band name or an integer (the schema's `int-or-string`; a string
/// that names no band is refused by [`crate::validation::validate`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(untagged)]
pub enum ObjectivePriority {
    /// The reference's integer `spec.priority`.
    Level(i32),
    /// `critical`, `standard` or `sheddable`.
    Band(String),
}

impl JsonSchema for ObjectivePriority {
    fn schema_name() -> Cow<'static, str> {
        "ObjectivePriority".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A band name (`critical`, `standard`, `sheddable`) or an integer priority.",
            "x-kubernetes-int-or-string": true,
        })
    }
}
