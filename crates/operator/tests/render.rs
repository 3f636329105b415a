//! Golden tests of the pure render, upstream-schema validation of every emitted object, and
//! "changing a field changes exactly the children it should".

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "common/render.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{children, example, example_files, load};
use infergate_api::{SchedulerPreset, Weights};
use infergate_operator::render::{CONFIG_LABEL, Child};
use serde_json::Value;

fn golden_text(children: &[Child]) -> String {
    let mut out = String::new();
    for c in children {
        out.push_str(&format!("---\n# {}\n", c.key()));
        out.push_str(&serde_yaml::to_string(&c.object).unwrap());
    }
    out
}

#[test]
fn golden_files_match_for_every_example() {
    let golden_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for path in example_files() {
        let text = golden_text(&children(&load(&path)));
        let golden = golden_dir.join(path.file_name().unwrap());
        if update {
            std::fs::write(&golden, &text).unwrap();
        } else if std::fs::read_to_string(&golden).unwrap_or_default() != text {
            stale.push(golden.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "golden files differ (inspect, then regenerate with UPDATE_GOLDEN=1 cargo test -p infergate-operator --test render): {stale:?}"
    );
}

/// `apiVersion/kind` → openAPIV3Schema of that served version, from the upstream CRDs.
fn upstream_schemas() -> BTreeMap<String, Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream-crds");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            if v["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = v["spec"]["group"].as_str().unwrap();
            let kind = v["spec"]["names"]["kind"].as_str().unwrap();
            for version in v["spec"]["versions"].as_array().unwrap() {
                let name = version["name"].as_str().unwrap();
                let mut schema = version["schema"]["openAPIV3Schema"].clone();
                close_objects(&mut schema);
                out.insert(format!("{group}/{name}/{kind}"), schema);
            }
        }
    }
    out
}

