use std::collections::BTreeMap;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::config::{Preset, Thresholds, Weights};
use crate::endpoint::{EngineType, LoraState};
use crate::filter::lora_affinity;
use crate::state::adapter_hash;

fn addr(i: u32) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8000 + i as u16))
}

fn meta(i: u32) -> EndpointMeta {
    EndpointMeta {
        namespace: "ns".into(),
        pod: format!("pod-{i}"),
        addr: addr(i),
        engine: EngineType::Vllm,
        gpu: None,
        labels: BTreeMap::new(),
    }
}

fn snap(t: Timestamp, waiting: u32, kv: f64) -> MetricsSnapshot {
    MetricsSnapshot {
        sampled_at: t,
        waiting,
        running: 0,
        kv_cache_usage: Some(kv),
        ..MetricsSnapshot::default()
    }
}

const T0: Timestamp = Timestamp::from_millis(10_000);

fn pool(cfg: SchedulerConfig, n: u32) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    for i in 0..n {
        s.upsert_endpoint(meta(i));
        s.apply_metrics(addr(i), snap(T0, 0, 0.1)).unwrap();
    }
    s
}

fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

fn weights_only(w: Weights) -> SchedulerConfig {
    SchedulerConfig {
        weights: w,
        ..SchedulerConfig::default()
    }
}

#[test]
fn empty_pool_rejects_with_503() {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    let err = s
        .pick(&RequestContext::new("m", 10), Timestamp::ZERO, &mut rng(1))
        .unwrap_err();
    assert_eq!(err, Rejection::NoEndpoints);
    assert_eq!(err.http_status(), 503);
    assert_eq!(err.metric_label(), "no_endpoints");
}

#[test]
fn returns_k_distinct_endpoints_with_the_ticket_on_the_first() {
    let mut s = pool(SchedulerConfig::default(), 5);
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(2))
        .unwrap();
    assert_eq!(d.endpoints.len(), 3);
    let v = d.endpoints.as_slice();
    assert!(v[0] != v[1] && v[1] != v[2] && v[0] != v[2]);
    assert_eq!(s.endpoint(d.endpoints.first()).unwrap().inflight, 1);
    assert_eq!(s.inflight(), 1);
    let header = d.endpoints.to_string();
    assert_eq!(header.split(',').count(), 3);
    assert!(header.starts_with(&v[0].to_string()));
}

#[test]
fn tickets_release_exactly_once() {
    let mut s = pool(SchedulerConfig::default(), 2);
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(3))
        .unwrap();
    assert!(s.first_token(d.ticket, T0));
    assert!(!s.first_token(d.ticket, T0), "first token twice");
    assert!(s.cancel(d.ticket, T0));
    assert!(!s.cancel(d.ticket, T0));
    assert!(!s.fail(d.ticket, T0));
    assert!(!s.complete(d.ticket, T0, Usage::default()));
    assert_eq!(s.inflight(), 0);
    let e = s.endpoint(d.endpoints.first()).unwrap();
    assert_eq!((e.inflight, e.awaiting_first_token), (0, 0));
    // A recycled entry gets a new generation: the old ticket stays dead.
    let d2 = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(4))
        .unwrap();
    assert_ne!(d.ticket, d2.ticket);
    assert!(!s.complete(d.ticket, T0, Usage::default()));
    assert_eq!(s.inflight(), 1);
}

#[test]
fn removed_endpoint_tickets_are_harmless() {
    let mut s = pool(SchedulerConfig::default(), 2);
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(5))
        .unwrap();
    assert!(s.remove_endpoint(d.endpoints.first()));
    assert!(!s.remove_endpoint(d.endpoints.first()));
    s.upsert_endpoint(meta(9));
    assert!(s.complete(d.ticket, T0, Usage::default()));
    assert_eq!(s.inflight(), 0);
    assert_eq!(s.endpoint(addr(9)).unwrap().inflight, 0);
}

