//! The `quotas:` section as the gateway file and the picker's configuration write it.
//!
//! ```yaml
//! quotas:
//!   default: { requestsPerMinute: 60, tokensPerMinute: 100000 }   # each unlisted tenant
//!   tenants:
//!     team-a: { requestsPerMinute: 600, tokensPerMinute: 1000000 }
//!     batch: { tokensPerMinute: 50000 }                         # no request limit
//!   windowSeconds: 60          # the sliding window (default 60; limits are scaled to it)
//!   buckets: 60                # buckets in the window (default 60)
//!   maxTenants: 10000          # unlisted tenants counted apart; more share one window
//!   redis:                     # shared counting across replicas (optional)
//!     address: 127.0.0.1:6379
//!     keyPrefix: "infergate:"
//!     syncIntervalMs: 100
//!     timeoutMs: 200           # connect and each round trip
//!     passwordEnv: REDIS_PASSWORD   # optional: `AUTH` with this variable's value
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use infergate_scheduler::quota::{DEFAULT_BUCKETS, Limits, QuotaError, Window};
use serde::{Deserialize, Serialize};

use super::{DEFAULT_MAX_TENANTS, QuotaConfig, SharedConfig};
use crate::redis::RedisConfig;

/// One tenant's limits, per minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a map of `requestsPerMinute` and/or `tokensPerMinute`, such as { requestsPerMinute: 60 }"
)]
pub struct LimitsSpec {
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Tokens (input plus output, as responses report them) per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
}

/// Where the shared counters live.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a map with `address` (host:port), such as { address: 10.0.0.5:6379 }"
)]
pub struct RedisSpec {
    /// `host:port`.
    pub address: String,
    /// Prepended to every key.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// How often this replica's use is written and the totals read, in ms (10–10,000; default 100).
    #[serde(default = "default_sync_ms")]
    pub sync_interval_ms: u64,
    /// The connect timeout and each round trip's, in ms (1–10,000; default 200).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// An environment variable holding the password sent with `AUTH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
}

/// The `quotas:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a map of quota settings (`default`, `tenants`, `windowSeconds`, `buckets`, `maxTenants`, `redis`)"
)]
pub struct QuotasSpec {
    /// Tenants with their own limits.
    #[serde(default)]
    pub tenants: BTreeMap<String, LimitsSpec>,
    /// The limits of every tenant not listed (each counted apart); none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<LimitsSpec>,
    /// The sliding window in seconds (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u64>,
    /// Buckets in the window (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u32>,
    /// Unlisted tenants counted apart (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tenants: Option<usize>,
    /// Shared counting through Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSpec>,
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

/// The most buckets, up to `buckets`, that split `window_ms` into whole milliseconds: the
/// resolution nearest the one asked for. A window is whole seconds, so 2 always divides it.
fn fitting_buckets(window_ms: u64, buckets: u32) -> u32 {
    (2..=buckets)
        .rev()
        .find(|b| window_ms.is_multiple_of(u64::from(*b)))
        .unwrap_or(2)
}

/// A per-minute limit over a window of `window_s` seconds, rounded up.
fn scaled(per_minute: Option<u64>, window_s: u64) -> Option<u64> {
    per_minute.map(|n| n.saturating_mul(window_s).div_ceil(60))
}

impl LimitsSpec {
    fn to_limits(self, window_s: u64) -> Limits {
        Limits {
            requests: scaled(self.requests_per_minute, window_s),
            tokens: scaled(self.tokens_per_minute, window_s),
        }
    }

