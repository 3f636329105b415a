//! Quotas shared through a real `redis-server` (Debian's package; the test fails, naming the
//! package, when it is missing): two services with separate state hold the configured rate
//! together, count locally when Redis is killed, and share again when it is back.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::sync::Arc;
use std::time::Duration;

use infergate_openai::ApiError;
use infergate_pool::quota::{QuotaConfig, QuotaTicket, Quotas, SharedConfig};
use infergate_pool::redis::RedisConfig;
use infergate_scheduler::quota::Limits;
use infergate_testkit::redis::RedisServer;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

fn config(redis: &RedisServer, prefix: &str, window: Duration, limit: u64) -> QuotaConfig {
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

/// Admits as fast as every millisecond allows on `q` until `until`; returns when each admitted
/// request was admitted, in ms after `start`. Any refusal but the quota's fails the test.
async fn hammer(q: Quotas, start: Instant, until: Instant) -> Vec<u64> {
    let mut admitted = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while Instant::now() < until {
        tick.tick().await;
        match q.admit("team-a", 0) {
            Ok(Some(t)) => {
                drop(QuotaTicket::commit(t));
                admitted.push(start.elapsed().as_millis() as u64);
            }
            Ok(None) => panic!("team-a has a quota"),
            Err(ApiError::QuotaExceeded { .. }) => {}
            Err(e) => panic!("not a quota refusal: {e}"),
        }
    }
    admitted
}

/// Both services hammered at once for `run`; the admissions of each, in ms after the start.
async fn run_both(a: &Quotas, b: &Quotas, run: Duration) -> (Vec<u64>, Vec<u64>) {
    let start = Instant::now();
    let until = start + run;
    let ta = tokio::spawn(hammer(a.clone(), start, until));
    let tb = tokio::spawn(hammer(b.clone(), start, until));
    (ta.await.unwrap(), tb.await.unwrap())
}

fn between(v: &[u64], from_ms: u64, to_ms: u64) -> usize {
    v.iter().filter(|t| (from_ms..to_ms).contains(t)).count()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn metrics(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_hold_the_configured_rate_within_5_percent() {
    let redis = RedisServer::start().await;
    // 6,000 per minute over a 6 s window: 600 per window, 100 per second.
    let window = Duration::from_secs(6);
    let a = Quotas::start(config(&redis, "rate:", window, 600), None).unwrap();
    let b = Quotas::start(config(&redis, "rate:", window, 600), None).unwrap();
    wait_for("both replicas see each other", || {
        a.redis_up() && b.redis_up() && a.replicas() == 2 && b.replicas() == 2
    })
    .await;
    let (ra, rb) = run_both(&a, &b, Duration::from_secs(18)).await;
    // After the first window, what leaves is refilled: 100 per second across both.
    let (na, nb) = (between(&ra, 6_000, 18_000), between(&rb, 6_000, 18_000));
    let total = na + nb;
    let rate = total as f64 / 12.0;
    println!(
        "shared quota of 100 requests/s (600 per 6 s window), two replicas, 12 s measured: \
         {na} + {nb} = {total} admitted, {rate:.1}/s ({:+.2}% of the configured rate)",
        (rate / 100.0 - 1.0) * 100.0
    );
    assert!((1140..=1260).contains(&total), "{total}");
    // Both replicas got a fair part (each hammered as hard as the other).
    assert!(na > 400 && nb > 400, "{na} / {nb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_means_local_counting_and_back_means_shared_again() {
    let mut redis = RedisServer::start().await;
    // 3,000 per minute over a 2 s window: 100 per window.
    let window = Duration::from_secs(2);
    let mut registry = Registry::default();
    let a = Quotas::start(config(&redis, "outage:", window, 100), Some(&mut registry)).unwrap();
    let b = Quotas::start(config(&redis, "outage:", window, 100), None).unwrap();
    wait_for("both replicas see each other", || {
        a.redis_up() && b.redis_up() && a.replicas() == 2 && b.replicas() == 2
    })
    .await;
    assert!(metrics(&registry).contains("infergate_quota_redis_up 1"));

    let (ra, rb) = run_both(&a, &b, Duration::from_secs(4)).await;
    let shared = between(&ra, 2_000, 4_000) + between(&rb, 2_000, 4_000);
    println!("shared, one 2 s window: {shared} admitted (limit 100)");
    assert!((95..=105).contains(&shared), "{shared}");

    redis.kill();
    wait_for("both replicas count locally", || {
        !a.redis_up() && !b.redis_up()
    })
    .await;
    let text = metrics(&registry);
    assert!(text.contains("infergate_quota_redis_up 0"), "{text}");
    // Every admission keeps being answered from local counts (`hammer` fails on any other
    // error); once the totals read before the outage have left the window, each replica
    // enforces its share: 100 / 2 replicas.
    let (ra, rb) = run_both(&a, &b, Duration::from_secs(4)).await;
    let (la, lb) = (between(&ra, 2_000, 4_000), between(&rb, 2_000, 4_000));
    println!("Redis down, one 2 s window: {la} + {lb} admitted (each replica's share: 50)");
    assert!(
        (45..=55).contains(&la) && (45..=55).contains(&lb),
        "{la} / {lb}"
    );

    redis.restart().await;
    wait_for("both replicas share again", || a.redis_up() && b.redis_up()).await;
    assert!(metrics(&registry).contains("infergate_quota_redis_up 1"));
    let (ra, rb) = run_both(&a, &b, Duration::from_secs(4)).await;
    let back = between(&ra, 2_000, 4_000) + between(&rb, 2_000, 4_000);
    println!("Redis back, one 2 s window: {back} admitted (limit 100)");
    assert!((95..=105).contains(&back), "{back}");
    assert!(
        text.contains("infergate_quota_redis_sync_errors_total"),
        "{text}"
    );
}
