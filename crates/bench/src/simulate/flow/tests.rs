#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use crate::report::{FlowRun, RunResult};
use crate::scenario::{FlowPolicy, Scenario};
use crate::{Report, Silent};

fn run(yaml: &str) -> Report {
    let s = Scenario::from_yaml(yaml, "t").unwrap();
    crate::simulate::run(&s, "t", &mut Silent).unwrap()
}

fn flow_of(r: &Report, policy: FlowPolicy) -> Vec<(&RunResult, &FlowRun)> {
    r.runs
        .iter()
        .filter(|run| run.policy == policy.as_str())
        .map(|run| (run, run.flow.as_ref().unwrap()))
        .collect()
}

/// Two pods, their scrapes hanging from 5 s to 35 s: late for 20 s, then failed but reachable.
const STALE: &str = r#"
name: stale
fleet:
  - { name: a10g, profile: llama-3.1-8b/a10g, replicas: 2 }
workload:
  duration_s: 40
  arrival: { kind: poisson, rate: 3 }
  prompt_tokens: { dist: uniform, min: 100, max: 400 }
  output_tokens: { dist: uniform, min: 16, max: 32 }
stale:
  - { from_s: 5, to_s: 35 }
seeds: [1]
policies: [infergate]
flow:
  targets: { stale_vs_direct: 3.0, bounded: true }
"#;

#[test]
fn stale_pods_keep_serving_fail_open_while_the_reference_stops() {
    let r = run(STALE);
    let f = r.flow.as_ref().unwrap();
    for (run, flow) in flow_of(&r, FlowPolicy::Infergate) {
        let stale = flow.stale.as_ref().unwrap();
        assert!(stale.arrived > 50, "{stale:?}");
        // Every request served, in the failed phase as in the late one: a hanging scrape is a
        // reachable pod, never "no fresh endpoints".
        assert_eq!(run.completed, run.requests, "{:?}", flow.rejects);
        assert!(flow.rejects.is_empty(), "{:?}", flow.rejects);
        assert_eq!(stale.dispatched, stale.arrived);
        assert_eq!(flow.unanswered, 0);
    }
    for (run, flow) in flow_of(&r, FlowPolicy::Reference) {
        let stale = flow.stale.as_ref().unwrap();
        // Fail-closed: nothing is sent while the metrics are stale; the requests wait (the
        // window is shorter than the TTL) and are served once the pages return.
        assert!(stale.dispatched <= 1, "{stale:?}");
        assert!(flow.max_wait_s > 25.0, "{}", flow.max_wait_s);
        assert_eq!(run.completed, run.requests);
    }
    assert!(f.verdicts.iter().all(|v| v.met), "{:?}", f.verdicts);
}

/// Three tenants over four pods, twice what they can serve, queues bounded and a short TTL.
const OVERLOAD: &str = r#"
name: overload
fleet:
  - { name: a10g, profile: llama-3.1-8b/a10g, replicas: 4 }
workload:
  duration_s: 30
  arrival: { kind: poisson, rate: 40 }
  prompt_tokens: { dist: lognormal, median: 400, sigma: 0.5, min: 32, max: 2000 }
  output_tokens: { dist: uniform, min: 32, max: 128 }
  tenants:
    - { name: checkout, share: 0.1, priority: critical }
    - { name: search, share: 0.5, priority: standard }
    - { name: batch, share: 0.4, priority: sheddable }
seeds: [1]
policies: [infergate]
flow:
  config:
    requestTtlMs: 5000
    maxRequests: 150
    bands:
      critical: { maxRequests: 50 }
      standard: { maxRequests: 100 }
      sheddable: { maxRequests: 100 }
    fairness: least-attained-service
  saturation: { queueDepth: 1, kvCache: 0.9 }
  targets: { shed_order: true, bounded: true }
"#;

#[test]
fn an_overloaded_pool_answers_every_request_within_the_queue_bounds() {
    let r = run(OVERLOAD);
    let (run, flow) = flow_of(&r, FlowPolicy::Infergate)[0];
    assert_eq!(flow.unanswered, 0);
    let rejected: u64 = flow.rejects.iter().map(|x| x.count).sum();
    assert_eq!(run.completed + rejected, run.requests);
    assert!(flow.max_queue <= 150 && flow.max_band[0] <= 50 && flow.max_band[1] <= 100);
    assert!(flow.max_wait_s <= 5.0 + 1e-6, "{}", flow.max_wait_s);
    // The TTL expires requests (the run ends although deadlines keep coming due), and every
    // rejection of the queues tells the client when to retry.
    let expired = flow
        .rejects
        .iter()
        .find(|x| x.reason == "rejected-ttl-expired")
        .unwrap();
    assert!(expired.count > 0);
    for x in &flow.rejects {
        assert_eq!(x.status, 429, "{x:?}");
        assert_eq!(x.with_retry_after, x.count, "{x:?}");
    }
    // Critical is never turned away; Sheddable loses the most.
    let p = |name: &str| flow.priorities.iter().find(|g| g.name == name).unwrap();
    assert_eq!(p("critical").rejected, 0);
    assert!(p("sheddable").rejected > p("standard").rejected);
    // Waiting in the queue is part of the TTFT, and the split adds up per request.
    for g in &flow.priorities {
        if g.completed > 0 {
            assert!(g.queued.p50 <= g.ttft.p50 + 1e-9, "{g:?}");
            assert!(
                g.at_pod.mean > 0.0 && g.at_pod.mean <= g.ttft.mean + 1e-9,
                "{g:?}"
            );
        }
    }
    assert!(r.flow.as_ref().unwrap().verdicts.iter().all(|v| v.met));
}

