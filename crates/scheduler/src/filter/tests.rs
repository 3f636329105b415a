use std::net::SocketAddr;
use std::time::Duration;

use crate::fixtures::*;
use crate::*;

#[test]
fn stale_pod_is_excluded_and_readmitted() {
    let cfg = SchedulerConfig {
        on_all_filtered: AllFilteredAction::Reject,
        ..SchedulerConfig::default()
    };
    let mut s = scheduler(cfg, 2);
    let later = T0.saturating_add(Duration::from_secs(5));
    s.apply_metrics(addr(0), snapshot(later, 0, 0.1)).unwrap();
    // pod 1's metrics are 5 s old: never a candidate, not even as a fallback.
    for seed in 0..20 {
        let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), later, &mut rng(seed));
        let d = d.unwrap();
        assert_eq!(d.endpoints.as_slice(), &[addr(0)]);
        assert!(ex.filtered.contains(&FilteredOut {
            addr: addr(1),
            filter: "freshness"
        }));
        s.cancel(d.ticket, later);
    }
    // Fresh metrics arrive: readmitted on the very next pick.
    s.apply_metrics(addr(1), snapshot(later, 0, 0.1)).unwrap();
    let d = s
        .pick(&RequestContext::new("m", 10), later, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.len(), 2);
    // Everything stale: 503 with Retry-After (changed deliberately from a plain NoEndpoints:
    // a stale pool is expected to come back, so the client is told when to retry).
    let much_later = later.saturating_add(Duration::from_secs(10));
    let err = s
        .pick(&RequestContext::new("m", 10), much_later, &mut rng(1))
        .unwrap_err();
    assert_eq!(
        err,
        Rejection::Unavailable {
            retry_after: Duration::from_secs(1)
        }
    );
    assert_eq!(err.http_status(), 503);
    assert_eq!(err.metric_label(), "no_fresh_endpoints");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
}

#[test]
fn all_ready_never_falls_back_to_stale_pods() {
    // The default (`onAllFiltered: all-ready`): every pod stale is 503 + Retry-After, not a pick
    // on dead pods' last numbers.
    let mut s = scheduler(SchedulerConfig::default(), 3);
    let later = T0.saturating_add(Duration::from_secs(60));
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), later, &mut rng(1));
    assert!(matches!(d, Err(Rejection::Unavailable { .. })), "{d:?}");
    assert!(!ex.fell_back_to_all_ready);
    assert_eq!(ex.filtered.len(), 3);
    assert_eq!(ex.rejection, Some("no_fresh_endpoints"));
    assert_eq!(ex.retry_after_secs, Some(1));
    // One pod back: it alone is routed to.
    s.apply_metrics(addr(2), snapshot(later, 0, 0.1)).unwrap();
    let d = s
        .pick(&RequestContext::new("m", 10), later, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.as_slice(), &[addr(2)]);
}

#[test]
fn all_filtered_by_lora_falls_back_to_the_fresh_pods_when_configured() {
    // Every pod's adapter slots are taken by other adapters: the LoRA filter removes them all.
    let full = |t: Timestamp| MetricsSnapshot {
        lora: Some(LoraState {
            max_lora: 1,
            running: vec!["other".into()],
            waiting: vec![],
        }),
        ..snapshot(t, 0, 0.1)
    };
    let mut s = scheduler(SchedulerConfig::default(), 3);
    for i in 0..3 {
        s.apply_metrics(addr(i), full(T0)).unwrap();
    }
    // pod 2 is stale: the fallback relaxes LoRA, not freshness.
    let later = T0.saturating_add(Duration::from_secs(1));
    s.apply_metrics(addr(0), full(later)).unwrap();
    s.apply_metrics(addr(1), full(later)).unwrap();
    let stale_later = later.saturating_add(Duration::from_millis(1_500));
    let req = RequestContext::new("m", 10).with_lora(Some("mine"));
    let (d, ex) = s.pick_explained(&req, stale_later, &mut rng(1));
    let mut got = d.unwrap().endpoints.as_slice().to_vec();
    got.sort();
    assert_eq!(got, [addr(0), addr(1)]);
    assert!(ex.fell_back_to_all_ready);
    assert!(ex.filtered.contains(&FilteredOut {
        addr: addr(2),
        filter: "freshness"
    }));
    assert!(ex.filtered.contains(&FilteredOut {
        addr: addr(0),
        filter: "lora"
    }));
    // `reject` answers 503 without Retry-After: no pod can take the adapter, waiting will not help.
    let mut s = scheduler(
        SchedulerConfig {
            on_all_filtered: AllFilteredAction::Reject,
            ..SchedulerConfig::default()
        },
        1,
    );
    s.apply_metrics(addr(0), full(T0)).unwrap();
    assert_eq!(s.pick(&req, T0, &mut rng(1)), Err(Rejection::NoEndpoints));
}

