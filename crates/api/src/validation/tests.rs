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
    assert_carries(&scheduler["properties"]["outlierDetection"], OUTLIER_RULES);
    assert_carries(&spec["properties"]["tls"], TLS_RULES);
    assert_carries(
        &spec["properties"]["gateway"]["properties"]["listeners"],
        LISTENER_RULES,
    );
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

/// A spec from YAML. Unless it says otherwise about authentication, authentication is waived,
/// so each test sees only the rule it is about (the authentication rules have their own test).
fn spec(yaml: &str) -> InferenceGatewayConfigSpec {
    let mut s: InferenceGatewayConfigSpec = serde_yaml::from_str(yaml).unwrap();
    if s.auth.is_none() && !yaml.contains("allowUnauthenticated") {
        s.allow_unauthenticated = true;
    }
    s
}

#[test]
fn authentication_is_configured_or_explicitly_waived_never_both() {
    let one = "schedulers: [{name: a, modelName: m, modelSelector: {app: a}}]";
    let auth = "auth: {jwt: {provider: {issuer: i, remoteJWKS: {uri: 'https://i/jwks'}}}}";
    assert_eq!(
        violations(&spec(&format!("{{{one}, allowUnauthenticated: false}}"))),
        vec![("spec".to_owned(), AUTH_REQUIRED.message.to_owned())]
    );
    assert_eq!(
        violations(&spec(&format!(
            "{{{one}, {auth}, allowUnauthenticated: true}}"
        ))),
        vec![(
            "spec".to_owned(),
            AUTH_OR_UNAUTHENTICATED.message.to_owned()
        )]
    );
    assert_eq!(violations(&spec(&format!("{{{one}, {auth}}}"))), vec![]);
    assert_eq!(
        violations(&spec(&format!("{{{one}, allowUnauthenticated: true}}"))),
        vec![]
    );
    // Unset is false: a spec that does not mention it is refused (what `spec()` waives above).
    let unset: InferenceGatewayConfigSpec = serde_yaml::from_str(&format!("{{{one}}}")).unwrap();
    assert!(!unset.allow_unauthenticated);
    assert_eq!(
        violations(&unset),
        vec![("spec".to_owned(), AUTH_REQUIRED.message.to_owned())]
    );
}