#[test]
fn reassign_moves_the_charge() {
    let mut s = pool(SchedulerConfig::default(), 3);
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(6))
        .unwrap();
    let fb = d.endpoints.as_slice()[1];
    assert!(s.reassign(d.ticket, fb));
    assert_eq!(s.endpoint(d.endpoints.first()).unwrap().inflight, 0);
    assert_eq!(s.endpoint(fb).unwrap().inflight, 1);
    assert!(s.fail(d.ticket, T0));
    assert_eq!(s.endpoint(fb).unwrap().inflight, 0);
    assert!(!s.reassign(d.ticket, fb));
}

#[test]
fn lora_resident_pod_is_preferred_over_an_equal_one() {
    for seed in 0..50 {
        let mut s = pool(SchedulerConfig::default(), 2);
        let mut m = snap(T0, 0, 0.1);
        m.lora = Some(LoraState {
            max_lora: 1,
            running: vec!["sql".into()],
            waiting: vec![],
        });
        s.apply_metrics(addr(1), m.clone()).unwrap();
        m.lora = Some(LoraState {
            max_lora: 1,
            running: vec!["other".into()],
            waiting: vec![],
        });
        s.apply_metrics(addr(0), m).unwrap();
        let req = RequestContext::new("m", 10).with_lora(Some("sql"));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.first(), addr(1), "seed {seed}");
    }
}

fn with_lora(waiting: u32, max: u32, running: &[&str], queued: &[&str]) -> MetricsSnapshot {
    let mut m = snap(T0, waiting, 0.1);
    m.lora = Some(LoraState {
        max_lora: max,
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: queued.iter().map(|s| s.to_string()).collect(),
    });
    m
}

#[test]
fn a_running_adapter_drains_from_the_pod_where_another_waits_for_its_slot() {
    for seed in 0..50 {
        let mut s = pool(SchedulerConfig::default(), 2);
        // Both run `sql` in their one slot; on pod 0 `legal` waits for that slot.
        s.apply_metrics(addr(0), with_lora(0, 1, &["sql"], &["sql", "legal"]))
            .unwrap();
        s.apply_metrics(addr(1), with_lora(0, 1, &["sql"], &["sql"]))
            .unwrap();
        let req = RequestContext::new("m", 10).with_lora(Some("sql"));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.first(), addr(1), "seed {seed}");
        // `legal` itself still goes where it already waits.
        let req = RequestContext::new("m", 10).with_lora(Some("legal"));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.first(), addr(0), "seed {seed}");
    }
}

#[test]
fn a_running_adapter_is_not_spread_into_free_slots_for_a_small_queue_difference() {
    let cfg = weights_only(Weights {
        queue: 1.0,
        lora_affinity: 2.0,
        ..Weights::default()
    });
    for seed in 0..20 {
        let mut s = pool(cfg.clone(), 2);
        // Pod 0 runs `sql` with a short queue; pod 1 is idle with a free slot.
        s.apply_metrics(addr(0), with_lora(3, 2, &["sql"], &["sql"]))
            .unwrap();
        s.apply_metrics(addr(1), with_lora(0, 2, &["chat"], &["chat"]))
            .unwrap();
        let req = RequestContext::new("m", 10).with_lora(Some("sql"));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.first(), addr(0), "seed {seed}");
        // An adapter that runs nowhere takes the free slot.
        let req = RequestContext::new("m", 10).with_lora(Some("code"));
        let d = s.pick(&req, T0, &mut rng(seed)).unwrap();
        assert_eq!(d.endpoints.first(), addr(1), "seed {seed}");
    }
}

