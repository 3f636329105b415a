//! Calibration and behaviour of the discrete-event fleet.

use super::*;
use crate::spec::PodSpec;
use crate::{Catalog, Profile, StepShape};

fn profile(id: &str) -> Profile {
    Catalog::builtin().unwrap().get(id).unwrap().clone()
}

fn fleet_of(p: &Profile, n: usize) -> Fleet {
    Fleet::new(&FleetSpec::uniform(p, EngineKind::Vllm, "pod", n).unwrap()).unwrap()
}

fn text_req(id: u64, arrival: f64, text: &str, out: u32) -> Request {
    Request {
        id,
        arrival,
        prompt: Prompt::Text(text.into()),
        max_tokens: out,
        lora: None,
    }
}

fn one(fleet: &mut Fleet, pod: usize, r: Request) -> Completion {
    let id = r.id;
    fleet.submit(pod, r).unwrap();
    fleet.run_until_idle();
    let mut out = Vec::new();
    fleet.drain_completions(&mut out);
    out.into_iter().find(|c| c.id == id).unwrap()
}

fn within(actual: f64, nominal: f64, tol: f64) -> bool {
    (actual - nominal).abs() <= tol * nominal
}

#[test]
fn batch_one_ttft_and_itl_match_every_profile_within_ten_percent() {
    for p in Catalog::builtin().unwrap().all() {
        let mut fleet = fleet_of(p, 1);
        let c = one(
            &mut fleet,
            0,
            Request {
                id: 1,
                arrival: 0.0,
                prompt: Prompt::tokens(512),
                max_tokens: 64,
                lora: None,
            },
        );
        let ttft_nominal = (p.prefill_overhead_ms + 512.0 * p.prefill_per_token_us * 1e-3) * 1e-3;
        let itl_nominal = p.decode_base_ms * 1e-3;
        assert!(
            within(c.ttft(), ttft_nominal, 0.10),
            "{}: ttft {} vs {}",
            p.id,
            c.ttft(),
            ttft_nominal
        );
        assert!(
            within(c.mean_itl(), itl_nominal, 0.10),
            "{}: itl {} vs {}",
            p.id,
            c.mean_itl(),
            itl_nominal
        );
        assert_eq!(c.output_tokens, 64);
    }
}

#[test]
fn h100_is_several_times_faster_than_a10g() {
    let (h, a) = (profile("llama-3.1-8b/h100"), profile("llama-3.1-8b/a10g"));
    let r = || Request {
        id: 1,
        arrival: 0.0,
        prompt: Prompt::tokens(1000),
        max_tokens: 100,
        lora: None,
    };
    let ch = one(&mut fleet_of(&h, 1), 0, r());
    let ca = one(&mut fleet_of(&a, 1), 0, r());
    assert!(ca.ttft() / ch.ttft() > 4.0, "{} {}", ca.ttft(), ch.ttft());
    assert!(ca.mean_itl() / ch.mean_itl() > 4.0);
}

/// Closed loop: `n` clients each send the next request when the previous one finishes.
fn closed_loop_tokens_per_s(p: &Profile, n: usize, prompt: u32, out: u32, horizon: f64) -> f64 {
    let mut fleet = fleet_of(p, 1);
    let mut next_id = 0u64;
    for _ in 0..n {
        fleet
            .submit(
                0,
                Request {
                    id: next_id,
                    arrival: 0.0,
                    prompt: Prompt::tokens(prompt),
                    max_tokens: out,
                    lora: None,
                },
            )
            .unwrap();
        next_id += 1;
    }
    let mut done = Vec::new();
    let mut tokens = 0u64;
    let warmup = horizon / 4.0;
    while let Some(t) = fleet.next_event_time() {
        if t > horizon {
            break;
        }
        fleet.advance_to(t);
        fleet.drain_completions(&mut done);
        for c in done.drain(..) {
            if c.last_token >= warmup {
                tokens += u64::from(c.output_tokens);
            }
            fleet
                .submit(
                    0,
                    Request {
                        id: next_id,
                        arrival: t,
                        prompt: Prompt::tokens(prompt),
                        max_tokens: out,
                        lora: None,
                    },
                )
                .unwrap();
            next_id += 1;
        }
    }
    tokens as f64 / (horizon - warmup)
}

