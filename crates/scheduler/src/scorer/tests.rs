use std::time::Duration;

use crate::fixtures::*;
use crate::*;

#[test]
fn lora_resident_pod_is_preferred_over_an_equal_one() {
    for seed in 0..50 {
        let mut s = scheduler(SchedulerConfig::default(), 2);
        let mut m = snapshot(T0, 0, 0.1);
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

#[test]
fn a_running_adapter_drains_from_the_pod_where_another_waits_for_its_slot() {
    for seed in 0..50 {
        let mut s = scheduler(SchedulerConfig::default(), 2);
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
        let mut s = scheduler(cfg.clone(), 2);
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
fn wait_scorer_ranks_a_5x_slower_pod_below_an_equally_loaded_fast_one() {
    let cfg = weights_only(Weights {
        estimated_wait: 1.0,
        ..Weights::default()
    });
    let mut s = scheduler(cfg, 2);
    teach(&mut s, 0, 1000, Duration::from_millis(50), 10);
    teach(&mut s, 1, 1000, Duration::from_millis(250), 10);
    let fast = s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec.unwrap();
    let slow = s.endpoint(addr(1)).unwrap().prefill_tokens_per_sec.unwrap();
    assert!((fast / slow - 5.0).abs() < 0.01, "{fast} / {slow}");
    for i in 0..2 {
        s.apply_metrics(addr(i), snapshot(T0, 3, 0.4)).unwrap();
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
    let mut s = scheduler(SchedulerConfig::default(), 2);
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

/// Pods 0 and 1 learn 10,000 prefill tokens/s, then each shows 4 requests waiting; pod 2 has
/// served nothing.
fn two_learned_and_loaded(s: &mut Scheduler) {
    teach(s, 0, 1000, Duration::from_millis(100), 5);
    teach(s, 1, 1000, Duration::from_millis(100), 5);
    s.apply_metrics(addr(0), snapshot(T0, 4, 0.3)).unwrap();
    s.apply_metrics(addr(1), snapshot(T0, 4, 0.3)).unwrap();
}

#[test]
fn cold_start_pods_use_the_pool_rate() {
    let mut s = scheduler(SchedulerConfig::default(), 3);
    // pod 2 never completed anything: it is assumed typical, so an idle pod 2 beats loaded ones.
    two_learned_and_loaded(&mut s);
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

/// A fleet of `gpus` (fixture endpoint `i` runs `gpus[i]`), all idle at [`T0`].
fn fleet_of(gpus: &[Option<&str>]) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
    for (i, gpu) in (0u32..).zip(gpus) {
        s.upsert_endpoint(EndpointMeta {
            gpu: gpu.map(str::to_owned),
            ..meta(i)
        });
        s.apply_metrics(addr(i), snapshot(T0, 0, 0.1)).unwrap();
    }
    s
}

#[test]
fn a_cold_pod_is_assumed_as_fast_as_its_gpu_type() {
    // Two H100s have learned 10,000 tokens/s; the A10G has served nothing yet. It is assumed to
    // run at 125/989 of their speed, not at theirs: loaded H100s (4 waiting each) still beat it
    // for a 1,000-token prompt.
    let mut s = fleet_of(&[
        Some("H100-SXM-80GB"),
        Some("H100-SXM-80GB"),
        Some("A10G-24GB"),
    ]);
    two_learned_and_loaded(&mut s);
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 1000), T0, &mut rng(1));
    assert_ne!(d.unwrap().endpoints.first(), addr(2), "{ex:?}");
    let a10g = ex.candidates.iter().find(|c| c.addr == addr(2)).unwrap();
    let want = 1000.0 / (10_000.0 * 125.0 / 989.0);
    assert!(
        (a10g.estimated_wait_secs - want).abs() < 0.02 * want,
        "A10G's wait {} s, want {want} s",
        a10g.estimated_wait_secs
    );
    // The same fleet without GPU types: the cold pod is assumed typical and wins (as
    // `cold_start_pods_use_the_pool_rate`).
    let mut s = fleet_of(&[None, None, None]);
    two_learned_and_loaded(&mut s);
    let d = s
        .pick(&RequestContext::new("m", 1000), T0, &mut rng(1))
        .unwrap();
    assert_eq!(d.endpoints.first(), addr(2));
}

#[test]
fn before_anything_is_learned_the_faster_gpu_gets_the_long_prompt() {
    for seed in 0..20 {
        let mut s = fleet_of(&[Some("A10G"), Some("H100")]);
        let d = s
            .pick(&RequestContext::new("m", 3000), T0, &mut rng(seed))
            .unwrap();
        assert_eq!(d.endpoints.first(), addr(1), "seed {seed}");
    }
}

#[test]
fn the_typical_speed_is_kept_per_reference_gpu() {
    // An A10G learned 1,262 tokens/s (an H100-equivalent of 10,000); a cold H100 is then
    // assumed at 10,000, a cold A10G at 1,262.
    let mut s = fleet_of(&[Some("A10G"), Some("H100"), Some("A10G")]);
    let a10g_rate = 10_000.0 * 125.0 / 989.0;
    let ttft = Duration::from_secs_f64(1000.0 / a10g_rate);
    teach(&mut s, 0, 1000, ttft, 5);
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 1000), T0, &mut rng(1));
    assert_eq!(
        d.unwrap().endpoints.first(),
        addr(1),
        "the H100 is the fastest"
    );
    let wait = |i: u32| {
        ex.candidates
            .iter()
            .find(|c| c.addr == addr(i))
            .unwrap()
            .estimated_wait_secs
    };
    assert!((wait(1) - 0.1).abs() < 0.005, "cold H100 {} s", wait(1));
    assert!(
        (wait(2) - 1000.0 / a10g_rate).abs() < 0.02,
        "cold A10G {} s",
        wait(2)
    );
    // Forgetting the A10G's rates takes them out of the typical speed: back to the configured
    // prior, scaled (pod 2 has nothing in flight; the H100 now has the pick above).
    assert!(s.forget_learned_rates(addr(0)));
    let (_, ex) = s.pick_explained(&RequestContext::new("m", 1000), T0, &mut rng(1));
    let cold = ex.candidates.iter().find(|c| c.addr == addr(2)).unwrap();
    let prior = SchedulerConfig::default().rates.prefill_tokens_per_sec * 125.0 / 989.0;
    assert!(
        (cold.estimated_wait_secs - 1000.0 / prior).abs() < 0.02,
        "{}",
        cold.estimated_wait_secs
    );
}

#[test]
fn zero_weight_removes_a_scorers_influence() {
    let cfg = weights_only(Weights {
        queue: 1.0,
        kv_cache: 0.0,
        ..Weights::default()
    });
    let mut s = scheduler(cfg, 2);
    s.apply_metrics(addr(0), snapshot(T0, 1, 0.0)).unwrap();
    s.apply_metrics(addr(1), snapshot(T0, 0, 0.9)).unwrap();
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    assert_eq!(d.unwrap().endpoints.first(), addr(1));
    assert!(
        ex.candidates[0]
            .scores
            .iter()
            .all(|r| r.scorer != "kv-cache")
    );
}

/// Views with every field varied, for the combination-step tests.
fn varied_views(n: u32) -> Vec<crate::view::View> {
    (0..n)
        .map(|i| {
            let f = f64::from(i);
            crate::view::View {
                slot: i,
                waiting: (f * 7.0) % 11.0,
                running: (f * 3.0) % 5.0,
                kv: (i % 4 != 0).then(|| (f * 0.137) % 1.0),
                inflight_tokens: (f * 913.0) % 4000.0,
                inflight: f % 3.0,
                prefix_blocks: i % 6,
                prefix: f64::from(i % 6) / 5.0,
                lora: [0.0, 0.3, 0.5, 0.8, 1.0][i as usize % 5],
                queued_tokens: (f * 577.0) % 3000.0,
                own_tokens: 400.0,
                wait: 0.01 + (f * 0.0731) % 2.0,
                ..Default::default()
            }
        })
        .collect()
}

#[test]
fn the_one_pass_combination_matches_the_explained_one_bit_for_bit() {
    use crate::explain::Explanation;
    use crate::scorer::{build, score_all};
    use crate::table::EndpointTable;
    let mut table = EndpointTable::default();
    for i in 0..40 {
        table.upsert(meta(i));
    }
    let all = Weights {
        queue: 1.5,
        kv_cache: 0.7,
        prefix: 3.0,
        lora_affinity: 2.0,
        running_requests: 0.3,
        inflight_tokens: 0.9,
        estimated_wait: 6.0,
    };
    for weights in [
        all,
        SchedulerConfig::preset(Preset::Infergate).weights,
        SchedulerConfig::preset(Preset::GieDefault).weights,
        Weights {
            queue: 0.0,
            prefix: 0.0,
            ..all
        },
    ] {
        let scorers = build(&weights);
        let mut hot = varied_views(40);
        score_all(&scorers, &mut hot, &table, T0, None);
        let mut explained = varied_views(40);
        let mut ex = Explanation::default();
        score_all(&scorers, &mut explained, &table, T0, Some(&mut ex));
        for (h, e) in hot.iter().zip(&explained) {
            assert_eq!(h.total.to_bits(), e.total.to_bits(), "{weights:?}");
        }
        assert!(hot.iter().any(|v| v.total != hot[0].total));
    }
}

/// Pods 0 and 1 learn their speeds idle (pod 0 a 20% faster prefill: 10 tokens in 100 ms against
/// 120 ms; both about 11 ms per output token), then pod 0 shows `running` requests decoding with
/// its KV cache 85% full and nothing queued, while pod 1 is empty.
fn busy_and_idle(running: u32) -> Scheduler {
    let mut s = scheduler(SchedulerConfig::default(), 2);
    teach(&mut s, 0, 10, Duration::from_millis(100), 5);
    teach(&mut s, 1, 10, Duration::from_millis(120), 5);
    let mut m = snapshot(T0, 0, 0.85);
    m.running = running;
    s.apply_metrics(addr(0), m).unwrap();
    s.apply_metrics(addr(1), snapshot(T0, 0, 0.0)).unwrap();
    s
}

#[test]
fn a_running_batch_costs_one_inter_token_time_before_the_first_token() {
    // One running request: the step's decode part is one inter-token time (11 ms), more than its
    // one token's compute at the prefill rate (10 ms).
    let mut s = busy_and_idle(1);
    let itl = 1.0 / s.endpoint(addr(0)).unwrap().decode_tokens_per_sec.unwrap();
    let per_token = 1.0 / s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec.unwrap();
    let prefill = 10.0 * per_token;
    assert!(
        itl > per_token,
        "{itl} s per output token, {per_token} s per prompt token"
    );
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    let wait = |i| {
        ex.candidates
            .iter()
            .find(|c| c.addr == addr(i))
            .unwrap()
            .estimated_wait_secs
    };
    assert!(
        (wait(0) - (prefill + itl)).abs() < 1e-9,
        "busy pod: {} s, want prefill {prefill} s + one inter-token time {itl} s",
        wait(0)
    );
    // A short request goes to the empty pod, though the busy one learned a faster prefill
    // (without the decode step it would be estimated 20 ms sooner there, and win).
    assert_eq!(d.unwrap().endpoints.first(), addr(1), "{}", ex.summary(2));
}

#[test]
fn among_busy_pods_the_decode_step_is_left_out() {
    // Both pods run a batch: each would pay the decode step, so neither wait carries it, and the
    // faster prefill wins as before.
    let mut s = busy_and_idle(12);
    let mut m = snapshot(T0, 0, 0.85);
    m.running = 3;
    s.apply_metrics(addr(1), m).unwrap();
    let prefill = |i| 10.0 / s.endpoint(addr(i)).unwrap().prefill_tokens_per_sec.unwrap();
    let want = [prefill(0), prefill(1)];
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    for (i, want) in (0u32..).zip(want) {
        let got = ex
            .candidates
            .iter()
            .find(|c| c.addr == addr(i))
            .unwrap()
            .estimated_wait_secs;
        assert!((got - want).abs() < 1e-9, "pod {i}: {got} s, want {want} s");
    }
    assert_eq!(d.unwrap().endpoints.first(), addr(0), "{}", ex.summary(2));
}

#[test]
fn a_large_batch_costs_its_decode_tokens_at_the_prefill_rate() {
    // Twelve running requests: their twelve decode tokens at 10 ms each (120 ms) outweigh one
    // inter-token time (11 ms), as in a step that compute bounds.
    let mut s = busy_and_idle(12);
    let per_token = 1.0 / s.endpoint(addr(0)).unwrap().prefill_tokens_per_sec.unwrap();
    let (d, ex) = s.pick_explained(&RequestContext::new("m", 10), T0, &mut rng(1));
    let got = ex
        .candidates
        .iter()
        .find(|c| c.addr == addr(0))
        .unwrap()
        .estimated_wait_secs;
    let want = (10.0 + 12.0) * per_token;
    assert!(
        (got - want).abs() < 1e-6,
        "busy pod: {got} s, want {want} s"
    );
    assert_eq!(d.unwrap().endpoints.first(), addr(1), "{}", ex.summary(2));
}