#[test]
fn subset_hint_restricts_and_an_empty_or_unknown_subset_is_503() {
    let mut s = scheduler(SchedulerConfig::default(), 5);
    let subset = [addr(3), addr(3), addr(4), addr(77)];
    for seed in 0..20 {
        let req = RequestContext::new("m", 10).with_subset(Some(&subset));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.len(), 2);
        assert!(d.endpoints.iter().all(|a| *a == addr(3) || *a == addr(4)));
        s.cancel(d.ticket, T0);
    }
    let req = RequestContext::new("m", 10).with_subset(Some(&[]));
    assert_eq!(s.pick(&req, T0, &mut rng(1)), Err(Rejection::NoEndpoints));
    let unknown = [addr(50)];
    let req = RequestContext::new("m", 10).with_subset(Some(&unknown));
    assert_eq!(s.pick(&req, T0, &mut rng(1)), Err(Rejection::NoEndpoints));
}

#[test]
fn sheddable_is_admitted_while_any_pod_has_headroom() {
    let mut s = saturated_scheduler();
    s.apply_metrics(addr(2), snapshot(T0, 0, 0.2)).unwrap();
    let req = RequestContext::new("m", 100).with_priority(Priority::Sheddable);
    let (d, ex) = s.pick_explained(&req, T0, &mut rng(1));
    let d = d.unwrap();
    // The saturation filter leaves only the pod with headroom.
    assert_eq!(d.endpoints.as_slice(), &[addr(2)]);
    assert_eq!(
        ex.filtered
            .iter()
            .filter(|f| f.filter == "saturation")
            .count(),
        2
    );
}

#[test]
fn a_late_pod_stays_a_candidate_on_its_last_page_plus_what_was_routed_since() {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    // Pod 0 answered at T0 with a queue of 3; its next page is late. Pod 1 is fresh and idle.
    s.set_scrape_state(addr(0), ScrapeState::Late).unwrap();
    s.apply_metrics(addr(0), snapshot(T0, 3, 0.2)).unwrap();
    assert_eq!(
        s.endpoint(addr(0)).unwrap().scrape,
        ScrapeState::Ok,
        "a page makes a pod ok"
    );
    s.set_scrape_state(addr(0), ScrapeState::Late).unwrap();
    let later = T0.saturating_add(Duration::from_secs(5));
    s.apply_metrics(addr(1), snapshot(later, 0, 0.1)).unwrap();
    // 5 s old, past the 2 s maxMetricsAge: kept while late, and scored on that page.
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), later, &mut rng(1));
    let d = d.unwrap();
    assert!(ex.filtered.is_empty(), "{:?}", ex.filtered);
    assert_eq!(d.endpoints.as_slice(), &[addr(1), addr(0)]);
    let late = ex.candidates.iter().find(|c| c.addr == addr(0)).unwrap();
    assert_eq!(late.scrape, ScrapeState::Late);
    assert_eq!(late.metrics_age_secs, Some(5.0));
    assert_eq!(late.waiting, 3.0);
    assert!(
        ex.summary(8).contains("scrape=late metrics_age_ms=5000"),
        "{}",
        ex.summary(8)
    );
    // Requests routed to the late pod since its page count on top of it (fail-open: the load
    // it must have gained from this gateway is estimated, not ignored).
    s.cancel(d.ticket, later);
    let only_late = [addr(0)];
    let req = RequestContext::new("m", 10).with_subset(Some(&only_late[..]));
    let first = s.pick(&req, later, &mut rng(2)).unwrap();
    assert_eq!(first.endpoints.as_slice(), &[addr(0)]);
    let (_, ex) = s.pick_explained(&req, later, &mut rng(3));
    assert_eq!(ex.candidates[0].waiting, 4.0, "3 scraped + 1 routed since");
}

