//! The picker end to end: emulated model servers (`infergate-sim`) on 127.0.0.1, the live pool
//! scraping them, and the harness standing in for Envoy — routing through ext_proc, forwarding to
//! the chosen endpoint, streaming the response back.
//!
//! These run on the real clock: the pool scrapes real sockets every 50 ms. Assertions are about
//! where requests go and about in-flight accounting, never about how long anything took.
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

use forward::forward;
use harness::*;
use infergate_extproc::run::{Membership, PickerListeners, ServerTls, run_picker};
use infergate_extproc::{EndpointPicker, PickerConfig, Telemetry};
use infergate_metrics::ScraperConfig;
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, EngineType, SchedulerConfig};
use infergate_sim::{
    Catalog, EngineKind, Faults, FleetSpec, MetricsFault, PodSpec, ServedFleet, serve_fleet,
};
use infergate_testkit::metric;
use std::net::SocketAddr;

const PROFILE: &str = "llama-3.1-8b/a10g";

struct Rig {
    fleet: ServedFleet,
    pool: LivePool,
    envoy: Envoy,
    model: String,
    _server: Server,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn rig(pods: usize) -> Rig {
    rig_with(pods, SchedulerConfig::default()).await
}

async fn rig_with(pods: usize, scheduler: SchedulerConfig) -> Rig {
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get(PROFILE).unwrap().clone();
    let model = profile.model.to_string();
    let spec = FleetSpec {
        seed: 7,
        pods: (0..pods)
            .map(|i| PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm))
            .collect(),
    }
    .finish()
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let pool = LivePool::start(
        PoolConfig {
            scheduler,
            scrape: ScraperConfig::default(),
            seed: 11,
        },
        None,
    )
    .unwrap();
    pool.set_endpoints(fleet.pods.iter().map(|p| EndpointMeta {
        namespace: "default".into(),
        pod: p.name.clone(),
        addr: p.addr,
        engine: EngineType::Vllm,
        gpu: None,
        labels: BTreeMap::new(),
    }))
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pool.endpoints_info().iter().all(|i| i.metrics.is_some()) {
        assert!(tokio::time::Instant::now() < deadline, "pods never scraped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let server = serve(EndpointPicker::new(
        PickerConfig::default(),
        pool.clone(),
        Telemetry::default(),
    ))
    .await;
    let envoy = Envoy::connect(server.addr).await;
    Rig {
        fleet,
        pool,
        envoy,
        model,
        _server: server,
        _stop: stop,
    }
}

fn chat(model: &str, system: &str, user: &str, max_tokens: u32, stream: bool) -> Vec<u8> {
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    });
    // vLLM refuses stream options on a request that is not streamed.
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    serde_json::to_vec(&body).unwrap()
}

