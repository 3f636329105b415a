//! Failing pods in the simulated runner: the gateway's retries, the answers reported to the
//! scheduler's outlier detection, and what the report counts.

use super::super::*;
use crate::Silent;

/// Three pods, the last failing `error_rate` of its requests; `extra` is appended (retries,
/// policies).
fn failing(error_rate: f64, extra: &str) -> Scenario {
    let yaml = format!(
        r#"
name: failing
targets: {{ beat_gie_default: false, floor_multiple: null }}
fleet:
  - {{ name: ok, profile: llama-3.1-8b/h100, replicas: 2 }}
  - {{ name: bad, profile: llama-3.1-8b/h100, faults: [{{ at_s: 0, error_rate: {error_rate} }}] }}
workload:
  duration_s: 40
  arrival: {{ kind: poisson, rate: 8 }}
  prompt_tokens: {{ dist: lognormal, median: 600, sigma: 0.6, min: 32, max: 3000 }}
  output_tokens: {{ dist: uniform, min: 16, max: 64 }}
seeds: [1]
{extra}
"#
    );
    Scenario::from_yaml(&yaml, "t").unwrap()
}

/// The fleet of `s` and its arrivals on seed 1, for a runner set up by hand.
fn fleet_and_arrivals(s: &Scenario) -> (FleetSpec, Vec<Arrival>) {
    let spec = s
        .fleet_spec(&infergate_sim::Catalog::builtin().unwrap(), "t")
        .unwrap();
    (spec, workload::generate(&s.workload, 1))
}

fn attempts(r: &RunResult) -> &Attempts {
    r.attempts.as_ref().unwrap()
}

#[test]
fn a_failed_attempt_is_retried_on_the_next_pod_and_counted() {
    let s = failing(
        1.0,
        "policies: [round-robin, { name: infergate-no-od, preset: infergate, outlierDetection: null }]",
    );
    let report = run(&s, "t", &mut Silent).unwrap();
    for r in &report.runs {
        let at = attempts(r);
        // Every request completed on a healthy pod after at most one failed attempt.
        assert_eq!((r.completed, r.errors, at.exhausted), (r.requests, 0, 0));
        assert_eq!(at.requests, r.requests);
        assert_eq!(r.per_pod_requests[2], 0, "{}", r.policy);
        assert!(at.failed > 0, "{}", r.policy);
        assert_eq!(at.failed, at.first_to_failing, "{}", r.policy);
        assert_eq!(at.first_per_pod[2], at.first_to_failing);
        assert_eq!(at.sent, at.requests + at.failed);
        assert_eq!(at.first_per_pod.iter().sum::<u64>(), at.requests);
        // Without outlier detection nothing is ejected.
        assert_eq!((at.ejections, at.held_back), (0, 0));
        assert!(r.failures.is_empty());
    }
    // Round-robin sends every third request to the failing pod first.
    let rr = attempts(&report.runs[0]);
    let share = rr.first_to_failing_share();
    assert!((0.30..0.37).contains(&share), "{share}");
}

#[test]
fn a_request_whose_every_attempt_fails_is_an_error_of_the_report() {
    // One attempt: each first attempt at the failing pod is a failed request.
    let s = failing(1.0, "retries: { maxAttempts: 1 }\npolicies: [round-robin]");
    let r = &run(&s, "t", &mut Silent).unwrap().runs[0];
    let at = attempts(r);
    assert!(at.first_to_failing > 0);
    assert_eq!(r.errors, at.first_to_failing);
    assert_eq!(at.exhausted, r.errors);
    assert_eq!(at.sent, at.requests);
    assert_eq!(r.completed + r.errors, r.requests);
    assert_eq!(
        r.failures.values().copied().collect::<Vec<_>>(),
        [r.errors],
        "{:?}",
        r.failures
    );
    // Every pod failing: each request is tried on min(maxAttempts, pods) pods, then fails.
    let mut all = failing(1.0, "retries: { maxAttempts: 5 }\npolicies: [round-robin]");
    all.fleet[0].faults = all.fleet[1].faults.clone();
    let r = &run(&all, "t", &mut Silent).unwrap().runs[0];
    let at = attempts(r);
    assert_eq!((r.completed, r.errors), (0, r.requests));
    assert_eq!(at.sent, 3 * r.requests);
    assert_eq!(at.failed, at.sent);
}

