use std::time::Duration;

use infergate_scheduler::Priority;
use infergate_scheduler::flow::{FlowConfig, FlowRequest};
use prometheus_client::registry::Registry;

use super::*;

fn controller(f: impl FnOnce(&mut FlowConfig)) -> (FlowController, Registry) {
    let mut cfg = FlowConfig {
        enabled: true,
        ..FlowConfig::default()
    };
    f(&mut cfg);
    let mut registry = Registry::default();
    let metrics = FlowMetrics::register(&mut registry);
    let c = FlowController::new(
        "p",
        cfg,
        Tenancy::default(),
        Clock::starting_now(),
        &metrics,
    );
    (c, registry)
}

fn req(tenant: &str, p: Priority) -> FlowRequest<'_> {
    FlowRequest::new(tenant, p, 100)
}

fn text(r: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r).unwrap();
    s
}

/// Polls once: `Some` when ready.
fn poll(q: &mut Queued) -> Option<Turn> {
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    match q.poll_turn(&mut cx) {
        Poll::Ready(t) => Some(t),
        Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn the_head_gets_the_turn_and_passes_it_on_when_dispatched() {
    let (c, registry) = controller(|_| {});
    let mut a = c.enqueue(req("a", Priority::Standard), None).unwrap();
    let mut b = c.enqueue(req("b", Priority::Standard), None).unwrap();
    let mut crit = c.enqueue(req("b", Priority::Critical), None).unwrap();
    // `a` was the head when it arrived: its turn is out; nobody else has one.
    assert_eq!(poll(&mut a), Some(Turn::Try));
    assert_eq!(poll(&mut b), None);
    assert_eq!(poll(&mut crit), None);
    // Still saturated: no new turn until something frees room.
    a.still_saturated(Duration::from_secs(2));
    assert_eq!(poll(&mut crit), None);
    c.kick();
    // The Critical request is the head now.
    assert_eq!(poll(&mut crit), Some(Turn::Try));
    assert!(crit.dispatched().is_some());
    // Dispatching passes the turn straight on.
    assert_eq!(poll(&mut a), Some(Turn::Try));
    assert!(a.dispatched().is_some());
    assert_eq!(poll(&mut b), Some(Turn::Try));
    assert_eq!(c.queued(), 1);
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_requests_total{pool="p",priority="critical",tenant="other",outcome="dispatched"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_flow_queue_requests{pool="p",priority="standard"} 1"#),
        "{m}"
    );
    assert_eq!(c.retry_after(), Duration::from_secs(2));
}

/// A gateway reload that changes `flowControl:` gives the pool a new controller while requests
/// still wait in the old one: both share the pool's series.
#[tokio::test(start_paused = true)]
async fn two_controllers_of_one_pool_show_their_queues_together() {
    let mut registry = Registry::default();
    let metrics = FlowMetrics::register(&mut registry);
    let cfg = FlowConfig {
        enabled: true,
        ..FlowConfig::default()
    };
    let new = |cfg| {
        FlowController::new(
            "p",
            cfg,
            Tenancy::default(),
            Clock::starting_now(),
            &metrics,
        )
    };
    let old = new(cfg);
    let waiting_old: Vec<_> = (0..2)
        .map(|_| old.enqueue(req("a", Priority::Standard), None).unwrap())
        .collect();
    let reloaded = new(FlowConfig {
        request_ttl: Duration::from_secs(5),
        ..cfg
    });
    let mut waiting_new: Vec<_> = (0..3)
        .map(|_| {
            reloaded
                .enqueue(req("b", Priority::Standard), None)
                .unwrap()
        })
        .collect();
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_queue_requests{pool="p",priority="standard"} 5"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_flow_queue_bytes{pool="p",priority="standard"} 500"#),
        "{m}"
    );
    drop(waiting_old);
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_queue_requests{pool="p",priority="standard"} 3"#),
        "{m}"
    );
    assert_eq!(poll(&mut waiting_new[0]), Some(Turn::Try));
    assert!(waiting_new.remove(0).dispatched().is_some());
    drop(waiting_new);
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_queue_requests{pool="p",priority="standard"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_flow_queue_bytes{pool="p",priority="standard"} 0"#),
        "{m}"
    );
}