fn messages(spec: &InferenceGatewayConfigSpec) -> Vec<String> {
    match validate(spec) {
        Ok(()) => vec![],
        Err(Error::Invalid(v)) => v.into_iter().map(|v| v.message.into_owned()).collect(),
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
    let got: Vec<(&str, &str)> = v
        .iter()
        .map(|v| (v.field.as_str(), v.message.as_ref()))
        .collect();
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
fn a_weight_that_is_not_a_finite_number_is_refused_naming_it() {
    // YAML carries `.inf` and `.nan` (JSON, and so the API server, cannot): the operator's
    // JSON round trip would turn them into null and fail with "invalid type: null".
    let s = spec(
        "{schedulers: [{name: a, modelName: m, modelSelector: {app: a}, weights: {queue: .inf}}]}",
    );
    assert_eq!(
        violations(&s),
        vec![(
            "spec.schedulers[0].weights.queue".to_owned(),
            WEIGHT_FINITE_MESSAGE.to_owned()
        )]
    );
    let mut s = spec(
        "{schedulers: [{name: a, modelName: m, modelSelector: {app: a}, weights: {queue: 1, inflightTokens: -.inf}}]}",
    );
    if let Some(w) = s.schedulers[0].weights.as_mut() {
        w.prefix = Some(f64::NAN);
    }
    assert_eq!(
        violations(&s),
        vec![
            (
                "spec.schedulers[0].weights.prefix".to_owned(),
                WEIGHT_FINITE_MESSAGE.to_owned()
            ),
            (
                "spec.schedulers[0].weights.inflightTokens".to_owned(),
                WEIGHT_FINITE_MESSAGE.to_owned()
            ),
        ]
    );
}

/// Weight name → value; absent names are unset.
type WeightValues<'a> = &'a [(&'a str, f64)];

/// Evaluates a weights rule's text on `weights` (name → value; absent names are unset). The
/// rules are a chain of one clause per weight joined by `joiner`; each clause is parsed back to
/// its weight name and must be exactly `clause(name)`, so a rule of another shape fails here
/// rather than being evaluated wrongly.
fn eval_weights_rule(
    rule: &str,
    joiner: &str,
    clause: impl Fn(&str) -> String,
    holds: impl Fn(Option<f64>) -> bool,
    weights: &[(&str, f64)],
) -> (Vec<String>, bool) {
    let mut names = Vec::new();
    let mut results = Vec::new();
    for c in rule.split(joiner) {
        let name = c
            .split("self.")
            .nth(1)
            .and_then(|rest| rest.split([')', ' ']).next())
            .unwrap_or_else(|| panic!("clause {c:?} names no weight"));
        assert_eq!(c, clause(name), "clause of {name} in {rule:?}");
        let value = weights.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        results.push(holds(value));
        names.push(name.to_owned());
    }
    let value = if joiner == " && " {
        results.iter().all(|r| *r)
    } else {
        results.iter().any(|r| *r)
    };
    (names, value)
}

#[test]
fn the_weight_rules_cover_every_weight_and_agree_with_the_validator() {
    let names: Vec<&str> = Weights::default().entries().map(|(n, _)| n).to_vec();
    // `inflightTokens` was missing from both rules while `entries` had it.
    assert!(names.contains(&"inflightTokens"));
    let non_negative = |w: &[(&str, f64)]| {
        eval_weights_rule(
            WEIGHTS_NON_NEGATIVE.rule,
            " && ",
            |n| format!("(!has(self.{n}) || self.{n} >= 0.0)"),
            |v| v.is_none_or(|v| v >= 0.0),
            w,
        )
    };
    let one_positive = |w: &[(&str, f64)]| {
        eval_weights_rule(
            WEIGHTS_ONE_POSITIVE.rule,
            " || ",
            |n| format!("(has(self.{n}) && self.{n} > 0.0)"),
            |v| v.is_some_and(|v| v > 0.0),
            w,
        )
    };
    // Each rule names every weight, once, in the order of `entries`.
    assert_eq!(non_negative(&[]).0, names);
    assert_eq!(one_positive(&[]).0, names);
    // The schema's weight properties are the same names.
    let s = schema();
    let props = s["properties"]["spec"]["properties"]["schedulers"]["items"]["properties"]
        ["weights"]["properties"]
        .as_object()
        .unwrap();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(props.keys().map(String::as_str).collect::<Vec<_>>(), sorted);
    // For each weight, the rule text and the Rust check give the same verdict.
    for name in &names {
        let other = if *name == "queue" { "prefix" } else { "queue" };
        // (weights, the non-negative rule holds, the one-positive rule holds)
        let cases: [(WeightValues, bool, bool); 3] = [
            (&[(name, 1.0)], true, true),
            (&[(other, 1.0), (name, -5.0)], false, true),
            (&[(name, 0.0)], true, false),
        ];
        for (weights, want_non_negative, want_one_positive) in cases {
            assert_eq!(non_negative(weights).1, want_non_negative, "{weights:?}");
            assert_eq!(one_positive(weights).1, want_one_positive, "{weights:?}");
            let yaml: Vec<String> = weights.iter().map(|(n, v)| format!("{n}: {v}")).collect();
            let s = spec(&format!(
                "{{schedulers: [{{name: a, modelName: m, modelSelector: {{app: a}}, weights: {{{}}}}}]}}",
                yaml.join(", ")
            ));
            let got = messages(&s);
            assert_eq!(
                !got.contains(&WEIGHTS_NON_NEGATIVE.message.to_owned()),
                want_non_negative,
                "{weights:?}: {got:?}"
            );
            assert_eq!(
                !got.contains(&WEIGHTS_ONE_POSITIVE.message.to_owned()),
                want_one_positive,
                "{weights:?}: {got:?}"
            );
        }
    }
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
            .map(|v| (v.field.as_str(), v.message.as_ref()))
            .collect::<Vec<_>>(),
        vec![("spec.auth.jwt.provider.remoteJWKS.uri", JWKS_HTTPS_MESSAGE)]
    );
    // The field is named once, not again inside the message.
    assert_eq!(
        err.to_string(),
        "invalid InferenceGatewayConfig: spec.auth.jwt.provider.remoteJWKS.uri: must start with https://: keys fetched in clear text could be replaced on the way"
    );
    let s = schema();
    let uri = &s["properties"]["spec"]["properties"]["auth"]["properties"]["jwt"]["properties"]["provider"]
        ["properties"]["remoteJWKS"]["properties"]["uri"];
    assert_eq!(uri["pattern"], "^https://", "{uri}");
}

fn violations(spec: &InferenceGatewayConfigSpec) -> Vec<(String, String)> {
    match validate(spec) {
        Ok(()) => vec![],
        Err(Error::Invalid(v)) => v
            .into_iter()
            .map(|v| (v.field, v.message.into_owned()))
            .collect(),
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
            (
                "spec.flowControl.requestTtlMs".to_owned(),
                FLOW_TTL_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.maxRequests".to_owned(),
                FLOW_LIMIT_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.maxBytes".to_owned(),
                FLOW_LIMIT_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.bands.standard.maxRequests".to_owned(),
                FLOW_LIMIT_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.bands.sheddable.maxBytes".to_owned(),
                FLOW_LIMIT_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.headroom.shareHalfLifeMs".to_owned(),
                FLOW_HALF_LIFE_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.serviceWeights.input".to_owned(),
                FLOW_WEIGHT_MESSAGE.to_owned()
            ),
            (
                "spec.flowControl.serviceWeights.output".to_owned(),
                FLOW_WEIGHT_MESSAGE.to_owned()
            ),
            (
                "spec.tenancy.objectives".to_owned(),
                OBJECTIVE_NAME_MESSAGE.to_owned()
            ),
            (
                "spec.tenancy.objectives.chat".to_owned(),
                OBJECTIVE_PRIORITY_MESSAGE.to_owned()
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
            PASSWORD_ENV_MESSAGE.to_owned()
        )]
    );
    assert_eq!(
        violations(&with(
            &format!("passwordEnv: REDIS_PASSWORD, {secret}"),
            "{name: REDIS_PASSWORD, value: x}"
        )),
        vec![(
            "spec.quotas.redis".to_owned(),
            REDIS_ONE_PASSWORD.message.to_owned()
        )]
    );
    let s = schema();
    let redis = &s["properties"]["spec"]["properties"]["quotas"]["properties"]["redis"];
    assert_carries(redis, REDIS_RULES);
}

fn crd_validator() -> jsonschema::Validator {
    jsonschema::validator_for(&schema()).unwrap()
}

fn object(spec: Value) -> Value {
    json!({
        "apiVersion": "infergate.dev/v1alpha1",
        "kind": "InferenceGatewayConfig",
        "metadata": { "name": "x", "namespace": "y" },
        "spec": spec,
    })
}

#[test]
fn a_model_selector_has_1_to_64_labels_in_the_validator_and_the_schema() {
    let s = spec("{schedulers: [{name: a, modelName: m, modelSelector: {}}]}");
    assert_eq!(
        violations(&s),
        vec![(
            "spec.schedulers[0].modelSelector".to_owned(),
            MODEL_SELECTOR_MESSAGE.to_owned()
        )]
    );
    let labels = |n: usize| -> Value {
        (0..n)
            .map(|i| (format!("l{i}"), json!("v")))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let mut s = spec(&format!("{{{ONE_SCHEDULER}}}"));
    s.schedulers[0].model_selector = serde_json::from_value(labels(65)).unwrap();
    assert_eq!(
        violations(&s),
        vec![(
            "spec.schedulers[0].modelSelector".to_owned(),
            MODEL_SELECTOR_MESSAGE.to_owned()
        )]
    );
    let selector = &schema()["properties"]["spec"]["properties"]["schedulers"]["items"]["properties"]
        ["modelSelector"];
    assert_eq!(selector["minProperties"], 1, "{selector}");
    assert_eq!(selector["maxProperties"], 64, "{selector}");
    let validator = crd_validator();
    let with = |selector: Value| {
        object(
            json!({ "schedulers": [{ "name": "a", "modelName": "m", "modelSelector": selector }] }),
        )
    };
    assert!(validator.is_valid(&with(labels(1))));
    assert!(validator.is_valid(&with(labels(64))));
    assert!(!validator.is_valid(&with(labels(0))));
    assert!(!validator.is_valid(&with(labels(65))));
}

#[test]
fn listeners_have_unique_names_and_unique_port_protocol_and_hostname() {
    let with = |listeners: &str| {
        spec(&format!(
            "{{gateway: {{listeners: [{listeners}]}}, {ONE_SCHEDULER}}}"
        ))
    };
    let name = (
        "spec.gateway.listeners".to_owned(),
        LISTENER_NAME_UNIQUE.message.to_owned(),
    );
    let port = (
        "spec.gateway.listeners".to_owned(),
        LISTENER_PORT_UNIQUE.message.to_owned(),
    );
    assert_eq!(
        violations(&with("{name: http, port: 80}, {name: http, port: 81}")),
        vec![name.clone()]
    );
    assert_eq!(
        violations(&with("{name: a, port: 80}, {name: b, port: 80}")),
        vec![port.clone()]
    );
    assert_eq!(
        violations(&with(
            "{name: a, port: 80, hostname: x.example}, {name: b, port: 80, hostname: x.example}"
        )),
        vec![port.clone()]
    );
    assert_eq!(
        violations(&with("{name: a, port: 80}, {name: a, port: 80}")),
        vec![name, port]
    );
    // As Gateway API allows: another hostname, or one listener with a hostname and one without,
    // or another protocol on the same port.
    for fine in [
        "{name: a, port: 80, hostname: x.example}, {name: b, port: 80, hostname: y.example}",
        "{name: a, port: 80, hostname: x.example}, {name: b, port: 80}",
        "{name: a, port: 443, protocol: HTTP}, {name: b, port: 443, protocol: HTTPS}",
    ] {
        let mut s = with(fine);
        s.tls = Some(serde_yaml::from_str("{certificateSecretRef: {name: c}}").unwrap());
        assert_eq!(violations(&s), vec![], "{fine}");
    }
}

#[test]
fn lora_adapters_need_the_body_based_router() {
    let s = spec(
        "{bbr: {enabled: false}, schedulers: [{name: a, modelName: m, modelSelector: {app: a}, loraAdapters: [x]}]}",
    );
    assert_eq!(
        violations(&s),
        vec![(
            "spec.bbr.enabled".to_owned(),
            LORA_NEEDS_BBR.message.to_owned()
        )]
    );
    // One scheduler without the BBR stays a documented mode, rewrites included.
    let s = spec(
        "{bbr: {enabled: false}, schedulers: [{name: a, modelName: m, modelSelector: {app: a},
          modelRewrites: [{matches: [{model: {value: alias}}], targets: [{modelRewrite: m}]}]}]}",
    );
    assert_eq!(violations(&s), vec![]);
}

