#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

fn examples(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples")
        .join(dir);
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap()
}

/// The violations of `doc`, as `field: problem` lines (none when it is admitted).
fn violations(doc: &mut Value) -> Vec<String> {
    match CrdSchema::new().admit(doc) {
        Ok(()) => Vec::new(),
        Err(Error::Schema(v)) => v.iter().map(ToString::to_string).collect(),
        Err(other) => panic!("{other}"),
    }
}

/// A config around one scheduler whose extra YAML lines are `extra` (indented under the
/// scheduler), and `spec_extra` under `spec`.
fn with_scheduler(extra: &str) -> Value {
    yaml(&format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\n\
         metadata: {{name: t, namespace: ns}}\nspec:\n  schedulers:\n  - name: a\n    \
         modelName: m\n    modelSelector: {{app: a}}\n{extra}"
    ))
}

fn assert_refused(doc: &mut Value, wants: &[&str]) {
    let got = violations(doc);
    for want in wants {
        assert!(
            got.iter().any(|g| g.contains(want)),
            "expected {want:?} among {got:#?}"
        );
    }
}

#[test]
fn every_example_is_admitted_unchanged() {
    let files = examples("");
    assert!(files.len() >= 3, "{files:?}");
    for path in files {
        let original = yaml(&std::fs::read_to_string(&path).unwrap());
        let mut doc = original.clone();
        assert_eq!(
            violations(&mut doc),
            Vec::<String>::new(),
            "{}",
            path.display()
        );
        assert_eq!(doc, original, "{}", path.display());
    }
}

