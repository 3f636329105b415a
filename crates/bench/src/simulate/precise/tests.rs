#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::net::SocketAddr;
use std::sync::Arc;

use infergate_scheduler::{Preset, Priority, RequestContext, SchedulerConfig};
use infergate_sim::fleet::Request;
use infergate_sim::{Catalog, EngineKind, FleetSpec, Profile, Prompt};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::super::{Sim, model_of, pod_addr, setup, ts};
use super::Precise;
use crate::Scenario;
use crate::workload::{self, Arrival};

const SCENARIO: &str = "name: p\nfleet: [{name: a, profile: llama-3.1-8b/a10g, replicas: 2}]\nworkload: {duration_s: 1, arrival: {kind: poisson, rate: 1}, prompt_tokens: {dist: fixed, value: 1}, output_tokens: {dist: fixed, value: 1}}\n";

/// An A10G with 64 KV blocks of 16 tokens, so two long prompts evict a third.
fn small() -> Profile {
    let mut p = Catalog::builtin()
        .unwrap()
        .get("llama-3.1-8b/a10g")
        .unwrap()
        .clone();
    p.kv_capacity_tokens = 16 * 64;
    p.max_model_len = 1024;
    p
}

fn arrival(id: u64, at: f64, prompt_tokens: u32, prefix_tokens: u32) -> Arrival {
    Arrival {
        id,
        at,
        prompt_tokens,
        prefix_group: Some(7),
        prefix_tokens,
        output_tokens: 4,
        lora: None,
        priority: Priority::Standard,
        tenant: 0,
    }
}

/// Where the scheduler would send `a` at `t` (the pick is released, not placed), with the
/// event-fed cached prefixes when `precise` is given.
fn first_choice(
    sim: &mut Sim<'_>,
    precise: Option<&mut Precise>,
    a: &Arrival,
    t: f64,
) -> SocketAddr {
    sim.advance(t);
    sim.absorb();
    sim.refresh_metrics();
    let model = model_of_sim(sim);
    let text = workload::prompt_text(a);
    let segments = [&*text];
    let cached = precise.map(|p| p.cached(&mut sim.fleet, &text, None));
    let cx = RequestContext::new(&model, a.prompt_tokens)
        .with_prompt(&segments)
        .with_output_tokens(a.output_tokens)
        .with_cached(cached);
    let mut rng = SmallRng::seed_from_u64(1);
    let d = sim.sched.pick(&cx, ts(t), &mut rng).unwrap();
    sim.sched.fail(d.ticket, ts(t));
    d.endpoints.first()
}

fn model_of_sim(sim: &Sim<'_>) -> Arc<str> {
    sim.fleet
        .engine(0)
        .map(|e| e.profile().model.as_str().into())
        .unwrap()
}

#[test]
fn precise_stops_preferring_a_pod_after_its_blocks_were_evicted() {
    let scenario = Scenario::from_yaml(SCENARIO, "t").unwrap();
    let spec = FleetSpec::uniform(&small(), EngineKind::Vllm, "pod", 2).unwrap();
    // Pod 0 gets the group's 480-token prefix, pod 1 its first 160 tokens (same text).
    let arrivals = vec![
        arrival(0, 0.0, 496, 480),
        arrival(1, 0.01, 176, 160),
        arrival(2, 1.0, 496, 480),
    ];
    let cfg = SchedulerConfig::preset(Preset::Infergate);
    let mut sim = setup(&scenario, &spec, cfg, &arrivals, 1, false, &[]).unwrap();
    assert_eq!(&*model_of(&spec), &*model_of_sim(&sim));
    let mut precise = Precise::new(&mut sim.fleet, 0.005, false);
    sim.prime();
    let model = model_of(&spec);
    let mut rng = SmallRng::seed_from_u64(1);
    for (a, pod) in [(&arrivals[0], 0), (&arrivals[1], 1)] {
        sim.advance(a.at);
        sim.absorb();
        sim.refresh_metrics();
        let text = workload::prompt_text(a);
        let segments = [&*text];
        let only = [pod_addr(pod)];
        let cx = RequestContext::new(&model, a.prompt_tokens)
            .with_prompt(&segments)
            .with_subset(Some(&only))
            .with_output_tokens(a.output_tokens);
        let d = sim.sched.pick(&cx, ts(a.at), &mut rng).unwrap();
        assert!(sim.place(a, &d, &text, None).unwrap().is_some());
    }
    let probe = &arrivals[2];
    // Both pods idle: the longer cached prefix wins, by either view.
    assert_eq!(
        first_choice(&mut sim, Some(&mut precise), probe, 3.0),
        pod_addr(0)
    );
    assert_eq!(first_choice(&mut sim, None, probe, 3.0), pod_addr(0));

    // Traffic this router did not route (another gateway replica's) fills pod 0's cache.
    for (id, at) in [(1000u64, 3.1), (1001, 6.0)] {
        sim.advance(at);
        let mut text = format!("<other traffic {id}>");
        while text.len() < 56 * 16 * 4 {
            text.push('o');
        }
        let req = Request {
            id,
            arrival: at,
            prompt: Prompt::Text(text.into()),
            max_tokens: 4,
            lora: None,
        };
        sim.fleet.submit(0, req).unwrap();
    }
    sim.advance(10.0);
    let probe_prompt = Prompt::Text(workload::prompt_text(probe));
    assert_eq!(
        sim.fleet
            .engine(0)
            .unwrap()
            .held_prefix_tokens(&probe_prompt, None),
        0
    );
    assert_eq!(
        sim.fleet
            .engine(1)
            .unwrap()
            .held_prefix_tokens(&probe_prompt, None),
        160
    );
    // The events tell the precise policy pod 0 lost the prefix and pod 1 kept its part; the
    // approximate index still believes pod 0 holds all of it.
    assert_eq!(
        first_choice(&mut sim, Some(&mut precise), probe, 10.0),
        pod_addr(1)
    );
    assert_eq!(first_choice(&mut sim, None, probe, 10.0), pod_addr(0));
}

