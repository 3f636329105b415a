//! `spec.quotas`, `spec.flowControl` and `spec.tenancy` rendered into the picker's files: the
//! ConfigMap keys, the flags and mounts that point at them, the Redis password's environment,
//! what a change rolls, and the files read back with the picker's own types. (The rendered
//! picker is started with these files by `crates/cli/tests/render_run.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "common/render.rs"]
mod common;

use std::time::Duration;

use common::{children, example};
use infergate_api::InferenceGatewayConfig;
use infergate_operator::render::{
    self, CONFIG_HASH_ANNOTATION, Child, FLOW_CONTROL_CONFIG_FILE, FLOW_CONTROL_CONFIG_PATH,
    QUOTAS_CONFIG_FILE, QUOTAS_CONFIG_PATH, REDIS_PASSWORD_ENV,
};
use infergate_pool::flow::FlowSettings;
use infergate_pool::quota::QuotasSpec;
use infergate_scheduler::Priority;
use infergate_scheduler::flow::{Fairness, FlowConfig, Ordering};
use serde_json::{Value, json};

const EXAMPLE: &str = "flow-control-quotas.yaml";

fn object(children: &[Child], key: &str) -> Value {
    let c = children
        .iter()
        .find(|c| c.key() == key)
        .unwrap_or_else(|| panic!("no {key}"));
    serde_json::to_value(&c.object).unwrap()
}

fn file(children: &[Child], key: &str) -> String {
    object(children, "ConfigMap/shared-llama-8b-epp")["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key}"))
        .to_owned()
}

fn container(children: &[Child]) -> Value {
    object(children, "Deployment/shared-llama-8b-epp")["spec"]["template"]["spec"]["containers"][0]
        .clone()
}

