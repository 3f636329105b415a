//! Status of an `InferenceGatewayConfig`: conditions for the whole config and per scheduler.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type: the spec passed validation and was rendered.
pub const ACCEPTED: &str = "Accepted";
/// Condition type: the Gateway is programmed, the BBR (if enabled) and every picker are available.
pub const READY: &str = "Ready";
/// Condition type: the Gateway reports `Programmed=True`.
pub const GATEWAY_PROGRAMMED: &str = "GatewayProgrammed";
/// Condition type: the BBR Deployment is available (or the BBR is disabled).
pub const BBR_READY: &str = "BBRReady";

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceGatewayConfigStatus {
    /// `Accepted`, `Ready`, `GatewayProgrammed`, `BBRReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per scheduler in the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedulers: Vec<SchedulerStatus>,
}

/// Observed state of one scheduler.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerStatus {
    /// The scheduler's `name`.
    pub name: String,
    /// `Ready` for the scheduler's picker Deployment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Rollout of the picker Deployment.
    pub rollout_state: RolloutState,
}

/// Rollout of a Deployment, as one word.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutState {
    /// Not observed yet.
    #[default]
    Pending,
    /// New pods are being rolled out.
    Progressing,
    /// Every desired pod is updated and available.
    Available,
    /// The rollout stalled or pods are unavailable.
    Degraded,
}