/// Every object node that lists its `properties` refuses other fields, as the API server's
/// pruning does in effect: a field the CRD does not declare is dropped without an error, so a
/// misspelt field in the render would have no effect and pass a plain JSON-schema check.
/// `metadata` and nodes marked `x-kubernetes-preserve-unknown-fields` stay open.
fn close_objects(node: &mut Value) {
    match node {
        Value::Object(map) => {
            let preserve = map
                .get("x-kubernetes-preserve-unknown-fields")
                .is_some_and(|v| v == true);
            if map.get("type").is_some_and(|t| t == "object")
                && map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !preserve
            {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, child) in map.iter_mut() {
                if key != "metadata" {
                    close_objects(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

use serde::Deserialize;

#[test]
fn every_emitted_upstream_object_validates_against_its_crd() {
    let schemas = upstream_schemas();
    let mut checked = BTreeSet::new();
    for path in example_files() {
        for c in children(&load(&path)) {
            if c.resource.group.is_empty()
                || [
                    "apps",
                    "policy",
                    "rbac.authorization.k8s.io",
                    "networking.k8s.io",
                ]
                .contains(&c.resource.group.as_str())
            {
                // Core kinds are typed by k8s-openapi; the render deserialises them into it.
                continue;
            }
            let key = format!(
                "{}/{}/{}",
                c.resource.group, c.resource.version, c.resource.kind
            );
            let schema = schemas
                .get(&key)
                .unwrap_or_else(|| panic!("no upstream CRD for {key}"));
            let validator = jsonschema::validator_for(schema).unwrap();
            let value = serde_json::to_value(&c.object).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| format!("{} at {}", e, e.instance_path))
                .collect();
            assert!(
                errors.is_empty(),
                "{} in {}: {errors:?}",
                c.key(),
                path.display()
            );
            checked.insert(c.resource.kind.clone());
        }
    }
    // The check can fail: a misspelt field, which the API server would drop, is refused.
    let gateway = children(&example("single-model.yaml"))
        .into_iter()
        .find(|c| c.resource.kind == "Gateway")
        .unwrap();
    let mut misspelt = serde_json::to_value(&gateway.object).unwrap();
    misspelt["spec"]["listeners"][0]["allowedRoute"] = serde_json::json!({});
    let validator =
        jsonschema::validator_for(&schemas["gateway.networking.k8s.io/v1/Gateway"]).unwrap();
    assert!(
        !validator.is_valid(&misspelt),
        "allowedRoute was not refused"
    );
    let want: BTreeSet<String> = [
        "Gateway",
        "HTTPRoute",
        "InferencePool",
        "EnvoyExtensionPolicy",
        "SecurityPolicy",
        "ClientTrafficPolicy",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(
        checked, want,
        "every upstream kind is exercised by some example"
    );
}

/// The BBR's ext_proc cluster carries a circuit breaker at Envoy Gateway's schema maximum.
/// Every request through the Gateway holds one ext_proc stream to the BBR; without
/// `backendSettings.circuitBreaker` Envoy Gateway sets only the retry threshold
/// (`internal/xds/translator/cluster.go` `buildXdsClusterCircuitBreaker`) and Envoy's defaults
/// of 1024 connections, requests and pending requests apply, so an Envoy replica failed its
/// 1025th concurrent request, of any model. A field left out of a present circuit breaker is
/// defaulted to 1024 by the CRD, so all three are checked.
#[test]
fn the_bbr_policy_lifts_envoys_default_circuit_breaker() {
    let schemas = upstream_schemas();
    let cb = &schemas["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"]["properties"]["spec"]
        ["properties"]["extProc"]["items"]["properties"]["backendSettings"]["properties"]["circuitBreaker"]
        ["properties"];
    let mut seen = 0;
    for path in example_files() {
        for c in children(&load(&path)) {
            if c.resource.kind != "EnvoyExtensionPolicy" {
                continue;
            }
            let v = serde_json::to_value(&c.object).unwrap();
            for ep in v["spec"]["extProc"].as_array().unwrap() {
                for field in [
                    "maxConnections",
                    "maxParallelRequests",
                    "maxPendingRequests",
                ] {
                    assert_eq!(cb[field]["default"], 1024, "{field}: Envoy's default");
                    let got = &ep["backendSettings"]["circuitBreaker"][field];
                    assert_eq!(got, &cb[field]["maximum"], "{} {field}: {v}", c.key());
                }
                seen += 1;
            }
        }
    }
    assert!(seen > 0, "no example renders the BBR");
}

/// Whether a NetworkPolicy's ingress admits, on `port`, a pod with these labels in another
/// namespace than the policy's (where Envoy Gateway runs its proxies by default).
fn admits_from_elsewhere(policy: &Value, port: i64, labels: &BTreeMap<String, String>) -> bool {
    policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .any(|rule| {
            let on_port = rule["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["port"] == port);
            let from = match rule["from"].as_array() {
                None => true,
                Some(peers) => peers.iter().any(|peer| {
                    // Without a namespaceSelector a peer is in the policy's namespace only.
                    peer["namespaceSelector"] == serde_json::json!({})
                        && peer["podSelector"]["matchLabels"]
                            .as_object()
                            .unwrap()
                            .iter()
                            .all(|(k, v)| labels.get(k).is_some_and(|l| v == l))
                }),
            };
            on_port && from
        })
}

/// The pickers' and the BBR's ext_proc port admits the Gateway's Envoy pods as Envoy Gateway
/// labels them in either of its deployment modes, and no other Gateway's: its own proxy
/// (`owning-gateway-name` and `-namespace`), or, when its `EnvoyProxy` merges the Gateways of
/// a class, the class's proxy, which carries only `owning-gatewayclass`
/// (`internal/gatewayapi/translator.go` `buildIR`, `helpers.go` `OwnerLabels`). Only the first
/// was admitted, so with merged Gateways every call to the BBR and the pickers was dropped.
#[test]
fn ext_proc_ports_admit_the_gateways_envoy_pods_in_both_modes() {
    let cfg = example("multi-model.yaml");
    let name = cfg.metadata.name.clone().unwrap();
    let ns = cfg.metadata.namespace.clone().unwrap();
    let class = cfg.spec.gateway.class_name.clone();
    let envoy = |owner: &[(&str, &str)]| -> BTreeMap<String, String> {
        [
            ("app.kubernetes.io/name", "envoy"),
            ("app.kubernetes.io/component", "proxy"),
            ("app.kubernetes.io/managed-by", "envoy-gateway"),
        ]
        .iter()
        .chain(owner)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    };
    let gateway_name = "gateway.envoyproxy.io/owning-gateway-name";
    let gateway_ns = "gateway.envoyproxy.io/owning-gateway-namespace";
    let gateway_class = "gateway.envoyproxy.io/owning-gatewayclass";
    let own = envoy(&[(gateway_name, &name), (gateway_ns, &ns)]);
    let merged = envoy(&[(gateway_class, &class)]);
    let other_gateway = envoy(&[(gateway_name, "other"), (gateway_ns, &ns)]);
    let other_class = envoy(&[(gateway_class, "other")]);
    let mut seen = 0;
    for c in children(&cfg) {
        if c.resource.kind != "NetworkPolicy" {
            continue;
        }
        let v = serde_json::to_value(&c.object).unwrap();
        let port = if c.key().ends_with("-bbr") {
            9004
        } else {
            9002
        };
        let admits = |labels| admits_from_elsewhere(&v, port, labels);
        assert!(admits(&own), "{}: the Gateway's own proxy: {v}", c.key());
        assert!(
            admits(&merged),
            "{}: the class's merged proxy: {v}",
            c.key()
        );
        assert!(!admits(&other_gateway), "{}: {v}", c.key());
        assert!(!admits(&other_class), "{}: {v}", c.key());
        seen += 1;
    }
    assert_eq!(seen, 3, "the BBR's and two pickers' policies");
}

#[test]
fn upstream_cel_rules_our_objects_could_break_hold() {
    for path in example_files() {
        for c in children(&load(&path)) {
            let v = serde_json::to_value(&c.object).unwrap();
            if c.resource.kind == "EnvoyExtensionPolicy" {
                for ep in v["spec"]["extProc"].as_array().unwrap() {
                    // "If FullDuplexStreamed body processing mode is used, FailOpen must be false."
                    assert_ne!(ep["failOpen"], true, "{}", c.key());
                    for b in ep["backendRefs"].as_array().unwrap() {
                        // "Must have port for Service reference"
                        assert!(b["port"].is_number(), "{}", c.key());
                        assert_eq!(b["kind"], "Service");
                    }
                }
                for t in v["spec"]["targetRefs"].as_array().unwrap() {
                    assert_eq!(t["group"], "gateway.networking.k8s.io");
                }
            }
            if c.resource.kind == "InferencePool" {
                // "port is required when kind is 'Service'"
                assert!(v["spec"]["endpointPickerRef"]["port"]["number"].is_number());
            }
            if c.resource.kind == "ClientTrafficPolicy" {
                // "either targetRef or targetRefs must be used", "this policy can only have a
                // targetRefs[*].group of gateway.networking.k8s.io", "… kind of Gateway or
                // ListenerSet".
                assert!(v["spec"].get("targetRef").is_none(), "{}", c.key());
                for t in v["spec"]["targetRefs"].as_array().unwrap() {
                    assert_eq!(t["group"], "gateway.networking.k8s.io");
                    assert_eq!(t["kind"], "Gateway");
                }
            }
        }
    }
}

#[test]
fn every_child_is_owned_labelled_and_namespaced() {
    for path in example_files() {
        let cfg = load(&path);
        for c in children(&cfg) {
            let m = &c.object.metadata;
            assert_eq!(m.namespace, cfg.metadata.namespace, "{}", c.key());
            let owners = m.owner_references.as_ref().unwrap();
            assert_eq!(owners.len(), 1);
            assert_eq!(owners[0].uid, common::UID);
            assert_eq!(owners[0].kind, "InferenceGatewayConfig");
            assert_eq!(owners[0].controller, Some(true));
            let labels = m.labels.as_ref().unwrap();
            assert_eq!(
                labels.get(CONFIG_LABEL),
                cfg.metadata.name.as_ref(),
                "{}",
                c.key()
            );
            assert!(m.name.as_ref().unwrap().len() <= 63);
        }
    }
}

#[test]
fn picker_rbac_is_least_privilege() {
    let cfg = example("multi-model.yaml");
    for c in children(&cfg).iter().filter(|c| c.resource.kind == "Role") {
        let rules = &c.object.data["rules"];
        let rules = rules.as_array().unwrap();
        assert_eq!(rules.len(), 2);
        for r in rules {
            assert_eq!(
                r["verbs"],
                serde_json::json!(["get", "list", "watch"]),
                "{}",
                c.key()
            );
        }
        assert_eq!(rules[0]["resources"], serde_json::json!(["pods"]));
        assert_eq!(rules[1]["resources"], serde_json::json!(["inferencepools"]));
    }
}

#[test]
fn kinds_per_example() {
    let count = |name: &str| -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for c in children(&example(name)) {
            *m.entry(c.resource.kind.clone()).or_default() += 1;
        }
        m
    };
    let multi = count("multi-model.yaml");
    // Gateway; BBR: SA, CM, Deployment, Service, PDB, NetworkPolicy, EEP; per scheduler (2):
    // pool, SA, Role, RoleBinding, CM, Deployment, Service, PDB, NetworkPolicy, HTTPRoute (no
    // EEP: Envoy Gateway calls the pool's picker itself), and for the one with two replicas the
    // headless Service of its peer exchange; SecurityPolicy and the Gateway's
    // ClientTrafficPolicy (auth).
    let expect: BTreeMap<String, usize> = [
        ("Gateway", 1),
        ("SecurityPolicy", 1),
        ("ClientTrafficPolicy", 1),
        ("ServiceAccount", 3),
        ("ConfigMap", 3),
        ("Deployment", 3),
        ("Service", 4),
        ("PodDisruptionBudget", 3),
        ("EnvoyExtensionPolicy", 1),
        ("NetworkPolicy", 3),
        ("InferencePool", 2),
        ("Role", 2),
        ("RoleBinding", 2),
        ("HTTPRoute", 2),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(multi, expect);
    let tgi = count("tgi-tls-secret.yaml");
    assert_eq!(tgi.get("SecurityPolicy"), None);
    assert_eq!(tgi.get("ClientTrafficPolicy"), None);
    assert_eq!(
        tgi.get("Deployment"),
        Some(&1),
        "BBR off: only the picker runs"
    );
}

/// Keys of children that differ between two renders: (changed, added, removed).
fn diff(a: &[Child], b: &[Child]) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let index = |cs: &[Child]| -> BTreeMap<String, Value> {
        cs.iter()
            .map(|c| (c.key(), serde_json::to_value(&c.object).unwrap()))
            .collect()
    };
    let (a, b) = (index(a), index(b));
    let changed = a
        .iter()
        .filter(|(k, v)| b.get(*k).is_some_and(|w| w != *v))
        .map(|(k, _)| k.clone())
        .collect();
    let added = b.keys().filter(|k| !a.contains_key(*k)).cloned().collect();
    let removed = a.keys().filter(|k| !b.contains_key(*k)).cloned().collect();
    (changed, added, removed)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn changing_weights_touches_only_that_pickers_config_and_pods() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers[1].weights = Some(Weights {
        queue: Some(1.0),
        ..Weights::default()
    });
    let (changed, added, removed) = diff(&children(&before), &children(&after));
    assert_eq!(
        changed,
        set(&[
            "ConfigMap/fleet-qwen-7b-epp",
            "Deployment/fleet-qwen-7b-epp"
        ])
    );
    assert!(added.is_empty() && removed.is_empty());
}

#[test]
fn switching_weights_to_a_preset_touches_only_that_picker() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers[1].weights = None;
    after.spec.schedulers[1].preset = Some(SchedulerPreset::GieDefault);
    let (changed, _, _) = diff(&children(&before), &children(&after));
    assert_eq!(
        changed,
        set(&[
            "ConfigMap/fleet-qwen-7b-epp",
            "Deployment/fleet-qwen-7b-epp"
        ])
    );
}

#[test]
fn bbr_replicas_touch_only_the_bbr_deployment() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.bbr.replicas = 5;
    let (changed, added, removed) = diff(&children(&before), &children(&after));
    assert_eq!(changed, set(&["Deployment/fleet-bbr"]));
    assert!(added.is_empty() && removed.is_empty());
}

#[test]
fn a_new_lora_adapter_touches_the_route_and_the_bbr_model_map() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers[0]
        .lora_adapters
        .push("legal".to_owned());
    let (changed, _, _) = diff(&children(&before), &children(&after));
    assert_eq!(
        changed,
        set(&[
            "HTTPRoute/fleet-llama-70b",
            "ConfigMap/fleet-bbr",
            "Deployment/fleet-bbr"
        ])
    );
}

/// The route's timeout and the picker's grace period to stop, which outlasts it.
#[test]
fn route_timeout_touches_the_route_and_its_pickers_grace_period() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers[1].route_timeout = Some("60s".to_owned());
    let (changed, _, _) = diff(&children(&before), &children(&after));
    // The BBR's period is the longest picker's, the 70B model's 300 s, unchanged.
    assert_eq!(
        changed,
        set(&["HTTPRoute/fleet-qwen-7b", "Deployment/fleet-qwen-7b-epp"])
    );
}

/// Every HTTPRoute carries a request timeout: `routeTimeout`, else 300 s. The route used to get
/// one only when `routeTimeout` was set, and Envoy's default route timeout (15 s, from the
/// request to the end of the response) then cut every streamed answer that took longer. `0s`
/// (no deadline, in Gateway API's terms) is passed as written.
#[test]
fn every_route_has_a_request_timeout() {
    for path in example_files() {
        let cfg = load(&path);
        for c in children(&cfg) {
            if c.resource.kind == "HTTPRoute" {
                let v = serde_json::to_value(&c.object).unwrap();
                let t = &v["spec"]["rules"][0]["timeouts"]["request"];
                assert!(t.is_string(), "{}: {v}", c.key());
            }
        }
    }
    let timeouts = |cfg: &infergate_api::InferenceGatewayConfig| {
        field_of(cfg, "HTTPRoute", "/spec/rules/0/timeouts")
    };
    let mut cfg = example("multi-model.yaml");
    cfg.spec.schedulers[0].route_timeout = None;
    cfg.spec.schedulers[1].route_timeout = Some("0s".to_owned());
    let got = timeouts(&cfg);
    assert_eq!(
        got["HTTPRoute/fleet-llama-70b"],
        serde_json::json!({ "request": infergate_api::DEFAULT_ROUTE_TIMEOUT })
    );
    assert_eq!(infergate_api::DEFAULT_ROUTE_TIMEOUT, "300s");
    assert_eq!(
        got["HTTPRoute/fleet-qwen-7b"],
        serde_json::json!({ "request": "0s" })
    );
}

/// One field (a JSON pointer) of every rendered child of `kind`, by child (`Null` when unset).
fn field_of(
    cfg: &infergate_api::InferenceGatewayConfig,
    kind: &str,
    pointer: &str,
) -> BTreeMap<String, Value> {
    children(cfg)
        .into_iter()
        .filter(|c| c.resource.kind == kind)
        .map(|c| {
            let v = serde_json::to_value(&c.object).unwrap();
            (c.key(), v.pointer(pointer).cloned().unwrap_or(Value::Null))
        })
        .collect()
}

/// With `auth`, every route removes `Authorization` on the way to the model servers. Envoy
/// Gateway's JWT provider keeps the token on the request after checking it
/// (`internal/xds/translator/jwt.go` `buildJWTProvider`: `Forward: true`, where Envoy's own
/// default removes it), so every model-server pod received every user's bearer token. Without
/// `auth` the header is the client's own (a model server's API key, say) and is left alone.
#[test]
fn routes_remove_the_clients_token_when_the_gateway_checks_it() {
    let filters = |cfg: &infergate_api::InferenceGatewayConfig| {
        field_of(cfg, "HTTPRoute", "/spec/rules/0/filters")
    };
    let removed = serde_json::json!([{
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": { "remove": ["Authorization"] },
    }]);
    let mut with_auth = 0;
    for path in example_files() {
        let cfg = load(&path);
        for (key, f) in filters(&cfg) {
            if cfg.spec.auth.is_some() {
                assert_eq!(f, removed, "{key} in {}", path.display());
                with_auth += 1;
            } else {
                assert_eq!(f, Value::Null, "{key} in {}", path.display());
            }
        }
    }
    assert!(with_auth > 0, "no example sets auth");
}

/// A picker pod is given, to stop, the longest its ext_proc streams can last: the wait in the
/// flow-control queue (its TTL) plus the route's request timeout (which Envoy starts once the
/// request has passed the picker), plus 30 s; an hour when either has no bound. Envoy AI
/// Gateway's filter streams the response body through the picker
/// (`internal/extensionserver/inferencepool.go` `buildHTTPFilterForInferencePool`), and the
/// picker lets open streams finish when told to stop, but the pods had Kubernetes' default of
/// 30 s, so a rollout or a drain cut every answer still streaming then. The 5 s preStop sleep
/// before it (below) comes on top: the grace period counts from its start.
#[test]
fn picker_pods_are_given_time_to_finish_their_answers() {
    let graces = |cfg: &infergate_api::InferenceGatewayConfig| {
        field_of(
            cfg,
            "Deployment",
            "/spec/template/spec/terminationGracePeriodSeconds",
        )
    };
    // Route timeout 300 s, no queue.
    let single = graces(&example("single-model.yaml"));
    assert_eq!(single["Deployment/llama-llama-8b-epp"], 5 + 330);
    // The BBR's streams last as long (Envoy keeps a request's ext_proc stream open until the
    // end of the answer): the longest picker's period.
    assert_eq!(single["Deployment/llama-bbr"], 5 + 330);
    // A 30 s queue TTL before the 300 s route timeout.
    let mut queued = example("flow-control-quotas.yaml");
    let name = queued.metadata.name.clone().unwrap();
    let s = queued.spec.schedulers[0].name.clone();
    assert_eq!(
        graces(&queued)[&format!("Deployment/{name}-{s}-epp")],
        5 + 360
    );
    // No deadline on the route, or none in the queue: capped at an hour.
    queued.spec.schedulers[0].route_timeout = Some("0s".to_owned());
    assert_eq!(
        graces(&queued)[&format!("Deployment/{name}-{s}-epp")],
        5 + 3600
    );
    queued.spec.schedulers[0].route_timeout = Some("1m30s".to_owned());
    queued.spec.flow_control.as_mut().unwrap().request_ttl_ms = Some(0);
    assert_eq!(
        graces(&queued)[&format!("Deployment/{name}-{s}-epp")],
        5 + 3600
    );
    queued.spec.flow_control.as_mut().unwrap().request_ttl_ms = Some(1_500);
    assert_eq!(
        graces(&queued)[&format!("Deployment/{name}-{s}-epp")],
        5 + 121
    );
    assert_eq!(graces(&queued)[&format!("Deployment/{name}-bbr")], 5 + 121);
    // Every example's pickers and routers outlast Kubernetes' default.
    for path in example_files() {
        for (key, g) in graces(&load(&path)) {
            if key.ends_with("-epp") || key.ends_with("-bbr") {
                assert!(g.as_u64().unwrap() > 30, "{key}: {g}");
            }
        }
    }
}

/// A stopping picker or BBR pod keeps serving for 5 s before SIGTERM (preStop, the image's
/// /bin/sleep): its endpoint's removal reaches Envoy a moment after the pod is marked for
/// deletion, and on SIGTERM it stops accepting connections, so the ext_proc streams opened in
/// between failed, and a picker's pool fails closed. And a Deployment of more than one replica
/// spreads them over nodes when it can: two pickers on one node are one node from none.
#[test]
fn ext_proc_pods_wait_before_stopping_and_replicas_spread_over_nodes() {
    let mut spread = 0;
    for path in example_files() {
        let cfg = load(&path);
        for c in children(&cfg) {
            if c.resource.kind != "Deployment" {
                continue;
            }
            let d = serde_json::to_value(&c.object).unwrap();
            let pod = &d["spec"]["template"]["spec"];
            assert_eq!(
                pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"],
                serde_json::json!(["/bin/sleep", "5"]),
                "{} in {}",
                c.key(),
                path.display()
            );
            let constraints = &pod["topologySpreadConstraints"];
            if d["spec"]["replicas"].as_i64().unwrap() > 1 {
                spread += 1;
                assert_eq!(constraints[0]["topologyKey"], "kubernetes.io/hostname");
                assert_eq!(constraints[0]["whenUnsatisfiable"], "ScheduleAnyway");
                assert_eq!(
                    constraints[0]["matchLabelKeys"],
                    serde_json::json!(["pod-template-hash"])
                );
                // The selector is the Deployment's own: its pods, and no other's.
                assert_eq!(
                    constraints[0]["labelSelector"]["matchLabels"],
                    d["spec"]["selector"]["matchLabels"],
                    "{}",
                    c.key()
                );
            } else {
                assert!(constraints.is_null(), "{}", c.key());
            }
        }
    }
    assert!(spread > 0, "no example runs more than one replica");
}

#[test]
fn failure_mode_touches_only_the_pool() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers[1].failure_mode = infergate_api::FailureMode::FailClose;
    let (changed, _, _) = diff(&children(&before), &children(&after));
    assert_eq!(changed, set(&["InferencePool/fleet-qwen-7b"]));
}

/// Removing `auth` removes the SecurityPolicy, the Gateway's removal of a client's tenant header
/// and the routes' removal of the token header (the client's `Authorization` is then its own,
/// passed on).
#[test]
fn removing_auth_removes_the_security_policy_and_touches_only_the_routes() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    // Authentication removed and waived (without the waiver the config is refused).
    after.spec.auth = None;
    after.spec.allow_unauthenticated = true;
    let (changed, added, removed) = diff(&children(&before), &children(&after));
    assert!(added.is_empty());
    assert_eq!(
        changed,
        set(&["HTTPRoute/fleet-llama-70b", "HTTPRoute/fleet-qwen-7b"])
    );
    assert_eq!(
        removed,
        set(&[
            "SecurityPolicy/fleet-auth",
            "ClientTrafficPolicy/fleet-client"
        ])
    );
}

