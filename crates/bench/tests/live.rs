//! Live mode end to end: emulated pods on 127.0.0.1, the standalone gateway in front, real
//! streaming HTTP requests.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use infergate_bench::{Scenario, Silent};

const TINY: &str = r#"
name: tiny-live
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g }
workload:
  duration_s: 3
  arrival: { kind: poisson, rate: 4 }
  prompt_tokens: { dist: uniform, min: 50, max: 400 }
  output_tokens: { dist: uniform, min: 4, max: 16 }
seeds: [5]
policies: [round-robin, infergate]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_runs_account_for_every_request_through_the_gateway() {
    let scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    let report = infergate_bench::live::run(&scenario, "tiny", &mut Silent)
        .await
        .unwrap();
    assert_eq!(report.mode, "live");
    assert_eq!(report.runs.len(), 2);
    for r in &report.runs {
        assert!(r.requests >= 4, "{}", r.requests);
        assert_eq!(r.errors + r.rejected, 0, "{}: {r:?}", r.policy);
        assert_eq!(r.completed, r.requests);
        // Every answer named the pod that served it.
        assert_eq!(r.per_pod_requests.iter().sum::<u64>(), r.completed);
        assert!(r.ttft.p50 > 0.0 && r.ttft.p99 <= r.e2e.p99);
        assert!(r.load.as_ref().unwrap().pods.len() == 2);
    }
    // Round-robin alternates: both pods served.
    let rr = &report.runs[0];
    assert!(
        rr.per_pod_requests.iter().all(|n| *n > 0),
        "{:?}",
        rr.per_pod_requests
    );
}
