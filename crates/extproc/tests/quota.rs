//! Per-tenant quotas in the endpoint picker (`--quotas`): emulated vLLM pods, the live pool and
//! the harness playing Envoy. The tenant is `x-llm-d-inference-fairness-id` (set by the Gateway
//! from trusted auth; its last value when repeated), else `default`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/forward.rs"]
mod forward;
#[path = "common/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use forward::forward_with;
use harness::*;
use infergate_extproc::PickerConfig;
use infergate_extproc::run::{Membership, PickerListeners, load_quotas, run_picker};
use infergate_metrics::ScraperConfig;
use infergate_pool::PoolConfig;
use infergate_pool::tenant::FAIRNESS_ID_HEADER;
use infergate_scheduler::{EndpointMeta, EngineType, SchedulerConfig};
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, serve_fleet};
use infergate_testkit::metric;

const BODY: &[u8] =
    br#"{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_is_answered_429_before_the_pick() {
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get("llama-3.1-8b/a10g").unwrap().clone();
    let spec = FleetSpec {
        seed: 3,
        pods: vec![PodSpec {
            model: "llama".into(),
            ..PodSpec::new("pod-0".to_owned(), &profile, EngineKind::Vllm)
        }],
    }
    .finish()
    .unwrap();
    let (_fleet_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        "tenants:\n  team-a: { requestsPerMinute: 2 }\n",
    )
    .unwrap();
    let quotas = load_quotas(file.path()).unwrap();
    let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let listeners = PickerListeners {
        grpc: bind().await,
        health: bind().await,
        metrics: bind().await,
        tls: None,
        metrics_tls: None,
        peers: None,
    };
    let grpc = listeners.grpc.local_addr().unwrap();
    let metrics = listeners.metrics.local_addr().unwrap();
    let endpoints = fleet
        .pods
        .iter()
        .map(|p| EndpointMeta {
            namespace: "default".into(),
            pod: p.name.clone(),
            addr: p.addr,
            engine: EngineType::Vllm,
            gpu: None,
            labels: BTreeMap::new(),
        })
        .collect();
    let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(run_picker(
        listeners,
        PickerConfig {
            pool_name: "llama-pool".into(),
            quotas: Some(quotas),
            ..PickerConfig::default()
        },
        PoolConfig {
            scheduler: SchedulerConfig::default(),
            scrape: ScraperConfig::default(),
            seed: 11,
        },
        Membership::Static(endpoints),
        async move {
            let _ = rx.await;
        },
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = http_get(metrics, "/metrics").await;
        if metric(&m, "infergate_pod_stale", &[("name", "default/pod-0")]) == Some(0.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never scraped\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let envoy = Envoy::connect(grpc).await;
    let team_a = [(FAIRNESS_ID_HEADER, "team-a")];
    let started = std::time::Instant::now();
    for _ in 0..2 {
        let f = forward_with(&envoy, "/v1/chat/completions", &team_a, BODY, 4096).await;
        assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    }
    // The third is answered by the picker itself, before any pod is chosen.
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &team_a, false))
        .await;
    ex.send(request_body(BODY, true)).await;
    let (status, headers, body) = immediate_parts(&ex.next().await);
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        headers["x-llm-d-request-dropped-reason"],
        "rejected-quota-requests"
    );
    // The first request's one-second bucket leaves the 60 s window 59 to 60 s after it began;
    // less whatever time the two requests and this one took (a loaded machine may take seconds).
    let took = started.elapsed();
    let retry: u64 = headers["retry-after"].parse().unwrap();
    let earliest = 59u64.saturating_sub(took.as_secs());
    assert!(
        (earliest..=60).contains(&retry),
        "retry-after {retry} with the three requests taking {took:?}"
    );
    assert_eq!(body["error"]["code"], "quota_exceeded");
    // Another tenant, and a request without one (`default`), have no quota here.
    for headers in [&[(FAIRNESS_ID_HEADER, "team-b")][..], &[][..]] {
        let f = forward_with(&envoy, "/v1/chat/completions", headers, BODY, 4096).await;
        assert_eq!(f.status, 200);
    }
    // Two values, as Envoy sends a client's own header followed by the one its JWT filter
    // appended from the token: the token's (the last) is the tenant. team-a's quota is spent,
    // so naming team-b first does not get its request in, and naming team-a first does not
    // charge team-a.
    let spoofed = [
        (FAIRNESS_ID_HEADER, "team-b"),
        (FAIRNESS_ID_HEADER, "team-a"),
    ];
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &spoofed, false))
        .await;
    ex.send(request_body(BODY, true)).await;
    let (status, _, body) = immediate_parts(&ex.next().await);
    assert_eq!(status, 429, "the client's own value was used: {body}");
    let other_way = [
        (FAIRNESS_ID_HEADER, "team-a"),
        (FAIRNESS_ID_HEADER, "team-b"),
    ];
    let f = forward_with(&envoy, "/v1/chat/completions", &other_way, BODY, 4096).await;
    assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    let m = http_get(metrics, "/metrics").await;
    for line in [
        r#"infergate_quota_requests_total{tenant="team-a",outcome="admitted"} 2"#,
        r#"infergate_quota_requests_total{tenant="team-a",outcome="rejected_requests"} 2"#,
    ] {
        assert!(m.contains(line), "{line}\n{m}");
    }
    // No Redis configured: nothing says Redis is down.
    assert!(!m.contains("infergate_quota_redis"), "{m}");
    // Tokens counted for team-a come from the usage the pod reported on both answers.
    let tokens = metric(&m, "infergate_quota_tokens_total", &[("tenant", "team-a")]).unwrap();
    assert!(tokens > 0.0, "{m}");
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    infergate_testkit::get(addr, path).await.text()
}