#[test]
fn the_same_seed_draws_the_same_failures_and_another_seed_others() {
    let s = failing(0.5, "policies: [round-robin, infergate]");
    let a = run(&s, "t", &mut Silent).unwrap();
    assert_eq!(a, run(&s, "t", &mut Silent).unwrap());
    let mut other = s.clone();
    other.seeds = vec![2];
    let b = run(&other, "t", &mut Silent).unwrap();
    let failed = |r: &Report| attempts(&r.runs[0]).failed;
    assert_ne!(failed(&a), failed(&b));
    // About half of the failing pod's attempts fail.
    let at = attempts(&a.runs[0]);
    let to_bad = at.first_per_pod[2] as f64;
    let share = at.failed as f64 / to_bad;
    assert!((0.35..0.65).contains(&share), "{share}");
}

#[test]
fn outlier_detection_sends_the_failing_pod_fewer_first_attempts() {
    let s = failing(
        1.0,
        "policies:\n  - { name: infergate-no-od, preset: infergate, outlierDetection: null }\n  - { name: infergate-od, preset: infergate, outlierDetection: { consecutive5xx: 3 } }",
    );
    let report = run(&s, "t", &mut Silent).unwrap();
    let (without, with) = (attempts(&report.runs[0]), attempts(&report.runs[1]));
    assert_eq!(report.runs[1].policy, "infergate-od");
    assert!(without.first_to_failing > 20, "{without:?}");
    // Three failures eject it for 30 s; it fails three more when it is back.
    assert!(with.first_to_failing <= 6, "{with:?}");
    assert!(with.ejections >= 1, "{with:?}");
    assert_eq!(without.ejections, 0);
    assert!(with.per_request() < without.per_request());
}

#[test]
fn a_retried_request_is_charged_to_the_pod_that_serves_it_and_the_failure_is_judged() {
    let s = failing(1.0, "policies: [round-robin]");
    let (spec, arrivals) = fleet_and_arrivals(&s);
    let mut cfg = SchedulerConfig::preset(infergate_scheduler::Preset::RoundRobin);
    cfg.outlier_detection = Some(infergate_scheduler::outlier::OutlierDetection {
        consecutive_5xx: 1,
        ..Default::default()
    });
    let mut sim = setup(&s, &spec, cfg, &arrivals, 1, false, &[]).unwrap();
    let text: Arc<str> = "a prompt".into();
    let model = model_of(&spec);
    let mut rng = SmallRng::seed_from_u64(1);
    // Round-robin's picks start at some pod; place arrivals until one goes to the failing pod.
    let bad = pod_addr(2);
    for a in arrivals.iter().take(3) {
        let cx = RequestContext::new(&model, a.prompt_tokens);
        let decision = sim.sched.pick(&cx, ts(a.at), &mut rng).unwrap();
        let first = decision.endpoints.first();
        let placed = sim.place(a, &decision, &text, None).unwrap().unwrap();
        if first == bad {
            assert_ne!(placed, bad);
            // Moved: the failing pod holds nothing, the one that took it holds it.
            assert_eq!(sim.sched.endpoint(bad).unwrap().inflight, 0);
            assert!(sim.sched.endpoint(placed).unwrap().inflight >= 1);
            // Judged: one failure with consecutive5xx 1 ejects it.
            assert_eq!(sim.attempts.as_ref().unwrap().ejections, 1);
            assert_eq!(sim.sched.ejected_endpoints(ts(a.at)), 1);
            return;
        }
    }
    panic!("round-robin sent none of three requests to the failing pod first");
}

