use serde_json::Value;

use super::*;
use crate::config::{InferenceGatewayConfig, SchedulerPreset};
use kube::CustomResourceExt;

fn schema() -> Value {
    let crd = InferenceGatewayConfig::crd();
    let v = &crd.spec.versions[0];
    let schema = v
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema).unwrap()
}

fn rules_at(node: &Value) -> Vec<(String, String)> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_owned(),
                        r["message"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn assert_carries(node: &Value, table: &[CelRule]) {
    let found = rules_at(node);
    assert_eq!(found.len(), table.len(), "rules at node: {found:?}");
    for rule in table {
        assert!(
            found.contains(&(rule.rule.to_owned(), rule.message.to_owned())),
            "missing rule {:?}",
            rule.rule
        );
    }
}

#[test]
fn crd_carries_every_rule_with_its_message_on_the_right_node() {
    let s = schema();
    let spec = &s["properties"]["spec"];
    assert_carries(spec, SPEC_RULES);
    let scheduler = &spec["properties"]["schedulers"]["items"];
    assert_carries(scheduler, SCHEDULER_RULES);
    assert_carries(&scheduler["properties"]["weights"], WEIGHTS_RULES);
    assert_carries(&spec["properties"]["tls"], TLS_RULES);
}

#[test]
fn crd_caps_lists_so_cel_cost_is_bounded() {
    // The API server refuses O(n²) rules over unbounded lists; these caps keep them admissible.
    let s = schema();
    let spec = &s["properties"]["spec"];
    assert_eq!(spec["properties"]["schedulers"]["maxItems"], 100);
    let item = &spec["properties"]["schedulers"]["items"]["properties"];
    assert_eq!(item["modelName"]["maxLength"], 253);
    assert_eq!(item["name"]["maxLength"], 40);
}

#[test]
fn crd_carries_defaults() {
    let s = schema();
    let spec = &s["properties"]["spec"]["properties"];
    assert_eq!(spec["bbr"]["properties"]["enabled"]["default"], true);
    assert_eq!(spec["bbr"]["properties"]["replicas"]["default"], 1);
    assert_eq!(spec["gateway"]["properties"]["className"]["default"], "eg");
    let item = &spec["schedulers"]["items"]["properties"];
    assert_eq!(item["targetPort"]["default"], 8000);
    assert_eq!(item["engineType"]["default"], "vllm");
    assert_eq!(item["failureMode"]["default"], "FailClose");
    assert_eq!(item["appProtocol"]["default"], "http");
}

#[test]
fn crd_is_namespaced_with_short_name_and_status() {
    let crd = InferenceGatewayConfig::crd();
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.group, "infergate.dev");
    assert_eq!(crd.spec.names.short_names, Some(vec!["igwc".to_owned()]));
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}

fn spec(yaml: &str) -> InferenceGatewayConfigSpec {
    serde_yaml::from_str(yaml).unwrap()
}

fn messages(spec: &InferenceGatewayConfigSpec) -> Vec<&'static str> {
    match validate(spec) {
        Ok(()) => vec![],
        Err(Error::Invalid(v)) => v.into_iter().map(|v| v.message).collect(),
        Err(e) => panic!("unexpected {e}"),
    }
}

#[test]
fn single_scheduler_without_bbr_is_fine() {
    let s = spec(
        "{bbr: {enabled: false}, schedulers: [{name: a, modelName: m, modelSelector: {app: a}}]}",
    );
    assert_eq!(messages(&s), Vec::<&str>::new());
}

#[test]
fn every_broken_rule_is_listed_with_its_field() {
    let s = spec(
        "{bbr: {enabled: false}, schedulers: [
            {name: a, modelName: m, modelSelector: {app: a}, preset: infergate, weights: {queue: -1}},
            {name: a, modelName: m, modelSelector: {app: b}}]}",
    );
    let err = validate(&s).unwrap_err();
    let Error::Invalid(v) = &err else {
        panic!("{err}")
    };
    let got: Vec<(&str, &str)> = v.iter().map(|v| (v.field.as_str(), v.message)).collect();
    assert_eq!(
        got,
        vec![
            ("spec.bbr.enabled", BBR_REQUIRED.message),
            ("spec.schedulers", MODEL_NAME_UNIQUE.message),
            ("spec.schedulers", NAME_UNIQUE.message),
            ("spec.schedulers[0]", PRESET_XOR_WEIGHTS.message),
            ("spec.schedulers[0].weights", WEIGHTS_NON_NEGATIVE.message),
            ("spec.schedulers[0].weights", WEIGHTS_ONE_POSITIVE.message),
        ]
    );
    // The error's text names each field, so `Accepted=False` is actionable.
    assert!(
        err.to_string()
            .contains("spec.schedulers[0].weights: scorer weights")
    );
}

#[test]
fn nan_weight_is_rejected() {
    let mut s = spec(
        "{schedulers: [{name: a, modelName: m, modelSelector: {app: a}, weights: {queue: 1}}]}",
    );
    if let Some(w) = s.schedulers[0].weights.as_mut() {
        w.prefix = Some(f64::NAN);
    }
    assert_eq!(messages(&s), vec![WEIGHTS_NON_NEGATIVE.message]);
}

#[test]
fn effective_preset_defaults_only_without_weights() {
    let s = spec(
        "{schedulers: [{name: a, modelName: m, modelSelector: {app: a}}, {name: b, modelName: n, modelSelector: {app: b}, weights: {queue: 1}}]}",
    );
    assert_eq!(
        s.schedulers[0].effective_preset(),
        Some(SchedulerPreset::Infergate)
    );
    assert_eq!(s.schedulers[1].effective_preset(), None);
}

#[test]
fn a_jwks_uri_must_be_https_in_the_validator_and_the_schema() {
    let with_uri = |uri: &str| {
        spec(&format!(
            "{{auth: {{jwt: {{provider: {{issuer: i, remoteJWKS: {{uri: \"{uri}\"}}}}}}}}, schedulers: [{{name: a, modelName: m, modelSelector: {{app: a}}}}]}}"
        ))
    };
    assert_eq!(
        messages(&with_uri("https://issuer/jwks")),
        Vec::<&str>::new()
    );
    let err = validate(&with_uri("http://issuer/jwks")).unwrap_err();
    let Error::Invalid(v) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        v.iter()
            .map(|v| (v.field.as_str(), v.message))
            .collect::<Vec<_>>(),
        vec![("spec.auth.jwt.provider.remoteJWKS.uri", JWKS_HTTPS_MESSAGE)]
    );
    let s = schema();
    let uri = &s["properties"]["spec"]["properties"]["auth"]["properties"]["jwt"]["properties"]["provider"]
        ["properties"]["remoteJWKS"]["properties"]["uri"];
    assert_eq!(uri["pattern"], "^https://", "{uri}");
}