#[test]
fn a_failed_pod_leaves_the_candidates_at_once_however_recent_its_page() {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    s.set_scrape_state(addr(0), ScrapeState::Failed).unwrap();
    // Its page is from T0 itself: fresh by age, out by state.
    for seed in 0..10 {
        let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(seed));
        let d = d.unwrap();
        assert_eq!(d.endpoints.as_slice(), &[addr(1)]);
        assert_eq!(
            ex.filtered,
            vec![FilteredOut {
                addr: addr(0),
                filter: "freshness"
            }]
        );
        s.cancel(d.ticket, T0);
    }
    // Both failed: 503 with Retry-After, as for stale pods.
    s.set_scrape_state(addr(1), ScrapeState::Failed).unwrap();
    assert_eq!(
        s.pick(&RequestContext::new("m", 10), T0, &mut rng(1))
            .unwrap_err(),
        Rejection::Unavailable {
            retry_after: Duration::from_secs(1)
        }
    );
    // Its next page readmits it.
    s.apply_metrics(addr(0), snapshot(T0, 0, 0.1)).unwrap();
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.as_slice(), &[addr(0)]);
    assert!(matches!(
        s.set_scrape_state(addr(7), ScrapeState::Late),
        Err(Error::UnknownEndpoint(_))
    ));
}

#[test]
fn forgotten_rates_let_a_restarted_pod_be_picked_again() {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    let t = |ms: u64| T0.saturating_add(Duration::from_millis(ms));
    // Pod 0 teaches a very slow prefill (its last requests before it died), pod 1 a fast one.
    for (pod, ttft_ms) in [(0u32, 2_000u64), (1, 20)] {
        let only = [addr(pod)];
        let req = RequestContext::new("m", 100).with_subset(Some(&only[..]));
        for i in 0..5 {
            let start = t(i * 3_000);
            s.apply_metrics(addr(pod), snapshot(start, 0, 0.0)).unwrap();
            let d = s.pick(&req, start, &mut rng(i)).unwrap();
            assert!(s.first_token(
                d.ticket,
                start.saturating_add(Duration::from_millis(ttft_ms))
            ));
            let usage = Usage {
                prompt_tokens: 100,
                cached_tokens: 0,
                output_tokens: 10,
            };
            assert!(s.complete(
                d.ticket,
                start.saturating_add(Duration::from_secs(1)),
                usage
            ));
        }
    }
    let now = t(20_000);
    for i in 0..2 {
        s.apply_metrics(addr(i), snapshot(now, 0, 0.0)).unwrap();
    }
    let slow = s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec.unwrap();
    let fast = s.endpoint(addr(1)).unwrap().prefill_tokens_per_sec.unwrap();
    assert!(fast > 50.0 * slow, "{slow} vs {fast}");
    // Idle pods, two requests at once: the slow-looking pod loses both.
    let pair = |s: &mut Scheduler| -> Vec<SocketAddr> {
        let a = s
            .pick(&RequestContext::new("m", 100), now, &mut rng(9))
            .unwrap();
        let b = s
            .pick(&RequestContext::new("m", 100), now, &mut rng(10))
            .unwrap();
        let out = vec![a.endpoints.first(), b.endpoints.first()];
        s.cancel(a.ticket, now);
        s.cancel(b.ticket, now);
        out
    };
    assert_eq!(pair(&mut s), vec![addr(1), addr(1)]);
    // The pod restarted: its rates are forgotten, the pool's prior applies, and a pair splits.
    assert!(s.forget_learned_rates(addr(0)));
    assert_eq!(s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec, None);
    assert_eq!(s.endpoint(addr(0)).unwrap().rate_samples, 0);
    let mut got = pair(&mut s);
    got.sort();
    assert_eq!(got, vec![addr(0), addr(1)]);
    assert!(!s.forget_learned_rates(addr(7)));
}

