//! Flow control in the endpoint picker: a request that finds every pod saturated waits in its
//! band, with no answer to Envoy, and is routed when the pool has room; one that waits past
//! its TTL is answered 429 `rejected-ttl-expired`. The harness plays Envoy; the pool is a gate
//! the test opens (saturated → headroom) and whose opening notifies the picker, as a live
//! pool's releases and metrics pages do.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use harness::*;
use infergate_extproc::{EndpointPicker, EndpointPool, InflightGuard, PickerConfig, Telemetry};
use infergate_metrics::Clock;
use infergate_pool::Changes;
use infergate_pool::flow::{FlowController, FlowMetrics};
use infergate_pool::tenant::{Tenancy, TenancyConfig};
use infergate_scheduler::flow::FlowConfig;
use infergate_scheduler::{Priority, Rejection, RequestContext, Usage};
use prometheus_client::registry::Registry;

const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const POD: &str = "10.0.0.1:8000";

/// Saturated (every pick shed) until opened; records the priority of each pick.
#[derive(Clone)]
struct Gate {
    open: Arc<AtomicBool>,
    changes: Arc<Changes>,
    priorities: Arc<std::sync::Mutex<Vec<Priority>>>,
}

struct Guard(Vec<SocketAddr>);

impl InflightGuard for Guard {
    fn endpoints(&self) -> &[SocketAddr] {
        &self.0
    }
    fn reassign(&mut self, _addr: SocketAddr) {}
    fn first_token(&mut self) {}
    fn complete(self, _usage: Usage) {}
    fn fail(self) {}
}

impl EndpointPool for Gate {
    type Inflight = Guard;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<Guard, Rejection> {
        self.priorities.lock().unwrap().push(cx.priority);
        if self.open.load(Ordering::SeqCst) {
            Ok(Guard(vec![POD.parse().unwrap()]))
        } else {
            assert!(cx.queue_when_saturated, "flow control asks to queue");
            Err(Rejection::Shed {
                retry_after: Duration::from_secs(2),
            })
        }
    }

    fn is_ready(&self) -> bool {
        true
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(Arc::clone(&self.changes))
    }
}

fn picker(ttl: Duration) -> (EndpointPicker<Gate>, Gate, FlowController) {
    let gate = Gate {
        open: Arc::default(),
        changes: Arc::new(Changes::new()),
        priorities: Arc::default(),
    };
    let tenancy: TenancyConfig = serde_yaml::from_str("objectives: { chat: critical }").unwrap();
    let flow = FlowController::new(
        "p",
        FlowConfig {
            enabled: true,
            request_ttl: ttl,
            ..FlowConfig::default()
        },
        Tenancy::new(&tenancy).unwrap(),
        Clock::starting_now(),
        &FlowMetrics::default(),
    );
    let config = PickerConfig {
        flow: Some(flow.clone()),
        ..PickerConfig::default()
    };
    let telemetry = Telemetry::register(&mut Registry::default());
    (
        EndpointPicker::new(config, gate.clone(), telemetry),
        gate,
        flow,
    )
}

async fn send_request(envoy: &Envoy) -> Exchange {
    let mut ex = envoy.open().await;
    ex.send(request_headers(
        "/v1/chat/completions",
        &[
            ("x-llm-d-inference-fairness-id", "team-a"),
            ("x-llm-d-inference-objective", "chat"),
        ],
        false,
    ))
    .await;
    ex.send(request_body(BODY, true)).await;
    ex
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn the_picker_queues_a_request_while_the_pool_is_saturated_and_routes_it_after() {
    let (service, gate, flow) = picker(Duration::from_secs(20));
    let server = serve(service).await;
    let envoy = Envoy::connect(server.addr).await;
    let mut ex = send_request(&envoy).await;
    until("the request to be queued", || {
        flow.queued_in(Priority::Critical) == 1
    })
    .await;
    // Queued: Envoy has no answer yet.
    let early = tokio::time::timeout(Duration::from_millis(100), ex.next()).await;
    assert!(early.is_err(), "answered while queued: {early:?}");
    gate.open.store(true, Ordering::SeqCst);
    gate.changes.signal();
    let route = headers_answer(&ex.next().await);
    assert_eq!(route.header("x-gateway-destination-endpoint"), Some(POD));
    assert_eq!(route.metadata_destination.as_deref(), Some(POD));
    assert_eq!(flow.queued(), 0);
    // The objective made it Critical: the first pick and the one on its turn.
    let seen = gate.priorities.lock().unwrap().clone();
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.iter().all(|p| *p == Priority::Critical), "{seen:?}");
}

#[tokio::test]
async fn the_picker_answers_429_rejected_ttl_expired_after_the_ttl() {
    let (service, _gate, flow) = picker(Duration::from_millis(200));
    let server = serve(service).await;
    let envoy = Envoy::connect(server.addr).await;
    let started = std::time::Instant::now();
    let mut ex = send_request(&envoy).await;
    let (status, headers, body) = immediate_parts(&ex.next().await);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(status, 429);
    assert_eq!(
        headers["x-llm-d-request-dropped-reason"],
        "rejected-ttl-expired"
    );
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(body["error"]["code"], "queue_ttl_expired");
    assert_eq!(flow.queued(), 0);
}

#[tokio::test]
async fn a_reset_stream_leaves_the_queue_at_once() {
    let (service, _gate, flow) = picker(Duration::from_secs(20));
    let server = serve(service).await;
    let envoy = Envoy::connect(server.addr).await;
    let ex = send_request(&envoy).await;
    until("the request to be queued", || flow.queued() == 1).await;
    drop(ex);
    until("the entry to leave", || flow.queued() == 0).await;
}
