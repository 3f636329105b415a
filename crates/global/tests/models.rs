//! The router's per-model series on its real `/metrics`, in front of scripted clusters:
//! `infergate_global_model_clusters{model}` (the clusters that could take the model now) and
//! `infergate_global_model_requests_total{model, cluster}` (requests by the model asked for and
//! the cluster chosen first).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/clusters.rs"]
mod clusters;
#[path = "common/scripted.rs"]
mod scripted;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clusters::{counter, router_with};
use scripted::Scripted;

/// Heartbeats every 50 ms, a drained cluster back at full share at once.
const HEARTBEAT: &str = "heartbeat: { intervalMs: 50, staleAfterMs: 2000, slowStartMs: 0 }\n";

/// A chat request for `model`.
async fn chat(router: SocketAddr, model: &str) -> infergate_testkit::Response {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let req = http::Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Bytes::from(body))
        .unwrap();
    infergate_testkit::send(router, req).await.unwrap()
}

async fn page(admin: SocketAddr) -> String {
    infergate_testkit::get(admin, "/metrics").await.text()
}

/// Waits until `series` reads `value` on `admin`'s page (within 3 s); the page then.
async fn until(admin: SocketAddr, series: &str, value: f64) -> String {
    let start = Instant::now();
    loop {
        let text = page(admin).await;
        if text.lines().any(|l| l.starts_with(series)) && counter(&text, series) == value {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{series} never {value}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A heartbeat naming `model` with one ready pod while `ready` holds, none otherwise.
async fn switched_heartbeat(model: &'static str, ready: Arc<AtomicBool>) -> SocketAddr {
    infergate_testkit::pages::page_server(Arc::new(move || {
        let pods = u8::from(ready.load(Ordering::Relaxed));
        format!(
            r#"{{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
            "models":[{{"name":"{model}","pods":1,"readyPods":{pods},"saturation":0.0,"queue":0,
            "running":0,"inflight":0,"estimatedTtftMs":20.0,"prefillMs":20.0,"drainMs":0.0}}]}}"#
        )
    }))
    .await
}

/// The model's only cluster drains (its heartbeat shows no ready pod): the model's count falls
/// to 0 — its series stays, for an alert on `== 0` — and is 1 again when the cluster comes
/// back. A routed request counts under the model and its cluster; a request for a model no
/// cluster serves is refused and leaves no series of its name in either family.
#[tokio::test]
async fn a_models_count_falls_to_zero_when_its_only_cluster_drains_and_comes_back() {
    let ready = Arc::new(AtomicBool::new(true));
    let beat = switched_heartbeat("m", Arc::clone(&ready)).await;
    let cluster = Scripted::start(200).await;
    let yaml = format!(
        "auth: none\n{HEARTBEAT}clusters:\n  - {{ name: a, url: 'http://{}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    );
    let (router, _stop) = router_with(&yaml).await;
    let admin = router.admin_addr().unwrap();
    let count = r#"infergate_global_model_clusters{model="m"}"#;
    until(admin, count, 1.0).await;

    let r = chat(router.http_addr(), "m").await;
    assert_eq!(r.status, 200, "{}", r.text());
    until(
        admin,
        r#"infergate_global_model_requests_total{model="m",cluster="a"}"#,
        1.0,
    )
    .await;

    let r = chat(router.http_addr(), "no-such-model").await;
    assert_eq!(r.status, 404, "{}", r.text());
    let text = page(admin).await;
    assert!(!text.contains("no-such-model"), "{text}");

    ready.store(false, Ordering::Relaxed);
    let text = until(admin, count, 0.0).await;
    assert_eq!(
        counter(&text, r#"infergate_global_cluster_weight{cluster="a"}"#),
        0.0,
        "{text}"
    );
    ready.store(true, Ordering::Relaxed);
    until(admin, count, 1.0).await;
}

/// A request failed over: counted once, under the cluster chosen first (the cheaper, which
/// answered 503), not under the one that answered. Both clusters up: the model's count is 2.
#[tokio::test]
async fn a_failed_over_request_counts_under_the_cluster_chosen_first() {
    let beat = scripted::heartbeat().await;
    let busy = Scripted::start(503).await;
    let good = Scripted::start(200).await;
    let entry = |name: &str, addr: SocketAddr, cost: f64| {
        format!(
            "  - {{ name: {name}, url: 'http://{addr}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: {cost} }} }}\n"
        )
    };
    let yaml = format!(
        "auth: none\n{HEARTBEAT}clusters:\n{}{}",
        entry("busy", busy.addr, 0.1),
        entry("good", good.addr, 1.0)
    );
    let (router, _stop) = router_with(&yaml).await;
    let admin = router.admin_addr().unwrap();
    until(admin, r#"infergate_global_model_clusters{model="m"}"#, 2.0).await;

    let r = chat(router.http_addr(), "m").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some("good"));
    let text = page(admin).await;
    assert_eq!(
        counter(
            &text,
            r#"infergate_global_failovers_total{cluster="busy",reason="status_5xx"}"#
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        counter(
            &text,
            r#"infergate_global_model_requests_total{model="m",cluster="busy"}"#
        ),
        1.0,
        "{text}"
    );
    // Made at 0 when the cluster first served the model; the failover did not count there.
    assert!(
        text.contains(r#"infergate_global_model_requests_total{model="m",cluster="good"} 0"#),
        "{text}"
    );
}

/// A reload that removes the only cluster serving `n` drops `n`'s count series; `m`, served by
/// the cluster kept, stays. The request counter of `n` stays (a total that stops growing).
#[tokio::test]
async fn a_reload_drops_the_count_of_a_model_no_cluster_serves() {
    let up = Arc::new(AtomicBool::new(true));
    let beat_m = switched_heartbeat("m", Arc::clone(&up)).await;
    let beat_n = switched_heartbeat("n", up).await;
    let a = Scripted::start(200).await;
    let b = Scripted::start(200).await;
    // Each heartbeat names its cluster's model alone (a model a heartbeat names is served).
    let entry = |name: &str, addr: SocketAddr, beat: SocketAddr, model: &str| {
        format!(
            "  - {{ name: {name}, url: 'http://{addr}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [{model}], cost: {{ inputPerMillion: 1 }} }}\n"
        )
    };
    let both = format!(
        "auth: none\n{HEARTBEAT}clusters:\n{}{}",
        entry("a", a.addr, beat_m, "m"),
        entry("b", b.addr, beat_n, "n")
    );
    let (router, _stop) = router_with(&both).await;
    let admin = router.admin_addr().unwrap();
    until(admin, r#"infergate_global_model_clusters{model="m"}"#, 1.0).await;
    until(admin, r#"infergate_global_model_clusters{model="n"}"#, 1.0).await;
    let r = chat(router.http_addr(), "n").await;
    assert_eq!(r.status, 200, "{}", r.text());

    let only_a = format!(
        "auth: none\n{HEARTBEAT}clusters:\n{}",
        entry("a", a.addr, beat_m, "m")
    );
    router
        .handle()
        .reload(infergate_global::GlobalConfig::from_yaml(&only_a).unwrap())
        .unwrap();
    let text = page(admin).await;
    assert!(
        !text.contains(r#"infergate_global_model_clusters{model="n"}"#),
        "{text}"
    );
    assert_eq!(
        counter(&text, r#"infergate_global_model_clusters{model="m"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        counter(
            &text,
            r#"infergate_global_model_requests_total{model="n",cluster="b"}"#
        ),
        1.0,
        "{text}"
    );
}
