//! Flow control at the gateway (`flowControl:`, `tenancy:`), end to end on 127.0.0.1 over
//! scripted model servers whose `/metrics` page says how many requests wait there: a pod
//! reporting 1,000 waiting requests is saturated, one reporting 0 has headroom.
//!
//! Real clock (loopback IO); tests wait on observable effects (gauges, answers) with deadlines.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig, WorkerListeners, serve_workers};
use tokio::sync::oneshot;
use upstream::{Behaviour, Upstream, get, open_stream, post, send};

const REASON: &str = "x-llm-d-request-dropped-reason";
const FAIRNESS: &str = "x-llm-d-inference-fairness-id";
const OBJECTIVE: &str = "x-llm-d-inference-objective";
const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const KEY_A: &str = "sk-team-a-0123456789";

struct Running {
    gw: Gateway,
    _stop: oneshot::Sender<()>,
}

impl Running {
    fn addr(&self) -> SocketAddr {
        self.gw.http_addr()
    }

    async fn metrics(&self) -> String {
        get(self.gw.admin_addr().unwrap(), "/metrics").await.1
    }

    /// Waits until the metrics page has `line`.
    async fn until_metric(&self, line: &str) {
        let admin = self.gw.admin_addr().unwrap();
        eventually(line, || async move {
            get(admin, "/metrics").await.1.contains(line)
        })
        .await;
    }
}

fn sha256_hex(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The configuration of a gateway whose model `m` is served by `endpoints`, with `extra` YAML
/// at the top level.
fn config(extra: &str, endpoints: &[SocketAddr]) -> GatewayConfig {
    let eps: Vec<String> = endpoints.iter().map(|a| a.to_string()).collect();
    let auth = if extra.contains("auth:") {
        ""
    } else {
        "auth: none\n"
    };
    let yaml = format!(
        "{auth}{extra}scrape: {{ intervalMs: 20 }}\ntimeouts: {{ connectMs: 500 }}\nmodels:\n  - name: m\n    scheduler: {{ preset: infergate }}\n    endpoints: [{}]\n",
        eps.join(", ")
    );
    GatewayConfig::from_yaml(&yaml).unwrap()
}

/// A gateway whose model `m` is served by `endpoints`, with `extra` YAML at the top level.
async fn start(extra: &str, endpoints: &[SocketAddr]) -> Running {
    let config = config(extra, endpoints);
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, Some(local), 2).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let gw = Running { gw, _stop: tx };
    if !endpoints.is_empty() {
        let admin = gw.gw.admin_addr().unwrap();
        eventually("readiness", || async move {
            get(admin, "/readyz").await.0 == 200
        })
        .await;
    }
    gw
}

/// A pod whose page says it is saturated (1,000 waiting).
async fn saturated_pod() -> Upstream {
    let up = Upstream::start(Behaviour::Ok).await;
    up.waiting.store(1_000, Ordering::SeqCst);
    up
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

fn queue_gauge(priority: &str, n: u64) -> String {
    format!(r#"infergate_flow_queue_requests{{pool="m",priority="{priority}"}} {n}"#)
}

fn outcome(priority: &str, tenant: &str, outcome: &str, n: u64) -> String {
    format!(
        r#"infergate_flow_requests_total{{pool="m",priority="{priority}",tenant="{tenant}",outcome="{outcome}"}} {n}"#
    )
}

/// Sends a chat request of `priority` (the `x-priority` header) and waits for the answer.
async fn chat_as(
    addr: SocketAddr,
    priority: &'static str,
) -> (http::StatusCode, http::HeaderMap, bytes::Bytes) {
    send(
        addr,
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-priority", priority)],
    )
    .await
}

/// Sends a chat request in the background.
fn spawn_chat(addr: SocketAddr, headers: &[(&'static str, &'static str)]) -> Answer {
    let headers = headers.to_vec();
    tokio::spawn(async move { send(addr, "POST", "/v1/chat/completions", CHAT, &headers).await })
}

#[tokio::test]
async fn a_request_waits_while_the_pod_is_saturated_and_is_served_once_it_has_headroom() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 20000 }\n",
        &[up.addr],
    )
    .await;
    let waiting = spawn_chat(gw.addr(), &[]);
    gw.until_metric(&queue_gauge("standard", 1)).await;
    assert_eq!(up.requests(), 0, "a queued request reached the pod");
    // The heartbeat the global router polls counts it: it said the pool had nothing queued.
    let heartbeat = json(
        get(gw.gw.admin_addr().unwrap(), "/heartbeat")
            .await
            .1
            .as_bytes(),
    );
    assert_eq!(heartbeat["models"][0]["flowQueue"], 1, "{heartbeat}");
    // The next page says the pod has room: the page wakes the queue.
    up.waiting.store(0, Ordering::SeqCst);
    let (status, _, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(up.requests(), 1);
    let m = gw.metrics().await;
    assert!(m.contains(&queue_gauge("standard", 0)), "{m}");
    assert!(
        m.contains(&outcome("standard", "default", "dispatched", 1)),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_flow_queue_wait_seconds_count{pool="m",priority="standard"} 1"#),
        "{m}"
    );
}