#[test]
fn throughput_saturates_at_max_num_seqs() {
    let p = profile("llama-3.1-8b/h100");
    let m = p.max_num_seqs as usize;
    let (prompt, out) = (128, 256);
    let quarter = closed_loop_tokens_per_s(&p, m / 4, prompt, out, 60.0);
    let full = closed_loop_tokens_per_s(&p, m, prompt, out, 60.0);
    let double = closed_loop_tokens_per_s(&p, 2 * m, prompt, out, 60.0);
    assert!(
        full > 1.4 * quarter,
        "below saturation throughput must grow: {quarter} -> {full}"
    );
    assert!(
        within(double, full, 0.05),
        "beyond max_num_seqs it must plateau: {full} -> {double}"
    );
    // the plateau is where the profile puts it: max_num_seqs decodes per step, each step priced by
    // the profile at the batch's mean context, plus the prefill steps of the replacements
    let mean_ctx = u64::from(prompt + out / 2);
    let decode_step = p.step_seconds(&StepShape {
        decode_seqs: m as u64,
        decode_kv_tokens: m as u64 * mean_ctx,
        ..StepShape::default()
    });
    let ceiling = m as f64 / decode_step;
    assert!(
        full < ceiling && full > 0.6 * ceiling,
        "{full} vs ceiling {ceiling}"
    );
}

#[test]
fn repeated_prefix_is_faster_on_the_same_pod_only() {
    let p = profile("llama-3.1-8b/h100");
    let mut fleet = fleet_of(&p, 2);
    let doc = "The quick brown fox jumps over the lazy dog. ".repeat(400); // ~4.5k tokens
    let first = one(&mut fleet, 0, text_req(1, 0.0, &format!("{doc} Q1"), 8));
    let t = fleet.now() + 1.0;
    let again = one(&mut fleet, 0, text_req(2, t, &format!("{doc} Q2"), 8));
    let t = fleet.now() + 1.0;
    let other = one(&mut fleet, 1, text_req(3, t, &format!("{doc} Q3"), 8));
    assert_eq!(first.cached_tokens, 0);
    assert!(again.cached_tokens > 4000, "{again:?}");
    assert_eq!(other.cached_tokens, 0);
    assert!(
        again.ttft() < 0.5 * first.ttft(),
        "{} vs {}",
        again.ttft(),
        first.ttft()
    );
    assert!(within(other.ttft(), first.ttft(), 0.02));
    let v = fleet.view(0).unwrap();
    assert_eq!(v.prefix_hits, u64::from(again.cached_tokens));
    assert!(v.prefix_queries >= u64::from(first.prompt_tokens + again.prompt_tokens));
}

#[test]
fn an_evicted_prefix_is_slow_again() {
    let mut p = profile("llama-3.1-8b/h100");
    p.kv_capacity_tokens = 16 * 1024; // 16k tokens so that a few long prompts evict
    let mut fleet = fleet_of(&p, 1);
    let doc = "a".repeat(4 * 6000);
    let first = one(&mut fleet, 0, text_req(1, 0.0, &doc, 4));
    let mut t = fleet.now() + 0.1;
    let hit = one(&mut fleet, 0, text_req(2, t, &doc, 4));
    assert!(hit.cached_tokens > 5900);
    for i in 0..4u64 {
        t = fleet.now() + 0.1;
        let filler = format!("{i}").repeat(4 * 6000);
        one(&mut fleet, 0, text_req(10 + i, t, &filler, 4));
    }
    t = fleet.now() + 0.1;
    let evicted = one(&mut fleet, 0, text_req(3, t, &doc, 4));
    assert_eq!(evicted.cached_tokens, 0);
    assert!(within(evicted.ttft(), first.ttft(), 0.02));
    assert!(fleet.engine(0).unwrap().stats().evictions > 0);
}