#[test]
fn lora_affinity_levels() {
    let l = |max, run: &[&str], wait: &[&str]| LoraState {
        max_lora: max,
        running: run.iter().map(|s| s.to_string()).collect(),
        waiting: wait.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(lora_affinity(&l(2, &["a"], &["a"]), "a"), 1.0);
    assert_eq!(lora_affinity(&l(2, &["b"], &["b"]), "a"), 0.8);
    assert_eq!(lora_affinity(&l(1, &["b"], &["b", "a"]), "a"), 0.6);
    assert_eq!(lora_affinity(&l(1, &["b"], &[]), "a"), 0.0);
    // A repeated name is one adapter: one of two slots is still free.
    assert_eq!(lora_affinity(&l(2, &["b", "b"], &[]), "a"), 0.8);
    assert_eq!(lora_affinity(&l(2, &["b", "c", "b"], &["c"]), "a"), 0.0);
    // Running, but another adapter waits for this pod's only slot: let this one drain here.
    assert_eq!(lora_affinity(&l(1, &["b"], &["b", "a"]), "b"), 0.5);
    assert_eq!(
        lora_affinity(&l(2, &["a", "b"], &["a", "b", "c"]), "a"),
        0.5
    );
    // Waiting with a slot still free is loading, not blocked.
    assert_eq!(
        lora_affinity(&l(3, &["a", "b"], &["a", "b", "c"]), "a"),
        1.0
    );
    // The pre-hashed hot path agrees with the names, inline and overflowing.
    let many: Vec<String> = (0..12).map(|i| format!("x{i}")).collect();
    let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
    for state in [
        l(2, &["a"], &["a"]),
        l(2, &["b"], &["b"]),
        l(1, &["b"], &["b", "a"]),
        l(1, &["b"], &[]),
        l(2, &["b", "b"], &[]),
        l(2, &["a", "b"], &["a", "b", "c"]),
        l(3, &["a", "b"], &["a", "b", "c"]),
        l(20, &many, &["a"]),
        l(12, &many, &["a"]),
    ] {
        let mut ep = crate::state::EndpointState::new(meta(0));
        ep.set_metrics(MetricsSnapshot {
            lora: Some(state.clone()),
            ..MetricsSnapshot::default()
        });
        for name in ["a", "b", "x3", "zz"] {
            assert_eq!(
                ep.lora_affinity(name, adapter_hash(name)),
                Some(lora_affinity(&state, name)),
                "{state:?} {name}"
            );
        }
    }
}

#[test]
fn stale_pod_is_excluded_and_readmitted() {
    let cfg = SchedulerConfig {
        on_all_filtered: AllFilteredAction::Reject,
        ..SchedulerConfig::default()
    };
    let mut s = pool(cfg, 2);
    let later = T0.saturating_add(Duration::from_secs(5));
    s.apply_metrics(addr(0), snap(later, 0, 0.1)).unwrap();
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
    s.apply_metrics(addr(1), snap(later, 0, 0.1)).unwrap();
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
    let mut s = pool(SchedulerConfig::default(), 3);
    let later = T0.saturating_add(Duration::from_secs(60));
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), later, &mut rng(1));
    assert!(matches!(d, Err(Rejection::Unavailable { .. })), "{d:?}");
    assert!(!ex.fell_back_to_all_ready);
    assert_eq!(ex.filtered.len(), 3);
    assert_eq!(ex.rejection, Some("no_fresh_endpoints"));
    assert_eq!(ex.retry_after_secs, Some(1));
    // One pod back: it alone is routed to.
    s.apply_metrics(addr(2), snap(later, 0, 0.1)).unwrap();
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
        ..snap(t, 0, 0.1)
    };
    let mut s = pool(SchedulerConfig::default(), 3);
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
    let mut s = pool(
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
    let mut s = pool(SchedulerConfig::default(), 5);
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

fn prompt_text(tag: &str) -> String {
    format!("{tag}: ").repeat(200)
}

#[test]
fn a_prompt_is_routed_to_the_same_pod_next_time() {
    for preset in [Preset::Infergate, Preset::GieDefault] {
        for seed in 0..10 {
            let mut s = pool(SchedulerConfig::preset(preset), 4);
            let text = prompt_text(&format!("conversation {seed}"));
            let segs = ["user", text.as_str()];
            let req = RequestContext::new("m", 500).with_prompt(&segs);
            let d1 = s.pick(&req, T0, &mut rng(seed)).unwrap();
            s.first_token(d1.ticket, T0);
            s.complete(d1.ticket, T0, Usage::default());
            // Follow-up turn: same prefix plus more text.
            let more = format!("{text} and a follow-up question");
            let segs2 = ["user", more.as_str()];
            let req2 = RequestContext::new("m", 520).with_prompt(&segs2);
            let (d2, ex) = s.pick_explained(&req2, T0, &mut rng(seed + 100));
            assert_eq!(
                d2.unwrap().endpoints.first(),
                d1.endpoints.first(),
                "{preset} seed {seed}: {ex:#?}"
            );
        }
    }
}

#[test]
fn prefix_affinity_yields_when_the_pod_is_overloaded() {
    let mut s = pool(SchedulerConfig::default(), 2);
    let text = prompt_text("shared");
    let segs = [text.as_str()];
    let req = RequestContext::new("m", 500).with_prompt(&segs);
    let d1 = s.pick(&req, T0, &mut rng(1)).unwrap();
    s.cancel(d1.ticket, T0);
    let hot = d1.endpoints.first();
    s.apply_metrics(hot, snap(T0, 40, 0.5)).unwrap();
    let d2 = s.pick(&req, T0, &mut rng(2)).unwrap();
    assert_ne!(d2.endpoints.first(), hot);
}

#[test]
fn picks_between_two_scrapes_do_not_pile_onto_one_pod() {
    for seed in 0..20 {
        let mut s = pool(SchedulerConfig::default(), 4);
        let mut firsts = Vec::new();
        for i in 0..4 {
            let d = s
                .pick(&RequestContext::new("m", 300), T0, &mut rng(seed * 10 + i))
                .unwrap();
            firsts.push(d.endpoints.first());
        }
        firsts.sort();
        firsts.dedup();
        assert_eq!(
            firsts.len(),
            4,
            "seed {seed}: four picks spread over four pods"
        );
    }
}

#[test]
fn a_new_scrape_replaces_routed_since_scrape_counts() {
    let mut s = pool(SchedulerConfig::default(), 1);
    let d = s
        .pick(&RequestContext::new("m", 300), T0, &mut rng(1))
        .unwrap();
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 300), T0, &mut rng(2));
    assert_eq!(ex.candidates[0].waiting, 1.0);
    // The engine now reports the request itself: it is not counted twice.
    let t1 = T0.saturating_add(Duration::from_millis(50));
    s.apply_metrics(addr(0), snap(t1, 2, 0.1)).unwrap();
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 300), t1, &mut rng(3));
    assert_eq!(ex.candidates[0].waiting, 2.0);
    assert!(s.first_token(d.ticket, t1));
}

