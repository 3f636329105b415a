//! The global router in front of three local clusters (each a real infergate gateway in front of
//! its own emulated fleet, in two regions), under closed-loop streamed load: a killed gateway is
//! drained and its requests retried elsewhere, a returning one ramps up over the slow-start
//! window, a gray failure (gateway up, pods stale) is read from the heartbeat, and a whole region
//! down moves traffic to the next region. Measured times and counts are printed
//! (`cargo test -p infergate-global --test failover -- --nocapture`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the test prints what it measured"
)]

#[path = "common/clusters.rs"]
mod clusters;

use std::net::SocketAddr;
use std::time::Duration;

use clusters::{CHAT, Load, Outcome, TestCluster, counter, wait_ready};
use infergate_global::{GlobalConfig, Listeners, serve};
use infergate_sim::MetricsFault;
use tokio::time::Instant;

const SLOW_START_MS: u64 = 6_000;

/// Samples the router's decision counter for `cluster` every 50 ms for `span`; returns the time
/// after `from` of its last increase (zero when it never increased).
async fn last_decision(
    admin: SocketAddr,
    cluster: &str,
    from: Instant,
    span: Duration,
) -> Duration {
    let series = format!(
        "infergate_global_decisions_total{{cluster=\"{cluster}\",reason=\"cheapest_within_objective\"}}"
    );
    let mut last_value = counter(
        &infergate_testkit::get(admin, "/metrics").await.text(),
        &series,
    );
    let mut last_change = Duration::ZERO;
    while from.elapsed() < span {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let v = counter(
            &infergate_testkit::get(admin, "/metrics").await.text(),
            &series,
        );
        if v > last_value {
            last_value = v;
            last_change = from.elapsed();
        }
    }
    last_change
}

fn share(outcomes: &[Outcome], from: Duration, to: Duration, cluster: &str) -> (f64, usize) {
    let window: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.at >= from && o.at < to && o.status == Some(200))
        .collect();
    let n = window.len();
    let hits = window
        .iter()
        .filter(|o| o.cluster.as_deref() == Some(cluster))
        .count();
    (if n == 0 { 0.0 } else { hits as f64 / n as f64 }, n)
}

fn lost(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| o.status.is_some_and(|s| s != 200))
        .count()
}

