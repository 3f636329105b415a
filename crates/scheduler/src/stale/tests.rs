use std::time::Duration;

use crate::fixtures::*;
use crate::*;

fn cfg(mode: StaleMode, cap: u32) -> SchedulerConfig {
    SchedulerConfig {
        stale_metrics: StaleMetrics {
            mode,
            max_inflight_per_endpoint: cap,
        },
        ..SchedulerConfig::default()
    }
}

/// `n` pods whose scrapes now fail, `reachable[i]` saying whether they still reach the server.
fn failing(mode: StaleMode, cap: u32, reachable: &[bool]) -> Scheduler {
    let n = u32::try_from(reachable.len()).unwrap();
    let mut s = scheduler(cfg(mode, cap), n);
    for (i, r) in reachable.iter().enumerate() {
        let a = addr(u32::try_from(i).unwrap());
        s.set_scrape_state(a, ScrapeState::Failed).unwrap();
        s.set_reachable(a, *r).unwrap();
    }
    s
}

#[test]
fn fail_open_dispatches_least_in_flight_up_to_the_cap_then_sheds() {
    let mut s = failing(StaleMode::FailOpen, 3, &[true, true]);
    let mut tickets = Vec::new();
    for i in 0..6 {
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(i))
            .unwrap();
        assert!(d.fail_open);
        tickets.push(d);
    }
    let on = |i| {
        tickets
            .iter()
            .filter(|d| d.endpoints.first() == addr(i))
            .count()
    };
    assert_eq!((on(0), on(1)), (3, 3));
    for i in 0..2 {
        assert_eq!(s.endpoint(addr(i)).unwrap().inflight, 3);
    }
    // Both at the cap: the seventh is shed (429 with Retry-After), not sent.
    let (r, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(9));
    assert_eq!(
        r.unwrap_err(),
        Rejection::Shed {
            retry_after: Duration::from_secs(1)
        }
    );
    assert!(ex.fail_open);
    assert!(ex.summary(8).contains(" fail_open"), "{}", ex.summary(8));
    assert_eq!(
        ex.filtered
            .iter()
            .filter(|f| f.filter == "stale-metrics-cap")
            .count(),
        2
    );
    // One completes: exactly one more fits, on the pod it freed.
    let done = tickets.remove(0);
    let freed = done.endpoints.first();
    assert!(s.complete(done.ticket, T0, Usage::default()));
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(10))
        .unwrap();
    assert_eq!(d.endpoints.first(), freed);
    assert!(
        s.pick(&RequestContext::new("m", 10), T0, &mut rng(11))
            .is_err()
    );
}

#[test]
fn an_explained_fail_open_pick_lists_the_pods_it_ranked_not_as_filtered() {
    let mut s = failing(StaleMode::FailOpen, 3, &[true, true]);
    let first = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(1))
        .unwrap();
    let (r, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(2));
    let d = r.unwrap();
    assert_ne!(d.endpoints.first(), first.endpoints.first());
    let line = ex.summary(8);
    assert!(line.contains(" fail_open"), "{line}");
    // The freshness filter removed both; fail-open took both back.
    assert!(ex.filtered.is_empty(), "{line}");
    assert!(!line.contains("filtered="), "{line}");
    assert_eq!(ex.candidates.len(), 2, "{line}");
    assert!(
        ex.candidates
            .iter()
            .all(|c| c.fail_open && c.scores.is_empty() && c.scrape == ScrapeState::Failed)
    );
    // Ranked on this gateway's requests in flight: the page's numbers are not shown.
    assert!(
        line.contains(" inflight=0 ") && line.contains(" inflight=1 "),
        "{line}"
    );
    assert!(
        !line.contains("est_wait_ms") && !line.contains("waiting="),
        "{line}"
    );
    let json = serde_json::to_value(&ex).unwrap();
    assert_eq!(json["candidates"][0]["fail_open"], true, "{json}");
}

#[test]
fn unreachable_pods_stay_removed_and_fail_closed_is_503() {
    // One pod answers, one does not: only the first is routed, with no fallback to the other.
    let mut s = failing(StaleMode::FailOpen, 8, &[false, true]);
    for i in 0..5 {
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(i))
            .unwrap();
        assert_eq!(d.endpoints.as_slice(), &[addr(1)]);
    }
    // None answers: 503 as before.
    let mut s = failing(StaleMode::FailOpen, 8, &[false, false]);
    assert!(matches!(
        s.pick(&RequestContext::new("m", 10), T0, &mut rng(1)),
        Err(Rejection::Unavailable { .. })
    ));
    // Fail-closed: reachable or not, 503.
    let mut s = failing(StaleMode::FailClosed, 8, &[true, true]);
    let (r, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    assert!(matches!(r, Err(Rejection::Unavailable { .. })), "{r:?}");
    assert!(!ex.fail_open);
}

#[test]
fn a_fresh_pod_is_preferred_and_fail_open_needs_every_pod_stale() {
    let mut s = failing(StaleMode::FailOpen, 8, &[true, true]);
    // Pod 0 recovers: its page makes it the only candidate, and the pick is not fail-open.
    s.apply_metrics(addr(0), snapshot(T0, 0, 0.1)).unwrap();
    for i in 0..5 {
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(i))
            .unwrap();
        assert!(!d.fail_open);
        assert_eq!(d.endpoints.as_slice(), &[addr(0)]);
    }
    // An ok pod whose page merely aged (the scraper said nothing) is not known to answer:
    // the fail-open set is the reachable failed pods only.
    let later = T0.saturating_add(Duration::from_secs(60));
    let d = s
        .pick(&RequestContext::new("m", 10), later, &mut rng(7))
        .unwrap();
    assert!(d.fail_open);
    assert_eq!(d.endpoints.as_slice(), &[addr(1)]);
}

