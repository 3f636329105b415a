//! The quota tests' shared configuration: one tenant limited in requests, shared through the
//! test's `redis-server` in 100 ms buckets, synced every 50 ms.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use std::sync::Arc;
use std::time::Duration;

use infergate_pool::quota::{QuotaConfig, SharedConfig};
use infergate_pool::redis::RedisConfig;
use infergate_scheduler::quota::Limits;
use infergate_testkit::redis::RedisServer;

/// `limit` requests per `window` for `team-a`, shared under the key `prefix`.
pub fn config(redis: &RedisServer, prefix: &str, window: Duration, limit: u64) -> QuotaConfig {
    QuotaConfig {
        tenants: vec![(
            Arc::from("team-a"),
            Limits {
                requests: Some(limit),
                tokens: None,
            },
        )],
        window,
        // 100 ms buckets.
        buckets: u32::try_from(window.as_millis() / 100).unwrap(),
        redis: Some(SharedConfig {
            redis: RedisConfig::new(redis.addr().to_string()),
            key_prefix: prefix.to_owned(),
            sync_interval: Duration::from_millis(50),
        }),
        ..QuotaConfig::default()
    }
}