fn saturated_pool() -> Scheduler {
    let mut s = pool(SchedulerConfig::default(), 3);
    let sat = s.config().saturation.queue_depth;
    for i in 0..3 {
        s.apply_metrics(addr(i), snap(T0, sat + i, 0.5)).unwrap();
    }
    s
}

#[test]
fn saturated_pool_sheds_sheddable_first_and_never_critical() {
    let mut s = saturated_pool();
    let shed = s
        .pick(
            &RequestContext::new("m", 100).with_priority(Priority::Sheddable),
            T0,
            &mut rng(1),
        )
        .unwrap_err();
    assert_eq!(shed.http_status(), 429);
    assert_eq!(shed.metric_label(), "shed");
    assert!(shed.retry_after().unwrap() >= Duration::from_secs(1));
    // Standard still gets through while the pool is saturated but not overloaded.
    let d = s
        .pick(&RequestContext::new("m", 100), T0, &mut rng(2))
        .unwrap();
    s.cancel(d.ticket, T0);
    // Overloaded: Standard is shed too, Critical is not.
    let over = s.config().overload.queue_depth;
    for i in 0..3 {
        s.apply_metrics(addr(i), snap(T0, over + i, 0.5)).unwrap();
    }
    let std = s.pick(&RequestContext::new("m", 100), T0, &mut rng(3));
    assert!(matches!(std, Err(Rejection::Shed { .. })));
    for seed in 0..20 {
        let d = s
            .pick(
                &RequestContext::new("m", 100).with_priority(Priority::Critical),
                T0,
                &mut rng(seed),
            )
            .unwrap();
        // Critical goes to the least loaded pod.
        assert_eq!(d.endpoints.first(), addr(0));
        s.cancel(d.ticket, T0);
    }
}