fn with_spec(cfg: &InferenceGatewayConfig, patch: Value) -> InferenceGatewayConfig {
    let mut v = serde_json::to_value(cfg).unwrap();
    for (k, val) in patch.as_object().unwrap() {
        if val.is_null() {
            v["spec"].as_object_mut().unwrap().remove(k);
        } else {
            v["spec"][k] = val.clone();
        }
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn quotas_and_flow_control_are_the_pickers_files_flags_and_mounts() {
    let out = children(&example(EXAMPLE));
    let c = container(&out);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.contains(&format!("--quotas={QUOTAS_CONFIG_PATH}").as_str()),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--flow-control={FLOW_CONTROL_CONFIG_PATH}").as_str()),
        "{args:?}"
    );
    let pod = &object(&out, "Deployment/shared-llama-8b-epp")["spec"]["template"]["spec"];
    let items = &pod["volumes"][0]["configMap"]["items"];
    for f in [QUOTAS_CONFIG_FILE, FLOW_CONTROL_CONFIG_FILE] {
        assert!(
            items
                .as_array()
                .unwrap()
                .contains(&json!({ "key": f, "path": f })),
            "{items}"
        );
    }
    // The Secret reaches the picker (and only the picker) as the variable the file names.
    let env = c["env"].as_array().unwrap();
    assert!(env.contains(&json!({
        "name": REDIS_PASSWORD_ENV,
        "valueFrom": { "secretKeyRef": { "name": "quota-redis", "key": "password" } },
    })));

    // The files, read back with the picker's own types: what the CR says, nothing lost.
    let q: QuotasSpec = serde_yaml::from_str(&file(&out, QUOTAS_CONFIG_FILE)).unwrap();
    assert_eq!(q.tenants["trial"].requests_per_minute, Some(5));
    assert_eq!(q.default.unwrap().tokens_per_minute, Some(1_000_000));
    let redis = q.redis.unwrap();
    assert_eq!(redis.address, "redis.inference.svc.cluster.local:6379");
    assert_eq!(redis.password_env.as_deref(), Some(REDIS_PASSWORD_ENV));
    let f: FlowSettings = serde_yaml::from_str(&file(&out, FLOW_CONTROL_CONFIG_FILE)).unwrap();
    let fc = f.flow_control;
    assert!(fc.enabled);
    assert_eq!(fc.request_ttl, Duration::from_secs(30));
    assert_eq!(fc.max_requests, 2000);
    assert_eq!(fc.bands.sheddable.max_requests, 200);
    // Unset limits keep the picker's defaults.
    assert_eq!(fc.bands.critical, FlowConfig::default().bands.critical);
    assert_eq!(fc.fairness, Fairness::LeastAttainedService);
    assert_eq!(fc.ordering, Ordering::Fcfs);
    assert_eq!(fc.headroom.reserved_endpoints, 1);
    assert_eq!(
        fc.headroom.share_half_life,
        FlowConfig::default().headroom.share_half_life
    );
    fc.validate().unwrap();
    let t = infergate_pool::tenant::Tenancy::new(&f.tenancy).unwrap();
    assert_eq!(
        t.picker(Some("team-a"), Some("interactive")).priority,
        Priority::Critical
    );
    assert_eq!(t.picker(None, Some("batch")).priority, Priority::Sheddable);
    assert_eq!(t.picker(None, None).priority, Priority::Standard);
    assert_eq!(t.label("trial"), "trial");
    assert_eq!(t.label("someone"), "other");
}

#[test]
fn without_the_sections_there_are_no_files_and_no_flags() {
    let out = children(&example("single-model.yaml"));
    for c in &out {
        let v = serde_json::to_value(&c.object).unwrap();
        let text = v.to_string();
        assert!(!text.contains("--quotas"), "{}", c.key());
        assert!(!text.contains("--flow-control"), "{}", c.key());
        assert!(!text.contains(REDIS_PASSWORD_ENV), "{}", c.key());
    }
}

#[test]
fn an_empty_flow_control_section_is_the_pickers_defaults() {
    // The CRD's unset fields are the picker's defaults, not the CRD's own copy of them.
    let cfg = with_spec(
        &example("single-model.yaml"),
        json!({ "flowControl": {}, "tenancy": null }),
    );
    let text = render::flow_control_yaml(&cfg.spec).unwrap().unwrap();
    let f: FlowSettings = serde_yaml::from_str(&text).unwrap();
    assert_eq!(f, FlowSettings::default());
    // Tenancy alone renders the file too (objectives without queues are the picker's to
    // ignore, as in the gateway file).
    let cfg = with_spec(
        &example("single-model.yaml"),
        json!({ "tenancy": { "defaultPriority": "sheddable" } }),
    );
    let text = render::flow_control_yaml(&cfg.spec).unwrap().unwrap();
    let f: FlowSettings = serde_yaml::from_str(&text).unwrap();
    assert_eq!(f.tenancy.default_priority, Priority::Sheddable);
    assert!(!f.flow_control.enabled);
}

#[test]
fn a_quota_or_flow_change_rolls_only_the_pickers_pods() {
    // The picker reads both files at start: a change must reach the pod template's hash.
    let before = example(EXAMPLE);
    let hash = |out: &[Child]| {
        object(out, "Deployment/shared-llama-8b-epp")["spec"]["template"]["metadata"]["annotations"]
            [CONFIG_HASH_ANNOTATION]
            .clone()
    };
    let base = children(&before);
    for patch in [
        json!({ "quotas": { "default": { "requestsPerMinute": 61 } } }),
        json!({ "flowControl": { "enabled": true, "requestTtlMs": 1000 } }),
        json!({ "tenancy": { "objectives": { "interactive": "standard" } } }),
    ] {
        let after = children(&with_spec(&before, patch.clone()));
        assert_ne!(hash(&base), hash(&after), "{patch}");
        let changed: Vec<String> = after
            .iter()
            .filter(|c| {
                base.iter()
                    .find(|b| b.key() == c.key())
                    .is_none_or(|b| b.object != c.object)
            })
            .map(Child::key)
            .collect();
        // A queue TTL also lengthens the pods' grace period to stop, the BBR's included (it
        // takes the longest of its pickers'); the quota and the tenancy change only the picker.
        let mut expected = vec![
            "ConfigMap/shared-llama-8b-epp",
            "Deployment/shared-llama-8b-epp",
        ];
        if patch.get("flowControl").is_some() {
            expected.insert(1, "Deployment/shared-bbr");
        }
        assert_eq!(changed, expected, "{patch}");
    }
}

#[test]
fn a_user_managed_password_variable_is_kept_as_written() {
    let cfg = with_spec(
        &example(EXAMPLE),
        json!({
            "podDefaults": { "env": [{ "name": "REDIS_PASSWORD", "valueFrom": { "secretKeyRef": { "name": "r", "key": "p" } } }] },
            "quotas": { "redis": { "address": "redis:6379", "passwordEnv": "REDIS_PASSWORD" } },
        }),
    );
    let out = children(&cfg);
    let q: QuotasSpec = serde_yaml::from_str(&file(&out, QUOTAS_CONFIG_FILE)).unwrap();
    assert_eq!(
        q.redis.unwrap().password_env.as_deref(),
        Some("REDIS_PASSWORD")
    );
    assert!(!container(&out).to_string().contains(REDIS_PASSWORD_ENV));
}

#[test]
fn a_section_the_picker_would_refuse_is_a_render_error_naming_it() {
    // A window the buckets do not divide into whole milliseconds: only the picker's own check
    // knows, and the render runs it (Accepted=False instead of a crash-looping pod).
    let cfg = with_spec(
        &example(EXAMPLE),
        json!({ "quotas": { "windowSeconds": 7, "buckets": 3 } }),
    );
    let err = render::render(&cfg, &common::opts()).unwrap_err();
    assert_eq!(err.metric_label(), "invalid");
    let text = err.to_string();
    assert!(
        text.starts_with("spec.quotas is not accepted by the endpoint picker: "),
        "{text}"
    );
    // Validation's own refusals name the field.
    let cfg = with_spec(
        &example(EXAMPLE),
        json!({ "flowControl": { "enabled": true, "maxBytes": 0 } }),
    );
    let err = render::render(&cfg, &common::opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.flowControl.maxBytes: must be at least 1"),
        "{err}"
    );
}

/// Field names of an object schema node.
fn schema_keys(node: &Value) -> std::collections::BTreeSet<String> {
    node["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("not an object schema: {node}"))
        .keys()
        .cloned()
        .collect()
}

/// Field names the picker's own type writes.
fn file_keys<T: serde::Serialize>(v: &T) -> std::collections::BTreeSet<String> {
    serde_json::to_value(v)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// The generated CRD's OpenAPI schema, as JSON.
fn crd_schema() -> serde_json::Value {
    use kube::CustomResourceExt;
    let crd = InferenceGatewayConfig::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn the_crd_sections_and_the_pickers_files_have_the_same_fields() {
    // One block moves between the gateway file, the picker's files and the CR: a field the
    // picker gains must be added to the CRD (and the other way round), or this fails.
    let schema = crd_schema();
    let spec = &schema["properties"]["spec"]["properties"];
    let flow = FlowConfig::default();
    assert_eq!(
        schema_keys(&spec["flowControl"]),
        file_keys(&flow),
        "spec.flowControl vs infergate_scheduler::flow::FlowConfig"
    );
    let bands = &spec["flowControl"]["properties"]["bands"];
    assert_eq!(schema_keys(bands), file_keys(&flow.bands));
    assert_eq!(
        schema_keys(&bands["properties"]["critical"]),
        file_keys(&flow.bands.critical)
    );
    assert_eq!(
        schema_keys(&spec["flowControl"]["properties"]["serviceWeights"]),
        file_keys(&flow.service_weights)
    );
    assert_eq!(
        schema_keys(&spec["flowControl"]["properties"]["headroom"]),
        file_keys(&flow.headroom)
    );
    // The gateway-only header fields are the one difference in tenancy.
    let mut tenancy = file_keys(&infergate_pool::tenant::TenancyConfig::default());
    tenancy.remove("tenantHeader");
    tenancy.remove("priorityHeader");
    assert_eq!(schema_keys(&spec["tenancy"]), tenancy);
    // Quotas: the CRD adds passwordSecretRef, which the render turns into passwordEnv.
    let q: QuotasSpec = serde_yaml::from_str(
        "default: {}\nwindowSeconds: 60\nbuckets: 60\nmaxTenants: 1\nredis: { address: a, passwordEnv: P }\n",
    )
    .unwrap();
    assert_eq!(schema_keys(&spec["quotas"]), file_keys(&q));
    let mut redis = file_keys(q.redis.as_ref().unwrap());
    redis.insert("passwordSecretRef".to_owned());
    assert_eq!(schema_keys(&spec["quotas"]["properties"]["redis"]), redis);
}

#[test]
fn the_crds_precise_prefix_bounds_are_the_pickers() {
    // The CRD's byteBudget / maxBodyBytes ranges become `--kv-index-bytes` /
    // `--kv-max-body-bytes`; the picker and the gateway refuse values outside their own ranges,
    // so the two must agree or a CR the API server accepts renders a picker that exits.
    let schema = crd_schema();
    let precise = &schema["properties"]["spec"]["properties"]["schedulers"]["items"]["properties"]
        ["precisePrefix"]["properties"];
    let range = |field: &str| {
        let f = &precise[field];
        (
            // Floats in the schema (`1048576.0`); exact for these powers of two.
            f["minimum"]
                .as_f64()
                .unwrap_or_else(|| panic!("{field}: {f}")) as u64,
            f["maximum"]
                .as_f64()
                .unwrap_or_else(|| panic!("{field}: {f}")) as u64,
        )
    };
    use infergate_pool::precise::{BYTE_BUDGET_RANGE, MAX_BODY_BYTES_RANGE};
    assert_eq!(range("byteBudget"), BYTE_BUDGET_RANGE);
    assert_eq!(range("maxBodyBytes"), MAX_BODY_BYTES_RANGE);
}