    fn validate(&self, at: &str) -> Result<(), String> {
        if self.requests_per_minute == Some(0) || self.tokens_per_minute == Some(0) {
            return Err(format!(
                "`{at}`: a limit must be at least 1 (leave it out for no limit)"
            ));
        }
        Ok(())
    }
}

impl QuotasSpec {
    /// Checks the section and builds the service's configuration. Errors name the field.
    pub fn to_config(&self) -> Result<QuotaConfig, String> {
        let window_s = self.window_seconds.unwrap_or(60);
        if !(1..=3600).contains(&window_s) {
            return Err("`quotas.windowSeconds` must be between 1 and 3600".into());
        }
        let window = Duration::from_secs(window_s);
        let buckets = self.buckets.unwrap_or(DEFAULT_BUCKETS);
        if !(2..=3600).contains(&buckets) {
            return Err("`quotas.buckets` must be between 2 and 3600".into());
        }
        Window::new(window, buckets).map_err(|e| match e {
            QuotaError::BadWindow { window_ms, buckets } => format!(
                "`quotas.buckets`: a window of {window_s} s (`quotas.windowSeconds`) cannot be \
                 split into {buckets} buckets of whole milliseconds (`buckets` is 60 unless \
                 set): set `quotas.buckets` to a number that divides {window_ms}, such as {}",
                fitting_buckets(window_ms, buckets)
            ),
            e => format!("`quotas`: {e}"),
        })?;
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for (name, l) in &self.tenants {
            if name.is_empty() || name.len() > super::MAX_TENANT_NAME {
                return Err(format!(
                    "`quotas.tenants`: a tenant name must have 1 to {} bytes",
                    super::MAX_TENANT_NAME
                ));
            }
            l.validate(&format!("quotas.tenants.{name}"))?;
            tenants.push((Arc::<str>::from(name.as_str()), l.to_limits(window_s)));
        }
        if let Some(d) = &self.default {
            d.validate("quotas.default")?;
        }
        let redis = match &self.redis {
            None => None,
            Some(r) => {
                if r.address.is_empty() {
                    return Err("`quotas.redis.address` must be set (host:port)".into());
                }
                // The connection is `TcpStream::connect(address)`: without a port it can never
                // succeed, so say so now rather than count locally forever.
                let port = r
                    .address
                    .rsplit_once(':')
                    .filter(|(host, _)| !host.is_empty());
                if !port.is_some_and(|(_, p)| p.parse::<u16>().is_ok_and(|p| p > 0)) {
                    return Err(format!(
                        "`quotas.redis.address`: `{}` is not host:port (e.g. 10.0.0.5:6379)",
                        r.address
                    ));
                }
                if !(10..=10_000).contains(&r.sync_interval_ms) {
                    return Err("`quotas.redis.syncIntervalMs` must be between 10 and 10000".into());
                }
                if !(1..=10_000).contains(&r.timeout_ms) {
                    return Err("`quotas.redis.timeoutMs` must be between 1 and 10000".into());
                }
                let password = match &r.password_env {
                    None => None,
                    Some(var) => Some(std::env::var(var).map_err(|_| {
                        format!("`quotas.redis.passwordEnv`: the variable `{var}` is not set")
                    })?),
                };
                let timeout = Duration::from_millis(r.timeout_ms);
                Some(SharedConfig {
                    redis: RedisConfig {
                        connect_timeout: timeout,
                        command_timeout: timeout,
                        password,
                        ..RedisConfig::new(r.address.clone())
                    },
                    key_prefix: r.key_prefix.clone(),
                    sync_interval: Duration::from_millis(r.sync_interval_ms),
                })
            }
        };
        Ok(QuotaConfig {
            tenants,
            default: self.default.map(|d| d.to_limits(window_s)),
            window,
            buckets,
            max_tenants: self.max_tenants.unwrap_or(DEFAULT_MAX_TENANTS),
            redis,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_into_per_window_limits() {
        let spec: QuotasSpec = serde_yaml::from_str(
            "default: { requestsPerMinute: 60 }\n\
             tenants:\n  team-a: { requestsPerMinute: 600, tokensPerMinute: 1000000 }\n\
             windowSeconds: 6\n\
             redis: { address: 127.0.0.1:6379, syncIntervalMs: 50 }\n",
        )
        .unwrap();
        let c = spec.to_config().unwrap();
        assert_eq!(c.window, Duration::from_secs(6));
        assert_eq!(
            c.tenants,
            vec![(
                Arc::from("team-a"),
                Limits {
                    requests: Some(60),
                    tokens: Some(100_000)
                }
            )]
        );
        assert_eq!(
            c.default,
            Some(Limits {
                requests: Some(6),
                tokens: None
            })
        );
        let r = c.redis.unwrap();
        assert_eq!(r.key_prefix, "infergate:");
        assert_eq!(r.sync_interval, Duration::from_millis(50));
        assert_eq!(r.redis.command_timeout, Duration::from_millis(200));
    }

    #[test]
    fn a_redis_address_without_a_port_is_refused() {
        for address in [
            "127.0.0.1",
            "redis",
            ":6379",
            "redis:",
            "redis:0",
            "redis:99999",
        ] {
            let spec: QuotasSpec =
                serde_yaml::from_str(&format!("redis: {{ address: '{address}' }}")).unwrap();
            let e = spec.to_config().unwrap_err();
            assert!(e.contains("`quotas.redis.address`"), "{address}: {e}");
            assert!(e.contains("is not host:port"), "{address}: {e}");
        }
        for address in ["10.0.0.5:6379", "redis.inference.svc:6379", "[::1]:6379"] {
            let spec: QuotasSpec =
                serde_yaml::from_str(&format!("redis: {{ address: '{address}' }}")).unwrap();
            spec.to_config().unwrap();
        }
    }

    /// `windowSeconds: 7` with the default 60 buckets: the error names the field to change and
    /// a value that works, not only the arithmetic.
    #[test]
    fn a_window_its_buckets_do_not_divide_names_buckets_and_a_count_that_fits() {
        for (yaml, window_ms, fits) in [
            ("windowSeconds: 7", 7000, 56),
            ("windowSeconds: 1", 1000, 50),
            ("windowSeconds: 7\nbuckets: 3", 7000, 2),
        ] {
            let spec: QuotasSpec = serde_yaml::from_str(yaml).unwrap();
            let e = spec.to_config().unwrap_err();
            assert!(e.starts_with("`quotas.buckets`: "), "{yaml}: {e}");
            assert!(e.contains("`quotas.windowSeconds`"), "{yaml}: {e}");
            assert!(
                e.ends_with(&format!(
                    "set `quotas.buckets` to a number that divides {window_ms}, such as {fits}"
                )),
                "{yaml}: {e}"
            );
            let fixed: QuotasSpec = serde_yaml::from_str(
                &format!("{yaml}\nbuckets: {fits}").replace("buckets: 3\n", ""),
            )
            .unwrap();
            fixed.to_config().unwrap();
        }
    }

    /// A limit written as a bare number (or a section as a scalar) is refused saying what is
    /// expected, not with the name of a Rust type (`expected struct LimitsSpec`).
    #[test]
    fn a_scalar_where_a_map_belongs_says_what_the_map_holds() {
        for (yaml, expected) in [
            (
                "default: 100",
                "`requestsPerMinute` and/or `tokensPerMinute`",
            ),
            (
                "tenants: { a: 5 }",
                "`requestsPerMinute` and/or `tokensPerMinute`",
            ),
            ("redis: 10.0.0.5:6379", "a map with `address` (host:port)"),
        ] {
            let e = serde_yaml::from_str::<QuotasSpec>(yaml)
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{yaml}: {e}");
            assert!(!e.contains("struct"), "{yaml}: {e}");
        }
        let e = serde_yaml::from_str::<QuotasSpec>("5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a map of quota settings"), "{e}");
    }

    #[test]
    fn impossible_values_are_refused_with_the_field() {
        let bad = [
            (
                "tenants: { a: { requestsPerMinute: 0 } }",
                "quotas.tenants.a",
            ),
            ("windowSeconds: 0", "quotas.windowSeconds"),
            ("windowSeconds: 7\nbuckets: 3", "quotas"),
            ("redis: { address: '' }", "quotas.redis.address"),
            (
                "redis: { address: 'a:1', syncIntervalMs: 1 }",
                "syncIntervalMs",
            ),
            (
                "redis: { address: 'a:1', passwordEnv: INFERGATE_TEST_UNSET_VAR }",
                "passwordEnv",
            ),
        ];
        for (yaml, field) in bad {
            let spec: QuotasSpec = serde_yaml::from_str(yaml).unwrap();
            let e = spec.to_config().unwrap_err();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        assert!(serde_yaml::from_str::<QuotasSpec>("tenant: {}").is_err());
    }
}