#[tokio::test]
async fn a_request_past_its_ttl_gets_429_rejected_ttl_expired_with_retry_after() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 300 }\n",
        &[up.addr],
    )
    .await;
    let started = std::time::Instant::now();
    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    let waited = started.elapsed();
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "rejected-ttl-expired");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");
    let v = json(&body);
    assert_eq!(v["error"]["code"], "queue_ttl_expired");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert_eq!(up.requests(), 0);
    let m = gw.metrics().await;
    assert!(
        m.contains(&outcome("standard", "default", "rejected-ttl-expired", 1)),
        "{m}"
    );
    assert!(m.contains(&queue_gauge("standard", 0)), "{m}");
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="queue_ttl_expired"} 1"#),
        "{m}"
    );
}

#[tokio::test]
async fn a_full_band_answers_429_rejected_saturated_and_the_queued_one_is_still_served() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 20000, bands: { standard: { maxRequests: 1 } } }\n",
        &[up.addr],
    )
    .await;
    let first = spawn_chat(gw.addr(), &[]);
    gw.until_metric(&queue_gauge("standard", 1)).await;
    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "rejected-saturated");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(json(&body)["error"]["code"], "queue_full");
    let message = json(&body)["error"]["message"].to_string();
    assert!(
        message.contains("the queue of its standard band is full"),
        "{message}"
    );
    up.waiting.store(0, Ordering::SeqCst);
    assert_eq!(first.await.unwrap().0, 200);
    let m = gw.metrics().await;
    assert!(
        m.contains(&outcome("standard", "default", "rejected-saturated", 1)),
        "{m}"
    );
    assert!(
        m.contains(&outcome("standard", "default", "dispatched", 1)),
        "{m}"
    );
}

#[tokio::test]
async fn with_no_endpoint_the_answer_is_503_rejected_no_endpoints() {
    let gw = start("flowControl: { enabled: true }\n", &[]).await;
    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "rejected-no-endpoints");
    assert!(!headers.contains_key("retry-after"));
    assert_eq!(json(&body)["error"]["code"], "queue_no_endpoints");
}

#[tokio::test]
async fn a_queued_sheddable_request_is_evicted_for_a_critical_one_with_429_evicted_priority() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 20000, maxRequests: 1 }\ntenancy: { priorityHeader: x-priority }\n",
        &[up.addr],
    )
    .await;
    let sheddable = spawn_chat(gw.addr(), &[("x-priority", "sheddable")]);
    gw.until_metric(&queue_gauge("sheddable", 1)).await;
    let critical = spawn_chat(gw.addr(), &[("x-priority", "critical")]);
    let (status, headers, body) = sheddable.await.unwrap();
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "evicted-priority");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(json(&body)["error"]["code"], "queue_evicted");
    gw.until_metric(&queue_gauge("critical", 1)).await;
    up.waiting.store(0, Ordering::SeqCst);
    assert_eq!(critical.await.unwrap().0, 200);
    let m = gw.metrics().await;
    assert!(
        m.contains(&outcome("sheddable", "default", "evicted-priority", 1)),
        "{m}"
    );
    assert!(
        m.contains(&outcome("critical", "default", "dispatched", 1)),
        "{m}"
    );
    assert!(m.contains(&queue_gauge("sheddable", 0)), "{m}");
    assert!(m.contains(&queue_gauge("critical", 0)), "{m}");
}