/// With `auth`, the pickers' tenant is the token's: the Gateway's ClientTrafficPolicy removes a
/// client's `x-llm-d-inference-fairness-id` as Envoy receives the request (Envoy Gateway
/// `internal/xds/translator/listener.go` `buildEarlyHeaderMutation`: the HTTP connection
/// manager's early header mutation, before any HTTP filter), and the SecurityPolicy has Envoy
/// write the token's `tenantClaim` into it after the check. Envoy's JWT filter appends the claim
/// (`jwt_authn/authenticator.cc` `addJWTClaimToHeader`: `addCopy`), so without the removal the
/// client's value came first, and the picker read it: a client chose its own quota and fairness
/// share. The header name is the one the picker reads.
#[test]
fn with_auth_the_tenant_header_is_the_tokens_claim_and_never_the_clients() {
    let mut with_auth = 0;
    for path in example_files() {
        let cfg = load(&path);
        let kids = children(&cfg);
        let name = cfg.metadata.name.clone().unwrap();
        let ctp = kids
            .iter()
            .find(|c| c.resource.kind == "ClientTrafficPolicy");
        let sp = kids.iter().find(|c| c.resource.kind == "SecurityPolicy");
        let Some(auth) = &cfg.spec.auth else {
            assert!(ctp.is_none() && sp.is_none(), "{}", path.display());
            continue;
        };
        with_auth += 1;
        let ctp = serde_json::to_value(&ctp.unwrap().object).unwrap();
        assert_eq!(
            ctp["spec"]["targetRefs"],
            serde_json::json!([{ "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name }]),
            "{}",
            path.display()
        );
        assert_eq!(
            ctp["spec"]["headers"]["earlyRequestHeaders"]["remove"],
            serde_json::json!([infergate_pool::tenant::FAIRNESS_ID_HEADER])
        );
        let sp = serde_json::to_value(&sp.unwrap().object).unwrap();
        assert_eq!(
            sp["spec"]["jwt"]["providers"][0]["claimToHeaders"],
            serde_json::json!([{
                "header": infergate_pool::tenant::FAIRNESS_ID_HEADER,
                "claim": auth.jwt.provider.tenant_claim,
            }])
        );
    }
    assert!(with_auth > 0, "no example sets auth");
    // `sub` when the config names no claim (multi-model.yaml does not); else the claim named.
    let mut cfg = example("multi-model.yaml");
    let claim = |cfg: &infergate_api::InferenceGatewayConfig| {
        field_of(
            cfg,
            "SecurityPolicy",
            "/spec/jwt/providers/0/claimToHeaders/0/claim",
        )
    };
    assert_eq!(claim(&cfg)["SecurityPolicy/fleet-auth"], "sub");
    cfg.spec.auth.as_mut().unwrap().jwt.provider.tenant_claim = "org.team".to_owned();
    assert_eq!(claim(&cfg)["SecurityPolicy/fleet-auth"], "org.team");
}

#[test]
fn removing_a_scheduler_removes_exactly_its_children() {
    let before = example("multi-model.yaml");
    let mut after = before.clone();
    after.spec.schedulers.truncate(1);
    let (changed, added, removed) = diff(&children(&before), &children(&after));
    assert!(added.is_empty());
    // The BBR's model map loses the model, so its ConfigMap and pods change too.
    assert_eq!(
        changed,
        set(&["ConfigMap/fleet-bbr", "Deployment/fleet-bbr"])
    );
    assert_eq!(
        removed,
        set(&[
            "InferencePool/fleet-qwen-7b",
            "HTTPRoute/fleet-qwen-7b",
            "ServiceAccount/fleet-qwen-7b-epp",
            "Role/fleet-qwen-7b-epp",
            "RoleBinding/fleet-qwen-7b-epp",
            "ConfigMap/fleet-qwen-7b-epp",
            "Deployment/fleet-qwen-7b-epp",
            "Service/fleet-qwen-7b-epp",
            "PodDisruptionBudget/fleet-qwen-7b-epp",
            "NetworkPolicy/fleet-qwen-7b-epp",
        ])
    );
}

#[test]
fn invalid_config_is_not_rendered() {
    let mut cfg = example("multi-model.yaml");
    cfg.spec.bbr.enabled = false;
    let err = infergate_operator::render::render(&cfg, &common::opts()).unwrap_err();
    assert!(
        err.to_string().contains("spec.bbr.enabled must be true"),
        "{err}"
    );
}

#[test]
fn a_config_without_uid_renders_without_owner_references() {
    // A config read from a file (`infergate render`) has no uid: its children must not name a
    // made-up owner, which the garbage collector would act on.
    let mut cfg = example("single-model.yaml");
    cfg.metadata.uid = None;
    let out = infergate_operator::render::render(&cfg, &common::opts()).unwrap();
    assert!(!out.is_empty());
    for c in &out {
        assert!(c.object.metadata.owner_references.is_none(), "{}", c.key());
    }
    let mut cfg = example("single-model.yaml");
    cfg.metadata.namespace = None;
    let err = infergate_operator::render::render(&cfg, &common::opts()).unwrap_err();
    assert_eq!(err.metric_label(), "missing_metadata");
}

#[test]
fn overlong_names_are_a_typed_error() {
    let mut cfg = example("single-model.yaml");
    cfg.metadata.name = Some("a".repeat(55));
    let err = infergate_operator::render::render(&cfg, &common::opts()).unwrap_err();
    assert_eq!(err.metric_label(), "name_too_long");
}

#[test]
fn the_crd_and_the_scheduler_have_the_same_scorers() {
    // One list of scorers: the scheduler's weights, the CRD's weights and the CRD schema's
    // properties name the same scorers in the same order. Adding one on one side fails here.
    let scheduler: Vec<String> = infergate_scheduler::Weights::default()
        .fields()
        .iter()
        .map(|(path, _)| path.trim_start_matches("weights.").to_owned())
        .collect();
    let crd: Vec<String> = Weights::default()
        .entries()
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    assert_eq!(crd, scheduler);
    let schema = serde_json::to_value(schemars::schema_for!(Weights)).unwrap();
    let props: BTreeSet<String> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(props, scheduler.iter().cloned().collect::<BTreeSet<_>>());
    // Each CRD weight reaches the picker's configuration as that scorer's weight.
    for (i, name) in scheduler.iter().enumerate() {
        let mut cfg = example("single-model.yaml");
        let mut w = serde_json::Map::new();
        w.insert(name.clone(), serde_json::json!(2.5));
        cfg.spec.schedulers[0].weights = Some(serde_json::from_value(Value::Object(w)).unwrap());
        let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
        let fields = sc.weights.fields();
        for (j, (path, v)) in fields.iter().enumerate() {
            let want = if i == j { 2.5 } else { 0.0 };
            assert_eq!(*v, want, "CRD weight {name}: scheduler {path}");
        }
    }
}

#[test]
fn every_crd_preset_is_a_scheduler_preset() {
    // The presets the CRD schema admits, each one the picker knows by the same name.
    let schema = serde_json::to_value(schemars::schema_for!(SchedulerPreset)).unwrap();
    let names: Vec<String> = schema["enum"]
        .as_array()
        .or_else(|| schema["oneOf"].as_array())
        .unwrap()
        .iter()
        .flat_map(|v| match v {
            Value::String(s) => vec![s.clone()],
            other => other["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(other.get("const"))
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
        })
        .collect();
    assert!(names.len() >= 5, "{schema}");
    for n in names {
        let parsed: infergate_scheduler::Preset = n.parse().unwrap();
        assert_eq!(parsed.as_str(), n);
    }
}

/// The picker's precise-prefix flags and the tokenizer's volume, from a ConfigMap or a claim.
#[test]
fn precise_prefix_renders_the_flags_and_mounts_the_tokenizer() {
    let picker = |cfg: &infergate_api::InferenceGatewayConfig| -> Value {
        children(cfg)
            .into_iter()
            .find(|c| c.resource.kind == "Deployment" && c.key().contains("-qwen-epp"))
            .map(|c| serde_json::to_value(&c.object).unwrap())
            .expect("the picker's Deployment")["spec"]["template"]["spec"]
            .clone()
    };
    let cfg = example("precise-prefix.yaml");
    let pod = picker(&cfg);
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "--kv-events-port=5557",
        "--kv-events-replay-port=5558",
        "--kv-max-body-bytes=131072",
        "--tokenizer=/etc/infergate-tokenizer",
    ] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tokenizer")
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "qwen-tokenizer");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tokenizer")
        .unwrap();
    assert_eq!(mount["mountPath"], "/etc/infergate-tokenizer");
    assert_eq!(mount["readOnly"], true);
    assert!(mount["subPath"].is_null());

    // A claim, with the directory of the files.
    let mut claim = cfg.clone();
    let pp = claim.spec.schedulers[0].precise_prefix.as_mut().unwrap();
    pp.tokenizer = infergate_api::TokenizerSource {
        config_map: None,
        persistent_volume_claim: Some("models".into()),
        sub_path: Some("qwen/tokenizer".into()),
    };
    pp.replay_port = None;
    let pod = picker(&claim);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tokenizer")
        .unwrap();
    assert_eq!(volume["persistentVolumeClaim"]["claimName"], "models");
    assert_eq!(volume["persistentVolumeClaim"]["readOnly"], true);
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tokenizer")
        .unwrap();
    assert_eq!(mount["subPath"], "qwen/tokenizer");
    let args = pod["containers"][0]["args"].to_string();
    assert!(!args.contains("--kv-events-replay-port"), "{args}");

    // Both sources, or a subPath of a ConfigMap, are refused naming the field.
    let mut both = cfg.clone();
    both.spec.schedulers[0]
        .precise_prefix
        .as_mut()
        .unwrap()
        .tokenizer
        .persistent_volume_claim = Some("models".into());
    let err = infergate_api::validation::validate(&both.spec)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.schedulers[0].precisePrefix.tokenizer") && err.contains("exactly one"),
        "{err}"
    );
    let mut sub = cfg;
    sub.spec.schedulers[0]
        .precise_prefix
        .as_mut()
        .unwrap()
        .tokenizer
        .sub_path = Some("x".into());
    let err = infergate_api::validation::validate(&sub.spec)
        .unwrap_err()
        .to_string();
    assert!(err.contains("subPath"), "{err}");
}

/// The name and `env` of every container of every Deployment in `children`, the env as
/// (name, entry) pairs.
fn container_envs(children: &[Child]) -> Vec<(String, Vec<(String, Value)>)> {
    children
        .iter()
        .filter(|c| c.resource.kind == "Deployment")
        .flat_map(|c| {
            let d = serde_json::to_value(&c.object).unwrap();
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    let env = c["env"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
                        .collect();
                    (c["name"].as_str().unwrap().to_owned(), env)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn pod_defaults_env_sets_each_name_once_and_the_users_value_wins() {
    // A container's env is a list-map keyed by name: a name twice is refused by server-side
    // apply, so a `podDefaults.env` entry the operator also sets must replace it.
    let mut cfg = example("flow-control-quotas.yaml");
    cfg.spec.pod_defaults.env = serde_json::from_value(serde_json::json!([
        { "name": "INFERGATE_LOG_FORMAT", "value": "text" },
        { "name": "RUST_LOG", "value": "infergate=trace" },
        { "name": "EXTRA", "value": "1" },
        { "name": "EXTRA", "value": "2" },
        // `passwordSecretRef` sets this one: the Secret's value stays.
        { "name": infergate_operator::render::REDIS_PASSWORD_ENV, "value": "typed-in" },
    ]))
    .unwrap();
    let envs = container_envs(&children(&cfg));
    assert!(!envs.is_empty());
    for (container, env) in envs {
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "a name twice: {names:?}");
        let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, e)| e.clone());
        assert_eq!(value("INFERGATE_LOG_FORMAT").unwrap()["value"], "text");
        assert_eq!(value("RUST_LOG").unwrap()["value"], "infergate=trace");
        assert_eq!(value("EXTRA").unwrap()["value"], "2");
        assert_eq!(
            value("POD_NAME").unwrap()["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.name"
        );
        // The user's value replaces the operator's where it stood (before the user's others).
        assert_eq!(
            &names[..4],
            [
                "RUST_LOG",
                "INFERGATE_LOG_FORMAT",
                "POD_NAMESPACE",
                "POD_NAME"
            ]
        );
        let password = value(infergate_operator::render::REDIS_PASSWORD_ENV).unwrap();
        if container == "endpoint-picker" {
            assert_eq!(password["valueFrom"]["secretKeyRef"]["name"], "quota-redis");
        } else {
            // The BBR reads no quotas: it has the user's variable as written.
            assert_eq!(password["value"], "typed-in");
        }
    }
}

/// Two schedulers (models `m1`, `m2`) with the given adapters and the names one rewrite rule
/// of each matches.
fn two_pools(
    adapters: [&[&str]; 2],
    matched: [Option<&str>; 2],
) -> infergate_api::InferenceGatewayConfig {
    let scheduler = |i: usize| {
        let (name, model) = [("a", "m1"), ("b", "m2")][i];
        let mut s = serde_json::json!({
            "name": name,
            "modelName": model,
            "modelSelector": { "app": model },
            "loraAdapters": adapters[i],
        });
        if let Some(n) = matched[i] {
            s["modelRewrites"] = serde_json::json!([{
                "matches": [{ "model": { "value": n } }],
                "targets": [{ "modelRewrite": model }],
            }]);
        }
        s
    };
    let mut cfg: infergate_api::InferenceGatewayConfig =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infergate.dev/v1alpha1",
            "kind": "InferenceGatewayConfig",
            "metadata": { "name": "t", "namespace": "ns" },
            "spec": { "allowUnauthenticated": true, "schedulers": [scheduler(0), scheduler(1)] },
        }))
        .unwrap();
    cfg.metadata.uid = Some(common::UID.to_owned());
    cfg
}

