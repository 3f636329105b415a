use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// The one table, tested once: every scheduler rejection → status, error code, `Retry-After`.
#[test]
fn every_rejection_has_one_status_code_and_retry_after() {
    let rows = [
        (
            Rejection::Shed {
                retry_after: Duration::from_millis(2500),
            },
            429,
            "shed",
            Some(3),
        ),
        (Rejection::NoEndpoints, 503, "no_endpoints", None),
        (
            Rejection::Unavailable {
                retry_after: Duration::from_secs(1),
            },
            503,
            "no_fresh_endpoints",
            Some(1),
        ),
    ];
    for (rejection, status, code, retry_after) in rows {
        let e = rejection_error(rejection, "m", false);
        assert_eq!(e.status(), status, "{rejection:?}");
        assert_eq!(e.metric_label(), code, "{rejection:?}");
        assert_eq!(e.retry_after_secs(), retry_after, "{rejection:?}");
        let json = String::from_utf8(e.to_json()).unwrap();
        assert!(json.contains("`m`"), "names the model: {json}");
    }
    // A request that named the endpoints it may go to is told the hint left none.
    let hinted = rejection_error(Rejection::NoEndpoints, "m", true);
    assert_eq!(
        (hinted.status(), hinted.metric_label()),
        (503, "no_endpoints")
    );
    assert_eq!(
        hinted.to_string(),
        "no ready endpoint serves the model `m` among the endpoints the request's subset hint \
         names (x-gateway-destination-endpoint-subset): check the hint's addresses against the \
         pool's"
    );
    assert_eq!(
        rejection_error(Rejection::NoEndpoints, "m", false).to_string(),
        "no ready endpoint serves the model `m`"
    );
}

#[test]
fn usage_saturates_instead_of_wrapping() {
    let u = Usage {
        prompt_tokens: u64::MAX,
        completion_tokens: 7,
        cached_tokens: 3,
    };
    let s = scheduler_usage(&u);
    assert_eq!(
        (s.prompt_tokens, s.output_tokens, s.cached_tokens),
        (u32::MAX, 7, 3)
    );
}

#[test]
fn segments_stay_in_order_past_the_inline_capacity() {
    let words: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
    for n in [0, 1, 16, 17, 40] {
        let s = Segments::new(words[..n].iter().map(String::as_str));
        let want: Vec<&str> = words[..n].iter().map(String::as_str).collect();
        assert_eq!(s.as_slice(), want.as_slice(), "{n} segments");
    }
}

#[derive(Default, Clone)]
struct Events(Arc<Mutex<Vec<String>>>);

struct Guard {
    events: Events,
    endpoints: Vec<SocketAddr>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.events.0.lock().unwrap().push("dropped".into());
    }
}

impl InflightGuard for Guard {
    fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }
    fn reassign(&mut self, _addr: SocketAddr) {}
    fn first_token(&mut self) {}
    fn complete(self, usage: infergate_scheduler::Usage) {
        self.events
            .0
            .lock()
            .unwrap()
            .push(format!("complete {}", usage.output_tokens));
    }
    fn fail(self) {
        self.events.0.lock().unwrap().push("fail".into());
    }
}

fn guard(events: &Events) -> Guard {
    Guard {
        events: events.clone(),
        endpoints: vec![SocketAddr::from(([127, 0, 0, 1], 1))],
    }
}

#[test]
fn finish_completes_2xx_fails_5xx_and_broken_answers_and_cancels_the_rest() {
    let json = br#"{"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
    let cases: [(u16, bool, Ending, &str); 5] = [
        (200, true, Ending::Completed, "complete 9"),
        (200, false, Ending::Failed, "fail"),
        (503, true, Ending::Failed, "fail"),
        (404, true, Ending::Refused, "dropped"),
        (429, true, Ending::Refused, "dropped"),
    ];
    for (status, clean, want, event) in cases {
        let events = Events::default();
        let mut watch = ResponseWatch::new(status, false, MAX_USAGE_BODY);
        watch.feed(json);
        let (ending, usage) = finish(guard(&events), status, clean, &mut watch);
        assert_eq!(ending, want, "{status} clean={clean}");
        let seen = events.0.lock().unwrap().clone();
        assert_eq!(
            seen.first().map(String::as_str),
            Some(event),
            "{status}: {seen:?}"
        );
        if want == Ending::Completed {
            assert_eq!(usage.completion_tokens, 9);
        }
    }
}

