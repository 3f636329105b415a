//! The example configs under `deploy/examples/` against the generated CRD's schema and the
//! admission rules: every valid example passes both, every invalid one fails with its message.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic here is a failed assertion"
)]
use std::path::{Path, PathBuf};

use infergate_api::validation::{self, CelRule};
use infergate_api::{Error, InferenceGatewayConfig};
use kube::CustomResourceExt;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples")
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn crd_validator() -> jsonschema::Validator {
    let crd = InferenceGatewayConfig::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap();
    let schema = serde_json::to_value(schema).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn valid_examples_pass_the_crd_schema_and_the_rules() {
    let validator = crd_validator();
    let files = yaml_files(&examples_dir());
    assert!(files.len() >= 3, "examples: {files:?}");
    for path in files {
        let value = load(&path);
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        let cfg: InferenceGatewayConfig = serde_json::from_value(value).unwrap();
        validation::validate(&cfg.spec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Each invalid example and the one rule it breaks.
const INVALID: &[(&str, CelRule)] = &[
    ("no-schedulers.yaml", validation::SCHEDULER_COUNT),
    ("too-many-schedulers.yaml", validation::SCHEDULER_COUNT),
    ("bbr-disabled-two-models.yaml", validation::BBR_REQUIRED),
    ("duplicate-model-name.yaml", validation::MODEL_NAME_UNIQUE),
    ("duplicate-name.yaml", validation::NAME_UNIQUE),
    ("preset-and-weights.yaml", validation::PRESET_XOR_WEIGHTS),
    ("negative-weight.yaml", validation::WEIGHTS_NON_NEGATIVE),
    ("all-zero-weights.yaml", validation::WEIGHTS_ONE_POSITIVE),
    ("https-without-tls.yaml", validation::HTTPS_NEEDS_TLS),
    (
        "issuer-listener-without-hostname.yaml",
        validation::ISSUER_NEEDS_HOSTNAME,
    ),
    ("tls-both-sources.yaml", validation::TLS_ONE_SOURCE),
    ("redis-password-both.yaml", validation::REDIS_ONE_PASSWORD),
    ("lora-without-bbr.yaml", validation::LORA_NEEDS_BBR),
    ("no-auth.yaml", validation::AUTH_REQUIRED),
    (
        "auth-and-unauthenticated.yaml",
        validation::AUTH_OR_UNAUTHENTICATED,
    ),
    (
        "duplicate-listener-name.yaml",
        validation::LISTENER_NAME_UNIQUE,
    ),
    (
        "duplicate-listener-port.yaml",
        validation::LISTENER_PORT_UNIQUE,
    ),
    (
        "tokenizer-both-sources.yaml",
        validation::TOKENIZER_ONE_SOURCE,
    ),
    (
        "tokenizer-sub-path-of-config-map.yaml",
        validation::SUB_PATH_NEEDS_CLAIM,
    ),
    (
        "replay-port-is-events-port.yaml",
        validation::REPLAY_NOT_EVENTS_PORT,
    ),
    (
        "outlier-max-below-base.yaml",
        validation::MAX_EJECTION_NOT_BELOW_BASE,
    ),
];

/// Invalid examples of the checks the schema's bounds and the operator make (no CEL rule):
/// the file, the field it names and the message.
const INVALID_FIELDS: &[(&str, &str, &str)] = &[
    (
        "flow-control-zero-band.yaml",
        "spec.flowControl.bands.sheddable.maxRequests",
        validation::FLOW_LIMIT_MESSAGE,
    ),
    (
        "objective-unknown-band.yaml",
        "spec.tenancy.objectives.interactive",
        validation::OBJECTIVE_PRIORITY_MESSAGE,
    ),
    (
        "redis-password-env-undefined.yaml",
        "spec.quotas.redis.passwordEnv",
        validation::PASSWORD_ENV_MESSAGE,
    ),
    (
        "empty-model-selector.yaml",
        "spec.schedulers[0].modelSelector",
        validation::MODEL_SELECTOR_MESSAGE,
    ),
    (
        "adapter-on-two-schedulers.yaml",
        "spec.schedulers[1].loraAdapters[0]",
        "`sql-expert` is already spec.schedulers[0].loraAdapters[0]: a model name, LoRA adapter or matched name routes to one scheduler only (the body-based router refuses one configured twice, and the two HTTPRoutes would both match it)",
    ),
    (
        "too-many-routed-names.yaml",
        "spec.schedulers[0]",
        "routes 65 names (modelName, the loraAdapters and the other names modelRewrites match, each once), but its HTTPRoute rule holds at most 64 matches: route at most 64",
    ),
];

#[test]
fn each_invalid_example_is_rejected_with_its_message() {
    let dir = examples_dir().join("invalid");
    let files = yaml_files(&dir);
    assert_eq!(
        files.len(),
        INVALID.len() + INVALID_FIELDS.len(),
        "every invalid example has an expected rule"
    );
    for (file, field, message) in INVALID_FIELDS {
        let value = load(&dir.join(file));
        let cfg: InferenceGatewayConfig = serde_json::from_value(value).unwrap();
        match validation::validate(&cfg.spec) {
            Err(Error::Invalid(v)) => {
                let got: Vec<(&str, &str)> = v
                    .iter()
                    .map(|v| (v.field.as_str(), v.message.as_ref()))
                    .collect();
                assert_eq!(got, vec![(*field, *message)], "{file}");
            }
            other => panic!("{file}: expected rejection, got {other:?}"),
        }
    }
    for (file, rule) in INVALID {
        let value = load(&dir.join(file));
        let cfg: InferenceGatewayConfig = serde_json::from_value(value).unwrap();
        match validation::validate(&cfg.spec) {
            Err(Error::Invalid(v)) => {
                let got: Vec<&str> = v.iter().map(|v| v.message.as_ref()).collect();
                assert_eq!(got, vec![rule.message], "{file}");
            }
            other => panic!("{file}: expected rejection, got {other:?}"),
        }
    }
}

#[test]
fn every_rule_has_an_invalid_example() {
    let tables = [
        validation::SPEC_RULES,
        validation::SCHEDULER_RULES,
        validation::WEIGHTS_RULES,
        validation::TLS_RULES,
        validation::REDIS_RULES,
        validation::LISTENER_RULES,
        validation::TOKENIZER_RULES,
        validation::PRECISE_RULES,
    ];
    for rule in tables.iter().flat_map(|t| t.iter()) {
        assert!(
            INVALID.iter().any(|(_, r)| r == rule),
            "no invalid example for {:?}",
            rule.message
        );
    }
}

#[test]
fn schema_rejects_structural_mistakes() {
    let validator = crd_validator();
    let mut value = load(&examples_dir().join("single-model.yaml"));
    value["spec"]["schedulers"][0]["engineType"] = "triton".into();
    assert!(!validator.is_valid(&value));
    let mut value = load(&examples_dir().join("single-model.yaml"));
    value["spec"]["schedulers"][0]["name"] = "Not_A_DNS_Label".into();
    assert!(!validator.is_valid(&value));
    let mut value = load(&examples_dir().join("single-model.yaml"));
    value["spec"]["schedulers"][0]["routeTimeout"] = "five minutes".into();
    assert!(!validator.is_valid(&value));
    // outlierDetection.failurePercentage's bounds.
    for (fp, valid) in [
        (serde_json::json!({}), true),
        (
            serde_json::json!({ "threshold": 100, "minimumRequests": 1, "intervalMs": 1 }),
            true,
        ),
        (serde_json::json!({ "threshold": 0 }), false),
        (serde_json::json!({ "threshold": 101 }), false),
        (serde_json::json!({ "minimumRequests": 0 }), false),
        (serde_json::json!({ "intervalMs": 604_800_001u64 }), false),
    ] {
        let mut value = load(&examples_dir().join("single-model.yaml"));
        value["spec"]["schedulers"][0]["outlierDetection"] =
            serde_json::json!({ "failurePercentage": fp });
        assert_eq!(validator.is_valid(&value), valid, "{fp}");
    }
}

#[test]
fn committed_crd_matches_the_generated_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    for (file, crd) in infergate_api::crd::crds() {
        let generated = infergate_api::crd::to_yaml(&crd).unwrap();
        if std::env::var_os("UPDATE_CRDS").is_some() {
            std::fs::write(dir.join(&file), &generated).unwrap();
        }
        let committed = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/{file} is stale: run `cargo run -q -p infergate-cli -- crdgen --out crds`"
        );
    }
}

/// docs/configuration.md's table of CEL rules ("Validation rules") lists every rule the CRD
/// carries, each with its place and message, inside the table (a row left after the table's
/// end is shown as a stray line, not as a rule).
#[test]
fn the_documented_cel_table_lists_every_rule() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
    )
    .unwrap();
    let rows: Vec<&str> = doc
        .lines()
        .skip_while(|l| *l != "| Where | Message |")
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(rows.len() > 2, "no CEL table in docs/configuration.md");
    let tables: &[(&str, &[CelRule])] = &[
        ("spec", validation::SPEC_RULES),
        ("spec.schedulers[*]", validation::SCHEDULER_RULES),
        ("spec.schedulers[*].weights", validation::WEIGHTS_RULES),
        ("spec.gateway.listeners", validation::LISTENER_RULES),
        ("spec.tls", validation::TLS_RULES),
        ("spec.quotas.redis", validation::REDIS_RULES),
        (
            "spec.schedulers[*].precisePrefix.tokenizer",
            validation::TOKENIZER_RULES,
        ),
        (
            "spec.schedulers[*].precisePrefix",
            validation::PRECISE_RULES,
        ),
    ];
    let mut documented = 0;
    for (place, rules) in tables {
        for rule in *rules {
            let row = format!("| `{place}` | {} |", rule.message);
            assert!(
                rows.contains(&row.as_str()),
                "docs/configuration.md's CEL table lacks {row}"
            );
            documented += 1;
        }
    }
    assert_eq!(
        rows.len() - 2,
        documented,
        "rows for rules that do not exist"
    );
}