#[test]
fn a_reserved_pod_shortens_critical_ttft_and_retry_after_covers_the_queue() {
    let with = OVERLOAD.replace(
        "    fairness: least-attained-service\n",
        "    fairness: least-attained-service\n    headroom: { reservedEndpoints: 1 }\n",
    );
    assert_ne!(with, OVERLOAD);
    let (before, after) = (run(OVERLOAD), run(&with));
    let critical = |r: &Report| {
        let (_, flow) = flow_of(r, FlowPolicy::Infergate)[0];
        let g = flow
            .priorities
            .iter()
            .find(|g| g.name == "critical")
            .unwrap();
        assert_eq!(g.rejected, 0);
        assert_eq!(flow.unanswered, 0);
        (g.ttft.p99, g.at_pod.p99)
    };
    let ((p99_before, pod_before), (p99_after, pod_after)) = (critical(&before), critical(&after));
    // Critical requests find a pod with no prefill ahead: less time on the pod and overall.
    assert!(pod_after < pod_before, "{pod_after} vs {pod_before}");
    assert!(p99_after < p99_before, "{p99_after} vs {p99_before}");
    // A request turned away after waiting its 5 s TTL is told the queue's wait, not the ~1 s
    // drain estimate of one pod.
    let (_, flow) = flow_of(&after, FlowPolicy::Infergate)[0];
    let expired = flow
        .rejects
        .iter()
        .find(|x| x.reason == "rejected-ttl-expired")
        .unwrap();
    assert!(expired.retry_after_mean_s > 2.0, "{expired:?}");
    assert!(expired.retry_after_max_s <= 5.0, "{expired:?}");
}

#[test]
fn shipped_flow_scenarios_carry_the_targets_they_are_documented_with() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/scenarios");
    let load =
        |name: &str| Scenario::from_file(&dir.join(format!("flow-{name}-llama-8b.yaml"))).unwrap();
    let s = load("noisy-neighbour");
    let f = s.flow.as_ref().unwrap();
    let iso = f.targets.isolation.as_ref().unwrap();
    assert_eq!((iso.tenant.as_str(), iso.max_ratio), ("quiet", 1.25));
    assert!(f.targets.bounded);
    assert_eq!(s.workload.tenants.len(), 2);
    let s = load("priority-overload");
    let f = s.flow.as_ref().unwrap();
    assert_eq!(f.targets.critical_vs_unloaded, Some(1.5));
    assert!(f.targets.shed_order && f.targets.bounded);
    let s = load("stale-metrics");
    let f = s.flow.as_ref().unwrap();
    assert_eq!(f.targets.stale_vs_direct, Some(1.5));
    assert!(!s.stale.is_empty());
    for s in ["noisy-neighbour", "priority-overload", "stale-metrics"].map(load) {
        assert!(s.seeds.len() >= 3, "{}", s.name);
        assert_eq!(
            s.flow.as_ref().unwrap().policies,
            [
                FlowPolicy::None,
                FlowPolicy::Reference,
                FlowPolicy::Infergate
            ]
        );
    }
}

#[test]
fn targets_without_the_traffic_they_measure_are_refused() {
    let field = |yaml: &str| match Scenario::from_yaml(yaml, "t") {
        Err(crate::BenchError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    // A Critical target with no Critical request would compare against nothing.
    let no_critical = OVERLOAD.replace("priority: critical", "priority: standard");
    let no_critical = no_critical.replace(
        "targets: { shed_order: true, bounded: true }",
        "targets: { critical_vs_unloaded: 1.5 }",
    );
    assert_eq!(field(&no_critical), "flow.targets.critical_vs_unloaded");
    let with_critical = OVERLOAD.replace(
        "targets: { shed_order: true, bounded: true }",
        "targets: { critical_vs_unloaded: 1.5 }",
    );
    assert!(Scenario::from_yaml(&with_critical, "t").is_ok());
    // A stale window after the last arrival measures no request.
    let late = STALE.replace("{ from_s: 5, to_s: 35 }", "{ from_s: 50, to_s: 60 }");
    assert_eq!(field(&late), "flow.targets.stale_vs_direct");
}

#[test]
fn a_bad_flow_config_value_is_named_by_its_path_in_the_scenario() {
    let invalid = |yaml: &str| match Scenario::from_yaml(yaml, "t") {
        Err(e @ crate::BenchError::Invalid { .. }) => e.to_string(),
        other => panic!("{other:?}"),
    };
    // The scheduler names the gateway's `flowControl.…`; the scenario spells it `flow.config.…`.
    let ttl = STALE.replace(
        "flow:\n",
        "flow:\n  config: { enabled: true, requestTtlMs: 90000000 }\n",
    );
    let msg = invalid(&ttl);
    assert!(
        msg.starts_with("scenario t: field `flow.config.requestTtlMs` must be between 0"),
        "{msg}"
    );
    let band = STALE.replace(
        "flow:\n",
        "flow:\n  config: { bands: { sheddable: { maxRequests: 0 } } }\n",
    );
    let msg = invalid(&band);
    assert_eq!(
        msg,
        "scenario t: field `flow.config.bands.sheddable.maxRequests` must be at least 1"
    );
}
