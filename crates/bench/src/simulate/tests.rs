#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;
use crate::Silent;

const MIXED: &str = r#"
name: small-mixed
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g, replicas: 3 }
workload:
  duration_s: 30
  arrival: { kind: poisson, rate: 6 }
  prompt_tokens: { dist: lognormal, median: 800, sigma: 0.6, min: 32, max: 4000 }
  output_tokens: { dist: uniform, min: 16, max: 64 }
seeds: [1]
policies: [round-robin, least-request, infergate]
"#;

#[test]
fn every_request_is_accounted_for_and_runs_are_reproducible() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let a = run(&s, "t", &mut Silent).unwrap();
    let b = run(&s, "t", &mut Silent).unwrap();
    assert_eq!(a, b);
    for r in &a.runs {
        assert!(r.requests > 100);
        assert_eq!(
            r.completed + r.rejected + r.errors,
            r.requests,
            "{}",
            r.policy
        );
        assert_eq!(r.per_pod_requests.iter().sum::<u64>(), r.completed);
        assert!(r.ttft.p50 > 0.0 && r.ttft.p50 <= r.ttft.p99);
        assert!(r.e2e.p99 >= r.ttft.p99);
        assert_eq!(r.ttft_cdf.len(), CDF_POINTS);
        assert!(r.ttft_cdf.windows(2).all(|w| w[0] <= w[1]));
        let load = r.load.as_ref().unwrap();
        assert_eq!(load.pods.len(), 4);
        assert!(load.pods[0].len() >= 30);
    }
    // Round-robin gives every pod the same share; the floor is below every policy.
    let rr = a.policy("round-robin").unwrap();
    assert!(
        rr.pod_share.iter().all(|s| (s - 0.25).abs() < 0.02),
        "{:?}",
        rr.pod_share
    );
    for p in &a.summary {
        assert!(p.ttft_p99_vs_floor.mean >= 1.0, "{}", p.policy);
    }
}

#[test]
fn speed_aware_routing_beats_round_robin_on_a_mixed_fleet() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let r = run(&s, "t", &mut Silent).unwrap();
    let rr = r.policy("round-robin").unwrap();
    let ig = r.policy("infergate").unwrap();
    // The H100 prefills ~8x faster than an A10G: a router that learns it must cut the tail.
    assert!(
        ig.ttft_p99.mean < rr.ttft_p99.mean,
        "{} vs {}",
        ig.ttft_p99.mean,
        rr.ttft_p99.mean
    );
    assert!(ig.pod_share[0] > rr.pod_share[0]);
}

#[test]
fn the_floor_counts_a_seen_prefix_as_cached() {
    let catalog = infergate_sim::Catalog::builtin().unwrap();
    let p = catalog.get("llama-3.1-8b/h100").unwrap();
    let spec = FleetSpec::uniform(p, EngineKind::Vllm, "h", 1).unwrap();
    let mk = |id| Arrival {
        id,
        at: id as f64,
        prompt_tokens: 1000,
        prefix_group: Some(0),
        prefix_tokens: 960,
        output_tokens: 1,
        lora: None,
        priority: Default::default(),
        tenant: 0,
    };
    let one = floor(&spec, &[mk(0)], 1);
    let two = floor(&spec, &[mk(0), mk(1)], 1);
    assert!((one.ttft.p50 - p.nominal_ttft(1000)).abs() < 1e-12);
    // The second request only prefills its 40 unshared tokens.
    assert!((two.ttft.p50 - p.nominal_ttft(40)).abs() < 1e-12);
}

#[test]
fn pod_addresses_are_distinct() {
    let addrs: std::collections::HashSet<_> = (0..600).map(pod_addr).collect();
    assert_eq!(addrs.len(), 600);
}

#[test]
fn pod_index_inverts_pod_addr() {
    for i in [0usize, 1, 254, 255, 256, 999, 1000, 65_534] {
        assert_eq!(pod_index(&pod_addr(i), 65_535), Some(i), "{i}");
    }
    assert_eq!(pod_index(&pod_addr(5), 5), None, "outside the fleet");
    assert_eq!(pod_index(&"10.0.0.1:8001".parse().unwrap(), 10), None);
    assert_eq!(pod_index(&"10.1.0.1:8000".parse().unwrap(), 10), None);
    assert_eq!(pod_index(&"[::1]:8000".parse().unwrap(), 10), None);
}