/// The queue's limit, below the gateway's in-flight limit, is what a flood of Sheddable requests
/// meets: the one past it gets 429 from the queue, and a Critical request still finds an
/// in-flight slot and evicts a Sheddable one instead of being refused 503 at the door.
#[tokio::test]
async fn a_sheddable_flood_fills_the_queue_not_the_in_flight_slots_and_critical_gets_through() {
    let up = saturated_pod().await;
    let gw = start(
        "limits: { maxRequestsInFlight: 3 }\nflowControl: { enabled: true, requestTtlMs: 20000, maxRequests: 2 }\ntenancy: { priorityHeader: x-priority }\n",
        &[up.addr],
    )
    .await;
    let first = spawn_chat(gw.addr(), &[("x-priority", "sheddable")]);
    let second = spawn_chat(gw.addr(), &[("x-priority", "sheddable")]);
    gw.until_metric(&queue_gauge("sheddable", 2)).await;
    let (status, headers, body) = chat_as(gw.addr(), "sheddable").await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "rejected-saturated");
    let critical = spawn_chat(gw.addr(), &[("x-priority", "critical")]);
    gw.until_metric(&queue_gauge("critical", 1)).await;
    let m = gw.metrics().await;
    assert!(m.contains(&queue_gauge("sheddable", 1)), "{m}");
    up.waiting.store(0, Ordering::SeqCst);
    assert_eq!(critical.await.unwrap().0, 200);
    let mut evicted = 0;
    for shed in [first, second] {
        let (status, headers, _) = shed.await.unwrap();
        if status == 429 {
            assert_eq!(headers[REASON], "evicted-priority");
            evicted += 1;
        } else {
            assert_eq!(status, 200);
        }
    }
    assert_eq!(evicted, 1);
    let m = gw.metrics().await;
    assert!(!m.contains(r#"reason="gateway_busy""#), "{m}");
}

/// A request answered by the gateway, as [`spawn_chat`] runs it.
type Answer = tokio::task::JoinHandle<(http::StatusCode, http::HeaderMap, bytes::Bytes)>;

/// Fills a gateway at `maxRequestsInFlight: 3` (model `m`'s pod saturated, `x-priority` the
/// priority header): one slot held by a request whose body is still coming (as a running one
/// would hold it), then two Sheddable requests queued, the first before the second.
async fn fill_the_door_with_sheddables(gw: &Running) -> (tokio::net::TcpStream, Answer, Answer) {
    let slow = infergate_testkit::hold_request_slot(gw.addr()).await;
    gw.until_metric("infergate_gateway_requests_in_flight 1\n")
        .await;
    let first = spawn_chat(gw.addr(), &[("x-priority", "sheddable")]);
    gw.until_metric(&queue_gauge("sheddable", 1)).await;
    let second = spawn_chat(gw.addr(), &[("x-priority", "sheddable")]);
    gw.until_metric(&queue_gauge("sheddable", 2)).await;
    (slow, first, second)
}

/// The door itself full (`limits.maxRequestsInFlight`, queued requests holding slots): a request
/// above Sheddable takes the slot of the newest queued Sheddable one, which is evicted (429
/// `evicted-priority`), instead of 503 `gateway_busy` before its priority was read; a Sheddable
/// one, or any once no Sheddable request is queued, is still turned away at the door.
#[tokio::test]
async fn at_the_in_flight_limit_a_critical_request_takes_the_slot_of_a_queued_sheddable_one() {
    let up = saturated_pod().await;
    let gw = start(
        "limits: { maxRequestsInFlight: 3 }\nflowControl: { enabled: true, requestTtlMs: 20000, maxRequests: 2 }\ntenancy: { priorityHeader: x-priority }\n",
        &[up.addr],
    )
    .await;
    let (slow, first, second) = fill_the_door_with_sheddables(&gw).await;
    let busy = |status: http::StatusCode, body: &[u8]| {
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(body));
        assert_eq!(json(body)["error"]["code"], "gateway_busy");
    };
    let (status, _, body) = chat_as(gw.addr(), "sheddable").await;
    busy(status, &body);

    // A Critical request: the newest Sheddable one (the second) gives up its slot.
    let critical = spawn_chat(gw.addr(), &[("x-priority", "critical")]);
    let (status, headers, _) = second.await.unwrap();
    assert_eq!(status, 429);
    assert_eq!(headers[REASON], "evicted-priority");
    gw.until_metric(&queue_gauge("critical", 1)).await;
    gw.until_metric("infergate_gateway_requests_in_flight_taken_over_total 1\n")
        .await;
    // A Standard one takes the last.
    let standard = spawn_chat(gw.addr(), &[("x-priority", "standard")]);
    let (status, headers, _) = first.await.unwrap();
    assert_eq!(status, 429);
    assert_eq!(headers[REASON], "evicted-priority");
    gw.until_metric(&queue_gauge("standard", 1)).await;
    gw.until_metric(&queue_gauge("sheddable", 0)).await;
    // No Sheddable request left to give a slot: turned away at the door.
    let (status, _, body) = chat_as(gw.addr(), "critical").await;
    busy(status, &body);

    up.waiting.store(0, Ordering::SeqCst);
    assert_eq!(critical.await.unwrap().0, 200);
    assert_eq!(standard.await.unwrap().0, 200);
    drop(slow);
    gw.until_metric("infergate_gateway_requests_in_flight 0\n")
        .await;
    let m = gw.metrics().await;
    assert!(
        m.contains(&outcome("sheddable", "default", "evicted-priority", 2)),
        "{m}"
    );
}