#[test]
fn sheddable_is_admitted_while_any_pod_has_headroom() {
    let mut s = saturated_pool();
    s.apply_metrics(addr(2), snap(T0, 0, 0.2)).unwrap();
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
fn retry_after_follows_the_estimated_drain_time() {
    let req = RequestContext::new("m", 100).with_priority(Priority::Sheddable);
    let mut retry = Vec::new();
    for depth in [16, 40, 200] {
        let mut s = pool(SchedulerConfig::default(), 2);
        for i in 0..2 {
            s.apply_metrics(addr(i), snap(T0, depth, 0.5)).unwrap();
        }
        retry.push(
            s.pick(&req, T0, &mut rng(1))
                .unwrap_err()
                .retry_after()
                .unwrap(),
        );
    }
    assert!(retry[0] < retry[1] && retry[1] < retry[2], "{retry:?}");
    assert!(retry.iter().all(|d| d.subsec_nanos() == 0));
}

/// Teaches endpoint `i` a prefill rate by reporting requests that took `ttft` for `tokens`.
fn teach(s: &mut Scheduler, i: u32, tokens: u32, ttft: Duration, n: usize) {
    let subset = [addr(i)];
    for k in 0..n {
        let req = RequestContext::new("m", tokens).with_subset(Some(&subset));
        let d = s.pick(&req, T0, &mut rng(k as u64)).unwrap();
        s.first_token(d.ticket, T0.saturating_add(ttft));
        s.complete(
            d.ticket,
            T0.saturating_add(ttft * 2),
            Usage {
                prompt_tokens: tokens,
                cached_tokens: 0,
                output_tokens: 10,
            },
        );
    }
}

#[test]
fn wait_scorer_ranks_a_5x_slower_pod_below_an_equally_loaded_fast_one() {
    let cfg = weights_only(Weights {
        estimated_wait: 1.0,
        ..Weights::default()
    });
    let mut s = pool(cfg, 2);
    teach(&mut s, 0, 1000, Duration::from_millis(50), 10);
    teach(&mut s, 1, 1000, Duration::from_millis(250), 10);
    let fast = s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec.unwrap();
    let slow = s.endpoint(addr(1)).unwrap().prefill_tokens_per_sec.unwrap();
    assert!((fast / slow - 5.0).abs() < 0.01, "{fast} / {slow}");
    for i in 0..2 {
        s.apply_metrics(addr(i), snap(T0, 3, 0.4)).unwrap();
    }
    for seed in 0..20 {
        let (d, ex) = s.pick_explained(&RequestContext::new("m", 800), T0, &mut rng(seed));
        let d = d.unwrap();
        assert_eq!(d.endpoints.as_slice(), &[addr(0), addr(1)]);
        let score = |a| ex.candidates.iter().find(|c| c.addr == a).unwrap().scores[0].value;
        assert_eq!(score(addr(0)), 1.0);
        assert!(score(addr(1)) < 0.25);
        s.cancel(d.ticket, T0);
    }
}

#[test]
fn the_fast_pod_takes_traffic_until_its_queue_evens_the_wait() {
    let mut s = pool(SchedulerConfig::default(), 2);
    teach(&mut s, 0, 1000, Duration::from_millis(50), 10);
    teach(&mut s, 1, 1000, Duration::from_millis(250), 10);
    let mut on_fast = 0;
    for seed in 0..12 {
        let d = s
            .pick(&RequestContext::new("m", 1000), T0, &mut rng(seed))
            .unwrap();
        if d.endpoints.first() == addr(0) {
            on_fast += 1;
        }
    }
    // Join-the-shortest-expected-wait: about 5 of every 6 go to the 5x faster pod, not all 12.
    assert!(
        (8..=11).contains(&on_fast),
        "{on_fast} of 12 on the fast pod"
    );
}

#[test]
fn cold_start_pods_use_the_pool_rate() {
    let mut s = pool(SchedulerConfig::default(), 3);
    teach(&mut s, 0, 1000, Duration::from_millis(100), 5);
    teach(&mut s, 1, 1000, Duration::from_millis(100), 5);
    // pod 2 never completed anything: it is assumed typical, so an idle pod 2 beats loaded ones.
    s.apply_metrics(addr(0), snap(T0, 4, 0.3)).unwrap();
    s.apply_metrics(addr(1), snap(T0, 4, 0.3)).unwrap();
    let d = s
        .pick(&RequestContext::new("m", 1000), T0, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.first(), addr(2));
    assert!(
        s.endpoint(addr(2))
            .unwrap()
            .prefill_tokens_per_sec
            .is_none()
    );
}

#[test]
fn same_seed_same_decision_and_explained_pick_agrees() {
    let mut a = pool(SchedulerConfig::default(), 8);
    let mut b = pool(SchedulerConfig::default(), 8);
    let mut ra = rng(42);
    let mut rb = rng(42);
    for _ in 0..50 {
        let req = RequestContext::new("m", 100);
        let da = a.pick(&req, T0, &mut ra).unwrap();
        let (db, ex) = b.pick_explained(&req, T0, &mut rb);
        let db = db.unwrap();
        assert_eq!(da, db);
        assert_eq!(ex.chosen, da.endpoints.as_slice());
        assert_eq!(ex.candidates.len(), 8);
    }
}

#[test]
fn zero_weight_removes_a_scorers_influence() {
    let cfg = weights_only(Weights {
        queue: 1.0,
        kv_cache: 0.0,
        ..Weights::default()
    });
    let mut s = pool(cfg, 2);
    s.apply_metrics(addr(0), snap(T0, 1, 0.0)).unwrap();
    s.apply_metrics(addr(1), snap(T0, 0, 0.9)).unwrap();
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    assert_eq!(d.unwrap().endpoints.first(), addr(1));
    assert!(
        ex.candidates[0]
            .scores
            .iter()
            .all(|r| r.scorer != "kv-cache")
    );
}

#[test]
fn baselines_ignore_scores_but_account_in_flight() {
    let mut s = pool(SchedulerConfig::preset(Preset::RoundRobin), 3);
    s.apply_metrics(addr(0), snap(T0, 100, 0.99)).unwrap();
    let firsts: Vec<_> = (0..6)
        .map(|i| {
            s.pick(&RequestContext::new("m", 10), T0, &mut rng(i))
                .unwrap()
                .endpoints
                .first()
        })
        .collect();
    assert_eq!(firsts[..3], firsts[3..]);
    let mut uniq = firsts[..3].to_vec();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 3);
    assert_eq!(s.inflight(), 6);

    let mut s = pool(SchedulerConfig::preset(Preset::LeastRequest), 3);
    for i in 0..9 {
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(i))
            .unwrap();
        assert_eq!(d.endpoints.len(), 3);
    }
    for i in 0..3 {
        assert_eq!(s.endpoint(addr(i)).unwrap().inflight, 3);
    }

    let mut s = pool(SchedulerConfig::preset(Preset::Random), 5);
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(9))
        .unwrap();
    let mut v = d.endpoints.as_slice().to_vec();
    v.sort();
    v.dedup();
    assert_eq!(v.len(), 3);
}

