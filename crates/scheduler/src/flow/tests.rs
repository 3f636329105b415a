use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

const T0: Timestamp = Timestamp::ZERO;

fn at(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn queues(f: impl FnOnce(&mut FlowConfig)) -> FlowQueues<&'static str> {
    let mut cfg = FlowConfig {
        enabled: true,
        ..FlowConfig::default()
    };
    f(&mut cfg);
    cfg.validate().unwrap();
    FlowQueues::new(cfg)
}

fn std_req(tenant: &str) -> FlowRequest<'_> {
    FlowRequest::new(tenant, Priority::Standard, 10)
}

fn push(q: &mut FlowQueues<&'static str>, req: FlowRequest<'_>, p: &'static str) -> FlowTicket {
    q.enqueue(req, p, T0, |r| {
        panic!("unexpected eviction of {}", r.payload)
    })
    .unwrap()
}

fn drain(q: &mut FlowQueues<&'static str>) -> Vec<&'static str> {
    std::iter::from_fn(|| q.pop(T0).map(|d| d.payload)).collect()
}

#[test]
fn bands_are_served_critical_then_standard_then_sheddable() {
    let mut q = queues(|_| {});
    push(&mut q, FlowRequest::new("a", Priority::Sheddable, 1), "s1");
    push(&mut q, std_req("a"), "n1");
    push(&mut q, FlowRequest::new("b", Priority::Critical, 1), "c1");
    push(&mut q, FlowRequest::new("a", Priority::Sheddable, 1), "s2");
    push(&mut q, FlowRequest::new("a", Priority::Critical, 1), "c2");
    assert_eq!(q.len(), 5);
    assert_eq!(q.band_len(Priority::Critical), 2);
    assert_eq!(q.band_len(Priority::Standard), 1);
    assert_eq!(q.band_len(Priority::Sheddable), 2);
    assert_eq!(drain(&mut q), ["c1", "c2", "n1", "s1", "s2"]);
    assert!(q.is_empty());
    assert_eq!(q.bytes(), 0);
}

#[test]
fn global_strict_is_fcfs_across_tenants() {
    let mut q = queues(|_| {});
    for (t, p) in [
        ("a", "a1"),
        ("a", "a2"),
        ("b", "b1"),
        ("a", "a3"),
        ("c", "c1"),
    ] {
        push(&mut q, std_req(t), p);
    }
    assert_eq!(drain(&mut q), ["a1", "a2", "b1", "a3", "c1"]);
}

#[test]
fn round_robin_serves_tenants_in_turn() {
    let mut q = queues(|c| c.fairness = Fairness::RoundRobin);
    for (t, p) in [
        ("a", "a1"),
        ("a", "a2"),
        ("a", "a3"),
        ("b", "b1"),
        ("b", "b2"),
        ("c", "c1"),
    ] {
        push(&mut q, std_req(t), p);
    }
    assert_eq!(drain(&mut q), ["a1", "b1", "c1", "a2", "b2", "a3"]);
}

#[test]
fn round_robin_turn_survives_a_flow_leaving_by_removal() {
    let mut q = queues(|c| c.fairness = Fairness::RoundRobin);
    push(&mut q, std_req("a"), "a1");
    push(&mut q, std_req("a"), "a2");
    let b1 = push(&mut q, std_req("b"), "b1");
    push(&mut q, std_req("c"), "c1");
    assert_eq!(q.pop(T0).unwrap().payload, "a1");
    assert_eq!(q.remove(b1), Some("b1"));
    assert_eq!(drain(&mut q), ["c1", "a2"]);
}

#[test]
fn least_attained_service_weighs_input_and_output_tokens() {
    // Output tokens weigh 3, input 1: a's requests cost 10 + 3*10 = 40, b's 100 + 3*0 = 100.
    let mut q = queues(|c| {
        c.fairness = Fairness::LeastAttainedService;
        c.service_weights = ServiceWeights {
            input: 1.0,
            output: 3.0,
        };
    });
    for p in ["a1", "a2", "a3", "a4"] {
        push(&mut q, std_req("a").with_tokens(10, 10), p);
    }
    for p in ["b1", "b2"] {
        push(&mut q, std_req("b").with_tokens(100, 0), p);
    }
    // a 0 / b 0 (tie: a1 arrived first) → a1 (a 40) → b1 (b 100) → a2 (80) → a3 (120)
    // → b2 (200) → a4.
    assert_eq!(drain(&mut q), ["a1", "b1", "a2", "a3", "b2", "a4"]);
    assert_eq!(q.attained("a", Priority::Standard), Some(160.0));
    assert_eq!(q.attained("b", Priority::Standard), Some(200.0));
}

#[test]
fn least_attained_service_is_corrected_by_reported_usage() {
    let mut q = queues(|c| c.fairness = Fairness::LeastAttainedService);
    push(&mut q, std_req("a").with_tokens(10, 10), "a1");
    let d = q.pop(T0).unwrap();
    assert_eq!(q.attained("a", Priority::Standard), Some(20.0));
    // The response reported 10 prompt and 500 generated tokens: a is charged 510.
    q.settle(d.charge, 10, 500);
    assert_eq!(q.attained("a", Priority::Standard), Some(510.0));
    push(&mut q, std_req("b").with_tokens(10, 10), "b1");
    push(&mut q, std_req("a").with_tokens(10, 10), "a2");
    // b became active while no flow was (no floor: 0); a stays at 510: b's requests go first.
    push(&mut q, std_req("b").with_tokens(10, 10), "b2");
    push(&mut q, std_req("b").with_tokens(10, 10), "b3");
    assert_eq!(drain(&mut q), ["b1", "b2", "b3", "a2"]);
}

#[test]
fn a_flow_that_becomes_active_starts_at_the_least_served_active_flow() {
    let mut q = queues(|c| c.fairness = Fairness::LeastAttainedService);
    for p in ["a1", "a2", "a3"] {
        push(&mut q, std_req("a").with_tokens(50, 50), p);
    }
    q.pop(T0).unwrap();
    q.pop(T0).unwrap();
    assert_eq!(q.attained("a", Priority::Standard), Some(200.0));
    // New tenant b is lifted to a's 200 instead of starting at 0 and owning the band.
    push(&mut q, std_req("b").with_tokens(50, 50), "b1");
    assert_eq!(q.attained("b", Priority::Standard), Some(200.0));
    push(&mut q, std_req("b").with_tokens(50, 50), "b2");
    // Tie at 200: a3 is the older head; then b (200) < a (300).
    assert_eq!(drain(&mut q), ["a3", "b1", "b2"]);
}

#[test]
fn edf_orders_a_flow_by_deadline_and_fcfs_ignores_deadlines() {
    for (ordering, want) in [
        (Ordering::Edf, ["d100", "ttl150", "d200", "d300"]),
        (Ordering::Fcfs, ["d300", "d100", "ttl150", "d200"]),
    ] {
        let mut q = queues(|c| {
            c.ordering = ordering;
            c.request_ttl = Duration::from_millis(150);
        });
        push(&mut q, std_req("a").with_deadline(Some(at(300))), "d300");
        push(&mut q, std_req("a").with_deadline(Some(at(100))), "d100");
        // No own deadline: enqueue (0) + TTL (150 ms).
        push(&mut q, std_req("a"), "ttl150");
        push(&mut q, std_req("a").with_deadline(Some(at(200))), "d200");
        assert_eq!(drain(&mut q), want, "{ordering:?}");
    }
}

#[test]
fn edf_with_global_strict_picks_the_earliest_deadline_across_tenants() {
    let mut q = queues(|c| c.ordering = Ordering::Edf);
    push(&mut q, std_req("a").with_deadline(Some(at(50))), "a50");
    push(&mut q, std_req("b").with_deadline(Some(at(10))), "b10");
    push(&mut q, std_req("a").with_deadline(Some(at(5))), "a5");
    push(&mut q, std_req("b").with_deadline(Some(at(70))), "b70");
    assert_eq!(drain(&mut q), ["a5", "b10", "a50", "b70"]);
}

#[test]
fn requests_without_a_deadline_come_last_under_edf() {
    let mut q = queues(|c| {
        c.ordering = Ordering::Edf;
        c.request_ttl = Duration::ZERO;
    });
    push(&mut q, std_req("a"), "none1");
    push(&mut q, std_req("a").with_deadline(Some(at(9))), "d9");
    push(&mut q, std_req("a"), "none2");
    assert_eq!(drain(&mut q), ["d9", "none1", "none2"]);
}

#[test]
fn a_band_is_bounded_by_count() {
    let mut q = queues(|c| c.bands.standard.max_requests = 3);
    for p in ["1", "2", "3"] {
        push(&mut q, std_req("a"), p);
    }
    let r = q.enqueue(std_req("b"), "4", T0, |_| {}).unwrap_err();
    assert_eq!(r.reason, Refusal::BandFull);
    assert_eq!(r.payload, "4");
    assert_eq!(q.band_len(Priority::Standard), 3);
    // Other bands are not affected by the Standard band's limit.
    push(&mut q, FlowRequest::new("b", Priority::Critical, 10), "c");
    assert_eq!(q.len(), 4);
    q.pop(T0).unwrap();
    q.pop(T0).unwrap();
    push(&mut q, std_req("b"), "5");
    assert_eq!(q.band_len(Priority::Standard), 3);
}

#[test]
fn a_band_is_bounded_by_bytes() {
    let mut q = queues(|c| c.bands.standard.max_bytes = 100);
    push(&mut q, FlowRequest::new("a", Priority::Standard, 60), "60");
    push(&mut q, FlowRequest::new("a", Priority::Standard, 40), "40");
    assert_eq!(q.band_bytes(Priority::Standard), 100);
    let r = q
        .enqueue(
            FlowRequest::new("a", Priority::Standard, 1),
            "1",
            T0,
            |_| {},
        )
        .unwrap_err();
    assert_eq!(r.reason, Refusal::BandFull);
    // A request larger than the band never fits.
    let mut empty = queues(|c| c.bands.standard.max_bytes = 100);
    let r = empty
        .enqueue(
            FlowRequest::new("a", Priority::Standard, 101),
            "x",
            T0,
            |_| {},
        )
        .unwrap_err();
    assert_eq!(r.reason, Refusal::BandFull);
    assert_eq!(empty.len(), 0);
}

#[test]
fn a_full_queue_evicts_the_newest_sheddable_for_a_higher_band() {
    let mut q = queues(|c| c.max_requests = 4);
    push(&mut q, FlowRequest::new("a", Priority::Sheddable, 10), "s1");
    push(&mut q, FlowRequest::new("b", Priority::Sheddable, 10), "s2");
    push(&mut q, FlowRequest::new("a", Priority::Sheddable, 10), "s3");
    push(&mut q, std_req("a"), "n1");
    // Full: another Sheddable is refused, not swapped for a queued one.
    let r = q
        .enqueue(
            FlowRequest::new("c", Priority::Sheddable, 1),
            "s4",
            at(5),
            |_| {},
        )
        .unwrap_err();
    assert_eq!(r.reason, Refusal::QueueFull);
    let mut evicted = Vec::new();
    q.enqueue(
        FlowRequest::new("c", Priority::Critical, 10),
        "c1",
        at(7),
        |r| evicted.push((r.payload, r.reason, r.priority, r.waited)),
    )
    .unwrap();
    assert_eq!(
        evicted,
        [(
            "s3",
            Removal::Evicted,
            Priority::Sheddable,
            Duration::from_millis(7)
        )]
    );
    q.enqueue(std_req("c"), "n2", at(8), |r| {
        evicted.push((r.payload, r.reason, r.priority, r.waited))
    })
    .unwrap();
    assert_eq!(evicted.len(), 2);
    assert_eq!(evicted[1].0, "s2");
    assert_eq!(q.len(), 4);
    assert_eq!(q.band_len(Priority::Sheddable), 1);
    assert_eq!(drain(&mut q), ["c1", "n1", "n2", "s1"]);
}

#[test]
fn evicting_the_newest_sheddable_takes_it_out_and_nothing_else() {
    let mut q = queues(|_| {});
    push(&mut q, FlowRequest::new("a", Priority::Sheddable, 10), "s1");
    push(&mut q, std_req("a"), "n1");
    push(&mut q, FlowRequest::new("b", Priority::Sheddable, 10), "s2");
    let r = q.evict_newest_sheddable(at(4)).unwrap();
    assert_eq!(
        (r.payload, r.reason, r.priority, r.waited),
        (
            "s2",
            Removal::Evicted,
            Priority::Sheddable,
            Duration::from_millis(4)
        )
    );
    assert_eq!(q.evict_newest_sheddable(at(4)).unwrap().payload, "s1");
    assert!(
        q.evict_newest_sheddable(at(4)).is_none(),
        "Standard is not taken"
    );
    assert_eq!((q.len(), q.bytes()), (1, 10));
    assert_eq!(drain(&mut q), ["n1"]);
}

#[test]
fn eviction_by_bytes_takes_as_many_sheddables_as_needed_or_none() {
    let mut q = queues(|c| c.max_bytes = 100);
    push(
        &mut q,
        FlowRequest::new("a", Priority::Sheddable, 30),
        "s30a",
    );
    push(
        &mut q,
        FlowRequest::new("a", Priority::Sheddable, 30),
        "s30b",
    );
    push(&mut q, FlowRequest::new("a", Priority::Standard, 40), "n40");
    // 70 bytes of Critical: both Sheddables must go (newest first).
    let mut evicted = Vec::new();
    q.enqueue(
        FlowRequest::new("b", Priority::Critical, 60),
        "c60",
        T0,
        |r| evicted.push(r.payload),
    )
    .unwrap();
    assert_eq!(evicted, ["s30b", "s30a"]);
    assert_eq!(q.bytes(), 100);
    // Nothing Sheddable left: a Critical request that does not fit is refused and evicts nothing.
    let r = q
        .enqueue(
            FlowRequest::new("b", Priority::Critical, 1),
            "c1",
            T0,
            |_| panic!("nothing to evict"),
        )
        .unwrap_err();
    assert_eq!(r.reason, Refusal::QueueFull);
    assert_eq!(q.len(), 2);
}

#[test]
fn eviction_never_happens_when_it_could_not_make_room() {
    let mut q = queues(|c| c.max_bytes = 100);
    push(
        &mut q,
        FlowRequest::new("a", Priority::Sheddable, 10),
        "s10",
    );
    push(&mut q, FlowRequest::new("a", Priority::Standard, 80), "n80");
    // 10 Sheddable bytes cannot make room for 30: refused, s10 stays.
    let r = q
        .enqueue(
            FlowRequest::new("b", Priority::Critical, 30),
            "c30",
            T0,
            |_| panic!("must not evict"),
        )
        .unwrap_err();
    assert_eq!(r.reason, Refusal::QueueFull);
    assert_eq!(q.band_len(Priority::Sheddable), 1);
}

#[test]
fn ttl_expires_exactly_the_requests_past_their_deadline() {
    let mut q = queues(|c| c.request_ttl = Duration::from_millis(100));
    for (t, p) in [(0, "t0"), (30, "t30"), (60, "t60")] {
        q.enqueue(std_req("a"), p, at(t), |_| {}).unwrap();
    }
    q.enqueue(
        FlowRequest::new("b", Priority::Critical, 10),
        "c0",
        at(0),
        |_| {},
    )
    .unwrap();
    assert_eq!(q.next_deadline(), Some(at(100)));
    let mut expired = Vec::new();
    q.expire(at(99), |r| expired.push(r.payload));
    assert!(expired.is_empty());
    q.expire(at(130), |r| {
        assert_eq!(r.reason, Removal::Expired);
        expired.push(r.payload)
    });
    assert_eq!(expired, ["c0", "t0", "t30"]);
    assert_eq!(q.len(), 1);
    assert_eq!(q.next_deadline(), Some(at(160)));
    assert_eq!(drain(&mut q), ["t60"]);
    assert_eq!(q.next_deadline(), None);
}

#[test]
fn a_zero_ttl_never_expires() {
    let mut q = queues(|c| c.request_ttl = Duration::ZERO);
    push(&mut q, std_req("a"), "a");
    assert_eq!(q.next_deadline(), None);
    q.expire(Timestamp(u64::MAX), |_| panic!("no TTL"));
    assert_eq!(q.len(), 1);
}

#[test]
fn removal_by_ticket_frees_the_entry_and_stale_tickets_are_ignored() {
    let mut q = queues(|_| {});
    let a = push(&mut q, FlowRequest::new("a", Priority::Standard, 7), "a");
    let b = push(&mut q, FlowRequest::new("a", Priority::Standard, 5), "b");
    assert_eq!(q.get(b), Some(&"b"));
    assert_eq!(q.priority(b), Some(Priority::Standard));
    assert_eq!(q.remove(b), Some("b"));
    assert_eq!(q.remove(b), None);
    assert_eq!(q.get(b), None);
    assert_eq!((q.len(), q.bytes()), (1, 7));
    // The freed slot is reused; the old ticket still names nothing.
    let c = push(&mut q, FlowRequest::new("a", Priority::Standard, 3), "c");
    assert_ne!(b, c);
    assert_eq!(q.remove(b), None);
    assert!(q.dispatch(b, T0).is_none());
    let d = q.dispatch(a, at(25)).unwrap();
    assert_eq!((d.payload, d.waited), ("a", Duration::from_millis(25)));
    assert_eq!(drain(&mut q), ["c"]);
    assert_eq!(q.next_deadline(), None);
}

#[test]
fn dispatching_a_ticket_other_than_the_head_keeps_the_order_of_the_rest() {
    let mut q = queues(|_| {});
    push(&mut q, std_req("a"), "1");
    let two = push(&mut q, std_req("b"), "2");
    push(&mut q, std_req("a"), "3");
    assert_eq!(q.dispatch(two, T0).unwrap().payload, "2");
    assert_eq!(drain(&mut q), ["1", "3"]);
}

#[test]
fn idle_flows_are_forgotten_past_the_cap() {
    let mut q: FlowQueues<u32> = FlowQueues::new(FlowConfig {
        fairness: Fairness::LeastAttainedService,
        ..FlowConfig::default()
    });
    let names: Vec<String> = (0..=MAX_IDLE_FLOWS).map(|i| format!("t{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        q.enqueue(std_req(n).with_tokens(1, 0), i as u32, T0, |_| {})
            .unwrap();
        q.pop(T0).unwrap();
    }
    // The last tenant forced a sweep of the first MAX_IDLE_FLOWS idle ones.
    assert_eq!(q.attained("t0", Priority::Standard), None);
    assert_eq!(
        q.attained(&names[MAX_IDLE_FLOWS], Priority::Standard),
        Some(1.0)
    );
    assert!(q.flows.len() <= MAX_IDLE_FLOWS + 1);
}

/// Random enqueue / remove / pop / expire against a plain list, for the heaps' bookkeeping.
#[test]
fn random_operations_match_a_reference_model() {
    for ordering in [Ordering::Fcfs, Ordering::Edf] {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut q: FlowQueues<u64> = FlowQueues::new(FlowConfig {
            ordering,
            request_ttl: Duration::from_millis(500),
            ..FlowConfig::default()
        });
        // (id, ticket, deadline ms, seq)
        let mut model: Vec<(u64, FlowTicket, u64, u64)> = Vec::new();
        let tenants = ["a", "b", "c"];
        let mut now = 0u64;
        for id in 0..5_000u64 {
            now += rng.random_range(0..5);
            match rng.random_range(0..10) {
                0..=4 => {
                    let own = rng.random_bool(0.5).then(|| now + rng.random_range(0..800));
                    let t = q
                        .enqueue(
                            std_req(tenants[rng.random_range(0..3)]).with_deadline(own.map(at)),
                            id,
                            at(now),
                            |_| panic!("no eviction"),
                        )
                        .unwrap();
                    model.push((id, t, own.unwrap_or(now + 500), id));
                }
                5 | 6 if !model.is_empty() => {
                    let (id, t, ..) = model.swap_remove(rng.random_range(0..model.len()));
                    assert_eq!(q.remove(t), Some(id));
                }
                7 | 8 => {
                    let want = match ordering {
                        Ordering::Fcfs => model.iter().min_by_key(|m| m.3),
                        Ordering::Edf => model.iter().min_by_key(|m| (m.2, m.3)),
                    }
                    .map(|m| m.0);
                    let got = q.pop(at(now)).map(|d| d.payload);
                    assert_eq!(got, want);
                    model.retain(|m| Some(m.0) != got);
                }
                _ => {
                    let mut gone = Vec::new();
                    q.expire(at(now), |r| gone.push(r.payload));
                    let mut want: Vec<_> = model
                        .iter()
                        .filter(|m| m.2 <= now)
                        .map(|m| (m.2, m.3, m.0))
                        .collect();
                    want.sort_unstable();
                    let want: Vec<u64> = want.into_iter().map(|w| w.2).collect();
                    assert_eq!(gone, want);
                    model.retain(|m| m.2 > now);
                }
            }
            assert_eq!(q.len(), model.len());
            assert_eq!(q.bytes(), 10 * model.len() as u64);
        }
    }
}

#[test]
fn configuration_parses_with_defaults_and_validates() {
    let cfg: FlowConfig = serde_yaml::from_str(
        "enabled: true\nrequestTtlMs: 2500\nfairness: least-attained-service\nordering: edf\n\
         serviceWeights: {input: 0.5, output: 2}\nbands: {sheddable: {maxRequests: 10}}\n",
    )
    .unwrap();
    assert!(cfg.enabled);
    assert_eq!(cfg.request_ttl, Duration::from_millis(2500));
    assert_eq!(cfg.fairness, Fairness::LeastAttainedService);
    assert_eq!(cfg.ordering, Ordering::Edf);
    assert_eq!(cfg.service_weights.output, 2.0);
    assert_eq!(cfg.bands.sheddable.max_requests, 10);
    assert_eq!(cfg.bands.sheddable.max_bytes, 1_000_000_000);
    assert_eq!(cfg.bands.critical.max_requests, 5_000);
    cfg.validate().unwrap();
    let d = FlowConfig::default();
    assert!(!d.enabled);
    assert_eq!(d.request_ttl, Duration::from_secs(60));
    assert_eq!((d.max_requests, d.max_bytes), (3_072, 1_000_000_000));
    assert_eq!(d.fairness, Fairness::GlobalStrict);
    assert_eq!(d.ordering, Ordering::Fcfs);
    for (yaml, field) in [
        (
            "bands: {critical: {maxBytes: 0}}",
            "flowControl.bands.critical.maxBytes",
        ),
        (
            "bands: {critical: {maxRequests: 0}}",
            "flowControl.bands.critical.maxRequests",
        ),
        (
            "bands: {standard: {maxBytes: 0}}",
            "flowControl.bands.standard.maxBytes",
        ),
        (
            "bands: {standard: {maxRequests: 0}}",
            "flowControl.bands.standard.maxRequests",
        ),
        (
            "bands: {sheddable: {maxBytes: 0}}",
            "flowControl.bands.sheddable.maxBytes",
        ),
        (
            "bands: {sheddable: {maxRequests: 0}}",
            "flowControl.bands.sheddable.maxRequests",
        ),
    ] {
        let bad: FlowConfig = serde_yaml::from_str(yaml).unwrap();
        let e = bad.validate().unwrap_err();
        assert_eq!(e.field, field, "{yaml}");
        assert_eq!(
            e.to_string(),
            format!("invalid scheduler configuration: `{field}` must be at least 1")
        );
    }
    let bad: FlowConfig = serde_yaml::from_str("serviceWeights: {output: -1}").unwrap();
    assert_eq!(
        bad.validate().unwrap_err().field,
        "flowControl.serviceWeights.output"
    );
    assert!(serde_yaml::from_str::<FlowConfig>("fairness: lottery").is_err());
    assert!(serde_yaml::from_str::<FlowConfig>("ttl: 5").is_err());
}

#[test]
fn direct_charges_count_toward_attained_service_and_settle_like_dispatches() {
    let mut q = queues(|c| c.fairness = Fairness::LeastAttainedService);
    let c = q.charge(&std_req("a").with_tokens(30, 10), T0);
    assert_eq!(q.attained("a", Priority::Standard), Some(40.0));
    q.settle(c, 30, 100);
    assert_eq!(q.attained("a", Priority::Standard), Some(130.0));
    assert!(!q.has_queued_at_or_above(Priority::Sheddable));
    push(&mut q, std_req("b"), "b1");
    assert!(!q.has_queued_at_or_above(Priority::Critical));
    assert!(q.has_queued_at_or_above(Priority::Standard));
    assert!(q.has_queued_at_or_above(Priority::Sheddable));
}

fn reserving(r: u16) -> FlowQueues<&'static str> {
    queues(|c| {
        c.fairness = Fairness::LeastAttainedService;
        c.headroom.reserved_endpoints = r;
    })
}

#[test]
fn the_reserve_binds_tenants_over_their_share_and_every_sheddable_request() {
    let mut q = reserving(1);
    // Nobody served yet: everyone is within its share, except Sheddable requests.
    assert_eq!(q.reserve_for("quiet", Priority::Standard, T0), 0);
    assert_eq!(q.reserve_for("batch", Priority::Sheddable, T0), 1);
    // A tenant alone is at its share.
    q.charge(&std_req("noisy").with_tokens(1_000, 0), T0);
    assert_eq!(q.reserve_for("noisy", Priority::Standard, T0), 0);
    // Two tenants, one served ten times the other: the heavier one is over the mean.
    q.charge(&std_req("quiet").with_tokens(100, 0), T0);
    assert_eq!(q.reserve_for("noisy", Priority::Standard, T0), 1);
    assert_eq!(q.reserve_for("quiet", Priority::Standard, T0), 0);
    // The share is over every band: a Critical request of the heavy tenant is bound too.
    assert_eq!(q.reserve_for("noisy", Priority::Critical, T0), 1);
    // A tenant never served is within its share.
    assert_eq!(q.reserve_for("new", Priority::Standard, T0), 0);
    // Recent service decays (half-life 10 s): after a minute of only the quiet tenant being
    // served, the noisy one is under its share again.
    for s in 1..=60 {
        q.charge(&std_req("quiet").with_tokens(100, 0), at(s * 1_000));
    }
    assert_eq!(q.reserve_for("noisy", Priority::Standard, at(60_000)), 0);
    assert_eq!(q.reserve_for("quiet", Priority::Standard, at(60_000)), 1);
    // Off: no reserve for anyone.
    let off = reserving(0);
    assert_eq!(off.reserve_for("batch", Priority::Sheddable, T0), 0);
    assert_eq!(off.peek_protected(T0), None);
}

#[test]
fn dispatches_count_as_recent_service_and_peek_protected_skips_the_heavy_tenant() {
    let mut q = reserving(2);
    let n1 = push(&mut q, std_req("noisy").with_tokens(500, 0), "n1");
    push(&mut q, std_req("noisy").with_tokens(500, 0), "n2");
    let d = q.dispatch(n1, T0).unwrap();
    assert_eq!(d.payload, "n1");
    q.charge(&std_req("quiet").with_tokens(50, 0), T0);
    let quiet = push(&mut q, std_req("quiet").with_tokens(50, 0), "q1");
    let n2 = q.peek().unwrap();
    // The quiet tenant's flow came in at the noisy one's attained service: the older head goes
    // first in the queues' order, and it must leave the reserve.
    assert_eq!(q.get(n2), Some(&"n2"));
    assert_eq!(q.reserve_of(n2, T0), 2);
    // The request to try when it is held back: the quiet tenant's.
    assert_eq!(q.peek_protected(T0), Some(quiet));
    assert_eq!(q.reserve_of(quiet, T0), 0);
    // Sheddable requests are never protected.
    let mut shed = reserving(1);
    let s1 = push(
        &mut shed,
        FlowRequest::new("a", Priority::Sheddable, 10),
        "s1",
    );
    assert_eq!(shed.peek(), Some(s1));
    assert_eq!(shed.peek_protected(T0), None);
    // A stale ticket owes nothing.
    q.remove(quiet);
    assert_eq!(q.reserve_of(quiet, T0), 0);
}

#[test]
fn headroom_configuration_is_read_and_checked() {
    let c: FlowConfig =
        serde_yaml::from_str("headroom: { reservedEndpoints: 1, shareHalfLifeMs: 5000 }").unwrap();
    assert_eq!(c.headroom.reserved_endpoints, 1);
    assert_eq!(c.headroom.share_half_life, Duration::from_secs(5));
    c.validate().unwrap();
    let d = FlowConfig::default();
    assert_eq!(d.headroom.reserved_endpoints, 0);
    assert_eq!(d.headroom.share_half_life, Duration::from_secs(10));
    let bad: FlowConfig = serde_yaml::from_str("headroom: { shareHalfLifeMs: 0 }").unwrap();
    assert_eq!(
        bad.validate().unwrap_err().field,
        "flowControl.headroom.shareHalfLifeMs"
    );
    assert!(serde_yaml::from_str::<FlowConfig>("headroom: { reserved: 1 }").is_err());
}

#[test]
fn a_rejection_retry_after_is_the_wait_of_the_queue_ahead_at_the_measured_rate() {
    let mut q = queues(|c| c.request_ttl = Duration::from_secs(30));
    // Nothing sent yet: no rate; with nothing queued the drain estimate stands (at least a
    // second), with requests queued and nothing ever sent the wait is unknown: the TTL.
    assert_eq!(q.send_rate(T0), None);
    assert_eq!(
        q.retry_after(Priority::Standard, Duration::from_millis(300), T0),
        Duration::from_secs(1)
    );
    let first = push(&mut q, std_req("z"), "z");
    assert_eq!(q.expected_wait(Priority::Standard, T0), None);
    assert_eq!(
        q.retry_after(Priority::Standard, Duration::from_millis(300), T0),
        Duration::from_secs(30)
    );
    assert_eq!(
        q.retry_after(Priority::Critical, Duration::from_millis(300), T0),
        Duration::from_secs(1)
    );
    q.remove(first);
    // Ten requests a second for 20 s.
    for i in 0..200 {
        q.charge(&std_req("a"), at(i * 100));
    }
    let now = at(20_000);
    let rate = q.send_rate(now).unwrap();
    assert!((rate - 10.0).abs() < 0.5, "{rate}");
    // 40 Standard requests and 15 Critical ones queued: a Standard one waits behind all 55,
    // about 5.5 s; a Critical one behind 15, about 1.5 s; a Sheddable one behind the same 55.
    for _ in 0..40 {
        push(&mut q, std_req("b"), "s");
    }
    for _ in 0..15 {
        push(&mut q, FlowRequest::new("c", Priority::Critical, 10), "c");
    }
    let one = Duration::from_secs(1);
    assert_eq!(
        q.retry_after(Priority::Standard, one, now),
        Duration::from_secs(6)
    );
    assert_eq!(
        q.retry_after(Priority::Critical, one, now),
        Duration::from_secs(2)
    );
    assert_eq!(
        q.retry_after(Priority::Sheddable, one, now),
        Duration::from_secs(6)
    );
    // A longer drain estimate wins (the scheduler bounds it); the TTL bounds the wait.
    assert_eq!(
        q.retry_after(Priority::Critical, Duration::from_millis(4_200), now),
        Duration::from_secs(5)
    );
    assert_eq!(
        q.retry_after(Priority::Standard, Duration::from_secs(45), now),
        Duration::from_secs(45)
    );
    // The rate decays when nothing is sent: a minute later the wait is bounded by the TTL.
    assert_eq!(
        q.retry_after(Priority::Standard, one, at(80_000)),
        Duration::from_secs(30)
    );
}

#[test]
fn the_sends_of_a_burst_s_first_milliseconds_are_not_taken_for_the_rate() {
    let mut q = queues(|c| c.request_ttl = Duration::from_secs(30));
    // A burst on two idle pods: one request each at once, then the pool is saturated and 20
    // wait. Two sends in 20 ms are not 100 a second: the queue ahead drains at no more than
    // the two a second that can be told.
    q.charge(&std_req("a"), T0);
    q.charge(&std_req("a"), at(20));
    for _ in 0..20 {
        push(&mut q, std_req("a"), "a");
    }
    let rate = q.send_rate(at(40)).unwrap();
    assert!(rate <= 2.0, "{rate}");
    let retry = q.retry_after(Priority::Standard, Duration::from_secs(1), at(40));
    assert!(retry >= Duration::from_secs(10), "{retry:?}");
    // A second on, the history is what it is.
    let rate = q.send_rate(at(1_500)).unwrap();
    assert!(rate > 1.0 && rate < 2.0, "{rate}");
}

#[test]
fn a_ttl_over_one_day_is_refused_naming_the_field() {
    let ok: FlowConfig = serde_yaml::from_str("requestTtlMs: 86400000").unwrap();
    ok.validate().unwrap();
    let off: FlowConfig = serde_yaml::from_str("requestTtlMs: 0").unwrap();
    off.validate().unwrap();
    for ttl in ["86400001", "18446744073709551615"] {
        let bad: FlowConfig = serde_yaml::from_str(&format!("requestTtlMs: {ttl}")).unwrap();
        let e = bad.validate().unwrap_err();
        assert_eq!(e.field, "flowControl.requestTtlMs", "{ttl}");
        assert!(e.to_string().contains("86400000 ms (one day)"), "{e}");
    }
}
