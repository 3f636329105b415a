use std::collections::BTreeMap;

use crate::fixtures::*;
use crate::*;

/// `n` endpoints with fresh, idle pages; the first `fast` on H100s, the rest on A10Gs.
fn pool(cfg: SchedulerConfig, n: u32, fast: u32) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    for i in 0..n {
        s.upsert_endpoint(EndpointMeta {
            namespace: "ns".into(),
            pod: format!("pod-{i}"),
            addr: addr(i),
            engine: EngineType::Vllm,
            gpu: Some(
                if i < fast {
                    "H100-SXM-80GB"
                } else {
                    "A10G-24GB"
                }
                .into(),
            ),
            labels: BTreeMap::new(),
        });
        s.apply_metrics(addr(i), snapshot(T0, 0, 0.1)).unwrap();
    }
    s
}

#[test]
fn a_large_pool_scores_a_sample_with_every_gpu_type_in_it() {
    let mut s = pool(SchedulerConfig::default(), 200, 3);
    for seed in 0..50 {
        let (r, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(seed));
        let d = r.unwrap();
        assert_eq!(ex.sampled_from, 200, "{}", ex.summary(2));
        assert!(!d.sample_fallback);
        // 16 A10Gs drawn at random, and every H100 (fewer than 16 of them).
        assert_eq!(ex.considered, 19, "{}", ex.summary(2));
        assert_eq!(ex.candidates.len(), 19);
        for i in 0..3 {
            assert!(
                ex.candidates.iter().any(|c| c.addr == addr(i)),
                "H100 {i} left out"
            );
        }
        assert!(ex.summary(2).contains(" sampled_from=200"));
        assert!(s.complete(d.ticket, T0, Usage::default()));
    }
}

#[test]
fn small_pools_and_a_sample_of_zero_score_every_candidate() {
    let mut s = pool(SchedulerConfig::default(), 64, 0);
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(1));
    assert_eq!(
        (ex.considered, ex.sampled_from, ex.candidates.len()),
        (64, 0, 64)
    );
    let cfg = SchedulerConfig {
        candidate_sample: 0,
        ..SchedulerConfig::default()
    };
    let mut s = pool(cfg, 300, 0);
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(1));
    assert_eq!((ex.considered, ex.sampled_from), (300, 0));
    assert!(!ex.summary(2).contains("sampled_from"));
}

#[test]
fn each_pick_draws_its_own_sample() {
    // Over 30 picks the samples cover most of the pool: no pod is left out for long, and no pod
    // is in every sample because it read best once.
    let mut s = pool(SchedulerConfig::default(), 200, 0);
    let mut seen = std::collections::HashSet::new();
    let mut chosen = std::collections::HashSet::new();
    for seed in 0..30 {
        let (r, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(seed));
        let d = r.unwrap();
        assert_eq!(ex.considered, 16);
        seen.extend(ex.candidates.iter().map(|c| c.addr));
        chosen.insert(d.endpoints.first());
        assert!(s.complete(d.ticket, T0, Usage::default()));
    }
    assert!(
        seen.len() >= 150,
        "{} of 200 pods in some sample",
        seen.len()
    );
    assert!(
        chosen.len() >= 20,
        "{} pods chosen in 30 picks",
        chosen.len()
    );
}

#[test]
fn the_sample_keeps_the_pods_with_the_prefix() {
    let mut s = pool(SchedulerConfig::default(), 200, 0);
    let prompt = "a long shared system prompt ".repeat(40);
    let segments = [prompt.as_str()];
    let cx = RequestContext::new("m", 300).with_prompt(&segments);
    let first = s.pick(&cx, T0, &mut rng(1)).unwrap();
    let home = first.endpoints.first();
    assert!(s.complete(first.ticket, T0, Usage::default()));
    for seed in 2..30 {
        let (r, ex) = s.pick_explained(&cx, T0, &mut rng(seed));
        let d = r.unwrap();
        assert!(ex.candidates.iter().any(|c| c.addr == home), "seed {seed}");
        assert_eq!(d.endpoints.first(), home, "seed {seed}: {}", ex.summary(3));
        assert!(s.complete(d.ticket, T0, Usage::default()));
    }
}

#[test]
fn what_the_sample_would_shed_goes_to_a_pod_outside_it() {
    // 199 overloaded pods and one idle one: a sample almost never holds the idle pod, and the
    // pick over every candidate finds it instead of shedding.
    let mut s = pool(SchedulerConfig::default(), 200, 0);
    for i in 1..200 {
        s.apply_metrics(addr(i), snapshot(T0, 90, 0.995)).unwrap();
    }
    let mut full = 0;
    for seed in 0..20 {
        let (r, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(seed));
        let d = r.unwrap();
        assert_eq!(d.endpoints.first(), addr(0), "{}", ex.summary(2));
        assert_eq!(d.sample_fallback, ex.sampled_from == 0);
        if ex.sampled_from == 0 {
            // The explanation is the full pick's alone (nothing left from the sample's).
            full += 1;
            assert_eq!(ex.considered, 200);
            assert_eq!(ex.candidates.len(), 1, "{}", ex.summary(2));
        } else {
            assert!(ex.candidates.iter().any(|c| c.addr == addr(0)));
        }
        assert!(s.complete(d.ticket, T0, Usage::default()));
    }
    assert!(full >= 15, "{full} of 20 picks went past the sample");
    // Every pod overloaded: shed, as without sampling.
    s.apply_metrics(addr(0), snapshot(T0, 90, 0.995)).unwrap();
    assert!(matches!(
        s.pick(&RequestContext::new("m", 100), T0, &mut rng(99)),
        Err(Rejection::Shed { .. })
    ));
}