#[test]
fn gie_default_keeps_stale_pods_and_scores_scraped_metrics_only() {
    let mut s = pool(SchedulerConfig::preset(Preset::GieDefault), 2);
    let later = T0.saturating_add(Duration::from_secs(30));
    let d = s
        .pick(&RequestContext::new("m", 10), later, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.len(), 2);
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 10), later, &mut rng(2));
    assert!(ex.candidates.iter().all(|c| c.waiting == 0.0));
    let names: Vec<_> = ex.candidates[0]
        .scores
        .iter()
        .map(|r| (r.scorer, r.weight))
        .collect();
    assert_eq!(names, [("queue", 2.0), ("kv-cache", 2.0), ("prefix", 3.0)]);
}

#[test]
fn metrics_are_validated() {
    let mut s = pool(SchedulerConfig::default(), 1);
    let mut m = snap(T0, 0, f64::NAN);
    let err = s.apply_metrics(addr(0), m.clone()).unwrap_err();
    assert!(err.to_string().contains("kv_cache_usage"), "{err}");
    m.kv_cache_usage = Some(1.7);
    s.apply_metrics(addr(0), m).unwrap();
    assert_eq!(
        s.endpoint(addr(0)).unwrap().metrics.unwrap().kv_cache_usage,
        Some(1.0)
    );
    assert!(matches!(
        s.apply_metrics(addr(5), snap(T0, 0, 0.1)),
        Err(Error::UnknownEndpoint(_))
    ));
    // An out-of-order older snapshot is ignored.
    s.apply_metrics(addr(0), snap(Timestamp::ZERO, 9, 0.1))
        .unwrap();
    assert_eq!(s.endpoint(addr(0)).unwrap().metrics.unwrap().waiting, 0);
}