/// Two invalid examples break a bound of the schema besides their rule; the others break only
/// CEL rules and the operator's checks, which the schema leaves to `validation::validate`.
#[test]
fn invalid_examples_break_the_schema_only_where_it_has_a_bound() {
    for (file, want) in [
        (
            "too-many-schedulers.yaml",
            vec!["spec.schedulers: lists 101 items; the most is 100"],
        ),
        (
            "flow-control-zero-band.yaml",
            vec!["spec.flowControl.bands.sheddable.maxRequests: must be at least 1 (is 0)"],
        ),
        ("duplicate-name.yaml", vec![]),
        ("negative-weight.yaml", vec![]),
        ("objective-unknown-band.yaml", vec![]),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/examples/invalid")
            .join(file);
        let mut doc = yaml(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(violations(&mut doc), want, "{file}");
    }
}

/// The walkthrough's files: each was rendered with exit 0 before the schema was applied.
#[test]
fn the_walkthroughs_files_are_refused_naming_field_and_problem() {
    // A typo and an unknown weight: both pruned by the API server.
    assert_refused(
        &mut with_scheduler("    loraAdpaters: [sql]\n    weights: {queue: 1, latency: 5}\n"),
        &[
            "spec.schedulers[0].loraAdpaters: unknown field: the API server would drop it",
            "(did you mean loraAdapters?)",
            "spec.schedulers[0].weights.latency: unknown field",
            "(fields here: estimatedWait, inflightTokens, kvCache, loraAffinity, prefix, queue, runningRequests)",
        ],
    );
    // Unknown fields at two depths.
    let mut doc = with_scheduler("    bogus: 1\n  foo: bar\n");
    assert_refused(
        &mut doc,
        &[
            "spec.schedulers[0].bogus: unknown field",
            "spec.foo: unknown field",
        ],
    );
    assert_refused(
        &mut with_scheduler("    targetPort: 70000\n"),
        &["spec.schedulers[0].targetPort: must be at most 65535 (is 70000)"],
    );
    let mut bad_name = with_scheduler("");
    bad_name["spec"]["schedulers"][0]["name"] = json!("A_b");
    assert_refused(
        &mut bad_name,
        &[r#"spec.schedulers[0].name: "A_b" is not a DNS label"#],
    );
    assert_refused(
        &mut with_scheduler("    routeTimeout: 5 minutes\n"),
        &[r#"spec.schedulers[0].routeTimeout: "5 minutes" is not a Gateway API duration"#],
    );
    let mut empty_model = with_scheduler("");
    empty_model["spec"]["schedulers"][0]["modelName"] = json!("");
    assert_refused(
        &mut empty_model,
        &["spec.schedulers[0].modelName: must not be empty"],
    );
    // apiVersion: another group, another version of ours, none at all.
    for (version, want) in [
        (
            Some("example.com/v9"),
            r#"apiVersion: is "example.com/v9", but the CRD serves infergate.dev/v1alpha1"#,
        ),
        (
            Some("infergate.dev/v1"),
            r#"apiVersion: is "infergate.dev/v1", but the CRD serves infergate.dev/v1alpha1"#,
        ),
        (
            None,
            "apiVersion: is missing: set it to infergate.dev/v1alpha1",
        ),
    ] {
        let mut doc = with_scheduler("");
        match version {
            Some(v) => doc["apiVersion"] = json!(v),
            None => {
                doc.as_object_mut().unwrap().remove("apiVersion");
            }
        }
        assert_eq!(violations(&mut doc), [want]);
    }
    let mut doc = with_scheduler("");
    doc["kind"] = json!("InferenceGatewayconfig");
    assert_refused(&mut doc, &["kind: is \"InferenceGatewayconfig\""]);
}

#[test]
fn types_lengths_enums_and_required_fields_name_the_value() {
    assert_refused(
        &mut with_scheduler("    targetPort: \"8000\"\n    replicas: 1.5\n"),
        &[
            r#"spec.schedulers[0].targetPort: must be an integer, not the string "8000""#,
            "spec.schedulers[0].replicas: must be an integer, not the number 1.5",
        ],
    );
    assert_refused(
        &mut with_scheduler("    preset: fastest\n"),
        &[
            r#"spec.schedulers[0].preset: "fastest" is not one of infergate, gie-default, round-robin, random, least-request"#,
        ],
    );
    let mut doc = with_scheduler("");
    doc["spec"]["schedulers"][0]
        .as_object_mut()
        .unwrap()
        .remove("modelSelector");
    assert_refused(
        &mut doc,
        &["spec.schedulers[0].modelSelector: is required but missing"],
    );
    let mut doc = with_scheduler("");
    doc["spec"]["schedulers"] = json!(7);
    assert_refused(
        &mut doc,
        &["spec.schedulers: must be a list, not the integer 7"],
    );
    let mut doc = with_scheduler("");
    doc["spec"]["schedulers"][0]["name"] = json!("a".repeat(41));
    assert_refused(
        &mut doc,
        &["spec.schedulers[0].name: is 41 characters long; the most is 40"],
    );
    // A label key with dots and a slash is named in brackets.
    let mut doc = with_scheduler("");
    doc["spec"]["schedulers"][0]["modelSelector"]["app.kubernetes.io/name"] = json!(5);
    assert_refused(
        &mut doc,
        &[r#"spec.schedulers[0].modelSelector["app.kubernetes.io/name"]: must be a string"#],
    );
    // Not a mapping at all.
    assert_eq!(
        violations(&mut json!([1])),
        [
            "(document): must be a mapping with apiVersion, kind, metadata and spec, not a list of 1 items"
        ]
    );
    let mut doc = with_scheduler("");
    doc["spce"] = doc["spec"].clone();
    doc.as_object_mut().unwrap().remove("spec");
    assert_refused(
        &mut doc,
        &[
            "spce: unknown field",
            "(did you mean spec?)",
            "spec: is required but missing",
        ],
    );
}

#[test]
fn nulls_are_kept_where_nullable_and_pruned_elsewhere() {
    // `weights` is nullable: kept. `bbr` is not: pruned, as the API server prunes it, and the
    // default applies. A required field given as null is missing.
    let mut doc = with_scheduler("    weights: null\n  bbr: null\n");
    assert_eq!(violations(&mut doc), Vec::<String>::new());
    assert_eq!(doc["spec"]["schedulers"][0]["weights"], Value::Null);
    assert!(doc["spec"].get("bbr").is_none(), "{doc}");
    let mut doc = with_scheduler("");
    doc["spec"]["schedulers"][0]["modelName"] = Value::Null;
    assert_refused(
        &mut doc,
        &["spec.schedulers[0].modelName: is required but missing"],
    );
    // A null list item is not pruned.
    let mut doc = with_scheduler("    loraAdapters: [a, null]\n");
    assert_refused(
        &mut doc,
        &["spec.schedulers[0].loraAdapters[1]: must be a string, not null"],
    );
}

#[test]
fn int_or_string_takes_either() {
    let tenancy = |v: &str| {
        let mut doc = with_scheduler(&format!("  tenancy: {{objectives: {{a: {v}}}}}\n"));
        violations(&mut doc)
    };
    assert!(tenancy("critical").is_empty());
    assert!(tenancy("-3").is_empty());
    assert_eq!(
        tenancy("1.5"),
        ["spec.tenancy.objectives.a: must be an integer or a string, not the number 1.5"]
    );
    assert_eq!(
        tenancy("[x]"),
        ["spec.tenancy.objectives.a: must be an integer or a string, not a list of 1 items"]
    );
}

/// The checker implements the keywords the generated CRD uses; a schema change that brings
/// another (a `oneOf`, a `multipleOf`…) fails here instead of going unchecked offline.
#[test]
fn the_crd_uses_only_keywords_the_checker_implements() {
    fn visit(s: &JSONSchemaProps, path: &str, patterns: &mut Vec<String>) {
        let unchecked = [
            ("allOf", s.all_of.is_some()),
            ("anyOf", s.any_of.is_some()),
            ("oneOf", s.one_of.is_some()),
            ("not", s.not.is_some()),
            ("multipleOf", s.multiple_of.is_some()),
            ("uniqueItems", s.unique_items.is_some()),
            ("patternProperties", s.pattern_properties.is_some()),
            ("additionalItems", s.additional_items.is_some()),
            ("dependencies", s.dependencies.is_some()),
            ("$ref", s.ref_path.is_some()),
            (
                "x-kubernetes-embedded-resource",
                s.x_kubernetes_embedded_resource.is_some(),
            ),
            ("x-kubernetes-list-type", s.x_kubernetes_list_type.is_some()),
            (
                "x-kubernetes-list-map-keys",
                s.x_kubernetes_list_map_keys.is_some(),
            ),
            ("x-kubernetes-map-type", s.x_kubernetes_map_type.is_some()),
        ];
        for (keyword, used) in unchecked {
            assert!(
                !used,
                "{path} uses {keyword}, which the offline check ignores"
            );
        }
        if let Some(t) = &s.type_ {
            assert!(
                ["object", "array", "string", "integer", "number", "boolean"].contains(&t.as_str()),
                "{path}: type {t}"
            );
        }
        if let Some(p) = &s.pattern {
            assert!(regex::Regex::new(p).is_ok(), "{path}: pattern {p}");
            patterns.push(p.clone());
        }
        for (k, sub) in s.properties.iter().flatten() {
            visit(sub, &format!("{path}.{k}"), patterns);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(sub)) = &s.additional_properties {
            visit(sub, &format!("{path}.*"), patterns);
        }
        match &s.items {
            Some(JSONSchemaPropsOrArray::Schema(sub)) => visit(sub, &format!("{path}[]"), patterns),
            Some(JSONSchemaPropsOrArray::Schemas(_)) => panic!("{path}: tuple items"),
            None => {}
        }
    }
    let schema = CrdSchema::new();
    assert_eq!(schema.api_version(), "infergate.dev/v1alpha1");
    assert_eq!(schema.kind(), "InferenceGatewayConfig");
    let mut patterns = Vec::new();
    visit(&schema.root, "", &mut patterns);
    // Every pattern has a message a person can act on.
    patterns.sort();
    patterns.dedup();
    assert!(!patterns.is_empty());
    for p in &patterns {
        assert!(
            hint(p).is_some(),
            "pattern {p} has no entry in PATTERN_HINTS"
        );
    }
}

/// The offline check agrees with a JSON Schema validator on the same schema made strict (unknown
/// fields refused) wherever the two dialects mean the same thing: no nulls (`nullable`) and no
/// int-or-string values here, which JSON Schema reads differently.
#[test]
fn agrees_with_a_json_schema_validator() {
    fn strict(v: &mut Value) {
        if let Value::Object(m) = v {
            if m.contains_key("properties")
                && !m.contains_key("additionalProperties")
                && m.get("x-kubernetes-preserve-unknown-fields") != Some(&json!(true))
            {
                m.insert("additionalProperties".into(), json!(false));
            }
            m.values_mut().for_each(strict);
        } else if let Value::Array(a) = v {
            a.iter_mut().for_each(strict);
        }
    }
    let mut schema = serde_json::to_value(&CrdSchema::new().root).unwrap();
    strict(&mut schema);
    // The API server's own fields are not in the CRD's schema.
    schema["properties"]["apiVersion"] = json!({ "type": "string" });
    schema["properties"]["kind"] = json!({ "type": "string" });
    schema["properties"]["metadata"] = json!({ "type": "object" });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut docs: Vec<(String, Value)> = examples("")
        .into_iter()
        .chain(examples("invalid"))
        .map(|p| {
            (
                p.display().to_string(),
                yaml(&std::fs::read_to_string(&p).unwrap()),
            )
        })
        .collect();
    for extra in [
        "    loraAdpaters: [sql]\n",
        "    weights: {queue: 1, latency: 5}\n",
        "    targetPort: 70000\n",
        "    targetPort: 0\n",
        "    routeTimeout: 5 minutes\n",
        "    routeTimeout: 1h30m\n",
        "    replicas: 101\n",
        "    preset: fastest\n",
        "    staleMetrics: {maxInflightPerEndpoint: 0}\n",
        "  bbr: {maxRequestBodyBytes: 1023}\n",
        "  bbr: {maxRequestBodyBytes: 1024}\n",
        "  foo: bar\n",
    ] {
        docs.push((extra.trim().to_owned(), with_scheduler(extra)));
    }
    let mut refused = 0;
    for (name, doc) in docs {
        let ours = violations(&mut doc.clone());
        let theirs: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert_eq!(
            ours.is_empty(),
            theirs.is_empty(),
            "{name}: ours {ours:?}, theirs {theirs:?}"
        );
        refused += usize::from(!ours.is_empty());
    }
    assert!(refused >= 10, "{refused}");
}

#[test]
fn a_typo_is_told_from_an_unrelated_name() {
    assert_eq!(distance("loraadpaters", "loraadapters"), 1);
    assert_eq!(distance("modelname", "modelname"), 0);
    assert_eq!(distance("", "abc"), 3);
    assert!(distance("latency", "queue") > 2);
}

/// An empty tenant claim would copy nothing into the tenant header, and every client would be
/// the tenant `default`: the schema refuses it, as the API server would.
#[test]
fn an_empty_tenant_claim_is_refused() {
    let auth = |claim: &str| {
        let mut doc = with_scheduler("");
        doc["spec"]["auth"] = json!({"jwt": {"provider": {
            "issuer": "https://issuer.example.com",
            "remoteJWKS": {"uri": "https://issuer.example.com/jwks"},
            "tenantClaim": claim,
        }}});
        doc
    };
    assert_eq!(violations(&mut auth("org.team")), Vec::<String>::new());
    assert_refused(
        &mut auth(""),
        &["spec.auth.jwt.provider.tenantClaim: must not be empty"],
    );
}
