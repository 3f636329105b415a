//! Cost-aware routing against a latency-only policy on two local clusters: `cheap` (one A10G
//! pod, a tenth of the price) and `fast` (two H100 pods). Under light load the cheaper cluster
//! meets the TTFT objective and takes the traffic; as load grows its queue (seen in its
//! heartbeat and in the router's measured TTFT) pushes it over the objective and traffic spills
//! to `fast`. Prints a table of share, TTFT P50/P99 and cost per million tokens per policy and
//! load (`cargo test -p infergate-global --test cost -- --nocapture`).
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

use clusters::{Load, Outcome, TestCluster, counter, quantile, wait_ready};
use infergate_global::{GlobalConfig, Listeners, serve};

const OBJECTIVE_MS: u64 = 1_500;

/// What one load phase measured.
#[derive(Debug)]
struct Phase {
    requests: usize,
    cheap_share: f64,
    p50: Duration,
    p99: Duration,
    cost_per_million: f64,
    failed: usize,
}

fn cost_and_tokens(page: &str) -> (f64, f64) {
    let mut cost = 0.0;
    let mut tokens = 0.0;
    for c in ["cheap", "fast"] {
        cost += counter(
            page,
            &format!("infergate_global_cost_total{{cluster=\"{c}\"}}"),
        );
        for k in ["input", "output"] {
            tokens += counter(
                page,
                &format!("infergate_global_tokens_total{{cluster=\"{c}\",kind=\"{k}\"}}"),
            );
        }
    }
    (cost, tokens)
}

async fn phase(
    front: SocketAddr,
    admin: SocketAddr,
    clients: usize,
    pause: Duration,
    span: Duration,
    body: Body,
) -> Phase {
    let (c0, t0) = cost_and_tokens(&infergate_testkit::get(admin, "/metrics").await.text());
    let load = Load::start_with(front, clients, pause, body);
    tokio::time::sleep(span).await;
    let outcomes: Vec<Outcome> = load.stop().await;
    let (c1, t1) = cost_and_tokens(&infergate_testkit::get(admin, "/metrics").await.text());
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.status == Some(200)).collect();
    let cheap = ok
        .iter()
        .filter(|o| o.cluster.as_deref() == Some("cheap"))
        .count();
    let mut ttfts: Vec<Duration> = ok.iter().filter_map(|o| o.ttft).collect();
    Phase {
        requests: ok.len(),
        cheap_share: cheap as f64 / ok.len().max(1) as f64,
        p50: quantile(&mut ttfts, 0.50),
        p99: quantile(&mut ttfts, 0.99),
        cost_per_million: if t1 > t0 {
            (c1 - c0) / (t1 - t0) * 1e6
        } else {
            0.0
        },
        failed: outcomes.len() - ok.len(),
    }
}

type Body = std::sync::Arc<dyn Fn(u64) -> String + Send + Sync>;

async fn run(policy: &str, cheap: &TestCluster, fast: &TestCluster, body: Body) -> (Phase, Phase) {
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 500, timeoutMs: 400, staleAfterMs: 1500 }}\nrouting: {{ policy: {policy}, ttftObjectiveMs: {OBJECTIVE_MS} }}\nclusters:\n{}{}",
        cheap.entry("r1", 0.05, 0.10),
        fast.entry("r1", 0.50, 1.00),
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
    // Both clusters' heartbeats in: each has a TTFT estimate and its full routing share.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = infergate_testkit::get(admin, "/metrics").await.text();
        let known = |family: &str, c: &str| counter(&page, &format!("{family}{{cluster=\"{c}\"}}"));
        if ["cheap", "fast"].iter().all(|c| {
            known("infergate_global_estimated_ttft_seconds", c) > 0.0
                && known("infergate_global_cluster_weight", c) == 1.0
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "heartbeats never in:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let light = phase(
        front,
        admin,
        1,
        Duration::from_millis(300),
        Duration::from_secs(10),
        body.clone(),
    )
    .await;
    let heavy = phase(
        front,
        admin,
        12,
        Duration::ZERO,
        Duration::from_secs(8),
        body,
    )
    .await;
    let _ = stop.send(());
    router.wait().await;
    // Let both clusters finish what they hold before the next policy runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    (light, heavy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cheaper_cluster_while_it_meets_the_objective_then_spill_over() {
    let cheap = TestCluster::start("cheap", "llama-3.1-8b/a10g", 1, 11).await;
    let fast = TestCluster::start("fast", "llama-3.1-8b/h100", 2, 12).await;
    wait_ready(cheap.admin).await;
    wait_ready(fast.admin).await;
    // About 2,000 prompt tokens, unique per request (its number first, so no prefix is
    // cached): ~0.55 s of prefill on the A10G, ~0.09 s on an H100.
    let words = "the lighthouse keeper watched the grey sea roll in ".repeat(160);
    let body: Body = std::sync::Arc::new(move |n| {
        format!(
            r#"{{"model":"llama","max_tokens":4,"stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"request {n}: {words}"}}]}}"#
        )
    });
    let (cost_light, cost_heavy) = run("costAware", &cheap, &fast, body.clone()).await;
    let (lat_light, lat_heavy) = run("latency", &cheap, &fast, body).await;
    println!(
        "TTFT objective {OBJECTIVE_MS} ms; cheap: 1 x A10G at 0.05/0.10 per million input/output tokens; fast: 2 x H100 at 0.50/1.00"
    );
    println!(
        "| policy | load | requests | share on cheap | TTFT P50 | TTFT P99 | cost per million tokens | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (policy, load, p) in [
        ("costAware", "light (1 client)", &cost_light),
        ("costAware", "heavy (12 clients)", &cost_heavy),
        ("latency", "light (1 client)", &lat_light),
        ("latency", "heavy (12 clients)", &lat_heavy),
    ] {
        println!(
            "| {policy} | {load} | {} | {:.2} | {} ms | {} ms | {:.3} | {} |",
            p.requests,
            p.cheap_share,
            p.p50.as_millis(),
            p.p99.as_millis(),
            p.cost_per_million,
            p.failed
        );
    }
    for p in [&cost_light, &cost_heavy, &lat_light, &lat_heavy] {
        assert_eq!(p.failed, 0, "{p:?}");
        assert!(p.requests > 5, "{p:?}");
    }
    // Light load: the cheaper cluster meets the objective and takes (nearly) everything.
    assert!(cost_light.cheap_share >= 0.9, "{cost_light:?}");
    // Heavy load: it no longer does, and traffic spills over to the fast cluster.
    assert!(cost_heavy.cheap_share < 0.8, "{cost_heavy:?}");
    assert!(cost_heavy.cheap_share > 0.0, "{cost_heavy:?}");
    // The latency-only policy sends everything to the fast cluster.
    assert!(lat_light.cheap_share <= 0.1, "{lat_light:?}");
    // The cheap cluster met the objective while it took the light load.
    assert!(
        cost_light.p99 <= Duration::from_millis(OBJECTIVE_MS),
        "{cost_light:?}"
    );
    // And the latency-only policy pays for its speed.
    assert!(cost_light.cost_per_million < lat_light.cost_per_million / 2.0);
}