fn broken(outcomes: &[Outcome]) -> usize {
    outcomes.iter().filter(|o| o.status.is_none()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_return_gray_failure_and_region_down_under_load() {
    let mut east_a = TestCluster::start("east-a", "llama-3.1-8b/h100", 2, 1).await;
    let mut east_b = TestCluster::start("east-b", "llama-3.1-8b/h100", 2, 2).await;
    let west_a = TestCluster::start("west-a", "llama-3.1-8b/h100", 2, 3).await;
    for c in [&east_a, &east_b, &west_a] {
        wait_ready(c.admin).await;
    }
    // east-a is the cheapest, then east-b, then west-a: with an objective every cluster meets
    // (60 s: this test is about failover, not latency, on a shared 2-core machine), cost alone
    // decides, so all traffic goes to east-a while it is up.
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 500, timeoutMs: 400, staleAfterMs: 1500, failuresToDrain: 2, slowStartMs: {SLOW_START_MS}, discoveryIntervalMs: 1000 }}\nrouting: {{ ttftObjectiveMs: 60000, regionPreference: [us-east, us-west] }}\nclusters:\n{}{}{}",
        east_a.entry("us-east", 0.1, 0.2),
        east_b.entry("us-east", 0.2, 0.4),
        west_a.entry("us-west", 0.3, 0.6),
    );
    let config = GlobalConfig::from_yaml(&yaml).unwrap();
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
    let (front, admin) = (router.http_addr(), router.admin_addr().unwrap());
    wait_ready(admin).await;
    // Wait for a heartbeat from every cluster.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = infergate_testkit::get(admin, "/metrics").await.text();
        let seen = ["east-a", "east-b", "west-a"].iter().all(|c| {
            counter(
                &m,
                &format!("infergate_global_cluster_weight{{cluster=\"{c}\"}}"),
            ) == 1.0
        });
        if seen {
            break;
        }
        assert!(Instant::now() < deadline, "clusters never up:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let models = infergate_testkit::get(front, "/v1/models").await;
    assert_eq!(models.status, 200);
    assert!(
        models.text().contains(r#""id":"llama""#),
        "{}",
        models.text()
    );
    // One model (`GET /v1/models/{id}`): a served one's entry, an unknown one 404 listing them.
    let one = infergate_testkit::get(front, "/v1/models/llama").await;
    assert_eq!(one.status, 200, "{}", one.text());
    let v: serde_json::Value = serde_json::from_str(&one.text()).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["object"].as_str()),
        (Some("llama"), Some("model"))
    );
    let unknown = infergate_testkit::get(front, "/v1/models/gpt-9").await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert!(unknown.text().contains("llama"), "{}", unknown.text());
    // A retrieve has no body: nothing about a `model` field to set.
    assert!(
        unknown.text().contains("ask for one of the served models")
            && !unknown.text().contains("`model` field"),
        "{}",
        unknown.text()
    );

    let load = Load::start(front, 6, Duration::ZERO, CHAT);
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "heartbeat of west-a: {}",
        infergate_testkit::get(west_a.admin, "/heartbeat")
            .await
            .text()
    );
    println!(
        "heartbeat of east-a: {}",
        infergate_testkit::get(east_a.admin, "/heartbeat")
            .await
            .text()
    );

    // Phase 1: everything on east-a.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Phase 2: kill east-a's gateway.
    let t_kill = load.elapsed();
    let killed_at = Instant::now();
    let sampler = tokio::spawn(last_decision(
        admin,
        "east-a",
        killed_at,
        Duration::from_secs(5),
    ));
    east_a.kill().await;
    let stop_after = sampler.await.unwrap();
    let m = infergate_testkit::get(admin, "/metrics").await.text();
    for l in m.lines().filter(|l| {
        l.starts_with("infergate_global_estimated_ttft")
            || l.starts_with("infergate_global_cluster_weight")
    }) {
        println!("  {l}");
    }
    println!(
        "kill: east-a's gateway stopped at {:.2} s; last request routed there first {:.3} s after the kill",
        t_kill.as_secs_f64(),
        stop_after.as_secs_f64()
    );
    assert!(stop_after < Duration::from_secs(10), "{stop_after:?}");

    // Phase 3: east-a returns and ramps up over the slow-start window.
    let t_back = load.elapsed();
    east_a.restart().await;
    tokio::time::sleep(Duration::from_millis(SLOW_START_MS + 3_000)).await;

    // Phase 4: gray failure — east-a's gateway answers, its pods' metrics are gone.
    let t_gray = load.elapsed();
    let gray_at = Instant::now();
    let sampler = tokio::spawn(last_decision(
        admin,
        "east-a",
        gray_at,
        Duration::from_secs(5),
    ));
    east_a.set_metrics(MetricsFault::Missing);
    let gray_after = sampler.await.unwrap();
    println!(
        "gray failure: east-a's pods stale at {:.2} s; last request routed there first {:.3} s later",
        t_gray.as_secs_f64(),
        gray_after.as_secs_f64()
    );
    assert!(gray_after < Duration::from_secs(10), "{gray_after:?}");

    // Phase 5: the whole us-east region down (east-a gray, east-b killed) → us-west.
    let t_region = load.elapsed();
    east_b.kill().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t_end = load.elapsed();
    let outcomes = load.stop().await;
    let m = infergate_testkit::get(admin, "/metrics").await.text();

    let total = outcomes.len();
    println!(
        "requests: {total} sent, {} answered 200, {} lost (non-200), {} broken after streaming started, {} incomplete streams",
        outcomes.iter().filter(|o| o.status == Some(200)).count(),
        lost(&outcomes),
        broken(&outcomes),
        outcomes
            .iter()
            .filter(|o| o.status == Some(200) && !o.complete)
            .count(),
    );
    for series in [
        "infergate_global_failovers_total{cluster=\"east-a\",reason=\"connect\"}",
        "infergate_global_failovers_total{cluster=\"east-a\",reason=\"error\"}",
        "infergate_global_failovers_total{cluster=\"east-a\",reason=\"status_5xx\"}",
        "infergate_global_failovers_total{cluster=\"east-b\",reason=\"connect\"}",
        "infergate_global_failovers_total{cluster=\"east-b\",reason=\"error\"}",
        "infergate_global_cluster_drains_total{cluster=\"east-a\",reason=\"failing\"}",
        "infergate_global_cluster_drains_total{cluster=\"east-a\",reason=\"no_ready_pods\"}",
        "infergate_global_cluster_drains_total{cluster=\"east-b\",reason=\"failing\"}",
        "infergate_global_cluster_returns_total{cluster=\"east-a\"}",
        "infergate_global_cluster_ejections_total{cluster=\"east-a\"}",
        "infergate_global_cluster_ejections_total{cluster=\"east-b\"}",
    ] {
        println!("  {series} {}", counter(&m, series));
    }
    assert_eq!(
        lost(&outcomes),
        0,
        "requests lost: {:?}",
        outcomes
            .iter()
            .filter(|o| o.status.is_some_and(|s| s != 200))
            .collect::<Vec<_>>()
    );
    assert!(total > 100, "{total}");

    // Phase 1: east-a took everything.
    let (s, n) = share(&outcomes, Duration::ZERO, t_kill, "east-a");
    println!("phase 1 (all up): east-a share {s:.2} of {n}");
    assert!(s >= 0.95, "{s}");
    // After the kill and its drain: nothing more on east-a, east-b takes it.
    let after = t_kill + stop_after + Duration::from_millis(200);
    let (s, n) = share(&outcomes, after, t_back, "east-b");
    println!(
        "phase 2 (east-a killed): east-b share {s:.2} of {n} (west-a {:.2})",
        share(&outcomes, after, t_back, "west-a").0
    );
    assert_eq!(share(&outcomes, after, t_back, "east-a").0, 0.0);
    assert!(s >= 0.95, "{s}");
    // The ramp: east-a's share per second after its return.
    let mut shares = Vec::new();
    for sec in 0..(SLOW_START_MS / 1000 + 3) {
        let from = t_back + Duration::from_secs(sec);
        let (s, n) = share(&outcomes, from, from + Duration::from_secs(1), "east-a");
        shares.push(s);
        println!("phase 3 (east-a back): second {sec}: east-a share {s:.2} of {n}");
    }
    assert!(shares[0] < 0.4, "{shares:?}");
    assert!(shares[shares.len() - 1] > 0.9, "{shares:?}");
    assert!(
        counter(
            &m,
            "infergate_global_cluster_returns_total{cluster=\"east-a\"}"
        ) >= 1.0
    );
    // Gray failure: drained for no ready pods.
    assert!(
        counter(
            &m,
            "infergate_global_cluster_drains_total{cluster=\"east-a\",reason=\"no_ready_pods\"}"
        ) >= 1.0,
        "{m}"
    );
    let after = t_gray + gray_after + Duration::from_millis(200);
    assert_eq!(share(&outcomes, after, t_region, "east-a").0, 0.0);
    // Region down: us-west serves.
    let (s, n) = share(
        &outcomes,
        t_region + Duration::from_secs(2),
        t_end,
        "west-a",
    );
    println!("phase 5 (us-east down): west-a share {s:.2} of {n}");
    assert!(s >= 0.95 && n > 0, "{s} of {n}");

    let _ = stop.send(());
    router.wait().await;
}