async fn wait_inflight(pool: &LivePool, n: usize) {
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    while pool.inflight() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "in-flight stuck at {}",
            pool.inflight()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_complete_and_release_in_flight() {
    let rig = rig(2).await;
    for stream in [false, true] {
        let body = chat(&rig.model, "be brief", "say hello", 8, stream);
        let f = forward(&rig.envoy, "/v1/chat/completions", &body, 13).await;
        assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
        assert!(
            rig.fleet
                .pods
                .iter()
                .any(|p| p.addr == f.endpoint && p.name == f.pod)
        );
        assert_eq!(
            f.destination.split(',').count(),
            2,
            "first choice and fallback"
        );
        let text = String::from_utf8(f.body).unwrap();
        assert!(text.contains("\"usage\""), "{text}");
        wait_inflight(&rig.pool, 0).await;
    }
    // A learned rate after streamed completions: the response path fed the scheduler.
    assert!(
        rig.pool
            .endpoints_info()
            .iter()
            .any(|i| i.picked > 0 && i.inflight == 0)
    );
}

/// Envoy forwards to the picker's choice and passes the model server's response headers back:
/// with `outlierDetection`, a pod whose answers are 503 `consecutive5xx` times in a row is out
/// of every later routing answer (first choice and fallbacks), while its metrics stay fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_ejects_a_pod_whose_answers_keep_failing() {
    use infergate_scheduler::outlier::OutlierDetection;
    let rig = rig_with(
        3,
        SchedulerConfig {
            outlier_detection: Some(OutlierDetection {
                consecutive_5xx: 2,
                base_ejection_ms: 60_000,
                max_ejection_ms: 60_000,
                max_ejection_percent: 50,
                failure_percentage: None,
            }),
            ..SchedulerConfig::default()
        },
    )
    .await;
    let body = chat(&rig.model, "x", "y", 8, false);
    // One exchange: the routing answer's endpoints; the first of them answers 503 when it is
    // `bad` (every first one when `bad` is empty), else 200.
    let exchange = |bad: String| {
        let (envoy, body) = (&rig.envoy, &body);
        async move {
            let mut ex = envoy.open().await;
            ex.send(request_headers("/v1/chat/completions", &[], false))
                .await;
            ex.send(request_body(body, true)).await;
            let dest = headers_answer(&ex.next().await)
                .header(infergate_extproc::wire::DESTINATION_HEADER)
                .unwrap()
                .to_owned();
            ex.streamed_body(true, usize::MAX).await;
            let first = dest.split(',').next().unwrap().to_owned();
            let fail = bad.is_empty() || first == bad;
            let status = if fail { 503 } else { 200 };
            ex.send(response_headers(status, "application/json", true))
                .await;
            ex.next().await;
            (dest, first, fail)
        }
    };
    let (_, bad, _) = exchange(String::new()).await;
    let (mut failed, mut exchanges) = (1, 1);
    for _ in 0..100 {
        if failed == 2 {
            break;
        }
        failed += usize::from(exchange(bad.clone()).await.2);
        exchanges += 1;
    }
    wait_inflight(&rig.pool, 0).await;
    assert_eq!(failed, 2, "{bad} was never first again");
    for _ in 0..20 {
        let (dest, _, failed) = exchange(bad.clone()).await;
        assert!(
            !failed && !dest.contains(&bad),
            "{dest} names the ejected {bad}"
        );
    }
    // Its metrics are fine all along: the scraper still has it fresh.
    let info = rig.pool.endpoints_info();
    let pod = info
        .iter()
        .find(|i| i.meta.addr.to_string() == bad)
        .unwrap();
    assert!(pod.metrics.is_some());
    assert!(pod.ejected_until.is_some());
    // Each answer Envoy passed is counted on the endpoint that gave it.
    assert_eq!((pod.answers.failure, pod.answers.success), (2, 0));
    let successes: u64 = info.iter().map(|i| i.answers.success).sum();
    assert_eq!(successes, exchanges + 20 - 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_mid_response_releases_in_flight_on_the_live_pool() {
    let rig = rig(1).await;
    let body = chat(&rig.model, "x", "y", 64, true);
    let mut ex = rig.envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(&body, true)).await;
    headers_answer(&ex.next().await);
    ex.streamed_body(true, usize::MAX).await;
    assert_eq!(rig.pool.inflight(), 1);
    ex.send(response_headers(200, "text/event-stream", false))
        .await;
    ex.next().await;
    drop(ex); // Envoy resets the stream (client went away)
    wait_inflight(&rig.pool, 0).await;

    // A reset mid-body never picked anything.
    let mut ex = rig.envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(&body[..10], false)).await;
    drop(ex);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.pool.inflight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_load() {
    let rig = rig(3).await;
    // Load pod-0 directly (as other gateways would): long generations keep its queue busy.
    let busy = rig.fleet.pods[0].addr;
    let model = rig.model.clone();
    let mut load = Vec::new();
    for i in 0..48 {
        let body = chat(&model, "load", &format!("background job {i}"), 2_000, false);
        load.push(tokio::spawn(async move {
            // Its answer does not matter (the load is aborted at the end).
            let _ =
                infergate_testkit::try_post(busy, "/v1/chat/completions", "application/json", body)
                    .await;
        }));
    }
    // Wait until the scraper has seen the load on pod-0.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = rig.pool.endpoints_info();
        let running = info
            .iter()
            .find(|i| i.meta.addr == busy)
            .and_then(|i| i.metrics.as_ref())
            .map_or(0, |m| m.running + m.waiting);
        if running >= 40 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "load never visible");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut on_busy = 0;
    for i in 0..20 {
        let body = chat(&rig.model, "q", &format!("question {i}"), 4, false);
        let f = forward(&rig.envoy, "/v1/chat/completions", &body, 4096).await;
        assert_eq!(f.status, 200);
        if f.endpoint == busy {
            on_busy += 1;
        }
    }
    assert_eq!(on_busy, 0, "requests avoid the loaded pod");
    for l in load {
        l.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_prefix() {
    let rig = rig(3).await;
    // Three conversations with long distinct system prompts; each follow-up must land where its
    // conversation's prefix is cached.
    let systems: Vec<String> = (0..3)
        .map(|c| format!("conversation {c}: ") + &"context sentence number. ".repeat(400))
        .collect();
    let mut home = Vec::new();
    for s in &systems {
        let f = forward(
            &rig.envoy,
            "/v1/chat/completions",
            &chat(&rig.model, s, "first", 4, false),
            16_384,
        )
        .await;
        home.push(f.endpoint);
    }
    for round in 0..4 {
        for (c, s) in systems.iter().enumerate() {
            let body = chat(&rig.model, s, &format!("follow-up {round}"), 4, false);
            let f = forward(&rig.envoy, "/v1/chat/completions", &body, 16_384).await;
            assert_eq!(
                f.endpoint, home[c],
                "conversation {c} round {round} left its cached pod"
            );
        }
    }
}

/// Emulated vLLM pods and a whole picker process (`run_picker`, as `infergate picker` runs it:
/// live pool, ext_proc, health and metrics ports), pool `llama-pool`, static membership.
struct Process {
    fleet: Option<ServedFleet>,
    fleet_stop: Option<tokio::sync::oneshot::Sender<()>>,
    envoy: Envoy,
    grpc: SocketAddr,
    metrics: SocketAddr,
    model: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Process {
    async fn start(pods: usize, picker: PickerConfig) -> Process {
        Process::start_with(pods, picker, None).await
    }

    /// As [`Process::start`], with TLS on the ext_proc port when `tls` is set (Envoy then
    /// connects over TLS, accepting any certificate, as Envoy AI Gateway does).
    async fn start_with(pods: usize, picker: PickerConfig, tls: Option<ServerTls>) -> Process {
        let over_tls = tls.is_some();
        let catalog = Catalog::builtin().unwrap();
        let profile = catalog.get(PROFILE).unwrap().clone();
        let model = profile.model.to_string();
        let spec = FleetSpec {
            seed: 7,
            pods: (0..pods)
                .map(|i| PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm))
                .collect(),
        }
        .finish()
        .unwrap();
        let (fleet_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let fleet = serve_fleet(&spec, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
        let listeners = PickerListeners {
            grpc: bind().await,
            health: bind().await,
            metrics: bind().await,
            tls,
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
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(run_picker(
            listeners,
            PickerConfig {
                pool_name: "llama-pool".into(),
                ..picker
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
        let envoy = if over_tls {
            Envoy::connect_tls(grpc).await
        } else {
            Envoy::connect(grpc).await
        };
        let p = Process {
            grpc,
            fleet: Some(fleet),
            fleet_stop: Some(fleet_stop),
            envoy,
            metrics,
            model,
            _stop: stop,
        };
        for i in 0..pods {
            p.wait_metric("infergate_pod_stale", &format!("pod-{i}"), 0.0)
                .await;
        }
        p
    }

    fn pod(&self, name: &str) -> SocketAddr {
        let fleet = self.fleet.as_ref().unwrap();
        fleet.pods.iter().find(|p| p.name == name).unwrap().addr
    }

    fn set_metrics(&self, name: &str, metrics: MetricsFault) {
        let h = self.fleet.as_ref().unwrap().handle(name).unwrap();
        h.set_faults(Faults {
            metrics,
            ..h.faults()
        });
    }

    async fn scrape(&self) -> String {
        http_get(self.metrics, "/metrics").await
    }

    async fn wait_metric(&self, family: &str, name: &str, value: f64) {
        let labels = [("pool", "llama-pool"), ("name", &format!("default/{name}"))];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.scrape().await;
            if metric(&m, family, &labels) == Some(value) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{family} of {name} never {value}\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Routes one chat request (not forwarded) and returns the picker's answer; the stream is
    /// reset when this returns.
    async fn route(
        &self,
        i: usize,
        extra_headers: &[(&str, &str)],
    ) -> envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse {
        self.open_route(i, extra_headers).await.0
    }

    /// As [`Process::route`], with the stream kept open.
    async fn open_route(
        &self,
        i: usize,
        extra_headers: &[(&str, &str)],
    ) -> (
        envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse,
        Exchange,
    ) {
        let body = chat(&self.model, "be brief", &format!("question {i}"), 4, false);
        let mut ex = self.envoy.open().await;
        ex.send(request_headers(
            "/v1/chat/completions",
            extra_headers,
            false,
        ))
        .await;
        ex.send(request_body(&body, true)).await;
        (ex.next().await, ex)
    }
}

/// A plain HTTP/1.1 GET; the body as text.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    infergate_testkit::get(addr, path).await.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pod_metrics_on_the_picker_match_the_pods_own_pages() {
    let p = Process::start(2, PickerConfig::default()).await;
    let busy = p.pod("pod-0");
    let model = p.model.clone();
    let mut load = Vec::new();
    for i in 0..300 {
        let body = chat(&model, "load", &format!("background job {i}"), 4_000, false);
        load.push(tokio::spawn(async move {
            // Its answer does not matter (the load is aborted at the end).
            let _ =
                infergate_testkit::try_post(busy, "/v1/chat/completions", "application/json", body)
                    .await;
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = http_get(busy, "/metrics").await;
        if metric(&page, "vllm:num_requests_running", &[]).unwrap_or(0.0) > 0.0
            && metric(&page, "vllm:num_requests_waiting", &[]).unwrap_or(0.0) > 0.0
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "load never visible\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Freeze the page: the picker's copy and ours are then the same page.
    p.set_metrics("pod-0", MetricsFault::Frozen);
    let page = http_get(busy, "/metrics").await;
    let waiting = metric(&page, "vllm:num_requests_waiting", &[]).unwrap();
    let running = metric(&page, "vllm:num_requests_running", &[]).unwrap();
    let kv = metric(&page, "vllm:kv_cache_usage_perc", &[]).unwrap();
    let pod = busy.to_string();
    let labels = [
        ("pool", "llama-pool"),
        ("pod", pod.as_str()),
        ("name", "default/pod-0"),
    ];
    // The picker's copy is the frozen page once all three values match: a page it read just
    // before the freeze may already show the same waiting count (the load is all queued) with
    // another KV usage, so matching one value says nothing of which page it holds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = p.scrape().await;
        if metric(&m, "infergate_pod_waiting_requests", &labels) == Some(waiting)
            && metric(&m, "infergate_pod_running_requests", &labels) == Some(running)
            && metric(&m, "infergate_pod_kv_cache_usage_ratio", &labels) == Some(kv)
        {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the picker never showed the frozen page (waiting {waiting}, running {running}, kv {kv})\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        metric(&m, "infergate_pod_inflight_requests", &labels),
        Some(0.0),
        "{m}"
    );
    assert_eq!(metric(&m, "infergate_pod_stale", &labels), Some(0.0), "{m}");
    // The pool's own series carry the pool label too.
    assert_eq!(
        metric(&m, "infergate_pool_endpoints", &[("pool", "llama-pool")]),
        Some(2.0),
        "{m}"
    );
    // A routed request is in flight on its pod until the stream ends.
    let (answer, open) = p.open_route(0, &[]).await;
    let dest = headers_answer(&answer)
        .header(infergate_extproc::wire::DESTINATION_HEADER)
        .unwrap()
        .to_owned();
    let first = dest.split(',').next().unwrap().to_owned();
    let m = p.scrape().await;
    assert_eq!(
        metric(
            &m,
            "infergate_pod_inflight_requests",
            &[("pod", first.as_str())]
        ),
        Some(1.0),
        "{m}"
    );
    drop(open);
    for l in load {
        l.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pod_is_excluded_and_readmitted_by_the_picker() {
    let p = Process::start(2, PickerConfig::default()).await;
    let stale = p.pod("pod-1").to_string();
    p.set_metrics("pod-1", MetricsFault::Missing);
    p.wait_metric("infergate_pod_stale", "pod-1", 1.0).await;
    for i in 0..20 {
        let answer = p.route(i, &[]).await;
        let dest = headers_answer(&answer)
            .header(infergate_extproc::wire::DESTINATION_HEADER)
            .unwrap()
            .to_owned();
        assert!(!dest.contains(&stale), "{dest} names the stale pod");
    }
    p.set_metrics("pod-1", MetricsFault::Normal);
    p.wait_metric("infergate_pod_stale", "pod-1", 0.0).await;
    // Readmitted: with two pods and fallbacks, every answer names both again.
    let answer = p.route(100, &[]).await;
    let dest = headers_answer(&answer)
        .header(infergate_extproc::wire::DESTINATION_HEADER)
        .unwrap()
        .to_owned();
    assert!(dest.contains(&stale), "{dest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pod_dead_is_503_with_retry_after_from_the_picker() {
    let mut p = Process::start(2, PickerConfig::default()).await;
    headers_answer(&p.route(0, &[]).await);
    p.fleet_stop.take().unwrap().send(()).unwrap();
    p.fleet.take().unwrap().wait().await;
    for name in ["pod-0", "pod-1"] {
        p.wait_metric("infergate_pod_stale", name, 1.0).await;
    }
    let (status, headers, json) = immediate_parts(&p.route(1, &[]).await);
    assert_eq!(status, 503);
    assert_eq!(headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(json["error"]["code"], "no_fresh_endpoints", "{json}");
    let m = p.scrape().await;
    assert_eq!(
        metric(
            &m,
            "infergate_extproc_rejections_total",
            &[("reason", "no_fresh_endpoints")]
        ),
        Some(1.0),
        "{m}"
    );
}

/// The value of `key` set by an answer's header mutation, if any.
fn set_header_value(
    a: &envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse,
    key: &str,
) -> Option<String> {
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
    let mutation = match a.response.as_ref()? {
        Response::ResponseHeaders(h) => h.response.as_ref()?.header_mutation.as_ref()?,
        Response::ImmediateResponse(i) => i.headers.as_ref()?,
        _ => return None,
    };
    mutation
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == key)
        .map(|h| String::from_utf8_lossy(infergate_extproc::wire::header_value(h)).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_explains_a_decision_only_when_enabled_and_asked() {
    let ask = [("x-infergate-explain", "1")];
    // Off by default: asking changes nothing on the response path.
    let off = Process::start(2, PickerConfig::default()).await;
    let (answer, mut ex) = off.open_route(0, &ask).await;
    headers_answer(&answer);
    ex.streamed_body(true, usize::MAX).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    drop(ex);
    drop(off);

    let mut on = Process::start(
        2,
        PickerConfig {
            explain_header: true,
            ..PickerConfig::default()
        },
    )
    .await;
    // On but not asked: nothing.
    let (_, mut ex) = on.open_route(1, &[]).await;
    ex.streamed_body(true, usize::MAX).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    drop(ex);
    // Asked: the response headers get the decision, naming the chosen pod.
    let (answer, mut ex) = on.open_route(2, &ask).await;
    let dest = headers_answer(&answer)
        .header(infergate_extproc::wire::DESTINATION_HEADER)
        .unwrap()
        .to_owned();
    let first = dest.split(',').next().unwrap().to_owned();
    ex.streamed_body(true, usize::MAX).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    let explained =
        set_header_value(&ex.next().await, "x-infergate-explain").expect("no explanation");
    assert!(
        explained.starts_with(&format!("chosen={dest}")),
        "{explained}"
    );
    let name = if first == on.pod("pod-0").to_string() {
        "default/pod-0"
    } else {
        "default/pod-1"
    };
    assert!(
        explained.contains(&format!("| {name} {first} total=")),
        "{explained}"
    );
    drop(ex);
    // Every page missing while the pods still answer: the default preset routes fail-open
    // (`staleMetrics`), and the decision says so. (Before fail-open this was the rejection
    // case; it moved to dead pods below.)
    on.set_metrics("pod-0", MetricsFault::Missing);
    on.set_metrics("pod-1", MetricsFault::Missing);
    on.wait_metric("infergate_pod_stale", "pod-0", 1.0).await;
    on.wait_metric("infergate_pod_stale", "pod-1", 1.0).await;
    let (answer, mut ex) = on.open_route(3, &ask).await;
    headers_answer(&answer);
    ex.streamed_body(true, usize::MAX).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    let explained =
        set_header_value(&ex.next().await, "x-infergate-explain").expect("no explanation");
    assert!(explained.contains(" fail_open"), "{explained}");
    drop(ex);
    // A rejection carries it on the immediate response: every pod gone, nothing answers.
    on.fleet_stop.take().unwrap().send(()).unwrap();
    on.fleet.take().unwrap().wait().await;
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    let answer = loop {
        let answer = on.route(4, &ask).await;
        if set_header_value(&answer, "x-infergate-explain").is_some() {
            break answer;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(immediate_parts(&answer).0, 503);
    let explained = set_header_value(&answer, "x-infergate-explain").expect("no explanation");
    assert!(
        explained.starts_with("rejected=no_fresh_endpoints"),
        "{explained}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_times_first_token_and_duration_per_pool() {
    let p = Process::start(1, PickerConfig::default()).await;
    let body = chat(&p.model, "be brief", "say hello", 8, true);
    let f = forward(&p.envoy, "/v1/chat/completions", &body, 4096).await;
    assert_eq!(f.status, 200);
    let labels = [("pool", "llama-pool")];
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    let m = loop {
        let m = p.scrape().await;
        if metric(
            &m,
            "infergate_extproc_request_duration_seconds_count",
            &labels,
        ) == Some(1.0)
        {
            break m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        metric(&m, "infergate_extproc_ttft_seconds_count", &labels),
        Some(1.0),
        "{m}"
    );
    let ttft = metric(&m, "infergate_extproc_ttft_seconds_sum", &labels).unwrap();
    let total = metric(
        &m,
        "infergate_extproc_request_duration_seconds_sum",
        &labels,
    )
    .unwrap();
    assert!(ttft > 0.0 && ttft <= total, "ttft {ttft} total {total}");
    // A stream reset after routing ends the request too: its duration is counted.
    drop(p.open_route(1, &[]).await);
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    while metric(
        &p.scrape().await,
        "infergate_extproc_request_duration_seconds_count",
        &labels,
    ) != Some(2.0)
    {
        assert!(tokio::time::Instant::now() < deadline, "reset not timed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// TLS on the picker's ext_proc port, as Envoy AI Gateway connects to it (TLS, any certificate
/// accepted, ALPN h2): a request is routed over TLS; a certificate replaced on disk is served
/// to the next connection, which routes too; a plaintext HTTP/2 client is closed at the
/// handshake and counted, and the TLS connection keeps routing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_routes_over_tls_and_serves_a_replaced_certificate() {
    use infergate_pool::tls::{ALPN_GRPC, Certificate, ServerTlsOptions};
    use infergate_testkit::tls::{TestCa, peer_certificate};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("picker ca");
    let first = ca.issue(&["localhost"]);
    let (cert, key) = first.write(dir.path());
    let options = ServerTlsOptions {
        reload_interval: Duration::from_millis(50),
        ..ServerTlsOptions::new(infergate_pool::tls::port::EXT_PROC, &ALPN_GRPC)
    };
    let tls = ServerTls::new(&Certificate::Files { cert, key }, &options).unwrap();
    let p = Process::start_with(2, PickerConfig::default(), Some(tls)).await;
    let dest = headers_answer(&p.route(0, &[]).await)
        .header(infergate_extproc::wire::DESTINATION_HEADER)
        .unwrap()
        .to_owned();
    assert!(dest.starts_with("127.0.0.1:"), "{dest}");
    assert_eq!(peer_certificate(p.grpc, "localhost").await, first.der);

    // A new certificate from another CA, written over the old files.
    let second = TestCa::new("rotated ca").issue(&["localhost"]);
    second.write(dir.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while peer_certificate(p.grpc, "localhost").await != second.der {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new connection (with the new certificate) routes; so does the old one.
    let fresh = Envoy::connect_tls(p.grpc).await;
    let mut ex = fresh.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(&chat(&p.model, "s", "u", 4, false), true))
        .await;
    assert!(
        headers_answer(&ex.next().await)
            .header(infergate_extproc::wire::DESTINATION_HEADER)
            .is_some()
    );
    headers_answer(&p.route(1, &[]).await);

    // Plaintext HTTP/2 (an h2c preface) to the TLS port: closed at once, nothing served.
    let mut plain = tokio::net::TcpStream::connect(p.grpc).await.unwrap();
    plain
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got)).await;
    assert!(closed.is_ok(), "the plaintext connection was not closed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = p.scrape().await;
        if metric(
            &m,
            "infergate_tls_handshake_failures_total",
            &[("reason", "error")],
        ) == Some(1.0)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    headers_answer(&p.route(2, &[]).await);
}

/// The body-based router with `--tls-self-signed` (`ext_proc_tls`, as `infergate bbr` builds it):
/// routes a LoRA request over TLS from a client that accepts any certificate; a plaintext h2c
/// client is closed and counted on its metrics port. The port counts the routed request by its
/// served name and base model (every served name's series there from the start, at 0), and the
/// unknown model's 404 as a rejection; none of the picker's families it would never fill is
/// exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bbr_routes_over_tls_with_a_self_signed_certificate() {
    use infergate_extproc::bbr::{BbrConfig, ModelsFile};
    use infergate_extproc::run::{Certificate, ext_proc_tls, run_bbr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, metrics_addr) = (grpc.local_addr().unwrap(), metrics.local_addr().unwrap());
    let tls = ext_proc_tls(
        Some(Certificate::SelfSigned {
            names: vec!["localhost".into()],
        }),
        None,
    )
    .unwrap();
    let router = ModelsFile::parse("llama-3-8b: [sql-lora]\n")
        .unwrap()
        .router()
        .unwrap();
    let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(run_bbr(
        grpc,
        tls,
        None,
        Some(metrics),
        None,
        BbrConfig::default(),
        router,
        async move {
            let _ = rx.await;
        },
    ));
    let envoy = Envoy::connect_tls(addr).await;
    let body = br#"{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}"#;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(body, true)).await;
    let answer = headers_answer(&ex.next().await);
    assert_eq!(
        answer.header(infergate_extproc::wire::MODEL_HEADER),
        Some("sql-lora")
    );
    assert_eq!(
        answer.header(infergate_extproc::wire::BASE_MODEL_HEADER),
        Some("llama-3-8b")
    );
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(
        br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#,
        true,
    ))
    .await;
    assert_eq!(immediate_parts(&ex.next().await).0, 404);
    let m = http_get(metrics_addr, "/metrics").await;
    let routed = |model: &str| {
        metric(
            &m,
            "infergate_extproc_bbr_routed_total",
            &[("model", model), ("base_model", "llama-3-8b")],
        )
    };
    assert_eq!(routed("sql-lora"), Some(1.0), "{m}");
    assert_eq!(routed("llama-3-8b"), Some(0.0), "{m}");
    assert_eq!(
        metric(
            &m,
            "infergate_extproc_bbr_rejections_total",
            &[("reason", "unknown_model")]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        m.contains("infergate_extproc_bbr_route_duration_seconds_count 1"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE infergate_extproc_bbr_rejections counter"),
        "{m}"
    );
    for picker_only in ["requests", "rejections", "tokens", "pods", "ttft_seconds"] {
        assert!(
            !m.contains(&format!("# TYPE infergate_extproc_{picker_only} ")),
            "{picker_only}: {m}"
        );
    }

    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got)).await;
    assert!(closed.is_ok(), "the plaintext connection was not closed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = http_get(metrics_addr, "/metrics").await;
        if metric(
            &m,
            "infergate_tls_handshake_failures_total",
            &[("reason", "error")],
        ) == Some(1.0)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client configuration that accepts any server certificate (as Envoy AI Gateway's connection
/// to an endpoint picker does) and presents `leaf` when asked for a client certificate.
fn accept_any_presenting(
    leaf: &infergate_testkit::tls::Leaf,
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::sign::{CertifiedKey, SingleCertAndKey};
    let mut config =
        std::sync::Arc::unwrap_or_clone(infergate_testkit::tls::accept_any_config(&[b"h2"]));
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let provider = rustls::crypto::ring::default_provider();
    let pair = CertifiedKey::from_der(vec![leaf.der.clone()], key, &provider).unwrap();
    config.client_auth_cert_resolver = std::sync::Arc::new(SingleCertAndKey::from(pair));
    std::sync::Arc::new(config)
}

/// `--tls-self-signed` with `--tls-client-ca-file` (`ext_proc_tls` of a generated certificate
/// and a bundle, as `infergate bbr` builds it): a client that verifies nothing of the server but
/// presents a certificate of the bundle's CA has its request routed; the same client presenting
/// none is refused at the handshake. A bundle without TLS is refused, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_port_with_a_client_ca_admits_only_clients_of_that_ca() {
    use infergate_extproc::bbr::{BbrConfig, ModelsFile};
    use infergate_extproc::run::{Certificate, ext_proc_tls, run_bbr};
    use infergate_testkit::tls::{TestCa, accept_any_config, connect};
    use tokio::io::AsyncReadExt;

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("envoy clients ca");
    let bundle = ca.write_ca(dir.path());
    let err = ext_proc_tls(None, Some(&bundle)).unwrap_err();
    assert!(
        matches!(err, infergate_extproc::Error::ClientCaWithoutTls { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&bundle.display().to_string()),
        "{err}"
    );

    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let tls = ext_proc_tls(
        Some(Certificate::SelfSigned {
            names: vec!["localhost".into()],
        }),
        Some(&bundle),
    )
    .unwrap();
    let router = ModelsFile::parse("llama-3-8b: [sql-lora]\n")
        .unwrap()
        .router()
        .unwrap();
    let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(run_bbr(
        grpc,
        tls,
        None,
        None,
        None,
        BbrConfig::default(),
        router,
        async move {
            let _ = rx.await;
        },
    ));

    let leaf = ca.issue(&["envoy"]);
    let stream = connect(addr, "localhost", accept_any_presenting(&leaf))
        .await
        .unwrap();
    let envoy = Envoy::over(stream, format!("https://{addr}")).await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(
        br#"{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}"#,
        true,
    ))
    .await;
    let answer = headers_answer(&ex.next().await);
    assert_eq!(
        answer.header(infergate_extproc::wire::BASE_MODEL_HEADER),
        Some("llama-3-8b")
    );

    // Without a certificate: the handshake ends on the client's side (TLS 1.3), and its first
    // read gets the server's alert.
    let mut refused = connect(addr, "localhost", accept_any_config(&[b"h2"]))
        .await
        .unwrap();
    let mut buf = [0_u8; 9];
    let err = tokio::time::timeout(Duration::from_secs(10), refused.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("CertificateRequired"), "{err}");
}
