use super::*;

fn target(model: &str, weight: u32) -> RewriteTarget {
    RewriteTarget {
        model_rewrite: model.to_owned(),
        weight,
    }
}

fn rule(model: Option<&str>, tenants: &[&str], targets: Vec<RewriteTarget>) -> RewriteRule {
    RewriteRule {
        name: None,
        matches: model
            .map(|m| {
                vec![ModelMatch {
                    model: MatchValue {
                        kind: MatchKind::Exact,
                        value: m.to_owned(),
                    },
                }]
            })
            .unwrap_or_default(),
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
        targets,
    }
}

fn counts(r: &Rewrites, model: &str, tenant: Option<&str>, n: usize) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for _ in 0..n {
        let name = r.choose(model, tenant).unwrap_or(model).to_owned();
        *out.entry(name).or_insert(0) += 1;
    }
    out
}

#[test]
fn ninety_ten_is_exact_over_every_whole_cycle_and_interleaved() {
    let r = Rewrites::new(&[rule(
        Some("llama"),
        &[],
        vec![target("llama-v1", 90), target("llama-v2", 10)],
    )])
    .unwrap();
    let c = counts(&r, "llama", None, 10_000);
    assert_eq!(c["llama-v1"], 9_000);
    assert_eq!(c["llama-v2"], 1_000);
    // The canary is spread out: never two in a row, one in every ten.
    let r = Rewrites::new(&[rule(
        Some("llama"),
        &[],
        vec![target("llama-v1", 90), target("llama-v2", 10)],
    )])
    .unwrap();
    let seq: Vec<bool> = (0..100)
        .map(|_| r.choose("llama", None) == Some("llama-v2"))
        .collect();
    for w in seq.chunks(10) {
        assert_eq!(w.iter().filter(|b| **b).count(), 1, "{seq:?}");
    }
}

#[test]
fn any_prefix_is_within_one_request_per_target_of_its_share() {
    let weights = [7_u32, 3, 5];
    let r = Rewrites::new(&[rule(
        Some("m"),
        &[],
        weights
            .iter()
            .enumerate()
            .map(|(i, w)| target(&format!("t{i}"), *w))
            .collect(),
    )])
    .unwrap();
    let mut seen = [0_f64; 3];
    for n in 1..=1_000 {
        let name = r.choose("m", None).unwrap();
        let i: usize = name[1..].parse().unwrap();
        seen[i] += 1.0;
        for (j, w) in weights.iter().enumerate() {
            let want = f64::from(*w) / 15.0 * f64::from(n);
            assert!((seen[j] - want).abs() < 1.0 + 1e-9, "n={n} {seen:?}");
        }
    }
}

#[test]
fn zero_weight_sends_nothing_and_all_zero_is_refused() {
    let r = Rewrites::new(&[rule(
        Some("m"),
        &[],
        vec![target("old", 0), target("new", 100)],
    )])
    .unwrap();
    let c = counts(&r, "m", None, 1_000);
    assert_eq!(c.get("old"), None);
    assert_eq!(c["new"], 1_000);
    let e = Rewrites::new(&[rule(Some("m"), &[], vec![target("old", 0)])]).unwrap_err();
    assert!(matches!(e, RewriteError::NoTarget { .. }), "{e}");
    let e = Rewrites::new(&[rule(Some("m"), &[], vec![])]).unwrap_err();
    assert!(matches!(e, RewriteError::NoTarget { .. }), "{e}");
}

#[test]
fn precedence_tenant_rule_then_model_rule_then_catch_alls() {
    let r = Rewrites::new(&[
        rule(Some("m"), &[], vec![target("m-general", 1)]),
        rule(Some("m"), &["team-a"], vec![target("m-team-a", 1)]),
        rule(None, &["team-b"], vec![target("any-team-b", 1)]),
        rule(None, &[], vec![target("any", 1)]),
    ])
    .unwrap();
    assert_eq!(r.choose("m", Some("team-a")), Some("m-team-a"));
    assert_eq!(r.choose("m", Some("team-b")), Some("m-general"));
    assert_eq!(r.choose("m", None), Some("m-general"));
    assert_eq!(r.choose("x", Some("team-b")), Some("any-team-b"));
    assert_eq!(r.choose("x", Some("team-a")), Some("any"));
    let none = Rewrites::new(&[rule(Some("m"), &[], vec![target("v", 1)])]).unwrap();
    assert_eq!(none.choose("x", None), None);
    assert!(Rewrites::new(&[]).unwrap().is_empty());
}

#[test]
fn ambiguous_rules_empty_names_and_long_cycles_are_refused() {
    let e = Rewrites::new(&[
        rule(Some("m"), &["a"], vec![target("x", 1)]),
        rule(Some("m"), &["b", "a"], vec![target("y", 1)]),
    ])
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rewrite rules rewrites[0] and rewrites[1] both apply to model m for tenant a"
    );
    let e = Rewrites::new(&[
        rule(None, &[], vec![target("x", 1)]),
        rule(None, &[], vec![target("y", 1)]),
    ])
    .unwrap_err();
    assert!(matches!(e, RewriteError::Ambiguous { .. }), "{e}");
    let e = Rewrites::new(&[rule(Some(""), &[], vec![target("x", 1)])]).unwrap_err();
    assert!(matches!(e, RewriteError::EmptyName { .. }), "{e}");
    let e = Rewrites::new(&[rule(Some("m"), &[], vec![target("", 1)])]).unwrap_err();
    assert!(matches!(e, RewriteError::EmptyTarget { .. }), "{e}");
    let e = Rewrites::new(&[rule(
        Some("m"),
        &[],
        vec![target("a", 9_999), target("b", 2)],
    )])
    .unwrap_err();
    assert!(
        matches!(e, RewriteError::CycleTooLong { cycle: 10_001, .. }),
        "{e}"
    );
}

#[test]
fn reads_the_reference_shape() {
    let yaml = r#"
- name: canary
  matches: [{ model: { type: Exact, value: small-segment-lora } }]
  targets:
    - { modelRewrite: small-segment-lora-v1, weight: 90 }
    - { modelRewrite: small-segment-lora-v2, weight: 10 }
- tenants: [team-a]
  targets: [{ modelRewrite: base }]
"#;
    let rules: Vec<RewriteRule> = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(rules[0].targets[1].weight, 10);
    assert_eq!(rules[1].targets[0].weight, 1);
    assert!(rules[1].matches.is_empty());
    let r = Rewrites::new(&rules).unwrap();
    assert_eq!(r.choose("zzz", Some("team-a")), Some("base"));
    assert_eq!(r.choose("zzz", Some("team-b")), None);
    let back: Vec<RewriteRule> =
        serde_yaml::from_str(&serde_yaml::to_string(&rules).unwrap()).unwrap();
    assert_eq!(back, rules);
}