#[test]
fn prefix_capacity_is_tuned_from_the_engine_cache() {
    let mut s = pool(SchedulerConfig::default(), 1);
    let mut m = snap(T0, 0, 0.1);
    m.cache = Some(crate::endpoint::CacheConfig {
        block_size: 16,
        num_blocks: 4,
    });
    s.apply_metrics(addr(0), m).unwrap();
    // 64 tokens × 4 chars/token / 64 chars per block = 4 blocks.
    let text = prompt_text("long");
    let segs = [text.as_str()];
    let d = s
        .pick(
            &RequestContext::new("m", 500).with_prompt(&segs),
            T0,
            &mut rng(1),
        )
        .unwrap();
    s.cancel(d.ticket, T0);
    assert_eq!(s.prefix_stats().entries, 4);
}

#[test]
fn thresholds_validate() {
    let cfg = SchedulerConfig {
        overload: Thresholds {
            queue_depth: 1,
            kv_cache: 0.99,
        },
        ..SchedulerConfig::default()
    };
    assert_eq!(cfg.validate().unwrap_err().field, "overload.queueDepth");
}

#[test]
fn an_explanation_summary_names_the_choice_the_filters_and_every_score() {
    let mut s = pool(SchedulerConfig::default(), 3);
    let later = T0.saturating_add(Duration::from_secs(1));
    s.apply_metrics(addr(0), snap(later, 0, 0.1)).unwrap();
    s.apply_metrics(addr(1), snap(later, 5, 0.5)).unwrap();
    // pod 2 stays at T0: 2.5 s old at `now`, stale.
    let now = later.saturating_add(Duration::from_millis(1_500));
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), now, &mut rng(1));
    let d = d.unwrap();
    let line = ex.summary(8);
    assert!(
        line.starts_with(&format!("chosen={}", d.endpoints)),
        "{line}"
    );
    assert!(
        line.contains(&format!("filtered={}:freshness", addr(2))),
        "{line}"
    );
    assert!(line.contains("| ns/pod-0 127.0.0.1:8000 total="), "{line}");
    assert!(line.contains("estimated-wait="), "{line}");
    assert!(line.contains("queue=0.000*1"), "{line}");
    assert!(
        line.find("ns/pod-0").unwrap() < line.find("ns/pod-1").unwrap(),
        "best first: {line}"
    );
    assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "{line}");
    assert!(ex.summary(1).ends_with("| +1 more"), "{}", ex.summary(1));
    let err = s
        .pick_explained(
            &RequestContext::new("m", 10),
            now.saturating_add(Duration::from_secs(9)),
            &mut rng(1),
        )
        .1;
    assert!(
        err.summary(8)
            .starts_with("rejected=no_fresh_endpoints retry_after=1s"),
        "{}",
        err.summary(8)
    );
}