#[test]
fn precise_is_a_policy_of_the_shipped_scenarios_and_refused_with_flow_control() {
    for file in [
        "shared-prefix-llama-8b.yaml",
        "eviction-heavy-llama-8b.yaml",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../benches/scenarios")
            .join(file);
        let s = Scenario::from_file(&path).unwrap();
        assert!(
            s.policies.contains(&crate::RoutePolicy::INFERGATE_PRECISE),
            "{file}"
        );
    }
    let flow = "name: f\nfleet: [{name: a, profile: llama-3.1-8b/a10g}]\nworkload: {duration_s: 1, arrival: {kind: poisson, rate: 1}, prompt_tokens: {dist: fixed, value: 1}, output_tokens: {dist: fixed, value: 1}, tenants: [{name: t}]}\nflow: {}\npolicies: [infergate, infergate-precise]\n";
    let e = Scenario::from_yaml(flow, "t").unwrap_err().to_string();
    assert!(e.contains("policies[1]"), "{e}");
}

#[test]
fn provisional_entries_cover_a_queued_request_until_it_completes() {
    let spec = FleetSpec::uniform(&small(), EngineKind::Vllm, "pod", 2).unwrap();
    let mut fleet = infergate_sim::Fleet::new(&spec).unwrap();
    let mut with = Precise::new(&mut fleet, 0.005, true);
    // Each view drains its fleet's events: the one without provisional entries gets its own.
    let mut fleet2 = infergate_sim::Fleet::new(&spec).unwrap();
    let mut without = Precise::new(&mut fleet2, 0.005, false);
    let text = workload::prompt_text(&arrival(0, 0.0, 496, 480));
    let req = |id: u64, at: f64, text: &Arc<str>| Request {
        id,
        arrival: at,
        prompt: Prompt::Text(text.clone()),
        max_tokens: 4,
        lora: None,
    };
    fleet.submit(0, req(0, 0.0, &text)).unwrap();
    fleet2.submit(0, req(0, 0.0, &text)).unwrap();
    with.placed(pod_addr(0), 0, &text, None);
    without.placed(pod_addr(0), 0, &text, None);
    // Nothing is computed yet: only the provisional entry knows where the prefix is going.
    let full = 496 / 16 * 16;
    assert_eq!(
        with.cached(&mut fleet, &text, None),
        [(pod_addr(0), full), (pod_addr(1), 0)]
    );
    assert_eq!(
        without.cached(&mut fleet2, &text, None),
        [(pod_addr(0), 0), (pod_addr(1), 0)]
    );
    fleet.run_until_idle();
    with.completed(0);
    fleet.advance_to(fleet.now() + 0.005);
    // Completed: the events hold the prefix now.
    assert_eq!(with.cached(&mut fleet, &text, None)[0], (pod_addr(0), full));
    // Evicted by two long prompts: the provisional entry is gone too, so nothing is claimed.
    for (id, at) in [(1u64, fleet.now()), (2, fleet.now() + 5.0)] {
        let mut other = format!("<other {id}>");
        while other.len() < 56 * 16 * 4 {
            other.push('o');
        }
        fleet.submit(0, req(id, at, &other.into())).unwrap();
        fleet.run_until_idle();
    }
    fleet.advance_to(fleet.now() + 0.005);
    assert_eq!(with.cached(&mut fleet, &text, None)[0], (pod_addr(0), 0));
}

/// The pods cache a LoRA request's prompt under its adapter, so the policy's lookups (events and
/// provisional entries alike) credit a pod with a prompt only under the adapter it ran with.
#[test]
fn lookups_are_keyed_by_the_lora_adapter() {
    let mut spec = FleetSpec::uniform(&small(), EngineKind::Vllm, "pod", 2).unwrap();
    for p in &mut spec.pods {
        p.lora_adapters = vec!["a".into(), "b".into()];
        p.max_loras = 2;
    }
    let mut fleet = infergate_sim::Fleet::new(&spec).unwrap();
    let mut precise = Precise::new(&mut fleet, 0.005, true);
    let text = workload::prompt_text(&arrival(0, 0.0, 496, 480));
    let full = 496 / 16 * 16;
    let req = Request {
        id: 0,
        arrival: 0.0,
        prompt: Prompt::Text(text.clone()),
        max_tokens: 4,
        lora: Some("a".into()),
    };
    fleet.submit(0, req).unwrap();
    precise.placed(pod_addr(0), 0, &text, Some("a"));
    let on_pod0 =
        |p: &mut Precise, f: &mut infergate_sim::Fleet, lora| p.cached(f, &text, lora)[0].1;
    assert_eq!(on_pod0(&mut precise, &mut fleet, Some("a")), full);
    assert_eq!(on_pod0(&mut precise, &mut fleet, Some("b")), 0);
    assert_eq!(on_pod0(&mut precise, &mut fleet, None), 0);
    fleet.run_until_idle();
    precise.completed(0);
    fleet.advance_to(fleet.now() + 0.005);
    assert_eq!(on_pod0(&mut precise, &mut fleet, Some("a")), full);
    assert_eq!(on_pod0(&mut precise, &mut fleet, Some("b")), 0);
    assert_eq!(on_pod0(&mut precise, &mut fleet, None), 0);
}