#[test]
fn an_adapter_running_on_one_pod_outweighs_a_faster_pod_that_must_load_it() {
    let t = |ms: u64| T0.saturating_add(Duration::from_millis(ms));
    let run = |load_ms: f64| -> Vec<SocketAddr> {
        let mut cfg = SchedulerConfig::default();
        cfg.rates.lora_load_ms = load_ms;
        let mut s = Scheduler::new(cfg).unwrap();
        let snap = |s: &mut Scheduler, at| {
            let mut a = with_lora(0, 2, &["lora-a"], &[]);
            a.sampled_at = at;
            let mut b = with_lora(0, 2, &[], &[]);
            b.sampled_at = at;
            s.apply_metrics(addr(0), a).unwrap();
            s.apply_metrics(addr(1), b).unwrap();
        };
        s.upsert_endpoint(meta(0));
        s.upsert_endpoint(meta(1));
        // Pod 0 (running the adapter) learned a prefill half as fast as pod 1's: 40 vs 20 ms
        // to a first token for 100 tokens. Both idle.
        for (pod, ttft_ms) in [(0u32, 40u64), (1, 20)] {
            let only = [addr(pod)];
            let req = RequestContext::new("m", 100).with_subset(Some(&only[..]));
            for i in 0..3 {
                let start = t(i * 1_000);
                snap(&mut s, start);
                let d = s.pick(&req, start, &mut rng(i)).unwrap();
                assert!(s.first_token(
                    d.ticket,
                    start.saturating_add(Duration::from_millis(ttft_ms))
                ));
                let usage = Usage {
                    prompt_tokens: 100,
                    cached_tokens: 0,
                    output_tokens: 4,
                };
                assert!(s.complete(
                    d.ticket,
                    start.saturating_add(Duration::from_millis(100)),
                    usage
                ));
            }
        }
        let now = t(5_000);
        snap(&mut s, now);
        (0..10)
            .map(|seed| {
                let req = RequestContext::new("m", 5).with_lora(Some("lora-a"));
                let d = s.pick(&req, now, &mut rng(seed)).unwrap();
                s.cancel(d.ticket, now);
                d.endpoints.first()
            })
            .collect()
    };
    // Counting the adapter load (50 ms by default) on the pod that must load it: the pod that
    // runs it wins every time.
    assert_eq!(run(50.0), vec![addr(0); 10]);
    // Without it, it still does: pod 1's free slot is the pool's last, and taking it is charged a
    // request's lifetime (`the_last_free_adapter_slot_is_kept_for_an_adapter_running_nowhere`).
    // Before that charge, a few milliseconds of learned speed outweighed the affinity here.
    assert_eq!(run(0.0), vec![addr(0); 10]);
}

/// A pod that reports no LoRA state (a vLLM pod whose engine has run no step yet shows none)
/// does not draw an adapter's requests from the pod running it: it is charged the adapter's load,
/// as a pod with a free slot is. Seen on two real vLLM instances: the idle one without LoRA
/// state took the first `lora-a` request (1.2 ms against the running pod's 26.3 ms estimate).
#[test]
fn a_pod_without_lora_state_is_charged_the_load_when_another_runs_the_adapter() {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    let mut running = with_lora(0, 2, &["lora-a"], &[]);
    running.running = 2;
    add_endpoint(&mut s, 0, running);
    add_endpoint(&mut s, 1, snapshot(T0, 0, 0.1));
    let req = RequestContext::new("m", 5).with_lora(Some("lora-a"));
    for seed in 0..10 {
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        s.cancel(d.ticket, T0);
        assert_eq!(d.endpoints.first(), addr(0), "seed {seed}");
    }
    // With no pod running the adapter, the pod without LoRA state is charged nothing more than
    // any other: the idle one is taken.
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    let mut busy = with_lora(0, 2, &[], &[]);
    busy.running = 2;
    add_endpoint(&mut s, 0, busy);
    add_endpoint(&mut s, 1, snapshot(T0, 0, 0.1));
    let d = s.pick(&req, T0, &mut rng(0)).unwrap();
    assert_eq!(d.endpoints.first(), addr(1));
}