#[test]
fn the_watch_reads_sse_first_token_and_usage_and_bounds_json() {
    let mut sse = ResponseWatch::new(200, true, MAX_USAGE_BODY);
    assert!(!sse.feed(b": keep-alive\n\n"));
    assert!(sse.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"));
    sse.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n");
    assert_eq!(sse.usage().unwrap().completion_tokens, 1);

    let body = Bytes::from_static(br#"{"usage":{"prompt_tokens":4,"completion_tokens":2}}"#);
    let mut one_frame = ResponseWatch::new(200, false, MAX_USAGE_BODY);
    one_frame.feed_bytes(&body);
    assert_eq!(one_frame.usage().unwrap().completion_tokens, 2);
    let mut two_frames = ResponseWatch::new(200, false, MAX_USAGE_BODY);
    two_frames.feed_bytes(&body.slice(..10));
    two_frames.feed_bytes(&body.slice(10..));
    assert_eq!(two_frames.usage().unwrap().prompt_tokens, 4);

    let mut big = ResponseWatch::new(200, false, MAX_USAGE_BODY);
    big.feed(&vec![b' '; MAX_USAGE_BODY]);
    big.feed(&body);
    assert!(matches!(big, ResponseWatch::Nothing));
    assert!(big.usage().is_none());
    assert!(matches!(
        ResponseWatch::new(500, true, MAX_USAGE_BODY),
        ResponseWatch::Nothing
    ));
}

/// A pool whose pods are all held back for a request with a reserve to leave, and free for one
/// without: it records the reserve of every pick.
#[derive(Clone, Default)]
struct Reserving {
    reserves: Arc<Mutex<Vec<u16>>>,
    events: Events,
}

impl EndpointPool for Reserving {
    type Inflight = Guard;
    fn pick(&self, cx: &RequestContext<'_>) -> Result<Guard, Rejection> {
        assert!(cx.queue_when_saturated, "flow control asks to queue");
        self.reserves.lock().unwrap().push(cx.reserved_endpoints);
        if cx.reserved_endpoints > 0 {
            Err(Rejection::Shed {
                retry_after: Duration::from_secs(1),
            })
        } else {
            Ok(guard(&self.events))
        }
    }
    fn is_ready(&self) -> bool {
        true
    }
}

#[tokio::test(start_paused = true)]
async fn picks_under_flow_control_carry_the_reserve_and_a_held_head_lets_a_protected_one_go() {
    use infergate_scheduler::flow::{Fairness, FlowConfig};
    let mut cfg = FlowConfig {
        enabled: true,
        fairness: Fairness::LeastAttainedService,
        ..FlowConfig::default()
    };
    cfg.headroom.reserved_endpoints = 1;
    let flow = FlowController::new(
        "p",
        cfg,
        crate::tenant::Tenancy::default(),
        infergate_metrics::Clock::starting_now(),
        &crate::flow::FlowMetrics::default(),
    );
    let pool = Reserving::default();
    let cx = RequestContext::new("m", 500).with_output_tokens(0);
    let part = |tenant| FlowPart {
        flow: &flow,
        tenant,
        bytes: 100,
    };
    // The noisy tenant has been served ten times the quiet one.
    flow.charge(
        &infergate_scheduler::FlowRequest::new("noisy", cx.priority, 1).with_tokens(5_000, 0),
    );
    flow.charge(
        &infergate_scheduler::FlowRequest::new("quiet", cx.priority, 1).with_tokens(500, 0),
    );
    // The noisy request's pick must leave one clear pod: every pod is held, it queues.
    let (a, _) = admit(&pool, false, &cx, Some(part("noisy")), "m");
    let Admission::Queued(noisy) = a else {
        panic!("the noisy request should wait");
    };
    // The quiet one queues behind it without a pick (its band has a request waiting).
    let (a, _) = admit(&pool, false, &cx, Some(part("quiet")), "m");
    let Admission::Queued(quiet) = a else {
        panic!("the quiet request should wait behind the noisy one");
    };
    assert_eq!(*pool.reserves.lock().unwrap(), [1]);
    let waker = std::task::Waker::noop();
    let mut task = std::task::Context::from_waker(waker);
    let (mut noisy, mut quiet) = (Some(noisy), Some(quiet));
    // The noisy head's turn: still held back; it passes the turn to the quiet request.
    assert!(poll_queued(&pool, &mut noisy, &cx, "m", &mut task).is_pending());
    let routed = poll_queued(&pool, &mut quiet, &cx, "m", &mut task);
    assert!(matches!(routed, std::task::Poll::Ready(Ok(_))));
    assert_eq!(*pool.reserves.lock().unwrap(), [1, 1, 0]);
    assert!(quiet.is_none() && noisy.is_some());
}

/// A pool whose every pod is saturated: each pick is shed.
#[derive(Clone)]
struct Saturated;

impl EndpointPool for Saturated {
    type Inflight = Guard;
    fn pick(&self, _cx: &RequestContext<'_>) -> Result<Guard, Rejection> {
        Err(Rejection::Shed {
            retry_after: Duration::from_secs(1),
        })
    }
    fn is_ready(&self) -> bool {
        true
    }
}

#[tokio::test(start_paused = true)]
async fn a_queue_refusal_says_whether_the_band_or_the_whole_queue_is_full() {
    use infergate_scheduler::flow::FlowConfig;
    let refusal = |set: fn(&mut FlowConfig)| {
        let mut cfg = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        set(&mut cfg);
        let flow = FlowController::new(
            "p",
            cfg,
            crate::tenant::Tenancy::default(),
            infergate_metrics::Clock::starting_now(),
            &crate::flow::FlowMetrics::default(),
        );
        let cx = RequestContext::new("m", 500);
        let part = || FlowPart {
            flow: &flow,
            tenant: "t",
            bytes: 100,
        };
        let (first, _) = admit(&Saturated, false, &cx, Some(part()), "m");
        assert!(matches!(first, Admission::Queued(_)), "the first one waits");
        let (second, _) = admit(&Saturated, false, &cx, Some(part()), "m");
        let Admission::Refused(e) = second else {
            panic!("the second one should be refused");
        };
        assert_eq!(e.metric_label(), "queue_full");
        e.to_string()
    };
    // The band's own limit: the message names the band.
    let band = refusal(|c| c.bands.standard.max_requests = 1);
    assert!(
        band.contains("the queue of its standard band is full"),
        "{band}"
    );
    // The whole queue's limit, the band far from its own: the message must not blame the band.
    let whole = refusal(|c| c.max_requests = 1);
    assert!(
        whole.contains("its whole queue (all priority bands together) is full"),
        "{whole}"
    );
    assert!(!whole.contains("standard"), "{whole}");
}

/// A pool whose pods are saturated until they are gone (`gone`), then has none.
#[derive(Clone, Default)]
struct Vanishing {
    gone: Arc<std::sync::atomic::AtomicBool>,
}

impl EndpointPool for Vanishing {
    type Inflight = Guard;
    fn pick(&self, _cx: &RequestContext<'_>) -> Result<Guard, Rejection> {
        if self.gone.load(std::sync::atomic::Ordering::Relaxed) {
            Err(Rejection::NoEndpoints)
        } else {
            Err(Rejection::Shed {
                retry_after: Duration::from_secs(1),
            })
        }
    }
    fn is_ready(&self) -> bool {
        true
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_pool_loses_its_pods_while_it_waits_is_told_it_waited() {
    use infergate_scheduler::flow::FlowConfig;
    let flow = FlowController::new(
        "p",
        FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        },
        crate::tenant::Tenancy::default(),
        infergate_metrics::Clock::starting_now(),
        &crate::flow::FlowMetrics::default(),
    );
    let pool = Vanishing::default();
    let cx = RequestContext::new("m", 500);
    let part = || FlowPart {
        flow: &flow,
        tenant: "t",
        bytes: 100,
    };
    let (a, _) = admit(&pool, false, &cx, Some(part()), "m");
    let Admission::Queued(q) = a else {
        panic!("a saturated pool queues the request");
    };
    let mut queued = Some(q);
    let waker = std::task::Waker::noop();
    let mut task = std::task::Context::from_waker(waker);
    assert!(poll_queued(&pool, &mut queued, &cx, "m", &mut task).is_pending());
    tokio::time::advance(Duration::from_millis(1_500)).await;
    pool.gone.store(true, std::sync::atomic::Ordering::Relaxed);
    flow.kick();
    let std::task::Poll::Ready(Err(e)) = poll_queued(&pool, &mut queued, &cx, "m", &mut task)
    else {
        panic!("the request should be refused");
    };
    assert_eq!(e.metric_label(), "queue_no_endpoints");
    let text = e.to_string();
    assert!(!text.contains("not queued"), "{text}");
    assert!(
        text.contains("left its queue after waiting 1500 ms"),
        "{text}"
    );
    // At admission, nothing waited.
    let (a, _) = admit(&pool, false, &cx, Some(part()), "m");
    let Admission::Refused(e) = a else {
        panic!("a pool without pods refuses at once");
    };
    assert!(e.to_string().contains("the request was not queued"), "{e}");
    assert!(!e.to_string().contains("subset hint"), "{e}");
    // With a subset hint, the refusal names it as the cause.
    let hinted: [SocketAddr; 1] = ["10.9.9.9:1".parse().unwrap()];
    let cx = cx.with_subset(Some(&hinted));
    let (a, _) = admit(&pool, false, &cx, Some(part()), "m");
    let Admission::Refused(e) = a else {
        panic!("a pool without pods refuses at once");
    };
    assert_eq!(
        e.to_string(),
        "no ready endpoint serves the model `m` among the endpoints the request's subset hint \
         names (x-gateway-destination-endpoint-subset): check the hint's addresses against the \
         pool's: the request was not queued"
    );
}

/// A stream without `stream_options.include_usage` reports no usage: its estimate stays
/// counted, against the tenant's token quota and in its attained service, instead of being
/// replaced by nothing (which let such requests pass a token quota without limit).
#[tokio::test(start_paused = true)]
async fn an_answer_that_reports_no_usage_keeps_its_estimates() {
    use crate::quota::{QuotaConfig, Quotas};
    use infergate_scheduler::Priority;
    use infergate_scheduler::flow::{Fairness, FlowConfig};
    use infergate_scheduler::quota::Limits;
    let quotas = Quotas::start(
        QuotaConfig {
            tenants: vec![(
                Arc::from("t"),
                Limits {
                    requests: None,
                    tokens: Some(1_000),
                },
            )],
            ..QuotaConfig::default()
        },
        None,
    )
    .unwrap();
    let flow = FlowController::new(
        "p",
        FlowConfig {
            enabled: true,
            fairness: Fairness::LeastAttainedService,
            ..FlowConfig::default()
        },
        crate::tenant::Tenancy::default(),
        infergate_metrics::Clock::starting_now(),
        &crate::flow::FlowMetrics::default(),
    );
    let answer = |sse: &[u8]| {
        let events = Events::default();
        let mut watch = ResponseWatch::new(200, true, MAX_USAGE_BODY);
        watch.feed(sse);
        finish(guard(&events), 200, true, &mut watch)
    };
    let no_usage = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    for _ in 0..2 {
        let ticket = quotas.admit("t", 400).unwrap().unwrap().commit();
        let charge = flow.charge(
            &infergate_scheduler::FlowRequest::new("t", Priority::Standard, 1)
                .with_tokens(300, 100),
        );
        let (ending, usage) = answer(no_usage);
        assert_eq!(ending, Ending::Completed);
        settle_quota(Some(ticket), ending, &usage);
        settle_flow(Some(charge), ending, &usage);
    }
    // Two estimates of 400 are counted: a third does not fit in 1,000.
    assert!(quotas.admit("t", 400).is_err());
    assert_eq!(flow.attained("t", Priority::Standard), Some(800.0));
    // A reported usage still replaces the estimate.
    let with_usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":10}}\n\ndata: [DONE]\n\n";
    let charge = flow.charge(
        &infergate_scheduler::FlowRequest::new("u", Priority::Standard, 1).with_tokens(300, 100),
    );
    let (ending, usage) = answer(with_usage);
    settle_flow(Some(charge), ending, &usage);
    assert_eq!(flow.attained("u", Priority::Standard), Some(40.0));
}

/// An embeddings request generates nothing: its quota estimate is its input alone, not the
/// input plus the default output budget a chat request without `max_tokens` is charged.
#[test]
fn an_embeddings_request_is_charged_its_input_alone() {
    use infergate_openai::{ApiKind, parse_request};
    let input = "x".repeat(400);
    let body = format!(r#"{{"model":"m","input":"{input}"}}"#);
    let parsed = parse_request(ApiKind::Embeddings, body.as_bytes()).unwrap();
    assert_eq!(quota_estimate(&parsed), 100);
    let body = format!(r#"{{"model":"m","prompt":"{input}"}}"#);
    let parsed = parse_request(ApiKind::Completions, body.as_bytes()).unwrap();
    assert_eq!(
        quota_estimate(&parsed),
        100 + u64::from(RequestContext::DEFAULT_OUTPUT_TOKENS)
    );
}
