//! Global per-tenant rate limits across two global-router replicas, counted through a real
//! `redis-server` (`infergate_pool::quota`, the gateway's quota service): the replicas together
//! admit the tenant's limit within 5%, whichever replica each request reaches; with Redis gone
//! each replica counts locally and enforces its share, so the fleet still holds the limit; a
//! token quota is charged what the clusters' usage reports say; with authentication, the API
//! key's tenant is the quota's and its models are enforced
//! (`cargo test -p infergate-global --test ratelimit -- --nocapture`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the test prints what it measured"
)]

#[path = "common/clusters.rs"]
mod clusters;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clusters::{TestCluster, counter, wait_ready};
use infergate_global::{GlobalConfig, Listeners, Router, serve};
use infergate_testkit::Response;
use infergate_testkit::redis::RedisServer;
use tokio::time::Instant;

const LIMIT: usize = 120;
const SENT: usize = 360;
const REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

async fn replica(yaml: &str) -> (Router, tokio::sync::oneshot::Sender<()>) {
    let config = GlobalConfig::from_yaml(yaml).unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let router = serve(
        config,
        Listeners {
            http,
            admin: Some(admin),
        },
        async move {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    wait_ready(router.admin_addr().unwrap()).await;
    (router, stop)
}

async fn chat(addr: SocketAddr, tenant: &str) -> Response {
    let req = http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .body(Bytes::from_static(
            br#"{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap();
    infergate_testkit::send(addr, req).await.unwrap()
}

async fn metrics(r: &Router) -> String {
    infergate_testkit::get(r.admin_addr().unwrap(), "/metrics")
        .await
        .text()
}

/// Waits until `series` reads `value` on the router's metrics page.
async fn wait_metric(r: &Router, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if counter(&metrics(r).await, series) == value {
            return;
        }
        assert!(Instant::now() < deadline, "{series} never read {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`drive`] counted.
struct Tally {
    admitted: usize,
    refused: usize,
    per_replica: [usize; 2],
    took: Duration,
}

/// Sends [`SENT`] requests of tenant `team` from four clients; one in `every_b` goes to replica
/// b, the rest to a. Every refusal must be the quota's 429 with `Retry-After` and the reason
/// header.
async fn drive(fronts: [SocketAddr; 2], every_b: usize) -> Tally {
    let admitted = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let refused = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (admitted, refused, next) = (
                Arc::clone(&admitted),
                Arc::clone(&refused),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= SENT {
                        return;
                    }
                    let r = usize::from(n % every_b == 0);
                    let resp = chat(fronts[r], "team").await;
                    match resp.status.as_u16() {
                        200 => {
                            admitted[r].fetch_add(1, Ordering::Relaxed);
                        }
                        429 => {
                            let retry: u64 = resp
                                .header("retry-after")
                                .expect("a 429 without Retry-After")
                                .parse()
                                .unwrap();
                            assert!((1..=60).contains(&retry), "Retry-After {retry}");
                            assert_eq!(resp.header(REASON_HEADER), Some("rejected-quota-requests"));
                            assert!(resp.text().contains("rate_limit_error"), "{}", resp.text());
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        s => panic!("status {s}: {}", resp.text()),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let per_replica = [
        admitted[0].load(Ordering::Relaxed),
        admitted[1].load(Ordering::Relaxed),
    ];
    Tally {
        admitted: per_replica[0] + per_replica[1],
        refused: refused.load(Ordering::Relaxed),
        per_replica,
        took: start.elapsed(),
    }
}

fn router_yaml(redis: SocketAddr, cluster: &TestCluster) -> String {
    format!(
        "auth: none\ntenancy: {{ tenantHeader: x-tenant }}\nquotas:\n  tenants: {{ team: {{ requestsPerMinute: {LIMIT} }}, tok: {{ tokensPerMinute: 100000 }} }}\n  redis: {{ address: '{redis}', syncIntervalMs: 100 }}\nclusters:\n{}",
        cluster.entry("r1", 0.1, 0.2)
    )
}

fn within_5_percent(admitted: usize) -> bool {
    let lo = LIMIT - LIMIT * 5 / 100;
    let hi = LIMIT + LIMIT * 5 / 100;
    (lo..=hi).contains(&admitted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hold_one_tenant_limit_through_redis() {
    let Some(redis) = RedisServer::start_if_installed().await else {
        return;
    };
    let cluster = TestCluster::start("c1", "llama-3.1-8b/h100", 2, 21).await;
    wait_ready(cluster.admin).await;
    let yaml = router_yaml(redis.addr(), &cluster);
    let (a, stop_a) = replica(&yaml).await;
    let (b, stop_b) = replica(&yaml).await;
    // Both replicas have seen each other in Redis.
    wait_metric(&a, "infergate_quota_replicas", 2.0).await;
    wait_metric(&b, "infergate_quota_replicas", 2.0).await;
    // Uneven traffic, as behind a load balancer with sticky connections: b alone would not
    // reach half the limit, so the fleet holds the limit only if a uses what b leaves.
    let t = drive([a.http_addr(), b.http_addr()], 8).await;
    let (ma, mb) = (metrics(&a).await, metrics(&b).await);
    let both = |series: &str| counter(&ma, series) + counter(&mb, series);
    println!(
        "Redis up: limit {LIMIT}/min for tenant `team`, {SENT} requests in {:.1} s over two replicas: {} admitted ({} on a, {} on b), {} refused (429); {:+.1}% from the limit",
        t.took.as_secs_f64(),
        t.admitted,
        t.per_replica[0],
        t.per_replica[1],
        t.refused,
        (t.admitted as f64 - LIMIT as f64) / LIMIT as f64 * 100.0,
    );
    assert!(
        t.took < Duration::from_secs(55),
        "the test must stay within one window: {:?}",
        t.took
    );
    assert_eq!(t.admitted + t.refused, SENT);
    assert!(
        within_5_percent(t.admitted),
        "{} not within 5% of {LIMIT}",
        t.admitted
    );
    assert!(
        t.per_replica[0] > LIMIT / 2 + LIMIT / 10,
        "a admitted {}: it did not use the share b left (counters not shared?)",
        t.per_replica[0]
    );
    // The fleet-level counts on the routers' metrics pages add up to what the clients saw.
    assert_eq!(
        both(r#"infergate_quota_requests_total{tenant="team",outcome="admitted"}"#),
        t.admitted as f64
    );
    assert_eq!(
        both(r#"infergate_quota_requests_total{tenant="team",outcome="rejected_requests"}"#),
        t.refused as f64
    );
    assert_eq!(
        both(r#"infergate_global_rejections_total{reason="quota_exceeded"}"#),
        t.refused as f64
    );
    assert_eq!(counter(&ma, "infergate_quota_redis_up"), 1.0);
    // Another tenant has no quota and is not affected.
    assert_eq!(chat(a.http_addr(), "someone-else").await.status, 200);
    let _ = stop_a.send(());
    let _ = stop_b.send(());
    a.wait().await;
    b.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_each_replica_counts_locally_and_enforces_its_share() {
    let Some(mut redis) = RedisServer::start_if_installed().await else {
        return;
    };
    let cluster = TestCluster::start("c1", "llama-3.1-8b/h100", 2, 22).await;
    wait_ready(cluster.admin).await;
    let yaml = router_yaml(redis.addr(), &cluster);
    let (a, stop_a) = replica(&yaml).await;
    let (b, stop_b) = replica(&yaml).await;
    wait_metric(&a, "infergate_quota_replicas", 2.0).await;
    wait_metric(&b, "infergate_quota_replicas", 2.0).await;
    redis.kill();
    wait_metric(&a, "infergate_quota_redis_up", 0.0).await;
    wait_metric(&b, "infergate_quota_redis_up", 0.0).await;
    // No request waits for Redis or fails because of it: every answer is a 200 or the quota's
    // 429. Traffic alternates, so each replica reaches its share.
    let t = drive([a.http_addr(), b.http_addr()], 2).await;
    let (ma, mb) = (metrics(&a).await, metrics(&b).await);
    println!(
        "Redis down: limit {LIMIT}/min for tenant `team`, {SENT} requests in {:.1} s over two replicas counting locally: {} admitted ({} on a, {} on b), {} refused (429); {:+.1}% from the limit",
        t.took.as_secs_f64(),
        t.admitted,
        t.per_replica[0],
        t.per_replica[1],
        t.refused,
        (t.admitted as f64 - LIMIT as f64) / LIMIT as f64 * 100.0,
    );
    assert_eq!(t.admitted + t.refused, SENT);
    // Each replica enforces the limit divided by the replicas it last saw (two).
    for n in t.per_replica {
        assert!(n <= LIMIT / 2, "one replica admitted {n}, over its share");
    }
    assert!(
        within_5_percent(t.admitted),
        "{} not within 5% of {LIMIT}",
        t.admitted
    );
    assert!(counter(&ma, "infergate_quota_redis_sync_errors_total") >= 1.0);
    assert!(counter(&mb, "infergate_quota_redis_sync_errors_total") >= 1.0);
    // Redis returns: the routers share their counters again.
    redis.restart().await;
    wait_metric(&a, "infergate_quota_redis_up", 1.0).await;
    wait_metric(&b, "infergate_quota_redis_up", 1.0).await;
    let _ = stop_a.send(());
    let _ = stop_b.send(());
    a.wait().await;
    b.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_quota_is_charged_the_usage_the_cluster_reported() {
    let Some(redis) = RedisServer::start_if_installed().await else {
        return;
    };
    let cluster = TestCluster::start("c1", "llama-3.1-8b/h100", 1, 23).await;
    wait_ready(cluster.admin).await;
    let (a, stop_a) = replica(&router_yaml(redis.addr(), &cluster)).await;
    let mut reported = 0.0;
    for _ in 0..3 {
        let resp = chat(a.http_addr(), "tok").await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        reported += v["usage"]["total_tokens"].as_f64().unwrap();
    }
    let page = metrics(&a).await;
    assert_eq!(
        counter(&page, r#"infergate_quota_tokens_total{tenant="tok"}"#),
        reported
    );
    let _ = stop_a.send(());
    a.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_keys_tenant_is_its_quota_tenant_and_its_models_are_enforced() {
    let cluster = TestCluster::start("c1", "llama-3.1-8b/h100", 1, 24).await;
    wait_ready(cluster.admin).await;
    let key = |k: &str| infergate_proxy::auth::sha256_hex(k.as_bytes());
    let yaml = format!(
        "auth:\n  apiKeys:\n    keys:\n      - {{ sha256: {}, tenant: team, models: [llama] }}\n      - {{ sha256: {}, tenant: other-team, models: [mistral] }}\ntenancy: {{ tenantHeader: x-tenant }}\nquotas:\n  tenants: {{ team: {{ requestsPerMinute: 2 }} }}\nclusters:\n{}",
        key("key-a"),
        key("key-b"),
        cluster.entry("r1", 0.1, 0.2)
    );
    let (a, stop_a) = replica(&yaml).await;
    let call = |bearer: &'static str, tenant: &'static str| {
        let front = a.http_addr();
        async move {
            let req = http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {bearer}"))
                .header("x-tenant", tenant)
                .body(Bytes::from_static(
                    br#"{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#,
                ))
                .unwrap();
            infergate_testkit::send(front, req).await.unwrap()
        }
    };
    assert_eq!(call("wrong", "team").await.status, 401);
    // Key b may not call llama: refused before any quota or cluster is involved.
    let forbidden = call("key-b", "team").await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.text());
    // Key a is tenant `team` whatever the header says: two admitted, then the quota's 429.
    assert_eq!(call("key-a", "someone-else").await.status, 200);
    assert_eq!(call("key-a", "someone-else").await.status, 200);
    let refused = call("key-a", "someone-else").await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(
        refused.header(REASON_HEADER),
        Some("rejected-quota-requests")
    );
    let page = metrics(&a).await;
    assert_eq!(
        counter(
            &page,
            r#"infergate_quota_requests_total{tenant="team",outcome="admitted"}"#
        ),
        2.0
    );
    assert_eq!(
        counter(
            &page,
            r#"infergate_global_rejections_total{reason="forbidden"}"#
        ),
        1.0
    );
    let _ = stop_a.send(());
    a.wait().await;
}
