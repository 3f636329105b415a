use std::time::Duration;

use crate::fixtures::*;
use crate::*;

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
    let mut s = scheduler(SchedulerConfig::default(), 5);
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
fn a_prompt_is_routed_to_the_same_pod_next_time() {
    for preset in [Preset::Infergate, Preset::GieDefault] {
        for seed in 0..10 {
            let mut s = scheduler(SchedulerConfig::preset(preset), 4);
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

/// An engine keys a LoRA request's prefix blocks by its adapter (vLLM hashes the adapter's name
/// into every block), so a prompt sent under adapter A is cached for A only: the prefix index must
/// not draw adapter B's request, nor the base model's, to A's pod with the same text.
#[test]
fn a_prompt_cached_under_one_adapter_does_not_match_under_another() {
    let mut s = scheduler(SchedulerConfig::default(), 4);
    let text = prompt_text("one system prompt, several adapters");
    let segs = [text.as_str()];
    let under = |lora| {
        RequestContext::new("m", 500)
            .with_prompt(&segs)
            .with_lora(lora)
    };
    let d = s.pick(&under(Some("lora-a")), T0, &mut rng(1)).unwrap();
    s.complete(d.ticket, T0, Usage::default());
    let matched = |s: &mut Scheduler, lora| {
        let (d, ex) = s.pick_explained(&under(lora), T0, &mut rng(2));
        s.cancel(d.unwrap().ticket, T0);
        assert!(ex.prompt_blocks > 0);
        ex.candidates
            .iter()
            .map(|c| (c.addr, c.prefix_blocks))
            .filter(|(_, n)| *n > 0)
            .collect::<Vec<_>>()
    };
    assert_eq!(matched(&mut s, Some("lora-b")), vec![]);
    assert_eq!(matched(&mut s, None), vec![]);
    let same = matched(&mut s, Some("lora-a"));
    assert_eq!(same.len(), 1, "{same:?}");
    assert_eq!(same[0].0, d.endpoints.first());
}

/// A request whose first choice failed is served by a fallback: the prompt's blocks go with it.
/// Left on the first choice, they drew the next request of that prefix back to the pod that
/// failed, and the pod that holds the prefix got no credit.
#[test]
fn a_fallback_takes_the_prompt_blocks_with_it() {
    let mut s = scheduler(SchedulerConfig::default(), 4);
    let text = prompt_text("retried conversation");
    let segs = [text.as_str()];
    let req = RequestContext::new("m", 500).with_prompt(&segs);
    let d = s.pick(&req, T0, &mut rng(1)).unwrap();
    let (failed, served) = (d.endpoints.as_slice()[0], d.endpoints.as_slice()[1]);
    assert!(s.reassign(d.ticket, served));
    assert!(s.complete(d.ticket, T0, Usage::default()));
    let (d2, ex) = s.pick_explained(&req, T0, &mut rng(2));
    s.cancel(d2.unwrap().ticket, T0);
    let holding: Vec<_> = ex
        .candidates
        .iter()
        .filter(|c| c.prefix_blocks > 0)
        .map(|c| (c.addr, c.prefix_blocks))
        .collect();
    assert_eq!(
        holding,
        [(served, ex.prompt_blocks as u32)],
        "failed: {failed}"
    );
    // Reassigning to where the request already is changes nothing.
    let d3 = s.pick(&req, T0, &mut rng(3)).unwrap();
    let first = d3.endpoints.first();
    assert!(s.reassign(d3.ticket, first));
    let (_, ex) = s.pick_explained(&req, T0, &mut rng(4));
    assert!(
        ex.candidates
            .iter()
            .any(|c| c.addr == first && c.prefix_blocks as usize == ex.prompt_blocks)
    );
}

#[test]
fn prefix_affinity_yields_when_the_pod_is_overloaded() {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    let text = prompt_text("shared");
    let segs = [text.as_str()];
    let req = RequestContext::new("m", 500).with_prompt(&segs);
    let d1 = s.pick(&req, T0, &mut rng(1)).unwrap();
    s.cancel(d1.ticket, T0);
    let hot = d1.endpoints.first();
    s.apply_metrics(hot, snapshot(T0, 40, 0.5)).unwrap();
    let d2 = s.pick(&req, T0, &mut rng(2)).unwrap();
    assert_ne!(d2.endpoints.first(), hot);
}

/// A prompt recorded under one `cache_salt` gives no prefix match to the same prompt with
/// another salt or none (vLLM shares no block between them), and does to the same salt.
#[test]
fn a_cache_salt_keeps_prefixes_apart() {
    /// The best prefix match of `asked` after a pick of `recorded` (each pick records its
    /// prompt on the pod it chose).
    fn matched(recorded: Option<&str>, asked: Option<&str>) -> u32 {
        let text = prompt_text("shared");
        let segs = [text.as_str()];
        let mut s = scheduler(SchedulerConfig::default(), 2);
        let first = RequestContext::new("m", 500)
            .with_prompt(&segs)
            .with_cache_salt(recorded);
        let d = s.pick(&first, T0, &mut rng(1)).unwrap();
        s.cancel(d.ticket, T0);
        let then = RequestContext::new("m", 500)
            .with_prompt(&segs)
            .with_cache_salt(asked);
        let (_, ex) = s.pick_explained(&then, T0, &mut rng(2));
        ex.candidates.iter().map(|c| c.prefix_blocks).max().unwrap()
    }
    assert!(
        matched(Some("tenant-a"), Some("tenant-a")) > 0,
        "the same salt matches"
    );
    assert!(matched(None, None) > 0);
    // An empty salt is none, as in vLLM.
    assert!(matched(None, Some("")) > 0);
    for (recorded, asked) in [
        (Some("tenant-a"), None),
        (Some("tenant-a"), Some("tenant-b")),
        (None, Some("tenant-a")),
    ] {
        assert_eq!(matched(recorded, asked), 0, "{recorded:?} then {asked:?}");
    }
}

#[test]
fn same_seed_same_decision_and_explained_pick_agrees() {
    let mut a = scheduler(SchedulerConfig::default(), 8);
    let mut b = scheduler(SchedulerConfig::default(), 8);
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
fn gie_default_keeps_stale_pods_and_scores_scraped_metrics_only() {
    let mut s = scheduler(SchedulerConfig::preset(Preset::GieDefault), 2);
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
    let mut s = scheduler(SchedulerConfig::default(), 1);
    let mut m = snapshot(T0, 0, f64::NAN);
    let err = s.apply_metrics(addr(0), m.clone()).unwrap_err();
    assert!(err.to_string().contains("kv_cache_usage"), "{err}");
    m.kv_cache_usage = Some(1.7);
    s.apply_metrics(addr(0), m).unwrap();
    assert_eq!(
        s.endpoint(addr(0)).unwrap().metrics.unwrap().kv_cache_usage,
        Some(1.0)
    );
    assert!(matches!(
        s.apply_metrics(addr(5), snapshot(T0, 0, 0.1)),
        Err(Error::UnknownEndpoint(_))
    ));
    // An out-of-order older snapshot is ignored.
    s.apply_metrics(addr(0), snapshot(Timestamp::ZERO, 9, 0.1))
        .unwrap();
    assert_eq!(s.endpoint(addr(0)).unwrap().metrics.unwrap().waiting, 0);
}

#[test]
fn prefix_capacity_is_tuned_from_the_engine_cache() {
    let mut s = scheduler(SchedulerConfig::default(), 1);
    let mut m = snapshot(T0, 0, 0.1);
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
    let mut s = scheduler(SchedulerConfig::default(), 3);
    let later = T0.saturating_add(Duration::from_secs(1));
    s.apply_metrics(addr(0), snapshot(later, 0, 0.1)).unwrap();
    let mut busy = snapshot(later, 5, 0.5);
    busy.running = 7;
    s.apply_metrics(addr(1), busy).unwrap();
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
    assert!(line.contains(" waiting=5 running=7 est_wait_ms="), "{line}");
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

#[test]
fn an_explanation_lists_the_endpoints_returned_first_when_totals_tie() {
    // Four identical idle pods: every total ties, and the pick breaks the tie at random. The
    // line must still start with the endpoints returned, in their order, not in pool order.
    let mut not_first_in_pool = 0;
    for seed in 0..20 {
        let mut s = scheduler(SchedulerConfig::default(), 4);
        let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(seed));
        let d = d.unwrap();
        let line = ex.summary(8);
        let listed: Vec<&str> = line
            .split(" | ")
            .skip(1)
            .map(|c| c.split(' ').nth(1).unwrap())
            .collect();
        let returned: Vec<String> = d
            .endpoints
            .as_slice()
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(listed.len(), 4, "{line}");
        assert_eq!(
            listed[..returned.len()],
            returned[..],
            "seed {seed}: {line}"
        );
        if d.endpoints.first() != addr(0) {
            not_first_in_pool += 1;
        }
    }
    assert!(
        not_first_in_pool > 0,
        "the ties never fell off the pool's first pod"
    );
}

#[test]
fn exact_cached_tokens_from_kv_events_override_the_approximate_guess() {
    for seed in 0..10 {
        let mut s = scheduler(SchedulerConfig::default(), 4);
        let text = prompt_text(&format!("evicted {seed}"));
        let segs = [text.as_str()];
        let req = RequestContext::new("m", 500).with_prompt(&segs);
        // The approximate index remembers where the prompt went.
        let d1 = s.pick(&req, T0, &mut rng(seed)).unwrap();
        s.first_token(d1.ticket, T0);
        s.complete(d1.ticket, T0, Usage::default());
        let first = d1.endpoints.first();
        let addrs: Vec<_> = s.endpoints().map(|e| e.addr).collect();
        let other = *addrs.iter().find(|a| **a != first).unwrap();
        // The engines say: the first pod evicted it, another pod holds 480 of its 500 tokens.
        let cached = [(first, 0), (other, 480)];
        let exact = req.with_cached(Some(&cached));
        let (d2, ex) = s.pick_explained(&exact, T0, &mut rng(seed + 100));
        assert_eq!(d2.unwrap().endpoints.first(), other, "seed {seed}: {ex:#?}");
        assert_eq!(ex.exact_prefix, 2);
        assert!(
            ex.summary(4).contains("exact_prefix=2"),
            "{}",
            ex.summary(4)
        );
        // Without the events the approximate guess stands.
        let (d3, _) = s.pick_explained(&req, T0, &mut rng(seed + 200));
        assert_eq!(d3.unwrap().endpoints.first(), first);
    }
}

#[test]
fn requests_per_adapter_are_counted_from_pick_to_release() {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    let count = |s: &Scheduler, pod: u32, name: &str| {
        let slot = s.endpoints.slot_of(&addr(pod)).unwrap();
        let ep = s.endpoints.get(slot).unwrap();
        ep.adapters.count(crate::lora::adapter_hash(name))
    };
    let req = RequestContext::new("m", 10).with_lora(Some("lora-a"));
    let d1 = s.pick(&req, T0, &mut rng(1)).unwrap();
    let d2 = s.pick(&req, T0, &mut rng(2)).unwrap();
    let (p1, p2) = (
        fixtures::index_of(d1.endpoints.first()) as u32,
        fixtures::index_of(d2.endpoints.first()) as u32,
    );
    assert_eq!(count(&s, 0, "lora-a") + count(&s, 1, "lora-a"), 2);
    assert_eq!(count(&s, 0, "lora-b"), 0);
    // A fallback moves the count with the charge; completion and cancellation release it.
    let other = addr(1 - p1);
    assert!(s.reassign(d1.ticket, other));
    assert_eq!(count(&s, 1 - p1, "lora-a"), if p2 == p1 { 1 } else { 2 });
    assert!(s.complete(d1.ticket, T0, Usage::default()));
    assert!(s.cancel(d2.ticket, T0));
    assert_eq!(count(&s, 0, "lora-a") + count(&s, 1, "lora-a"), 0);
    // A request without an adapter is not counted per adapter.
    let d = s
        .pick(&RequestContext::new("m", 10), T0, &mut rng(3))
        .unwrap();
    assert_eq!(count(&s, 0, "lora-a") + count(&s, 1, "lora-a"), 0);
    assert!(s.fail(d.ticket, T0));
}

/// A pod whose requests keep failing (its metrics fine, so it looks the least loaded) is taken
/// out of the candidates after `consecutive5xx` failed answers, for every preset; the
/// explanation says why; it is back once its ejection is over; a request whose only candidates
/// are ejected still gets one; more than `maxEjectionPercent` of the pool is never out.
/// Without `outlierDetection` (off: the baselines, or `null`) nothing is counted.
#[test]
fn outlier_detection_takes_a_failing_pod_out_and_brings_it_back() {
    use crate::outlier::{Answer, Ejection, OutlierDetection};
    let mut plain = scheduler(
        SchedulerConfig {
            outlier_detection: None,
            ..SchedulerConfig::default()
        },
        2,
    );
    let addr = plain.endpoints().next().unwrap().addr;
    for _ in 0..10 {
        assert_eq!(plain.observe_answer(addr, Answer::Failure, T0), None);
    }
    assert_eq!(plain.ejected_endpoints(T0), 0);
    // Counted all the same, for the pod's answers series.
    plain.observe_answer(addr, Answer::Neutral, T0);
    let info = plain.endpoint(addr).unwrap();
    assert_eq!((info.answers.failure, info.answers.neutral), (10, 1));
    assert_eq!(info.failure_interval, None);
    for preset in [Preset::Infergate, Preset::GieDefault, Preset::RoundRobin] {
        let cfg = SchedulerConfig {
            outlier_detection: Some(OutlierDetection {
                consecutive_5xx: 2,
                base_ejection_ms: 1_000,
                max_ejection_ms: 60_000,
                max_ejection_percent: 50,
                failure_percentage: None,
            }),
            ..SchedulerConfig::preset(preset)
        };
        let mut s = scheduler(cfg, 4);
        let req = RequestContext::new("m", 10);
        let bad = s.pick(&req, T0, &mut rng(1)).unwrap().endpoints.first();
        assert_eq!(s.observe_answer(bad, Answer::Failure, T0), None);
        // A 4xx is the request's problem: the run goes on.
        assert_eq!(s.observe_answer(bad, Answer::Neutral, T0), None);
        let Some(Ejection::Ejected {
            length, in_a_row, ..
        }) = s.observe_answer(bad, Answer::Failure, T0)
        else {
            panic!("{preset}: not ejected");
        };
        assert_eq!((length, in_a_row), (Duration::from_secs(1), 1));
        assert_eq!(s.ejected_endpoints(T0), 1);
        let t = T0.saturating_add(Duration::from_millis(500));
        for seed in 0..40 {
            let (d, ex) = s.pick_explained(&req, t, &mut rng(seed));
            let d = d.unwrap();
            assert!(!d.endpoints.as_slice().contains(&bad), "{preset}: {ex:#?}");
            assert!(
                ex.filtered
                    .iter()
                    .any(|f| f.addr == bad && f.filter == "outlier"),
                "{preset}: {ex:#?}"
            );
            s.cancel(d.ticket, t);
        }
        // Its only candidate ejected, a request still gets it.
        let only = [bad];
        let d = s
            .pick(&req.with_subset(Some(&only)), t, &mut rng(1))
            .unwrap();
        assert_eq!(d.endpoints.first(), bad);
        s.cancel(d.ticket, t);
        // Two of four may be out at 50%, not three.
        let others: Vec<_> = s
            .endpoints()
            .map(|m| m.addr)
            .filter(|a| *a != bad)
            .collect();
        for (i, addr) in others.iter().enumerate() {
            s.observe_answer(*addr, Answer::Failure, t);
            let done = s.observe_answer(*addr, Answer::Failure, t);
            if i == 0 {
                assert!(matches!(done, Some(Ejection::Ejected { .. })), "{done:?}");
            } else {
                assert_eq!(done, Some(Ejection::HeldBack));
            }
        }
        assert_eq!(s.ejected_endpoints(t), 2);
        // Back after 1 s (the second one half a second later).
        let back = T0.saturating_add(Duration::from_secs(1));
        assert_eq!(s.ejected_endpoints(back), 1);
        let picked: std::collections::HashSet<_> = (0..40)
            .map(|seed| {
                let d = s.pick(&req, back, &mut rng(seed)).unwrap();
                s.cancel(d.ticket, back);
                d.endpoints.first()
            })
            .collect();
        assert!(
            picked.contains(&bad) || preset != Preset::RoundRobin,
            "{picked:?}"
        );
        assert!(!picked.contains(&others[0]), "{preset}: {picked:?}");
    }
}

#[test]
fn short_prompts_teach_the_fixed_cost_per_request() {
    // Seven-token prompts answered in 40 ms: before any bulk rate, their time less seven tokens
    // at the 4,000 tokens/s prior, 38.25 ms.
    let mut s = scheduler(SchedulerConfig::default(), 1);
    assert_eq!(s.endpoint(addr(0)).unwrap().fixed_cost_secs, None);
    teach(&mut s, 0, 7, Duration::from_millis(40), 5);
    let fixed = s.endpoint(addr(0)).unwrap().fixed_cost_secs.unwrap();
    assert!((fixed - (0.040 - 7.0 / 4_000.0)).abs() < 1e-9, "{fixed}");
    // A long prompt teaches the bulk rate, not the fixed cost, and the bulk rate its time
    // without the fixed cost: the speed per token alone.
    teach(&mut s, 0, 512, Duration::from_millis(165), 3);
    let info = s.endpoint(addr(0)).unwrap();
    assert_eq!(info.fixed_cost_secs, Some(fixed));
    let bulk = info.bulk_prefill_tokens_per_sec.unwrap();
    assert!((bulk - 512.0 / (0.165 - fixed)).abs() < 1e-6, "{bulk}");
    // Forgotten with the rates.
    assert!(s.forget_learned_rates(addr(0)));
    assert_eq!(s.endpoint(addr(0)).unwrap().fixed_cost_secs, None);
}

#[test]
fn short_prompts_teach_no_bulk_prefill_rate() {
    // An emulated A10G (35 ms per prefill step plus 250 us per token) answering five seven-token
    // prompts in 40 ms: their time to first token is the fixed cost of a step. The scorer's rate
    // keeps it (175 tokens/s: each queued request pays it), the bulk rate learns nothing from it:
    // extrapolated to 512 tokens, 175 tokens/s made a first token the pod gives in 165 ms 2.9 s.
    let mut s = scheduler(SchedulerConfig::default(), 1);
    teach(&mut s, 0, 7, Duration::from_millis(40), 5);
    let info = s.endpoint(addr(0)).unwrap();
    assert!((info.prefill_tokens_per_sec.unwrap() - 175.0).abs() < 1.0);
    assert_eq!(info.bulk_prefill_tokens_per_sec, None);
    // A prompt long enough for its prefill to dominate teaches it, its time without the fixed
    // cost the short ones taught (40 ms less seven tokens at the 4,000 tokens/s prior).
    teach(&mut s, 0, 512, Duration::from_millis(165), 1);
    let bulk = s
        .endpoint(addr(0))
        .unwrap()
        .bulk_prefill_tokens_per_sec
        .unwrap();
    assert!((bulk - 512.0 / (0.165 - 0.03825)).abs() < 1.0, "{bulk}");
    // Forgotten with the other rates.
    assert!(s.forget_learned_rates(addr(0)));
    assert_eq!(
        s.endpoint(addr(0)).unwrap().bulk_prefill_tokens_per_sec,
        None
    );
}
