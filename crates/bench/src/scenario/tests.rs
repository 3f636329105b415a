#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;

const GOOD: &str = r#"
name: tiny
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g, engine: tgi, replicas: 2 }
workload:
  duration_s: 10
  arrival: { kind: poisson, rate: 2 }
  prompt_tokens: { dist: uniform, min: 10, max: 100 }
  output_tokens: { dist: fixed, value: 8 }
seeds: [4]
policies: [round-robin, infergate]
"#;

fn err(text: &str) -> BenchError {
    Scenario::from_yaml(text, "t.yaml").unwrap_err()
}

fn field(e: &BenchError) -> &str {
    match e {
        BenchError::Parse { field, .. }
        | BenchError::Invalid { field, .. }
        | BenchError::Fleet { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_good_scenario_loads_with_defaults() {
    let s = Scenario::from_yaml(GOOD, "t.yaml").unwrap();
    assert_eq!(
        s.policies,
        vec![
            RoutePolicy::from(Preset::RoundRobin),
            RoutePolicy::from(Preset::Infergate)
        ]
    );
    assert_eq!(s.scrape.interval_ms, 50.0);
    assert!(s.targets.beat_gie_default);
    let fleet = s
        .fleet_spec(&Catalog::builtin().unwrap(), "t.yaml")
        .unwrap();
    assert_eq!(fleet.pods.len(), 3);
    assert_eq!(fleet.pods[2].name, "a10g-1");
    assert_eq!(fleet.pods[2].engine, EngineKind::Tgi);
}

#[test]
fn wrong_types_and_unknown_keys_name_the_field() {
    let e = err(&GOOD.replace("rate: 2", "rate: fast"));
    assert_eq!(field(&e), "workload.arrival");
    let cause = std::error::Error::source(&e).unwrap().to_string();
    assert!(cause.contains("fast"), "{cause}");
    let e = err(&GOOD.replace("duration_s: 10", "duration_s: 10\n  durration: 3"));
    assert_eq!(field(&e), "workload.durration");
    let e = err(&GOOD.replace(
        "policies: [round-robin, infergate]",
        "policies: [round-robin, smart]",
    ));
    assert_eq!(field(&e), "policies[1]");
    let e = err(&GOOD.replace("replicas: 2", "replicas: -2"));
    assert_eq!(field(&e), "fleet[1].replicas");
    let e = err(&GOOD.replace("kind: poisson", "kind: lumpy"));
    assert_eq!(field(&e), "workload.arrival.kind");
    let e = err("name: [");
    assert!(matches!(e, BenchError::Parse { .. }));
}

#[test]
fn out_of_range_values_name_the_field() {
    for (from, to, want) in [
        ("rate: 2", "rate: -1", "workload.arrival.rate"),
        ("duration_s: 10", "duration_s: 0", "workload.duration_s"),
        (
            "min: 10, max: 100",
            "min: 100, max: 10",
            "workload.prompt_tokens.max",
        ),
        ("value: 8", "value: 0", "workload.output_tokens.value"),
        ("replicas: 2", "replicas: 0", "fleet[1].replicas"),
        ("seeds: [4]", "seeds: []", "seeds"),
        ("name: tiny", "name: 'a b'", "name"),
    ] {
        let text = GOOD.replace(from, to);
        assert_ne!(text, GOOD, "{from}");
        assert_eq!(field(&err(&text)), want, "{from} -> {to}");
    }
    let e = err(&GOOD.replace(
        "output_tokens: { dist: fixed, value: 8 }",
        "output_tokens: { dist: fixed, value: 8 }\n  lora: { adapters: [sql], fraction: 0.5 }",
    ));
    assert_eq!(field(&e), "workload.lora.adapters[0]");
    let e = err(&GOOD.replace(
        "output_tokens: { dist: fixed, value: 8 }",
        "output_tokens: { dist: fixed, value: 8 }\n  prefix: { groups: 2, tokens: 10, fraction: 1.5 }",
    ));
    assert_eq!(field(&e), "workload.prefix.fraction");
}

#[test]
fn fleet_problems_name_the_field() {
    let catalog = Catalog::builtin().unwrap();
    let s =
        Scenario::from_yaml(&GOOD.replace("llama-3.1-8b/a10g", "llama-3.1-8b/b200"), "t").unwrap();
    let e = s.fleet_spec(&catalog, "t").unwrap_err();
    assert_eq!(field(&e), "fleet[1].profile");
    let s =
        Scenario::from_yaml(&GOOD.replace("llama-3.1-8b/a10g", "qwen3-32b/h100x2"), "t").unwrap();
    assert_eq!(field(&s.fleet_spec(&catalog, "t").unwrap_err()), "fleet");
    let s = Scenario::from_yaml(&GOOD.replace("max: 100", "max: 40000"), "t").unwrap();
    assert_eq!(
        field(&s.fleet_spec(&catalog, "t").unwrap_err()),
        "fleet[1].profile"
    );
}

#[test]
fn every_shipped_scenario_loads() {
    let benches = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches");
    let catalog = Catalog::builtin().unwrap();
    for (folder, at_least) in [
        ("scenarios", 6),
        ("peers", 1),
        ("robustness", 2),
        ("scale", 1),
    ] {
        let dir = benches.join(folder);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let s = Scenario::from_file(&path).unwrap();
                s.validate(&path.display().to_string()).unwrap();
                s.fleet_spec(&catalog, &path.display().to_string()).unwrap();
                n += 1;
            }
        }
        assert!(n >= at_least, "found {n} scenarios in {}", dir.display());
    }
}

const TENANTS: &str = r#"
  tenants:
    - { name: quiet, share: 0.5 }
    - name: noisy
      arrival: { kind: bursty, base_rate: 1, burst_rate: 10, burst_s: 2, period_s: 5 }
      priority: sheddable
      output_tokens: { dist: fixed, value: 4 }
"#;

fn with_tenants(tenants: &str) -> String {
    GOOD.replace(
        "output_tokens: { dist: fixed, value: 8 }\n",
        &format!(
            "output_tokens: {{ dist: fixed, value: 8 }}\n{}",
            tenants.trim_start_matches('\n')
        ),
    )
}

#[test]
fn tenants_load_and_their_mistakes_name_the_field() {
    let s = Scenario::from_yaml(&with_tenants(TENANTS), "t.yaml").unwrap();
    assert_eq!(s.workload.tenant_names(), ["quiet", "noisy"]);
    assert_eq!(s.workload.tenants[1].priority, Some(Priority::Sheddable));
    let mut scaled = s.clone();
    scaled.scale_load(2.0);
    assert_eq!(
        scaled.workload.tenants[1].arrival,
        Some(ArrivalProcess::Bursty {
            base_rate: 2.0,
            burst_rate: 20.0,
            burst_s: 2.0,
            period_s: 5.0
        })
    );
    for (from, to, want) in [
        ("share: 0.5", "share: 0", "workload.tenants[0].share"),
        ("name: noisy", "name: quiet", "workload.tenants[1].name"),
        (
            "burst_s: 2",
            "burst_s: 9",
            "workload.tenants[1].arrival.burst_s",
        ),
        (
            "base_rate: 1",
            "base_rate: -1",
            "workload.tenants[1].arrival.base_rate",
        ),
        (
            "value: 4",
            "value: 0",
            "workload.tenants[1].output_tokens.value",
        ),
        (
            "priority: sheddable",
            "priority: sheddable\n      priorities: { critical: 0.5 }",
            "workload.tenants[1].priorities",
        ),
        (
            "priority: sheddable",
            "priorities: { critical: 0.7, sheddable: 0.7 }",
            "workload.tenants[1].priorities",
        ),
    ] {
        let text = with_tenants(&TENANTS.replace(from, to));
        assert_eq!(field(&err(&text)), want, "{from} -> {to}");
    }
    let e = err(&with_tenants(
        &TENANTS.replace("priority: sheddable", "priority: urgent"),
    ));
    assert_eq!(field(&e), "workload.tenants[1].priority");
    // A tenant's longer outputs count against the pods' context length.
    let long = with_tenants(&TENANTS.replace("value: 4", "value: 200000"));
    let s = Scenario::from_yaml(&long, "t").unwrap();
    assert!(s.fleet_spec(&Catalog::builtin().unwrap(), "t").is_err());
}

#[test]
fn a_seed_or_policy_listed_twice_is_refused_naming_the_repeat() {
    let e = err(&GOOD.replace("seeds: [4]", "seeds: [4, 5, 4]"));
    assert_eq!(field(&e), "seeds[2]");
    assert!(e.to_string().contains("seed 4 is listed twice"), "{e}");
    let e = err(&GOOD.replace(
        "[round-robin, infergate]",
        "[infergate, round-robin, infergate]",
    ));
    assert_eq!(field(&e), "policies[2]");
    assert!(e.to_string().contains("infergate is listed twice"), "{e}");
    // Precise and plain infergate are two policies.
    Scenario::from_yaml(
        &GOOD.replace("[round-robin, infergate]", "[infergate, infergate-precise]"),
        "t.yaml",
    )
    .unwrap();
}

/// [`GOOD`] with these policies.
fn with_policies(policies: &str) -> String {
    GOOD.replace("policies: [round-robin, infergate]", policies)
}

#[test]
fn a_policy_entry_turns_outlier_detection_on_and_round_trips() {
    let s = Scenario::from_yaml(
        &with_policies(
            "policies:\n  - infergate\n  - { name: infergate-od, preset: infergate, outlierDetection: { consecutive5xx: 4, baseEjectionMs: 1000 } }\n  - { name: infergate-no-od, preset: infergate, outlierDetection: null }\n  - round-robin",
        ),
        "t.yaml",
    )
    .unwrap();
    let p = &s.policies[1];
    assert_eq!(p.as_str(), "infergate-od");
    assert_eq!(p.preset, Preset::Infergate);
    let od = p.outlier_detection.unwrap().unwrap();
    assert_eq!((od.consecutive_5xx, od.base_ejection_ms), (4, 1000));
    // Unset fields take the gateway's defaults.
    assert_eq!(od.max_ejection_percent, 50);
    assert_eq!(p.scheduler_config().outlier_detection, Some(od));
    // A preset alone runs as the gateway would: on in `infergate`, off in the baselines;
    // `null` turns it off.
    assert_eq!(
        s.policies[0].scheduler_config().outlier_detection,
        Some(infergate_scheduler::outlier::OutlierDetection::default())
    );
    assert_eq!(s.policies[2].outlier_detection, Some(None));
    assert_eq!(s.policies[2].scheduler_config().outlier_detection, None);
    assert_eq!(s.policies[3].scheduler_config().outlier_detection, None);
    // A report's scenario is read back the same.
    let json = serde_json::to_string(&s).unwrap();
    let back: Scenario = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    assert!(
        json.contains(r#""policies":["infergate",{"name":"infergate-od""#),
        "{json}"
    );
    assert!(
        json.contains(r#"{"name":"infergate-no-od","preset":"infergate","outlierDetection":null}"#),
        "{json}"
    );
}

#[test]
fn bad_policy_entries_faults_and_retries_are_refused_naming_the_field() {
    for (policies, at, says) in [
        (
            "{ name: od, preset: infergate, outlierDetection: { consecutive5xx: 0 } }",
            "policies[1].outlierDetection.consecutive5xx",
            "must be at least 1",
        ),
        (
            "{ name: od, preset: infergate, outlierDetection: { baseEjectionMs: 9000, maxEjectionMs: 10 } }",
            "policies[1].outlierDetection.maxEjectionMs",
            "below baseEjectionMs",
        ),
        (
            "{ name: od, preset: infergate, outlierDetection: { consecutive5xx: -1 } }",
            "policies[1].outlierDetection.consecutive5xx",
            "",
        ),
        (
            "{ name: od, preset: infergate, outlierDetection: { consecutive_5xx: 3 } }",
            "policies[1].outlierDetection.consecutive_5xx",
            "",
        ),
        (
            "{ name: od, preset: infergate, outlier: {} }",
            "policies[1].outlier",
            "",
        ),
        ("{ name: od, preset: smart }", "policies[1]", "`smart`"),
        (
            "{ name: 'my policy', preset: infergate }",
            "policies[1].name",
            "letters, digits",
        ),
        (
            "{ name: round-robin, preset: infergate }",
            "policies[1]",
            "round-robin is listed twice",
        ),
    ] {
        let e = err(&with_policies(&format!(
            "policies:\n  - round-robin\n  - {policies}"
        )));
        assert_eq!(field(&e), at, "{policies}: {e}");
        let said = match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        };
        assert!(said.contains(says), "{policies}: {said}");
    }
    let fault = |f: &str| {
        GOOD.replace(
            "engine: tgi, replicas: 2 }",
            &format!("engine: tgi, replicas: 2, faults: [{f}] }}"),
        )
    };
    for (f, at, says) in [
        (
            "{ at_s: 0, error_rate: 1.5 }",
            "fleet[1].faults[0].error_rate",
            "1.5 must be between 0 and 1",
        ),
        (
            "{ at_s: -1, error_rate: 1 }",
            "fleet[1].faults[0].at_s",
            "must be 0 or more",
        ),
        (
            "{ at_s: 0, slowdown: 0 }",
            "fleet[1].faults[0].slowdown",
            "must be above 0",
        ),
        (
            "{ at_s: 0, hang: true }",
            "fleet[1].faults[0].hang",
            "`infergate sim` fleets only",
        ),
        (
            "{ at_s: 0, metrics: frozen }",
            "fleet[1].faults[0].metrics",
            "see `stale:`",
        ),
        ("{ at_s: 0, error: 1 }", "fleet[1].faults[0].error", ""),
    ] {
        let e = err(&fault(f));
        assert_eq!(field(&e), at, "{f}: {e}");
        assert!(e.to_string().contains(says), "{f}: {e}");
    }
    let e = err(&format!("{GOOD}retries: {{ maxAttempts: 0 }}\n"));
    assert_eq!(field(&e), "retries.maxAttempts");
    let e = err(&format!("{GOOD}retries: {{ max_attempts: 2 }}\n"));
    assert_eq!(field(&e), "retries.max_attempts");
    // The flow and replica runners have no failing pods and take no entries.
    let tenants = "output_tokens: { dist: fixed, value: 8 }\n  tenants: [{ name: a }]";
    let flow = |s: String| {
        format!(
            "{}flow: {{}}\n",
            s.replace("output_tokens: { dist: fixed, value: 8 }", tenants)
        )
    };
    let e = err(&flow(fault("{ at_s: 0, error_rate: 1 }")));
    assert_eq!(field(&e), "fleet[1].faults");
    let e = err(&flow(with_policies(
        "policies: [{ name: od, preset: infergate, outlierDetection: {} }]",
    )));
    assert_eq!(field(&e), "policies[0]");
    // A good fault list resolves to the pods' faults and script.
    let s = Scenario::from_yaml(
        &fault("{ at_s: 0, error_rate: 0.5 }, { at_s: 5, error_rate: 0, slowdown: 2 }"),
        "t.yaml",
    )
    .unwrap();
    assert!(s.has_failing_pods());
    assert!(!Scenario::from_yaml(GOOD, "t").unwrap().has_failing_pods());
    let spec = s.fleet_spec(&Catalog::builtin().unwrap(), "t").unwrap();
    assert_eq!(spec.pods[0].faults.error_rate, 0.0);
    assert_eq!(spec.pods[2].faults.error_rate, 0.5);
    assert_eq!(spec.pods[2].fault_script.len(), 1);
}