#[test]
fn a_non_resident_lora_adapter_pays_its_load_delay_once() {
    let p = profile("llama-3.1-8b/h100");
    let mut pod = PodSpec::new("pod", &p, EngineKind::Vllm);
    pod.lora_adapters = vec!["sql".into()];
    let mut fleet = Fleet::new(
        &FleetSpec {
            seed: 1,
            pods: vec![pod],
        }
        .finish()
        .unwrap(),
    )
    .unwrap();
    let r = |id, arrival, lora: Option<&str>| Request {
        id,
        arrival,
        prompt: Prompt::tokens(256),
        max_tokens: 4,
        lora: lora.map(Into::into),
    };
    let base = one(&mut fleet, 0, r(1, 0.0, None));
    let t = fleet.now() + 1.0;
    let cold = one(&mut fleet, 0, r(2, t, Some("sql")));
    let t = fleet.now() + 1.0;
    let warm = one(&mut fleet, 0, r(3, t, Some("sql")));
    let load = p.lora_load_ms * 1e-3;
    assert!(
        within(cold.ttft() - base.ttft(), load, 0.01),
        "{} {}",
        cold.ttft(),
        base.ttft()
    );
    assert!(within(warm.ttft(), base.ttft(), 0.01));
    assert!(fleet.submit(0, r(4, fleet.now(), Some("nope"))).is_err());
}

#[test]
fn scraped_views_lag_behind_exact_views() {
    let p = profile("llama-3.1-8b/a10g");
    let mut fleet = fleet_of(&p, 1);
    fleet.set_scrape(Some(ScrapeConfig {
        interval: 0.05,
        lag: 0.02,
    }));
    for i in 0..8 {
        fleet
            .submit(
                0,
                Request {
                    id: i,
                    arrival: 0.001,
                    prompt: Prompt::tokens(2000),
                    max_tokens: 20,
                    lora: None,
                },
            )
            .unwrap();
    }
    assert_eq!(
        fleet.view(0).unwrap().waiting + fleet.view(0).unwrap().running,
        8
    );
    // the scrape at t=0 saw an idle pod; it becomes visible at 0.02
    fleet.advance_to(0.03);
    assert_eq!(
        fleet.scraped(0).unwrap().running + fleet.scraped(0).unwrap().waiting,
        0
    );
    // the scrape at 0.05 (visible at 0.07) sees the load
    fleet.advance_to(0.07);
    let s = fleet.scraped(0).unwrap().clone();
    assert_eq!(s.running + s.waiting, 8);
    assert!(s.kv_usage > 0.0);
    assert_eq!(s.block_size, 16);
    assert_eq!(s.num_blocks, p.num_blocks());
}

#[test]
fn arrivals_in_the_past_and_unknown_pods_are_errors() {
    let p = profile("llama-3.1-8b/a10g");
    let mut fleet = fleet_of(&p, 1);
    fleet.advance_to(1.0);
    let r = Request {
        id: 1,
        arrival: 0.5,
        prompt: Prompt::tokens(10),
        max_tokens: 1,
        lora: None,
    };
    assert!(matches!(
        fleet.submit(0, r.clone()),
        Err(SimError::ArrivalInPast { .. })
    ));
    assert!(matches!(fleet.submit(3, r), Err(SimError::NoSuchPod(3))));
}

#[test]
fn same_seed_same_results() {
    let p = profile("llama-3.1-8b/h100");
    let run = || {
        let mut fleet = fleet_of(&p, 3);
        for i in 0..300u64 {
            let r = Request {
                id: i,
                arrival: i as f64 * 0.004,
                prompt: Prompt::Tokens {
                    tokens: 300 + (i as u32 * 97) % 700,
                    prefix_group: i % 5,
                    prefix_tokens: 256,
                },
                max_tokens: 10 + (i as u32 * 31) % 90,
                lora: None,
            };
            fleet.submit((i % 3) as usize, r).unwrap();
        }
        fleet.run_until_idle();
        let mut out = Vec::new();
        fleet.drain_completions(&mut out);
        out
    };
    let (a, b) = (run(), run());
    assert_eq!(a.len(), 300);
    assert_eq!(a, b);
    assert!(a.iter().any(|c| c.cached_tokens >= 256));
}