fn two_schedulers(a: &str, b: &str) -> InferenceGatewayConfigSpec {
    spec(&format!(
        "{{schedulers: [{{name: a, modelName: m1, modelSelector: {{app: a}}, {a}}},
                        {{name: b, modelName: m2, modelSelector: {{app: b}}, {b}}}]}}"
    ))
}

#[test]
fn a_routed_name_belongs_to_one_scheduler_and_the_message_names_both_places() {
    let across = "a model name, LoRA adapter or matched name routes to one scheduler only (the body-based router refuses one configured twice, and the two HTTPRoutes would both match it)";
    let rewrite = |name: &str| {
        format!(
            "modelRewrites: [{{matches: [{{model: {{value: {name}}}}}], targets: [{{modelRewrite: m1}}]}}]"
        )
    };
    // The walkthrough's three: an adapter on two schedulers, an adapter that is another
    // scheduler's model, a rewrite in one pool matching the other pool's model.
    assert_eq!(
        violations(&two_schedulers("loraAdapters: [x]", "loraAdapters: [x]")),
        vec![(
            "spec.schedulers[1].loraAdapters[0]".to_owned(),
            format!("`x` is already spec.schedulers[0].loraAdapters[0]: {across}")
        )]
    );
    assert_eq!(
        violations(&two_schedulers("loraAdapters: [m2]", "")),
        vec![(
            "spec.schedulers[1].modelName".to_owned(),
            format!("`m2` is already spec.schedulers[0].loraAdapters[0]: {across}")
        )]
    );
    assert_eq!(
        violations(&two_schedulers(&rewrite("m2"), "")),
        vec![(
            "spec.schedulers[1].modelName".to_owned(),
            format!(
                "`m2` is already spec.schedulers[0].modelRewrites[0].matches[0].model.value: {across}"
            )
        )]
    );
    // Two pools matching one name in their rewrites.
    assert_eq!(
        violations(&two_schedulers(
            &rewrite("alias"),
            &rewrite("alias").replace("m1", "m2")
        )),
        vec![(
            "spec.schedulers[1].modelRewrites[0].matches[0].model.value".to_owned(),
            format!(
                "`alias` is already spec.schedulers[0].modelRewrites[0].matches[0].model.value: {across}"
            )
        )]
    );
    // Within one scheduler: what the BBR's table refuses is refused, what the render folds
    // into one name (a rewrite of the scheduler's own model or adapter) is fine.
    let within = "a scheduler's model and adapters must be different names, the body-based router refuses one configured twice";
    assert_eq!(
        violations(&two_schedulers("loraAdapters: [x, x]", "")),
        vec![(
            "spec.schedulers[0].loraAdapters[1]".to_owned(),
            format!("`x` is already spec.schedulers[0].loraAdapters[0]: {within}")
        )]
    );
    assert_eq!(
        violations(&two_schedulers("loraAdapters: [m1]", "")),
        vec![(
            "spec.schedulers[0].loraAdapters[0]".to_owned(),
            format!("`m1` is already spec.schedulers[0].modelName: {within}")
        )]
    );
    assert_eq!(
        violations(&two_schedulers(
            "loraAdapters: [x], modelRewrites: [{matches: [{model: {value: x}}, {model: {value: m1}}], targets: [{modelRewrite: m1}]}]",
            ""
        )),
        vec![]
    );
    // Blank names, which the BBR refuses too.
    assert_eq!(
        violations(&two_schedulers("loraAdapters: [' ']", &rewrite("''"))),
        vec![
            (
                "spec.schedulers[0].loraAdapters[0]".to_owned(),
                NAME_BLANK_MESSAGE.to_owned()
            ),
            (
                "spec.schedulers[1].modelRewrites[0].matches[0].model.value".to_owned(),
                NAME_BLANK_MESSAGE.to_owned()
            ),
        ]
    );
    // Two schedulers with one modelName stay the CEL rule's, reported once.
    assert_eq!(
        messages(&spec(
            "{schedulers: [{name: a, modelName: m, modelSelector: {app: a}}, {name: b, modelName: m, modelSelector: {app: b}}]}"
        )),
        vec![MODEL_NAME_UNIQUE.message]
    );
}