/// Where the CRD gives an object a `default` and one of its properties a `default` too, the
/// two agree: the API server fills in the object's default when the object is left out, and
/// the property's when only the property is, so a disagreement makes one field default to two
/// values (`observability.metrics` did: `true` when `observability` was written, `false` when
/// it was left out).
#[test]
fn object_defaults_agree_with_their_properties_defaults() {
    fn walk(node: &Value, path: &str, errors: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if let (Some(Value::Object(def)), Some(Value::Object(props))) =
                    (map.get("default"), map.get("properties"))
                {
                    for (name, prop) in props {
                        let (Some(want), Some(got)) = (prop.get("default"), def.get(name)) else {
                            continue;
                        };
                        if want != got {
                            errors.push(format!(
                                "{path}.{name}: default {want} on the field, {got} in the default of {path}"
                            ));
                        }
                    }
                }
                for (k, v) in map {
                    walk(v, &format!("{path}.{k}"), errors);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{path}[{i}]"), errors);
                }
            }
            _ => {}
        }
    }
    let crd = serde_json::to_value(InferenceGatewayConfig::crd()).unwrap();
    let mut errors = Vec::new();
    walk(&crd["spec"]["versions"][0]["schema"], "schema", &mut errors);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// `kubectl get igwc` shows whether the config was accepted, whether it is ready and, when it
/// is not, the reason in a word; `-o wide` adds the message that says what to do.
#[test]
fn printer_columns_show_the_ready_reason_and_wide_the_message() {
    let crd = InferenceGatewayConfig::crd();
    let cols: Vec<(String, String, i32)> = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.json_path, c.priority.unwrap_or(0)))
        .collect();
    let want = |name: &str, path: &str, priority: i32| {
        assert!(
            cols.contains(&(name.to_owned(), path.to_owned(), priority)),
            "no column {name} = {path} (priority {priority}): {cols:?}"
        );
    };
    let cond =
        |type_: &str, field: &str| format!(".status.conditions[?(@.type==\"{type_}\")].{field}");
    use infergate_api::status::{ACCEPTED, READY};
    want("Accepted", &cond(ACCEPTED, "status"), 0);
    want("Ready", &cond(READY, "status"), 0);
    want("Reason", &cond(READY, "reason"), 0);
    want("Age", ".metadata.creationTimestamp", 0);
    want("Message", &cond(READY, "message"), 1);
}