/// The first choice for a request for `lora-a`, and its explanation, on pods with the given LoRA
/// state and scraped queue depth (default configuration: no rates learned).
fn lora_pick(pods: &[(u32, &[&str], &[&str])], seed: u64) -> (SocketAddr, Explanation) {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    for (i, &(waiting, running, queued)) in pods.iter().enumerate() {
        add_endpoint(&mut s, i as u32, with_lora(waiting, 2, running, queued));
    }
    let req = RequestContext::new("m", 300).with_lora(Some("lora-a"));
    let (d, ex) = s.pick_explained(&req, T0, &mut rng(seed));
    (d.unwrap().endpoints.first(), ex)
}

fn est_wait(ex: &Explanation, pod: u32) -> f64 {
    ex.candidates
        .iter()
        .find(|c| c.addr == addr(pod))
        .map(|c| c.estimated_wait_secs)
        .unwrap()
}

#[test]
fn the_last_free_adapter_slot_is_kept_for_an_adapter_running_nowhere() {
    // Pod 0 runs lora-a (and lora-b) with three requests queued; pod 1 runs lora-c and has the
    // pool's only free slot. Taking it would leave no slot for the next adapter that runs
    // nowhere: it costs a typical request's lifetime, far more than pod 0's queue.
    let pods: [(u32, &[&str], &[&str]); 2] =
        [(3, &["lora-a", "lora-b"], &[]), (0, &["lora-c"], &[])];
    for seed in 0..10 {
        let (first, ex) = lora_pick(&pods, seed);
        assert_eq!(first, addr(0), "seed {seed}");
        assert!(est_wait(&ex, 1) > 5.0, "{}", ex.summary(2));
        assert!(est_wait(&ex, 0) < 1.0, "{}", ex.summary(2));
    }
}

#[test]
fn an_adapter_spreads_to_one_of_many_free_slots_when_its_pod_is_busy() {
    // Pod 0 runs lora-a with eight requests queued; pods 1-4 are empty. One of four free slots
    // costs a sixteenth of a lifetime: less than pod 0's queue, so the adapter spreads.
    let pods: [(u32, &[&str], &[&str]); 5] = [
        (8, &["lora-a"], &[]),
        (0, &[], &[]),
        (0, &[], &[]),
        (0, &[], &[]),
        (0, &[], &[]),
    ];
    for seed in 0..10 {
        let (first, ex) = lora_pick(&pods, seed);
        assert_ne!(first, addr(0), "seed {seed}: {}", ex.summary(5));
    }
}

#[test]
fn a_running_adapter_leaves_the_pod_where_another_waits_for_its_slot() {
    // Pod 0 runs lora-a and lora-b while lora-c waits there for a slot; pod 1 runs lora-a with a
    // longer queue. Another lora-a request on pod 0 keeps lora-c's slot taken about one more
    // request's lifetime: it goes to pod 1.
    let pods: [(u32, &[&str], &[&str]); 2] = [
        (1, &["lora-a", "lora-b"], &["lora-c"]),
        (3, &["lora-a"], &[]),
    ];
    for seed in 0..10 {
        let (first, ex) = lora_pick(&pods, seed);
        assert_eq!(first, addr(1), "seed {seed}: {}", ex.summary(2));
        assert!(est_wait(&ex, 0) > 5.0, "{}", ex.summary(2));
    }
}

/// Picks `n` requests for `adapter` (all land on the one pod that runs it) and leaves them in
/// flight.
fn route(s: &mut Scheduler, adapter: &str, n: u64) {
    for i in 0..n {
        let req = RequestContext::new("m", 300).with_lora(Some(adapter));
        s.pick(&req, T0, &mut rng(i)).unwrap();
    }
}

