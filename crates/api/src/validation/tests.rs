use serde_json::{Value, json};

use super::*;
use crate::config::{InferenceGatewayConfig, ObjectivePriority, SchedulerPreset};
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

fn violations(spec: &InferenceGatewayConfigSpec) -> Vec<(String, &'static str)> {
    match validate(spec) {
        Ok(()) => vec![],
        Err(Error::Invalid(v)) => v.into_iter().map(|v| (v.field, v.message)).collect(),
        Err(e) => panic!("unexpected {e}"),
    }
}

const ONE_SCHEDULER: &str = "schedulers: [{name: a, modelName: m, modelSelector: {app: a}}]";

#[test]
fn flow_control_and_tenancy_as_the_gateway_file_writes_them_are_accepted() {
    let s = spec(&format!(
        "{{{ONE_SCHEDULER},
          flowControl: {{enabled: true, requestTtlMs: 30000, maxRequests: 2000, maxBytes: 100000000,
            bands: {{critical: {{maxRequests: 500}}, sheddable: {{maxRequests: 100, maxBytes: 1000000}}}},
            fairness: least-attained-service, ordering: edf, serviceWeights: {{input: 1, output: 2}},
            headroom: {{reservedEndpoints: 1, shareHalfLifeMs: 5000}}}},
          tenancy: {{objectives: {{chat: critical, batch: -1, default-objective: 0}},
            defaultPriority: standard, metricTenants: [team-a]}}}}"
    ));
    assert_eq!(violations(&s), vec![]);
    let t = s.tenancy.as_ref().unwrap();
    assert_eq!(t.objectives["batch"], ObjectivePriority::Level(-1));
    assert_eq!(
        t.objectives["chat"],
        ObjectivePriority::Band("critical".into())
    );
}

#[test]
fn bad_flow_control_values_are_refused_naming_their_path() {
    let s = spec(&format!(
        "{{{ONE_SCHEDULER},
          flowControl: {{enabled: true, requestTtlMs: 90000000, maxRequests: 0, maxBytes: 0,
            bands: {{standard: {{maxRequests: 0}}, sheddable: {{maxBytes: 0}}}},
            serviceWeights: {{input: -1}}, headroom: {{reservedEndpoints: 1, shareHalfLifeMs: 0}}}},
          tenancy: {{objectives: {{chat: urgent, '': 1}}}}}}"
    ));
    let mut s = s;
    if let Some(w) = s
        .flow_control
        .as_mut()
        .and_then(|f| f.service_weights.as_mut())
    {
        // JSON cannot carry NaN, a Rust caller can.
        w.output = Some(f64::NAN);
    }
    assert_eq!(
        violations(&s),
        vec![
            ("spec.flowControl.requestTtlMs".to_owned(), FLOW_TTL_MESSAGE),
            (
                "spec.flowControl.maxRequests".to_owned(),
                FLOW_LIMIT_MESSAGE
            ),
            ("spec.flowControl.maxBytes".to_owned(), FLOW_LIMIT_MESSAGE),
            (
                "spec.flowControl.bands.standard.maxRequests".to_owned(),
                FLOW_LIMIT_MESSAGE
            ),
            (
                "spec.flowControl.bands.sheddable.maxBytes".to_owned(),
                FLOW_LIMIT_MESSAGE
            ),
            (
                "spec.flowControl.headroom.shareHalfLifeMs".to_owned(),
                FLOW_HALF_LIFE_MESSAGE
            ),
            (
                "spec.flowControl.serviceWeights.input".to_owned(),
                FLOW_WEIGHT_MESSAGE
            ),
            (
                "spec.flowControl.serviceWeights.output".to_owned(),
                FLOW_WEIGHT_MESSAGE
            ),
            ("spec.tenancy.objectives".to_owned(), OBJECTIVE_NAME_MESSAGE),
            (
                "spec.tenancy.objectives.chat".to_owned(),
                OBJECTIVE_PRIORITY_MESSAGE
            ),
        ]
    );
    let err = validate(&s).unwrap_err().to_string();
    assert!(
        err.contains("spec.flowControl.bands.standard.maxRequests: must be at least 1"),
        "{err}"
    );
}

#[test]
fn the_schema_refuses_what_the_validator_refuses_in_flow_control() {
    let crd = InferenceGatewayConfig::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap();
    let validator = jsonschema::validator_for(&serde_json::to_value(schema).unwrap()).unwrap();
    let with = |flow: Value| {
        json!({
            "apiVersion": "infergate.dev/v1alpha1",
            "kind": "InferenceGatewayConfig",
            "metadata": { "name": "x", "namespace": "y" },
            "spec": {
                "schedulers": [{ "name": "a", "modelName": "m", "modelSelector": { "app": "a" } }],
                "flowControl": flow,
            },
        })
    };
    assert!(validator.is_valid(&with(json!({ "enabled": true, "maxRequests": 1 }))));
    for bad in [
        json!({ "maxRequests": 0 }),
        json!({ "maxBytes": 0 }),
        json!({ "requestTtlMs": -1 }),
        json!({ "requestTtlMs": 90000000 }),
        json!({ "bands": { "critical": { "maxRequests": 0 } } }),
        json!({ "serviceWeights": { "input": -0.5 } }),
        json!({ "headroom": { "shareHalfLifeMs": 0 } }),
        json!({ "headroom": { "reservedEndpoints": -1 } }),
        json!({ "fairness": "lottery" }),
        json!({ "ordering": "lifo" }),
        json!({ "enabled": "yes" }),
    ] {
        assert!(!validator.is_valid(&with(bad.clone())), "{bad}");
    }
    let flow = &serde_json::to_value(schema).unwrap()["properties"]["spec"]["properties"]["tenancy"]
        ["properties"]["objectives"]["additionalProperties"];
    assert_eq!(flow["x-kubernetes-int-or-string"], true, "{flow}");
}

#[test]
fn the_redis_password_has_one_source_defined_for_the_pods() {
    let with = |redis: &str, env: &str| {
        spec(&format!(
            "{{{ONE_SCHEDULER}, podDefaults: {{env: [{env}]}},
              quotas: {{default: {{requestsPerMinute: 60}}, redis: {{address: 'redis:6379', {redis}}}}}}}"
        ))
    };
    let secret = "passwordSecretRef: {name: redis, key: password}";
    assert_eq!(violations(&with(secret, "")), vec![]);
    assert_eq!(
        violations(&with(
            "passwordEnv: REDIS_PASSWORD",
            "{name: REDIS_PASSWORD, valueFrom: {secretKeyRef: {name: redis, key: password}}}"
        )),
        vec![]
    );
    assert_eq!(
        violations(&with(
            "passwordEnv: REDIS_PASSWORD",
            "{name: OTHER, value: x}"
        )),
        vec![(
            "spec.quotas.redis.passwordEnv".to_owned(),
            PASSWORD_ENV_MESSAGE
        )]
    );
    assert_eq!(
        violations(&with(
            &format!("passwordEnv: REDIS_PASSWORD, {secret}"),
            "{name: REDIS_PASSWORD, value: x}"
        )),
        vec![("spec.quotas.redis".to_owned(), REDIS_ONE_PASSWORD.message)]
    );
    let s = schema();
    let redis = &s["properties"]["spec"]["properties"]["quotas"]["properties"]["redis"];
    assert_carries(redis, REDIS_RULES);
}
