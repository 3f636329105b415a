//! `spec.quotas`: per-tenant request and token quotas, optionally shared through Redis.
//!
//! The same shape as the `quotas:` section of the gateway file and the picker's `--quotas`
//! file (`infergate_pool::quota::spec`), so one block of YAML moves between them. Limits are
//! per minute; the window they are counted over is `windowSeconds` (default 60). One addition
//! for Kubernetes: `redis.passwordSecretRef`, which the operator turns into the pickers'
//! environment and a `passwordEnv` naming it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Per-tenant quotas.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotasSpec {
    /// Tenants with their own limits, by name (the authenticated tenant, or the
    /// `x-llm-d-inference-fairness-id` the Gateway sets from it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, QuotaLimits>,
    /// The limits of every tenant not listed, each counted on its own; none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<QuotaLimits>,
    /// The sliding window in seconds (1–3600; default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub window_seconds: Option<u64>,
    /// Buckets in the window (2–3600; default 60): the window's resolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 3600))]
    pub buckets: Option<u32>,
    /// Unlisted tenants counted apart (default 10,000); more share one window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_tenants: Option<u64>,
    /// Shared counters in Redis, so every replica holds the same quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<QuotaRedis>,
}

/// One tenant's limits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLimits {
    /// Requests per minute (at least 1; none: no request limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u64>,
    /// Input plus output tokens per minute, as the responses report them (at least 1; none: no
    /// token limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<u64>,
}

/// Where the shared counters live.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::validation::redis_rules)]
pub struct QuotaRedis {
    /// `host:port` of Redis (plain TCP: no TLS).
    #[schemars(length(min = 1))]
    pub address: String,
    /// Prepended to every key.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// How often this replica's use is written and the totals read, in ms.
    #[serde(default = "default_sync_ms")]
    #[schemars(range(min = 10, max = 10000))]
    pub sync_interval_ms: u64,
    /// The connect timeout and each round trip's, in ms.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = 10000))]
    pub timeout_ms: u64,
    /// An environment variable of the picker's pod holding the password sent with `AUTH`;
    /// it must be defined in `spec.podDefaults.env` (e.g. from a Secret). Exclusive with
    /// `passwordSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub password_env: Option<String>,
    /// A Secret key holding the password sent with `AUTH`: the operator sets it as the
    /// pickers' `INFERGATE_QUOTA_REDIS_PASSWORD` and points `passwordEnv` at it. Exclusive with
    /// `passwordEnv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the config's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key within the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_prefix() -> String {
    "infergate:".into()
}

fn default_sync_ms() -> u64 {
    100
}

fn default_timeout_ms() -> u64 {
    200
}
