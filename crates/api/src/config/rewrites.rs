//! `spec.schedulers[].modelRewrites`, `spec.schedulers[].staleMetrics` and
//! `spec.schedulers[].outlierDetection`.
//!
//! `modelRewrites` follows the Gateway API Inference Extension's `InferenceModelRewrite` rules
//! (`matches[].model{type, value}`, `targets[]{modelRewrite, weight}`), plus infergate's
//! per-tenant `tenants`. It is the shape of the gateway file's `rewrites:` and of the picker's
//! `--rewrites` file, which the operator writes into the picker's ConfigMap; the picker reloads
//! it in place, so a CR update changes a split without restarting a pod.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation;

/// One rewrite rule: requests for the matched names (every name, with no `matches`) are sent
/// as one of the targets, split by weight.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRewriteRule {
    /// A name for logs and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Requested model names this rule applies to; empty: every name no other rule matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub matches: Vec<ModelMatch>,
    /// Tenants this rule applies to (the `x-llm-d-inference-fairness-id` the Gateway sets);
    /// empty: every tenant. A tenant's rule wins over the same model's rule without tenants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub tenants: Vec<String>,
    /// The served models or LoRA adapters, with their shares.
    #[schemars(length(min = 1, max = 64))]
    pub targets: Vec<RewriteTarget>,
}

/// A match on the requested model.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelMatch {
    /// The name.
    pub model: MatchValue,
}

/// How a name is matched.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchValue {
    /// `Exact` (the only kind).
    #[serde(rename = "type", default)]
    pub kind: MatchKind,
    /// The requested name.
    #[schemars(length(min = 1, max = 253))]
    pub value: String,
}

/// Match kinds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MatchKind {
    /// Byte for byte.
    #[default]
    Exact,
}

/// One target of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RewriteTarget {
    /// The model name or LoRA adapter the request is sent as.
    #[schemars(length(min = 1, max = 253))]
    pub model_rewrite: String,
    /// Its share relative to the other targets (default 1; 0 sends it nothing). The weights
    /// over their greatest common divisor may sum to at most 10,000.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 0, max = 10000))]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// What the picker does when no pod of the pool has fresh metrics.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaleMetricsSpec {
    /// `failOpen` (the default): keep dispatching to the pods that still answer, on in-flight
    /// accounting; `failClosed`: answer 503, as the reference picker does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<StaleMode>,
    /// In fail-open, requests in flight per pod beyond which it takes no more (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_inflight_per_endpoint: Option<u32>,
}

/// Passive outlier detection: a pod whose requests keep failing while its metrics look fine (an
/// engine in an error state answering 500 at once looks idle, so it draws more requests) leaves
/// the candidates for a while. On with its defaults under the `infergate` preset and custom
/// weights, off under the baseline presets unless given; `enabled: false` turns it off; each
/// field left out takes its default.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::outlier_rules)]
pub struct OutlierDetectionSpec {
    /// `false` turns outlier detection off, whatever the preset (default `true`: the section
    /// given turns it on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Failed answers in a row (500, 502, 503, 504, or no response headers) that eject a pod
    /// (default 5).
    #[serde(
        rename = "consecutive5xx",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub consecutive_5xx: Option<u32>,
    /// The first ejection's length in ms (default 30000); the n-th in a row lasts n times as
    /// long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604_800_000))]
    pub base_ejection_ms: Option<u64>,
    /// The longest ejection in ms (default 300000; not below `baseEjectionMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604_800_000))]
    pub max_ejection_ms: Option<u64>,
    /// The most of the pool's pods ejected at once, percent, rounded down (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_ejection_percent: Option<u32>,
    /// Ejection by the share of failed answers over an interval, for a pod whose failures come
    /// mixed with successes (off unless given; `{}` turns it on with its defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_percentage: Option<FailurePercentageSpec>,
}

/// `outlierDetection.failurePercentage`: a pod is ejected when, over an interval of
/// `intervalMs` with at least `minimumRequests` answers, `threshold` percent or more failed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePercentageSpec {
    /// The share of failed answers that ejects, percent (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub threshold: Option<u32>,
    /// The fewest answers an interval must have to be judged (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub minimum_requests: Option<u32>,
    /// The interval's length in ms (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604_800_000))]
    pub interval_ms: Option<u64>,
}

impl OutlierDetectionSpec {
    /// `baseEjectionMs` when left out.
    pub const DEFAULT_BASE_EJECTION_MS: u64 = 30_000;
    /// `maxEjectionMs` when left out.
    pub const DEFAULT_MAX_EJECTION_MS: u64 = 300_000;

    /// `baseEjectionMs`, defaulted.
    pub fn base_ejection_ms(&self) -> u64 {
        self.base_ejection_ms
            .unwrap_or(Self::DEFAULT_BASE_EJECTION_MS)
    }

    /// `maxEjectionMs`, defaulted.
    pub fn max_ejection_ms(&self) -> u64 {
        self.max_ejection_ms
            .unwrap_or(Self::DEFAULT_MAX_EJECTION_MS)
    }
}

/// Stale-metrics modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StaleMode {
    /// Dispatch on in-flight accounting to the pods that answer, within the cap.
    FailOpen,
    /// Answer 503 with `Retry-After`.
    FailClosed,
}