#[test]
fn a_failed_attempts_prompt_blocks_go_to_the_pod_that_serves_it() {
    // The runner moves a failed request to its fallback with the scheduler's `reassign`, as
    // the gateway's `Inflight::reassign` does, and the prompt's blocks in the prefix index go
    // with it: the next request of that prefix is drawn to the pod that served the first, never
    // back to the failing pod. Left on the failing pod, they drew a shared prompt's requests
    // there: the live run of record in docs/benchmarks.md, made before the scheduler moved
    // them, sent it 440 of 603 first attempts where the simulation sends 273.
    let s = failing(1.0, "policies: [infergate]");
    let (spec, arrivals) = fleet_and_arrivals(&s);
    let mut cfg = SchedulerConfig::preset(infergate_scheduler::Preset::Infergate);
    cfg.outlier_detection = None;
    let mut sim = setup(&s, &spec, cfg, &arrivals, 1, false, &[]).unwrap();
    sim.prime();
    let model = model_of(&spec);
    let mut rng = SmallRng::seed_from_u64(1);
    let bad = pod_addr(2);
    // System prompts whose request failed on the failing pod first, and the picks that came
    // after under one of them.
    let (mut failed_under, mut after) = (Vec::new(), 0);
    // Three requests under each system prompt: the first finds the prefix nowhere.
    for a in arrivals.iter().take(30) {
        sim.advance(a.at);
        sim.absorb();
        sim.refresh_metrics();
        let system = format!("system prompt {} ", a.id / 3).repeat(60);
        let text: Arc<str> = format!("{system}<request {}>", a.id).into();
        let segments = [&*text];
        let cx = RequestContext::new(&model, a.prompt_tokens).with_prompt(&segments);
        let (decision, ex) = sim.sched.pick_explained(&cx, ts(a.at), &mut rng);
        let decision = decision.unwrap();
        after += usize::from(failed_under.contains(&(a.id / 3)));
        for c in ex.candidates.iter().filter(|c| c.addr == bad) {
            assert_eq!(c.prefix_blocks, 0, "request {}: {}", a.id, ex.summary(4));
        }
        if decision.endpoints.first() == bad {
            failed_under.push(a.id / 3);
        }
        let placed = sim.place(a, &decision, &text, None).unwrap().unwrap();
        assert_ne!(placed, bad);
    }
    // Its idle page made it the first choice of requests whose prefix no pod held; later
    // requests under those prefixes were picked with the index as the fallbacks left it.
    assert!(
        !failed_under.is_empty() && after > 0,
        "{failed_under:?} {after}"
    );
}

#[test]
fn a_completed_request_starts_its_pods_failure_count_again() {
    // The failing pod fails everything for 0.6 s in every 3 s: a few failures in a row each time
    // (round-robin sends it a third of about 8 requests a second), with successes between.
    let mut steps = Vec::new();
    for w in 0..8 {
        let at = 3.0 * f64::from(w);
        steps.push(format!("{{ at_s: {at}, error_rate: 1.0 }}"));
        steps.push(format!("{{ at_s: {}, error_rate: 0 }}", at + 0.6));
    }
    let mut s = failing(
        1.0,
        "policies: [{ name: rr-od, preset: round-robin, outlierDetection: { consecutive5xx: 6 } }]",
    );
    s.fleet[1].faults = Scenario::from_yaml(
        &format!(
            "name: x\nfleet: [{{ name: a, profile: llama-3.1-8b/h100, faults: [{}] }}]\nworkload: {{ duration_s: 1, arrival: {{ kind: poisson, rate: 1 }}, prompt_tokens: {{ dist: fixed, value: 1 }}, output_tokens: {{ dist: fixed, value: 1 }} }}\n",
            steps.join(", ")
        ),
        "t",
    )
    .unwrap()
    .fleet[0]
        .faults
        .clone();
    let r = &run(&s, "t", &mut Silent).unwrap().runs[0];
    let at = attempts(r);
    // Far more than six failures in all, never six in a row: no ejection, since every request
    // the pod completes between its bad spells is reported as a success.
    assert!(at.failed > 12, "{at:?}");
    assert_eq!(at.ejections, 0, "{at:?}");
}

#[test]
fn each_run_seed_draws_its_own_failures_on_the_same_requests() {
    let s = failing(0.5, "policies: [round-robin]");
    let (spec, arrivals) = fleet_and_arrivals(&s);
    let pattern = |seed: u64| {
        let cfg = SchedulerConfig::preset(infergate_scheduler::Preset::RoundRobin);
        let mut sim = setup(&s, &spec, cfg, &arrivals, seed, false, &[]).unwrap();
        (0..200u64)
            .map(|i| {
                let req = Request {
                    id: i,
                    arrival: i as f64 * 0.01,
                    prompt: Prompt::Text("the same request".into()),
                    max_tokens: 1,
                    lora: None,
                };
                matches!(sim.fleet.submit(2, req), Err(SimError::Failed(2)))
            })
            .collect::<Vec<bool>>()
    };
    assert_eq!(pattern(1), pattern(1));
    assert_ne!(pattern(1), pattern(2));
}