#[test]
fn a_sample_of_saturated_pods_does_not_hide_a_pod_with_headroom() {
    // Saturated (a queue over 16) but not overloaded (under 64): a Standard request is admitted
    // on such pods, and a sample holding only them would route there while pod 0 idles.
    let mut s = pool(SchedulerConfig::default(), 200, 0);
    for i in 1..200 {
        s.apply_metrics(addr(i), snapshot(T0, 30, 0.5)).unwrap();
    }
    for seed in 0..20 {
        let (r, ex) = s.pick_explained(&RequestContext::new("m", 100), T0, &mut rng(seed));
        let d = r.unwrap();
        assert_eq!(d.endpoints.first(), addr(0), "{}", ex.summary(2));
        assert!(s.complete(d.ticket, T0, Usage::default()));
    }
}

#[test]
fn the_headroom_reserve_is_judged_over_the_pool_not_the_sample() {
    // Two clear H100s (in every sample: fewer than 16 of their type), one clear A10G among 99
    // that are prefilling with headroom. A request that must leave two clear pods may take one
    // here: the pool has three. A sample without the clear A10G sees exactly two, and judged
    // there would leave both H100s and send it to a busy A10G.
    let mut s = pool(SchedulerConfig::default(), 101, 2);
    for i in 2..100 {
        s.apply_metrics(addr(i), snapshot(T0, 1, 0.1)).unwrap();
    }
    let cx = RequestContext::new("m", 500)
        .with_queueing(true)
        .with_reserved_endpoints(2);
    let mut fell_back = 0;
    for seed in 0..20 {
        let (r, ex) = s.pick_explained(&cx, T0, &mut rng(seed));
        let d = r.unwrap();
        assert!(
            d.endpoints.first() == addr(0) || d.endpoints.first() == addr(1),
            "seed {seed}: {}",
            ex.summary(3)
        );
        assert!(ex.reserve_held.is_empty(), "{}", ex.summary(3));
        fell_back += usize::from(d.sample_fallback);
        s.cancel(d.ticket, T0);
    }
    assert!(
        fell_back >= 10,
        "{fell_back} of 20 picks judged the reserve on the pool"
    );
    // With only the two H100s clear the pool itself is at the reserve: the request goes to a
    // pod already prefilling, sampled or not.
    s.apply_metrics(addr(100), snapshot(T0, 1, 0.1)).unwrap();
    for seed in 20..30 {
        let (r, ex) = s.pick_explained(&cx, T0, &mut rng(seed));
        let d = r.unwrap();
        assert!(
            d.endpoints.first().port() >= addr(2).port(),
            "{}",
            ex.summary(3)
        );
        assert_eq!(ex.reserve_held.len(), 2, "{}", ex.summary(3));
        s.cancel(d.ticket, T0);
    }
}

#[test]
fn a_hot_adapter_on_most_pods_keeps_a_sample_of_them_the_best_first() {
    // 150 pods run the adapter while another adapter waits there for a slot, one runs it
    // unblocked, 49 hold other adapters in every slot. Keeping every pod that knows the adapter
    // would score 151 pods each pick; the sample keeps 16 of them, the unblocked one always,
    // the others at random, and draws 16 more from the rest.
    let mut s = pool(SchedulerConfig::default(), 200, 0);
    for i in 0..150 {
        s.apply_metrics(addr(i), with_lora(0, 2, &["hot", "b"], &["c"]))
            .unwrap();
    }
    s.apply_metrics(addr(150), with_lora(0, 2, &["hot"], &[]))
        .unwrap();
    for i in 151..200 {
        s.apply_metrics(addr(i), with_lora(0, 2, &["b", "c"], &[]))
            .unwrap();
    }
    let cx = RequestContext::new("m", 100).with_lora(Some("hot"));
    let mut seen = std::collections::HashSet::new();
    for seed in 0..30 {
        let (r, ex) = s.pick_explained(&cx, T0, &mut rng(seed));
        let d = r.unwrap();
        assert_eq!(ex.sampled_from, 200, "{}", ex.summary(2));
        assert!(ex.considered <= 32, "{} considered", ex.considered);
        assert!(
            ex.candidates.iter().any(|c| c.addr == addr(150)),
            "seed {seed}: the pod running the adapter unblocked was left out"
        );
        assert_eq!(d.endpoints.first(), addr(150), "{}", ex.summary(2));
        seen.extend(
            ex.candidates
                .iter()
                .filter(|c| index_of(c.addr) < 150)
                .map(|c| c.addr),
        );
        s.cancel(d.ticket, T0);
    }
    assert!(
        seen.len() >= 100,
        "{} of the 150 blocked pods in some sample",
        seen.len()
    );
}