/// The first choice for a request for `lora-a`, which runs nowhere and finds no free slot, after
/// `routed` requests per adapter, and its explanation.
fn blocked_pick(
    pods: &[(&[&str], &[&str])],
    routed: &[(&str, u64)],
    seed: u64,
) -> (SocketAddr, Explanation) {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    for (i, &(running, queued)) in pods.iter().enumerate() {
        add_endpoint(&mut s, i as u32, with_lora(0, 2, running, queued));
    }
    for &(adapter, n) in routed {
        route(&mut s, adapter, n);
    }
    let req = RequestContext::new("m", 300).with_lora(Some("lora-a"));
    let (d, ex) = s.pick_explained(&req, T0, &mut rng(seed));
    (d.unwrap().endpoints.first(), ex)
}

#[test]
fn a_request_for_a_slot_goes_where_a_running_adapter_has_the_fewest_requests_left() {
    // No pod can take lora-a without a slot freeing. Pod 0 has four of this gateway's requests in
    // flight, two per adapter; pod 1 six, but only one for lora-e, whose slot frees first: the
    // request goes there, though pod 0's queue is shorter.
    let pods: [(&[&str], &[&str]); 2] =
        [(&["lora-b", "lora-c"], &[]), (&["lora-d", "lora-e"], &[])];
    let routed = [("lora-b", 2), ("lora-c", 2), ("lora-d", 5), ("lora-e", 1)];
    for seed in 0..10 {
        let (first, ex) = blocked_pick(&pods, &routed, seed);
        assert!(ex.fell_back_to_all_ready, "{}", ex.summary(2));
        assert_eq!(first, addr(1), "seed {seed}: {}", ex.summary(2));
    }
    // A running adapter with none of this gateway's requests left frees its slot at once.
    let routed = [("lora-b", 2), ("lora-c", 2), ("lora-d", 5)];
    let (first, ex) = blocked_pick(&pods, &routed, 0);
    assert_eq!(first, addr(1), "{}", ex.summary(2));
    assert!(est_wait(&ex, 1) < 1.0, "{}", ex.summary(2));
    assert!(est_wait(&ex, 0) > 3.0, "{}", ex.summary(2));
}

#[test]
fn a_request_for_a_slot_queues_behind_an_adapter_already_waiting_there() {
    // Pod 0's lora-b has one request left, but lora-x already waits there and takes that slot:
    // lora-a would need the next one, lora-c's (three left). Pod 1's adapters have two each.
    let pods: [(&[&str], &[&str]); 2] = [
        (&["lora-b", "lora-c"], &["lora-x"]),
        (&["lora-d", "lora-e"], &[]),
    ];
    let routed = [("lora-b", 1), ("lora-c", 3), ("lora-d", 2), ("lora-e", 2)];
    for seed in 0..10 {
        let (first, ex) = blocked_pick(&pods, &routed, seed);
        assert_eq!(first, addr(1), "seed {seed}: {}", ex.summary(2));
    }
}

#[test]
fn adapters_sent_since_the_page_take_its_free_slot() {
    // Pod 0's page shows lora-b running and one slot free; pod 1's shows lora-d and lora-e (no
    // slot free), with none of this gateway's lora-e requests left: that slot frees at once.
    // lora-c is then sent to pod 0 and takes its free slot before any new page says so. A request
    // for lora-a must not see that slot as free: pod 0 now holds lora-b and lora-c, both busy,
    // and lora-a goes where a slot frees first, pod 1.
    let pods: [(&[&str], &[&str]); 2] = [(&["lora-b"], &[]), (&["lora-d", "lora-e"], &[])];
    let routed = [("lora-b", 3), ("lora-c", 1), ("lora-d", 2)];
    for seed in 0..10 {
        let (first, ex) = blocked_pick(&pods, &routed, seed);
        assert!(ex.fell_back_to_all_ready, "{}", ex.summary(2));
        assert_eq!(first, addr(1), "seed {seed}: {}", ex.summary(2));
        assert!(est_wait(&ex, 0) > 2.0, "{}", ex.summary(2));
    }
}