#[test]
fn ties_go_to_the_pod_running_the_adapter_on_its_last_page() {
    let mut s = scheduler(cfg(StaleMode::FailOpen, 8), 0);
    add_endpoint(&mut s, 0, with_lora(0, 2, &[], &[]));
    add_endpoint(&mut s, 1, with_lora(0, 2, &["sql"], &[]));
    for i in 0..2 {
        s.set_scrape_state(addr(i), ScrapeState::Failed).unwrap();
        s.set_reachable(addr(i), true).unwrap();
    }
    let cx = RequestContext::new("m", 10).with_lora(Some("sql"));
    let first = s.pick(&cx, T0, &mut rng(1)).unwrap();
    assert_eq!(first.endpoints.first(), addr(1));
    // Least in flight still comes first: the next goes to the idle pod.
    let second = s.pick(&cx, T0, &mut rng(2)).unwrap();
    assert_eq!(second.endpoints.first(), addr(0));
}

#[test]
fn the_setting_reads_and_validates() {
    let c: SchedulerConfig = serde_yaml::from_str(
        "preset: infergate\nstaleMetrics: { mode: failClosed, maxInflightPerEndpoint: 4 }\n",
    )
    .unwrap();
    assert_eq!(c.stale_metrics.fail_open_cap(), None);
    assert_eq!(c.stale_metrics.max_inflight_per_endpoint, 4);
    let d = SchedulerConfig::default();
    assert_eq!(d.stale_metrics.fail_open_cap(), Some(32));
    let bad = SchedulerConfig {
        stale_metrics: StaleMetrics {
            mode: StaleMode::FailOpen,
            max_inflight_per_endpoint: 0,
        },
        ..SchedulerConfig::default()
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("staleMetrics.maxInflightPerEndpoint"), "{e}");
    let back: SchedulerConfig = serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn when_every_fresh_pod_would_shed_a_reachable_failed_pod_takes_the_request() {
    // Pod 0 answers its scrapes and is overloaded (KV full, a long queue); pod 1's scrapes fail
    // while it still answers. Shedding would turn away a request that pod 1 may well serve.
    let overloaded = |s: &mut Scheduler| {
        s.apply_metrics(addr(0), snapshot(T0, 70, 0.995)).unwrap();
    };
    let mut s = failing(StaleMode::FailOpen, 2, &[true, true]);
    overloaded(&mut s);
    let (r, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    let d = r.unwrap();
    assert!(d.fail_open);
    assert_eq!(d.endpoints.as_slice(), &[addr(1)]);
    // The record says what happened: the fresh pod would have shed it, the pod without a page
    // took it on its in-flight count.
    let line = ex.summary(8);
    assert!(line.contains(" fail_open"), "{line}");
    assert_eq!(
        ex.filtered,
        vec![FilteredOut {
            addr: addr(0),
            filter: "admission"
        }],
        "{line}"
    );
    assert!(
        line.contains(&format!(" filtered={}:admission ", addr(0))),
        "{line}"
    );
    assert_eq!(ex.candidates.len(), 1, "{line}");
    assert!(ex.candidates[0].fail_open && ex.candidates[0].addr == addr(1));
    assert!(
        line.contains(&format!(
            "{} total=0.250 inflight=0 prefix_blocks=0 scrape=failed",
            addr(1)
        )),
        "{line}"
    );
    // Up to the cap; then shed as before, with the fresh pods' drain time.
    assert!(
        s.pick(&RequestContext::new("m", 10), T0, &mut rng(2))
            .is_ok()
    );
    let r = s.pick(&RequestContext::new("m", 10), T0, &mut rng(3));
    assert!(
        matches!(r, Err(Rejection::Shed { retry_after }) if retry_after > Duration::from_secs(1)),
        "{r:?}"
    );

    // The pod that fails its scrapes does not answer either: shed.
    let mut s = failing(StaleMode::FailOpen, 2, &[true, false]);
    overloaded(&mut s);
    let r = s.pick(&RequestContext::new("m", 10), T0, &mut rng(1));
    assert!(matches!(r, Err(Rejection::Shed { .. })), "{r:?}");
    // Fail-closed: shed.
    let mut s = failing(StaleMode::FailClosed, 2, &[true, true]);
    overloaded(&mut s);
    let r = s.pick(&RequestContext::new("m", 10), T0, &mut rng(1));
    assert!(matches!(r, Err(Rejection::Shed { .. })), "{r:?}");
    // A caller that queues (flow control) waits for a pod with headroom instead.
    let mut s = failing(StaleMode::FailOpen, 2, &[true, true]);
    overloaded(&mut s);
    let cx = RequestContext::new("m", 10).with_queueing(true);
    let r = s.pick(&cx, T0, &mut rng(1));
    assert!(matches!(r, Err(Rejection::Shed { .. })), "{r:?}");
    // A fresh pod with headroom: routed there, not fail-open.
    let mut s = failing(StaleMode::FailOpen, 2, &[true, true]);
    s.apply_metrics(addr(0), snapshot(T0, 0, 0.2)).unwrap();
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(1))
        .unwrap();
    assert!(!d.fail_open);
    assert_eq!(d.endpoints.as_slice(), &[addr(0)]);
}