#[test]
fn staggered_scrapes_see_each_pod_at_its_own_phase() {
    let p = profile("llama-3.1-8b/a10g");
    let mut fleet = fleet_of(&p, 8);
    fleet.set_scrape_staggered(
        ScrapeConfig {
            interval: 1.0,
            lag: 0.0,
        },
        9,
    );
    for pod in 0..8 {
        let r = Request {
            id: pod as u64,
            arrival: 0.0,
            prompt: Prompt::tokens(100),
            max_tokens: 1000,
            lora: None,
        };
        fleet.submit(pod, r).unwrap();
    }
    // Each pod is first scraped at its own phase in [0, 1 s): by 0.5 s only some have been.
    fleet.advance_to(0.5);
    let seen_early = (0..8)
        .filter(|&i| fleet.scraped(i).unwrap().running == 1)
        .count();
    assert!(
        seen_early > 0 && seen_early < 8,
        "phases must spread: {seen_early} of 8 scraped by 0.5 s"
    );
    fleet.advance_to(1.0);
    assert!((0..8).all(|i| fleet.scraped(i).unwrap().running == 1));
    // deterministic per seed
    let mut again = fleet_of(&p, 8);
    again.set_scrape_staggered(
        ScrapeConfig {
            interval: 1.0,
            lag: 0.0,
        },
        9,
    );
    for pod in 0..8 {
        let r = Request {
            id: pod as u64,
            arrival: 0.0,
            prompt: Prompt::tokens(100),
            max_tokens: 1000,
            lora: None,
        };
        again.submit(pod, r).unwrap();
    }
    again.advance_to(0.5);
    assert_eq!(
        (0..8)
            .filter(|&i| again.scraped(i).unwrap().running == 1)
            .count(),
        seen_early
    );
}

#[test]
fn first_tokens_are_reported_when_produced_and_match_completions() {
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get("llama-3.1-8b/h100").unwrap();
    let spec = FleetSpec {
        seed: 1,
        pods: vec![PodSpec::new("p0", profile, EngineKind::Vllm)],
    }
    .finish()
    .unwrap();
    let mut fleet = Fleet::new(&spec).unwrap();
    let mut firsts = Vec::new();
    fleet.drain_first_tokens(&mut firsts);
    assert!(firsts.is_empty(), "nothing is recorded unless asked");
    fleet.record_first_tokens(true);
    for id in 0..3u64 {
        fleet
            .submit(
                0,
                Request {
                    id,
                    arrival: id as f64 * 0.01,
                    prompt: Prompt::Tokens {
                        tokens: 512,
                        prefix_group: 0,
                        prefix_tokens: 0,
                    },
                    max_tokens: 64,
                    lora: None,
                },
            )
            .unwrap();
    }
    // Stop before any request can finish its 64 tokens: first tokens are known already.
    fleet.advance_to(0.2);
    fleet.drain_first_tokens(&mut firsts);
    let mut done = Vec::new();
    fleet.drain_completions(&mut done);
    assert_eq!(firsts.len(), 3, "{firsts:?}");
    assert!(done.is_empty());
    fleet.run_until_idle();
    fleet.drain_completions(&mut done);
    for f in &firsts {
        let c = done.iter().find(|c| c.id == f.id).unwrap();
        assert_eq!(c.first_token, f.t);
        assert_eq!(f.pod, 0);
    }
}