/// A reload that changes `flowControl:` gives the model a new queue, but the requests queued in
/// the old one still wait there holding in-flight slots: the door still reaches them, and a
/// Critical request takes the slot of the newest of them.
#[tokio::test]
async fn after_a_reload_that_replaced_the_queue_a_critical_request_still_takes_a_queued_sheddable_slot()
 {
    let up = saturated_pod().await;
    let door = "limits: { maxRequestsInFlight: 3 }\ntenancy: { priorityHeader: x-priority }\n";
    let gw = start(
        &format!("{door}flowControl: {{ enabled: true, requestTtlMs: 20000, maxRequests: 2 }}\n"),
        &[up.addr],
    )
    .await;
    let (slow, first, second) = fill_the_door_with_sheddables(&gw).await;

    // A new queue (another request TTL); the two Sheddable requests stay in the old one.
    gw.gw
        .handle()
        .reload(config(
            &format!(
                "{door}flowControl: {{ enabled: true, requestTtlMs: 30000, maxRequests: 2 }}\n"
            ),
            &[up.addr],
        ))
        .unwrap();
    let critical = spawn_chat(gw.addr(), &[("x-priority", "critical")]);
    let (status, headers, body) = second.await.unwrap();
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "evicted-priority");
    gw.until_metric("infergate_gateway_requests_in_flight_taken_over_total 1\n")
        .await;

    // The old queue still dispatches: the pod frees up and both queues' requests are served.
    up.waiting.store(0, Ordering::SeqCst);
    assert_eq!(critical.await.unwrap().0, 200);
    assert_eq!(first.await.unwrap().0, 200);
    drop(slow);
    gw.until_metric("infergate_gateway_requests_in_flight 0\n")
        .await;
}

#[tokio::test]
async fn a_client_that_disconnects_leaves_the_queue_at_once() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 20000 }\n",
        &[up.addr],
    )
    .await;
    let waiting = spawn_chat(gw.addr(), &[]);
    gw.until_metric(&queue_gauge("standard", 1)).await;
    // Dropping the client's future closes its connection.
    waiting.abort();
    let _ = waiting.await;
    gw.until_metric(&queue_gauge("standard", 0)).await;
    gw.until_metric(&outcome(
        "standard",
        "default",
        "rejected-context-cancelled",
        1,
    ))
    .await;
    // Nothing was left to send once the pod has room.
    up.waiting.store(0, Ordering::SeqCst);
    let (status, _, _) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert_eq!(up.requests(), 1);
}

#[tokio::test]
async fn the_tenant_is_the_api_key_s_before_the_header_and_reaches_the_pod_as_the_fairness_id() {
    let up = Upstream::start(Behaviour::Ok).await;
    let auth = format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {}, tenant: team-a, models: [m] }}]\nflowControl: {{ enabled: true }}\ntenancy: {{ tenantHeader: x-tenant }}\n",
        sha256_hex(KEY_A)
    );
    let gw = start(&auth, &[up.addr]).await;
    let bearer = format!("Bearer {KEY_A}");
    let (status, _, body) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("authorization", &bearer), ("x-tenant", "team-b")],
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let seen = up.seen.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen[FAIRNESS], "team-a");

    // Without authentication, the configured header names the tenant.
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(
        "flowControl: { enabled: true }\ntenancy: { tenantHeader: x-tenant }\n",
        &[up.addr],
    )
    .await;
    let (status, _, _) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-tenant", "team-b")],
    )
    .await;
    assert_eq!(status, 200);
    let seen = up.seen.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen[FAIRNESS], "team-b");
    // Neither: the default tenant.
    let (status, _, _) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    let seen = up.seen.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen[FAIRNESS], "default");
}