/// Waits as long as a TTL allows (one day at most) are told apart by the wait histogram.
#[tokio::test(start_paused = true)]
async fn a_long_wait_lands_in_a_bucket_of_its_own() {
    let (c, registry) = controller(|cfg| cfg.request_ttl = Duration::from_secs(3_600));
    let mut a = c.enqueue(req("a", Priority::Standard), None).unwrap();
    assert_eq!(poll(&mut a), Some(Turn::Try));
    a.still_saturated(Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(1_000)).await;
    c.kick();
    assert_eq!(poll(&mut a), Some(Turn::Try));
    assert!(a.dispatched().is_some());
    let m = text(&registry);
    let bucket = |le: &str| {
        format!(
            r#"infergate_flow_queue_wait_seconds_bucket{{le="{le}",pool="p",priority="standard"}}"#
        )
    };
    assert!(m.contains(&format!("{} 0", bucket("524.288"))), "{m}");
    assert!(m.contains(&format!("{} 1", bucket("1048.576"))), "{m}");
    // The last bucket before `+Inf` is past one day.
    assert!(m.contains(&bucket("134217.728")), "{m}");
}

#[tokio::test(start_paused = true)]
async fn a_release_during_a_turn_gives_the_head_another_turn_at_once() {
    let (c, _r) = controller(|_| {});
    let mut a = c.enqueue(req("a", Priority::Standard), None).unwrap();
    assert_eq!(poll(&mut a), Some(Turn::Try));
    // Room freed while `a` was picking: its "still saturated" is stale, so it tries again.
    c.kick();
    a.still_saturated(Duration::from_secs(1));
    assert_eq!(poll(&mut a), Some(Turn::Try));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_queued_request_removes_it_and_passes_its_turn_on() {
    let (c, registry) = controller(|_| {});
    let a = c.enqueue(req("a", Priority::Standard), None).unwrap();
    let mut b = c.enqueue(req("b", Priority::Standard), None).unwrap();
    assert_eq!(c.queued(), 2);
    drop(a);
    assert_eq!(c.queued(), 1);
    assert_eq!(poll(&mut b), Some(Turn::Try));
    drop(b);
    assert_eq!(c.queued(), 0);
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_queue_requests{pool="p",priority="standard"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_flow_requests_total{pool="p",priority="standard",tenant="other",outcome="rejected-context-cancelled"} 2"#),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_ttl_fires_on_its_own_timer() {
    let (c, registry) = controller(|cfg| cfg.request_ttl = Duration::from_millis(500));
    let mut a = c.enqueue(req("a", Priority::Standard), None).unwrap();
    assert_eq!(a.turn().await, Turn::Try);
    a.still_saturated(Duration::from_secs(1));
    let started = Instant::now();
    let t = a.turn().await;
    assert_eq!(t, Turn::Expired(Duration::from_millis(500)));
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert_eq!(c.queued(), 0);
    drop(a);
    let m = text(&registry);
    assert!(
        m.contains(r#"infergate_flow_requests_total{pool="p",priority="standard",tenant="other",outcome="rejected-ttl-expired"} 1"#),
        "{m}"
    );
    assert!(!m.contains("rejected-context-cancelled"), "{m}");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_evicts_a_sheddable_waiter_and_tells_it() {
    let (c, _r) = controller(|cfg| cfg.max_requests = 2);
    let mut s = c.enqueue(req("a", Priority::Sheddable), None).unwrap();
    let _n = c.enqueue(req("a", Priority::Standard), None).unwrap();
    assert_eq!(
        c.enqueue(req("b", Priority::Sheddable), None).unwrap_err(),
        QueueRefused(Refusal::QueueFull)
    );
    tokio::time::advance(Duration::from_millis(30)).await;
    let _crit = c.enqueue(req("b", Priority::Critical), None).unwrap();
    assert_eq!(poll(&mut s), Some(Turn::Evicted(Duration::from_millis(30))));
    assert_eq!(c.queued_in(Priority::Sheddable), 0);
    assert_eq!(c.queued(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_queue_rejection_retry_after_covers_the_queue_ahead_of_its_band() {
    let (c, _r) = controller(|cfg| cfg.request_ttl = Duration::from_secs(60));
    // Ten requests a second sent for 10 s.
    for _ in 0..100 {
        c.charge(&req("a", Priority::Standard));
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    // 55 Standard requests waiting, and the last saturated pick's drain estimate 1 s.
    let mut waiting = Vec::new();
    for _ in 0..55 {
        waiting.push(
            c.enqueue(req("b", Priority::Standard), Some(Duration::from_secs(1)))
                .unwrap(),
        );
    }
    // The drain estimate alone said 1 s; the queue ahead takes about 5.5 s at 10/s.
    assert_eq!(c.retry_after(), Duration::from_secs(1));
    assert_eq!(
        c.queue_retry_after(Priority::Standard),
        Duration::from_secs(6)
    );
    assert_eq!(waiting[0].retry_after(), Duration::from_secs(6));
    // Nothing waits in the Critical band: its drain estimate stands.
    assert_eq!(
        c.queue_retry_after(Priority::Critical),
        Duration::from_secs(1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_head_held_back_by_the_reserve_passes_its_turn_to_a_protected_request() {
    let (c, _r) = controller(|cfg| {
        cfg.fairness = infergate_scheduler::flow::Fairness::LeastAttainedService;
        cfg.headroom.reserved_endpoints = 1;
    });
    let tokens = |tenant, n| FlowRequest::new(tenant, Priority::Standard, 100).with_tokens(n, 0);
    // The noisy tenant has been served ten times the quiet one.
    c.charge(&tokens("noisy", 5_000));
    c.charge(&tokens("quiet", 500));
    assert_eq!(c.reserve_for(&tokens("noisy", 500)), 1);
    assert_eq!(c.reserve_for(&tokens("quiet", 500)), 0);
    let mut n = c.enqueue(tokens("noisy", 500), None).unwrap();
    let mut q = c.enqueue(tokens("quiet", 500), None).unwrap();
    assert_eq!(n.reserve(), 1);
    assert_eq!(q.reserve(), 0);
    // The noisy head gets the turn; its pick finds only reserved pods.
    assert_eq!(poll(&mut n), Some(Turn::Try));
    assert_eq!(poll(&mut q), None);
    n.still_saturated(Duration::from_secs(1));
    // The quiet request behind it may take a reserved pod: its turn.
    assert_eq!(poll(&mut q), Some(Turn::Try));
    assert_eq!(poll(&mut n), None);
    // Still saturated for it too: nobody tries again until room frees up.
    q.still_saturated(Duration::from_secs(1));
    assert_eq!(poll(&mut n), None);
    assert_eq!(poll(&mut q), None);
    c.kick();
    assert_eq!(poll(&mut n), Some(Turn::Try));
}

#[test]
fn the_picker_s_file_refuses_the_gateway_s_header_fields() {
    let settings = |yaml| serde_yaml::from_str::<FlowSettings>(yaml).unwrap();
    assert_eq!(
        settings("tenancy: { objectives: { batch: sheddable } }").check_for_picker(),
        Ok(())
    );
    for (yaml, field) in [
        ("tenancy: { tenantHeader: x-tenant }", "tenantHeader"),
        ("tenancy: { priorityHeader: x-band }", "priorityHeader"),
    ] {
        let e = settings(yaml).check_for_picker().unwrap_err();
        assert_eq!(e.field, field);
        let text = e.to_string();
        assert!(text.contains(&format!("`tenancy.{field}`")), "{text}");
        assert!(text.contains("x-llm-d-inference-fairness-id"), "{text}");
    }
}

/// A gateway reload that changes `flowControl:` keeps the pool and starts a second controller
/// while the first one's requests still wait: one change of the pool gives both queues' heads
/// their turn (a wake-up for one waiter alone would have left the other queue waiting).
#[tokio::test(start_paused = true)]
async fn two_controllers_on_one_pool_are_both_woken_by_one_change() {
    let changes = Arc::new(Changes::new());
    let (old, _r1) = controller(|_| {});
    let (new, _r2) = controller(|_| {});
    old.watch(Arc::clone(&changes));
    new.watch(Arc::clone(&changes));
    // Both watchers wait on the pool's changes.
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let mut a = old.enqueue(req("a", Priority::Standard), None).unwrap();
    let mut b = new.enqueue(req("b", Priority::Standard), None).unwrap();
    for q in [&mut a, &mut b] {
        assert_eq!(poll(q), Some(Turn::Try));
        q.still_saturated(Duration::from_secs(1));
        assert_eq!(poll(q), None);
    }
    changes.signal();
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        poll(&mut a),
        Some(Turn::Try),
        "the old controller missed the change"
    );
    assert_eq!(
        poll(&mut b),
        Some(Turn::Try),
        "the new controller missed the change"
    );
}