/// Two H100 pods, the second with `faults` (a fleet file's fault list).
fn failing_fleet(faults: &str) -> Fleet {
    let spec = FleetSpec::from_yaml(&format!(
        "seed: 5\npods:\n  - {{name: ok, profile: llama-3.1-8b/h100}}\n  - {{name: bad, profile: llama-3.1-8b/h100, faults: {faults}}}\n"
    ))
    .unwrap();
    Fleet::new(&spec).unwrap()
}

/// Which of `n` requests, one every 10 ms from `from`, pod `pod` fails.
fn failures(fleet: &mut Fleet, pod: usize, from: f64, n: u64) -> Vec<bool> {
    (0..n)
        .map(|i| {
            let r = text_req(i, from + i as f64 * 0.01, "hello there", 4);
            match fleet.submit(pod, r) {
                Ok(()) => false,
                Err(SimError::Failed(p)) => {
                    assert_eq!(p, pod);
                    true
                }
                Err(e) => panic!("{e}"),
            }
        })
        .collect()
}

#[test]
fn a_pod_with_error_rate_one_fails_every_request_at_no_cost_and_normal_metrics() {
    let mut fleet = failing_fleet("[{at_s: 0, error_rate: 1.0}]");
    assert!(failures(&mut fleet, 1, 0.0, 50).iter().all(|f| *f));
    // Nothing reached its engine: idle, no prompt seen, no completion, nothing to run.
    let v = fleet.view(1).unwrap();
    assert_eq!((v.running, v.waiting, v.prefix_queries), (0, 0, 0));
    assert_eq!(v.kv_usage, 0.0);
    let stats = fleet.engine(1).unwrap().stats();
    assert_eq!((stats.prompt_tokens_computed, stats.steps), (0, 0));
    // The healthy pod serves the same requests.
    assert!(failures(&mut fleet, 0, 1.0, 50).iter().all(|f| !*f));
    fleet.run_until_idle();
    let mut done = Vec::new();
    fleet.drain_completions(&mut done);
    assert_eq!(done.len(), 50);
    assert!(done.iter().all(|c| c.pod == 0));
}

#[test]
fn error_draws_are_seeded_per_pod_and_run_seed() {
    let draw = |seed: u64| {
        let mut fleet = failing_fleet("[{at_s: 0, error_rate: 0.3}]");
        fleet.seed_faults(seed);
        failures(&mut fleet, 1, 0.0, 2000)
    };
    let a = draw(1);
    assert_eq!(a, draw(1), "the same seed draws the same failures");
    assert_ne!(a, draw(2), "another run seed draws afresh");
    let share = a.iter().filter(|f| **f).count() as f64 / a.len() as f64;
    assert!((0.27..0.33).contains(&share), "{share}");
    // A pod without the fault never fails.
    let mut fleet = failing_fleet("[{at_s: 0, error_rate: 0.3}]");
    assert!(failures(&mut fleet, 0, 0.0, 200).iter().all(|f| !*f));
}

#[test]
fn scripted_fault_steps_change_the_error_rate_and_speed_on_the_virtual_clock() {
    let mut fleet = failing_fleet("[{at_s: 2, error_rate: 1.0}, {at_s: 4, error_rate: 0}]");
    assert_eq!(fleet.faults(1).unwrap().error_rate, 0.0);
    assert!(failures(&mut fleet, 1, 0.0, 100).iter().all(|f| !*f));
    fleet.run_until_idle();
    assert!(failures(&mut fleet, 1, 2.0, 100).iter().all(|f| *f));
    assert_eq!(fleet.faults(1).unwrap().error_rate, 1.0);
    fleet.run_until_idle();
    assert!(failures(&mut fleet, 1, 4.0, 100).iter().all(|f| !*f));
    // A scripted slowdown prices the steps after it.
    let mut slow = failing_fleet("[{at_s: 10, slowdown: 3.0}]");
    let before = one(&mut slow, 1, text_req(1, 0.0, "the same prompt", 64));
    let after = one(&mut slow, 1, text_req(2, 20.0, "another prompt!", 64));
    let ratio = after.mean_itl() / before.mean_itl();
    assert!((2.9..3.1).contains(&ratio), "{ratio}");
}