#[tokio::test]
async fn fairness_headers_a_client_sends_are_stripped() {
    let spoof = [(FAIRNESS, "spoofed"), (OBJECTIVE, "premium")];
    // Flow control on: the pod sees the gateway's tenant, never the client's.
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start("flowControl: { enabled: true }\n", &[up.addr]).await;
    let (status, _, _) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &spoof).await;
    assert_eq!(status, 200);
    let seen = up.seen.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen[FAIRNESS], "default");
    assert!(!seen.contains_key(OBJECTIVE));
    // Flow control off: neither header passes.
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start("", &[up.addr]).await;
    let (status, _, _) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &spoof).await;
    assert_eq!(status, 200);
    let seen = up.seen.last_headers.lock().unwrap().clone().unwrap();
    assert!(!seen.contains_key(FAIRNESS) && !seen.contains_key(OBJECTIVE));
}

#[tokio::test]
async fn without_flow_control_a_saturated_pool_answers_as_before() {
    // Standard requests are routed to a saturated (not overloaded) pod, as without queues.
    let up = Upstream::start(Behaviour::Ok).await;
    up.waiting.store(20, Ordering::SeqCst);
    let gw = start("", &[up.addr]).await;
    let admin = gw.gw.admin_addr().unwrap();
    eventually("a scrape", || async move {
        get(admin, "/metrics")
            .await
            .1
            .contains("infergate_metrics_scrape_duration_seconds_count{model=\"m\"} ")
    })
    .await;
    let (status, headers, _) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key(REASON));
    let m = gw.metrics().await;
    assert!(!m.contains("infergate_flow_requests_total{"), "{m}");
}

#[tokio::test]
async fn at_its_concurrency_limit_a_model_queues_and_dispatches_when_a_slot_frees() {
    // The pod has room; the model's one slot is what is taken.
    let up = Upstream::start(Behaviour::Stepped).await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 20000 }\nlimits: { maxConcurrentRequests: 1 }\n",
        &[up.addr],
    )
    .await;
    let first = open_stream(gw.addr(), "m").await;
    let addr = gw.addr();
    let second = tokio::spawn(async move { open_stream(addr, "m").await });
    gw.until_metric(&queue_gauge("standard", 1)).await;
    assert_eq!(up.requests(), 1, "the queued request reached the pod");
    // The first client leaves: its slot frees and the queued request takes it.
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the queued request was not dispatched when the slot freed")
        .unwrap();
    assert_eq!(up.requests(), 2);
    let m = gw.metrics().await;
    assert!(m.contains(&queue_gauge("standard", 0)), "{m}");
    assert!(
        m.contains(&outcome("standard", "default", "dispatched", 1)),
        "{m}"
    );
    assert!(!m.contains(r#"reason="concurrency_limit""#), "{m}");
    // The dispatched request holds the slot now: the next one waits in its turn.
    let third = spawn_chat(gw.addr(), &[]);
    gw.until_metric(&queue_gauge("standard", 1)).await;
    assert_eq!(up.requests(), 2);
    drop(second);
    gw.until_metric(&outcome("standard", "default", "dispatched", 2))
        .await;
    assert_eq!(up.requests(), 3);
    third.abort();
}

#[tokio::test]
async fn a_request_queued_for_a_slot_past_its_ttl_gets_429_ttl_expired() {
    let up = Upstream::start(Behaviour::Stepped).await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 300 }\nlimits: { maxConcurrentRequests: 1 }\nexplainHeader: true\n",
        &[up.addr],
    )
    .await;
    let _first = open_stream(gw.addr(), "m").await;
    let (status, headers, body) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-infergate-explain", "1")],
    )
    .await;
    // The decision names the limit, not the pod's scores.
    let explained = headers["x-infergate-explain"].to_str().unwrap();
    assert!(
        explained.contains("policy=concurrency-limit") && explained.contains("limit=1"),
        "{explained}"
    );
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[REASON], "rejected-ttl-expired");
    assert_eq!(json(&body)["error"]["code"], "queue_ttl_expired");
    assert_eq!(up.requests(), 1);
}

#[tokio::test]
async fn a_request_queued_behind_waiting_ones_is_explained_as_queued() {
    let up = saturated_pod().await;
    let gw = start(
        "flowControl: { enabled: true, requestTtlMs: 300 }\nexplainHeader: true\n",
        &[up.addr],
    )
    .await;
    let first = spawn_chat(gw.addr(), &[]);
    gw.until_metric(&queue_gauge("standard", 1)).await;
    let (status, headers, body) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-infergate-explain", "1")],
    )
    .await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    let explained = headers
        .get("x-infergate-explain")
        .expect("no explanation for a request that went behind waiting ones")
        .to_str()
        .unwrap();
    assert!(
        explained.contains("policy=queued") && explained.contains("queued=1"),
        "{explained}"
    );
    assert_eq!(first.await.unwrap().0, 429);
}