#[test]
fn the_validation_refuses_every_name_table_the_bbr_refuses() {
    // Every placement of a few names (both models, two others, a blank one) as adapters and
    // rewritten names of two schedulers. Whatever the validation accepts renders a models file
    // that the body-based router's loader (`ModelsFile` → `router()`, what `infergate bbr`
    // runs at start) accepts, and HTTPRoutes that match disjoint names; whatever table that
    // loader refuses, the validation refused first.
    use infergate_extproc::bbr::ModelsFile;
    let names = ["m1", "m2", "x", "y", " "];
    let mut lists: Vec<Vec<&str>> = vec![vec![]];
    lists.extend(names.iter().map(|n| vec![*n]));
    for a in names {
        for b in names {
            lists.push(vec![a, b]);
        }
    }
    let matched: Vec<Option<&str>> = std::iter::once(None)
        .chain(names.iter().map(|n| Some(*n)))
        .collect();
    let (mut accepted, mut refused) = (0, 0);
    for a_adapters in &lists {
        for b_adapters in lists.iter().filter(|l| l.len() <= 1) {
            for a_match in &matched {
                for b_match in &matched {
                    let cfg = two_pools([a_adapters, b_adapters], [*a_match, *b_match]);
                    let case = format!("{a_adapters:?} {a_match:?} / {b_adapters:?} {b_match:?}");
                    let table = ModelsFile {
                        models: cfg
                            .spec
                            .schedulers
                            .iter()
                            .map(|s| {
                                let names = s.routed_names().into_iter().map(str::to_owned);
                                (s.model_name.clone(), names.collect())
                            })
                            .collect(),
                    };
                    let loads = table.router().is_ok();
                    if infergate_api::validation::validate(&cfg.spec).is_err() {
                        refused += 1;
                        continue;
                    }
                    accepted += 1;
                    assert!(loads, "accepted but the BBR refuses its table: {case}");
                    let out = infergate_operator::render::render(&cfg, &common::opts())
                        .unwrap_or_else(|e| panic!("accepted but not rendered: {case}: {e}"));
                    let objects: Vec<Value> = out
                        .iter()
                        .map(|c| serde_json::to_value(&c.object).unwrap())
                        .collect();
                    let models = objects
                        .iter()
                        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "t-bbr")
                        .unwrap()["data"]["models.yaml"]
                        .as_str()
                        .unwrap();
                    ModelsFile::parse(models)
                        .unwrap()
                        .router()
                        .unwrap_or_else(|e| panic!("{case}: the BBR refuses {models:?}: {e}"));
                    let mut routed = BTreeSet::new();
                    for route in objects.iter().filter(|o| o["kind"] == "HTTPRoute") {
                        for m in route["spec"]["rules"][0]["matches"].as_array().unwrap() {
                            let name = m["headers"][0]["value"].as_str().unwrap();
                            assert!(
                                routed.insert(name.to_owned()),
                                "{case}: {name} routed twice"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(
        accepted > 50 && refused > 50,
        "{accepted} accepted, {refused} refused"
    );
    // The walkthrough's cases are among the refused.
    for (adapters, matched) in [
        ([&["x"][..], &["x"][..]], [None, None]),
        ([&["m2"][..], &[][..]], [None, None]),
        ([&[][..], &[][..]], [Some("m2"), None]),
    ] {
        let cfg = two_pools(adapters, matched);
        assert!(infergate_api::validation::validate(&cfg.spec).is_err());
    }
}

#[test]
fn pods_are_annotated_for_scraping_unless_observability_metrics_is_false() {
    // `observability.metrics` defaults to true, whether `observability` is written or not.
    let scraped = |cfg: &infergate_api::InferenceGatewayConfig| -> Vec<bool> {
        children(cfg)
            .iter()
            .filter(|c| c.resource.kind == "Deployment")
            .map(|c| {
                c.object.data["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"]
                    == "true"
            })
            .collect()
    };
    let cfg = example("single-model.yaml");
    assert!(
        cfg.spec.observability.metrics,
        "observability left out: metrics on"
    );
    let on = scraped(&cfg);
    assert!(!on.is_empty() && on.iter().all(|s| *s), "{on:?}");
    let mut off = cfg.clone();
    off.spec.observability.metrics = false;
    assert!(scraped(&off).iter().all(|s| !*s));
}

/// `schedulers[].outlierDetection` reaches the picker's scheduler configuration field by field,
/// a field left out takes the scheduler's own default (the CRD's documented defaults are the
/// scheduler's), and leaving the section out leaves outlier detection off.
#[test]
fn crd_outlier_detection_reaches_the_pickers_scheduler_configuration() {
    use infergate_api::config::{FailurePercentageSpec, OutlierDetectionSpec};
    use infergate_scheduler::outlier::{FailurePercentage, OutlierDetection};
    let mut cfg = example("single-model.yaml");
    // Left out: the preset's, on under `infergate`, off under a baseline; `enabled: false` off.
    let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
    assert_eq!(
        cfg.spec.schedulers[0].effective_preset(),
        Some(infergate_api::SchedulerPreset::Infergate)
    );
    assert_eq!(sc.outlier_detection, Some(OutlierDetection::default()));
    cfg.spec.schedulers[0].outlier_detection = Some(OutlierDetectionSpec {
        enabled: Some(false),
        consecutive_5xx: Some(2),
        ..OutlierDetectionSpec::default()
    });
    let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
    assert_eq!(sc.outlier_detection, None);
    let mut baseline = cfg.spec.schedulers[0].clone();
    baseline.preset = Some(infergate_api::SchedulerPreset::RoundRobin);
    baseline.outlier_detection = None;
    let sc = infergate_operator::render::scheduler_config(&baseline).unwrap();
    assert_eq!(sc.outlier_detection, None);
    baseline.outlier_detection = Some(OutlierDetectionSpec::default());
    let sc = infergate_operator::render::scheduler_config(&baseline).unwrap();
    assert_eq!(sc.outlier_detection, Some(OutlierDetection::default()));
    cfg.spec.schedulers[0].outlier_detection = Some(OutlierDetectionSpec::default());
    let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
    assert_eq!(sc.outlier_detection, Some(OutlierDetection::default()));
    let d = OutlierDetection::default();
    assert_eq!(
        (
            OutlierDetectionSpec::DEFAULT_BASE_EJECTION_MS,
            OutlierDetectionSpec::DEFAULT_MAX_EJECTION_MS
        ),
        (d.base_ejection_ms, d.max_ejection_ms)
    );
    cfg.spec.schedulers[0].outlier_detection = Some(OutlierDetectionSpec {
        enabled: None,
        consecutive_5xx: Some(2),
        base_ejection_ms: Some(1_000),
        max_ejection_ms: Some(4_000),
        max_ejection_percent: Some(34),
        failure_percentage: Some(FailurePercentageSpec {
            threshold: Some(25),
            minimum_requests: None,
            interval_ms: Some(2_000),
        }),
    });
    let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
    assert_eq!(
        sc.outlier_detection,
        Some(OutlierDetection {
            consecutive_5xx: 2,
            base_ejection_ms: 1_000,
            max_ejection_ms: 4_000,
            max_ejection_percent: 34,
            failure_percentage: Some(FailurePercentage {
                threshold: 25,
                minimum_requests: FailurePercentage::default().minimum_requests,
                interval_ms: 2_000,
            }),
        })
    );
    // `failurePercentage: {}` is on with the scheduler's defaults.
    cfg.spec.schedulers[0].outlier_detection = Some(OutlierDetectionSpec {
        failure_percentage: Some(FailurePercentageSpec::default()),
        ..OutlierDetectionSpec::default()
    });
    let sc = infergate_operator::render::scheduler_config(&cfg.spec.schedulers[0]).unwrap();
    assert_eq!(
        sc.outlier_detection.and_then(|o| o.failure_percentage),
        Some(FailurePercentage::default())
    );
}

/// The operator's pull settings (`--image-pull-policy`, `--image-pull-secret`) reach every pod it
/// renders: an image from a registry that needs credentials could not be pulled by the pickers
/// before, whatever the chart's `imagePullSecrets` said. By default: `IfNotPresent`, no Secrets.
#[test]
fn pull_policy_and_secrets_reach_every_pod() {
    use infergate_operator::render::{PullPolicy, RenderOptions, render};
    let cfg = example("multi-model.yaml");
    let pods = |opts: &RenderOptions| -> Vec<Value> {
        render(&cfg, opts)
            .unwrap()
            .into_iter()
            .filter(|c| c.resource.kind == "Deployment")
            .map(|c| serde_json::to_value(&c.object).unwrap()["spec"]["template"]["spec"].clone())
            .collect()
    };
    let defaults = pods(&common::opts());
    assert_eq!(defaults.len(), 3);
    for p in &defaults {
        assert_eq!(p["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert!(p["imagePullSecrets"].is_null(), "{p}");
    }
    let opts = RenderOptions {
        image_pull_policy: PullPolicy::Always,
        image_pull_secrets: vec!["regcred".to_owned(), "mirror".to_owned()],
        ..common::opts()
    };
    for p in pods(&opts) {
        assert_eq!(p["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(
            p["imagePullSecrets"],
            serde_json::json!([{ "name": "regcred" }, { "name": "mirror" }])
        );
    }
}