#[test]
fn a_scheduler_routes_at_most_as_many_names_as_an_httproute_rule_has_matches() {
    let adapters: Vec<String> = (0..63).map(|i| format!("ad{i}")).collect();
    let with = |bbr: bool, rewrites: &str| {
        spec(&format!(
            "{{bbr: {{enabled: {bbr}}}, schedulers: [{{name: a, modelName: m, modelSelector: {{app: a}},
              loraAdapters: [{}], {rewrites}}}]}}",
            adapters.join(", ")
        ))
    };
    // 63 adapters and the model: 64 matches, the most a rule holds.
    assert_eq!(violations(&with(true, "")), vec![]);
    // A rewrite's name makes 65 (the walkthrough's case); a rewrite of an adapter adds none.
    let rewrite = |name: &str| {
        format!(
            "modelRewrites: [{{matches: [{{model: {{value: {name}}}}}], targets: [{{modelRewrite: m}}]}}]"
        )
    };
    assert_eq!(
        violations(&with(true, &rewrite("alias"))),
        vec![(
            "spec.schedulers[0]".to_owned(),
            "routes 65 names (modelName, the loraAdapters and the other names modelRewrites match, each once), but its HTTPRoute rule holds at most 64 matches: route at most 64".to_owned()
        )]
    );
    assert_eq!(violations(&with(true, &rewrite("ad5"))), vec![]);
    // Without the BBR the route has one catch-all match: only the adapters are refused.
    assert_eq!(
        messages(&with(false, &rewrite("alias"))),
        vec![LORA_NEEDS_BBR.message]
    );
}
