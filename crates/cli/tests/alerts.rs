//! The Helm chart's alerting rules (`charts/infergate/alerts/infergate.rules.yaml`) select only
//! families that infergate really exports, with the labels they really carry.
//!
//! The real binaries run over emulated vLLM pods: the gateway and the picker
//! (`common/front_doors.rs`, the picker with `--endpoints-file`, driven so that counters have
//! series, a refusal of the picker's among them), the body-based router with a `--models` file
//! (a request routed, one for a model the file does not list), a second gateway serving mutual
//! TLS with quotas shared through a Redis that is not there (the `tls` and `quota` families, its
//! sync rounds failing), and the global router over the first gateway and dead clusters (one
//! over TLS), sent a request for a model no cluster serves. Every metric name a rule's
//! expression selects must be exported by one of them, every label name its matchers test
//! (`{reason="…"}`) must be on that family's samples, and every label its aggregations keep or
//! drop (`by (pool)`), other than the scrape's own (`namespace`, `job`, `instance`), on one of
//! the families it selects. The operator needs a Kubernetes API and is not started: its
//! families are held to their registration in `crates/operator/src/metrics.rs`. The rule file's
//! shape (severities, annotations, the docs its `runbook_url`s point to) is checked too, and so
//! is every `reason` a rule matches on a `*_rejections_total` family: it must be one that errors
//! are counted under (`ApiError::metric_label`), since a misspelt one matches no series and the
//! alert stays silent. What the expressions compute is `promtool test rules`' part
//! (tests/alerts/).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "../../extproc/tests/common/forward.rs"]
mod forward;
#[path = "common/front_doors.rs"]
mod front_doors;
#[path = "../../extproc/tests/common/harness.rs"]
mod harness;
#[path = "common/promql.rs"]
mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use front_doors::{
    ADAPTER, FrontDoors, Proc, chat, ext_proc_answer, http, local, sample_name, scrape_until,
    start_ext_proc,
};
use harness::{Envoy, immediate};
use promql::{Matcher, Selector, grouping_labels, selectors};
use serde_json::json;

/// Fewest alerts the file must hold (so the checks cannot pass on an empty or truncated file).
const MIN_ALERTS: usize = 15;

/// Where the `runbook_url`s point: the repository's docs.
const DOCS_URL: &str = "https://github.com/infergate/infergate/blob/main/docs/";

/// Labels the scrape adds to every target (Prometheus' `job` and `instance`, a ServiceMonitor's
/// `namespace`): aggregations may keep them though no process exports them.
const TARGET_LABELS: &[&str] = &["namespace", "job", "instance"];

/// The operator's family prefix: not started here (it needs a Kubernetes API).
const OPERATOR: &str = "infergate_operator_";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One alerting rule of the file.
struct Rule {
    alert: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn rules() -> Vec<Rule> {
    let path = repo().join("charts/infergate/alerts/infergate.rules.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let file: serde_yaml::Value = serde_yaml::from_str(&text).expect("the rule file is YAML");
    let strings = |v: &serde_yaml::Value| -> BTreeMap<String, String> {
        serde_yaml::from_value(v.clone()).unwrap_or_default()
    };
    let mut out = Vec::new();
    for group in file["groups"].as_sequence().expect("a `groups` list") {
        for rule in group["rules"]
            .as_sequence()
            .expect("each group has `rules`")
        {
            out.push(Rule {
                alert: rule["alert"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a rule without `alert`: {rule:?}"))
                    .to_owned(),
                expr: rule["expr"].as_str().expect("`expr`").to_owned(),
                labels: strings(&rule["labels"]),
                annotations: strings(&rule["annotations"]),
            });
        }
    }
    out
}

/// Every sample name of an exposition page with the label names its samples carry.
fn series_labels(page: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = sample_name(line);
        let labels = out.entry(name.to_owned()).or_default();
        let Some(rest) = line[name.len()..].strip_prefix('{') else {
            continue;
        };
        let c: Vec<char> = rest.chars().collect();
        let mut i = 0;
        while i < c.len() && c[i] != '}' {
            let start = i;
            while i < c.len() && c[i] != '=' {
                i += 1;
            }
            labels.insert(c[start..i].iter().collect::<String>().trim().to_owned());
            // Past `="value"`, escapes included, and the comma.
            i += 2;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            if c.get(i) == Some(&',') {
                i += 1;
            }
        }
    }
    out
}

/// The families `crates/operator/src/metrics.rs` registers under `infergate_operator_`, as
/// exposed (counters with `_total`), with the label names of their label sets.
fn operator_families() -> BTreeMap<String, BTreeSet<String>> {
    let src = std::fs::read_to_string(repo().join("crates/operator/src/metrics.rs")).unwrap();
    assert!(
        src.contains("sub_registry_with_prefix(\"infergate_operator\")"),
        "crates/operator/src/metrics.rs no longer registers under infergate_operator"
    );
    let mut out = BTreeMap::new();
    // `sub.register("name", "help", self.field.clone())`, with `field: Counter` or
    // `field: Family<Labels, Counter>`, and `struct Labels { pub label: … }`.
    for reg in src.split("sub.register(").skip(1) {
        let name = reg.split('"').nth(1).unwrap();
        let field = reg
            .split("self.")
            .nth(1)
            .unwrap()
            .split('.')
            .next()
            .unwrap();
        let decl = src
            .split(&format!("pub {field}: "))
            .nth(1)
            .unwrap()
            .split(",\n")
            .next()
            .unwrap();
        let suffix = if decl.contains("Counter") {
            "_total"
        } else {
            ""
        };
        let mut labels = BTreeSet::new();
        if let Some(set) = decl
            .strip_prefix("Family<")
            .and_then(|d| d.split(',').next())
        {
            let body = src
                .split(&format!("pub struct {set} {{"))
                .nth(1)
                .unwrap()
                .split('}')
                .next()
                .unwrap();
            for line in body.lines().map(str::trim) {
                if let Some(l) = line.strip_prefix("pub ").and_then(|l| l.split(':').next()) {
                    labels.insert(l.to_owned());
                }
            }
        }
        out.insert(format!("{OPERATOR}{name}{suffix}"), labels);
    }
    out
}

/// The `reason` values errors are counted under: the strings `ApiError::metric_label` in
/// `crates/openai/src/error.rs` returns (the gateway's, the picker's, the body-based router's and
/// the global router's `*_rejections_total` carry no other).
fn rejection_reasons() -> BTreeSet<String> {
    let src = std::fs::read_to_string(repo().join("crates/openai/src/error.rs")).unwrap();
    let body = src
        .split("pub fn metric_label(&self) -> &'static str {")
        .nth(1)
        .expect("crates/openai/src/error.rs has no ApiError::metric_label")
        .split("\n    }\n")
        .next()
        .unwrap();
    body.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_selector_parser_finds_names_and_matched_labels() {
    let e = r#"sum by (a) (rate(x_total{b="1", c =~ "y|z}"}[5m])) / y unless on (d) z{e!="}", f!~'g'} > 0.5"#;
    let got: Vec<(String, Vec<String>)> = selectors(e)
        .into_iter()
        .map(|Selector { name, labels, .. }| (name, labels.into_iter().collect()))
        .collect();
    let want: Vec<(String, Vec<String>)> = vec![
        ("x_total".into(), vec!["b".into(), "c".into()]),
        ("y".into(), vec![]),
        ("z".into(), vec!["e".into(), "f".into()]),
    ];
    assert_eq!(got, want);
    let m = |label: &str, op: &str, value: &str| Matcher {
        label: label.into(),
        op: op.into(),
        value: value.into(),
    };
    assert_eq!(
        selectors(e)[0].matchers,
        vec![m("b", "=", "1"), m("c", "=~", "y|z}")]
    );
    assert_eq!(
        selectors(r#"a{e!="}", f!~'g', h="q\"r"}"#)[0].matchers,
        vec![m("e", "!=", "}"), m("f", "!~", "g"), m("h", "=", "q\"r")]
    );
    let values = |m: Matcher| m.accepted_values();
    assert_eq!(values(m("r", "=", "x.y")), Some(vec!["x.y".into()]));
    assert_eq!(
        values(m("r", "=~", "shed|queue_full")),
        Some(vec!["shed".into(), "queue_full".into()])
    );
    assert_eq!(values(m("r", "=~", "queue_.*")), None);
    assert_eq!(values(m("r", "!=", "x")), None);
    let reasons = rejection_reasons();
    for r in [
        "shed",
        "no_endpoints",
        "unknown_model",
        "queue_no_endpoints",
    ] {
        assert!(reasons.contains(r), "{r} not among {reasons:?}");
    }
    assert!(!reasons.contains("model_not_found"), "{reasons:?}");
    assert_eq!(
        grouping_labels(r#"sum by (a, b) (x{c="by (z)"}) / max without(d) (y) * on (e) w"#),
        BTreeSet::from(["a".into(), "b".into(), "d".into()])
    );
    let page = "# TYPE a counter\na_total{x=\"1,\\\"}\",y=\"2\"} 0\nb 1\n";
    let labels = series_labels(page);
    assert_eq!(labels["a_total"], BTreeSet::from(["x".into(), "y".into()]));
    assert!(labels["b"].is_empty());
    let op = operator_families();
    assert_eq!(
        op.get("infergate_operator_reconcile_failures_total"),
        Some(&BTreeSet::from(["error".to_owned()])),
        "{op:?}"
    );
}

#[test]
fn the_rule_file_is_well_formed() {
    let rules = rules();
    assert!(rules.len() >= MIN_ALERTS, "only {} alerts", rules.len());
    let mut seen = BTreeSet::new();
    for r in &rules {
        assert!(seen.insert(r.alert.clone()), "{} defined twice", r.alert);
        assert!(
            r.alert.starts_with("Infergate"),
            "{}: not named Infergate…",
            r.alert
        );
        let severity = r.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{}: severity {severity:?}, not critical or warning",
            r.alert
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                r.annotations.get(key).is_some_and(|v| !v.trim().is_empty()),
                "{}: no {key} annotation",
                r.alert
            );
        }
        let url = &r.annotations["runbook_url"];
        let page = url
            .strip_prefix(DOCS_URL)
            .unwrap_or_else(|| panic!("{}: runbook_url {url} is not under {DOCS_URL}", r.alert));
        let (file, anchor) = page.split_once('#').unwrap_or((page, ""));
        let text = std::fs::read_to_string(repo().join("docs").join(file))
            .unwrap_or_else(|e| panic!("{}: runbook_url {url}: docs/{file}: {e}", r.alert));
        // GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped.
        let anchors: BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|h| {
                h.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        ' ' => Some('-'),
                        c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        assert!(
            anchor.is_empty() || anchors.contains(anchor),
            "{}: runbook_url {url}: docs/{file} has no heading #{anchor}",
            r.alert
        );
        assert!(
            !selectors(&r.expr).is_empty(),
            "{}: the expression selects nothing",
            r.alert
        );
    }
}

#[test]
fn every_reason_the_alerts_match_is_one_errors_are_counted_under() {
    let reasons = rejection_reasons();
    let mut checked = 0;
    let mut problems = Vec::new();
    for r in rules() {
        for s in selectors(&r.expr) {
            if !s.name.ends_with("_rejections_total") {
                continue;
            }
            for m in s.matchers.iter().filter(|m| m.label == "reason") {
                let Some(values) = m.accepted_values() else {
                    problems.push(format!(
                        "{}: {}{{reason{}\"{}\"}} is not a list of reasons that can be checked",
                        r.alert, s.name, m.op, m.value
                    ));
                    continue;
                };
                for v in values {
                    checked += 1;
                    if !reasons.contains(&v) {
                        problems.push(format!(
                            "{}: {}{{reason{}\"{}\"}}: no error is counted under `{v}`",
                            r.alert, s.name, m.op, m.value
                        ));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the alerting rules match reasons no error has (ApiError::metric_label in \
         crates/openai/src/error.rs):\n  {}",
        problems.join("\n  ")
    );
    assert!(checked > 0, "no rule matches a reason");
    eprintln!("{checked} reasons matched by the rules, each one errors are counted under");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_and_label_the_alerts_select_is_exported() {
    let rules = rules();
    // Each selector with the alerts that use it.
    let mut used: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for r in &rules {
        for s in selectors(&r.expr) {
            let entry = used.entry(s.name).or_default();
            entry.0.extend(s.labels);
            entry.1.insert(r.alert.clone());
        }
    }

    let mut doors = FrontDoors::start(7).await;
    let p = doors.spare_ports.clone();
    let dir = doors.dir.path().to_owned();

    // The body-based router, for the pods' model and adapter.
    let (bbr_grpc, bbr_metrics) = (local(p[4]), local(p[6]));
    let models = dir.join("models.yaml");
    std::fs::write(&models, format!("{}: [{ADAPTER}]\n", doors.model)).unwrap();
    let mut bbr = start_ext_proc(
        "bbr",
        &["--models", models.to_str().unwrap()],
        [p[4], p[5], p[6]],
        &dir,
    );

    // A gateway serving mutual TLS, with quotas shared through a Redis nothing listens on.
    let (tls_front, tls_admin) = (local(p[0]), local(p[1]));
    let ca = infergate_testkit::tls::TestCa::new("alerts CA");
    let ca_file = ca.write_ca(&dir);
    let (cert, key) = ca.issue(&["localhost"]).write(&dir);
    let tls_config = dir.join("tls-gateway.yaml");
    let config = json!({
        "listen": tls_front.to_string(),
        "admin": tls_admin.to_string(),
        "auth": "none",
        "tls": {
            "certFile": cert.to_str().unwrap(),
            "keyFile": key.to_str().unwrap(),
            "clientCaFile": ca_file.to_str().unwrap(),
        },
        "quotas": {
            "default": { "requestsPerMinute": 600 },
            "redis": { "address": doors.dead.to_string(), "timeoutMs": 100 },
        },
        "models": [{ "name": doors.model, "endpoints": [doors.dead.to_string()] }],
    });
    std::fs::write(&tls_config, serde_yaml::to_string(&config).unwrap()).unwrap();
    let mut tls_gateway = Proc::start(
        "tls-gateway",
        &["gateway", "--config", tls_config.to_str().unwrap()],
        &dir,
    );

    // The global router over the gateway and two dead clusters (drained at their first
    // heartbeat), one reached over TLS (its CA's expiry is exported).
    let (global_front, global_admin) = (local(p[2]), local(p[3]));
    let global_file = dir.join("global.yaml");
    let config = json!({
        "listen": global_front.to_string(),
        "admin": global_admin.to_string(),
        "auth": "none",
        "heartbeat": { "intervalMs": 100, "failuresToDrain": 1 },
        "clusters": [
            {
                "name": "east",
                "url": format!("http://{}", doors.front),
                "heartbeatUrl": format!("http://{}/heartbeat", doors.gateway_admin),
                "region": "us-east",
                "cost": { "inputPerMillion": 0.5, "outputPerMillion": 1.0 },
            },
            {
                "name": "west",
                "url": format!("http://{}", doors.dead),
                "heartbeatUrl": format!("http://{}/heartbeat", doors.dead),
                "region": "us-west",
                "cost": { "inputPerMillion": 0.1, "outputPerMillion": 0.2 },
            },
            {
                "name": "north",
                "url": format!("https://{}", doors.dead),
                "heartbeatUrl": format!("http://{}/heartbeat", doors.dead),
                "region": "us-north",
                "cost": { "inputPerMillion": 0.1, "outputPerMillion": 0.2 },
                "tls": { "caFile": ca_file.to_str().unwrap() },
            },
        ],
    });
    std::fs::write(&global_file, serde_yaml::to_string(&config).unwrap()).unwrap();
    let mut global = Proc::start(
        "global",
        &["global", "--config", global_file.to_str().unwrap()],
        &dir,
    );

    doors.drive().await;
    tls_gateway.wait_answering(tls_admin, "/metrics").await;
    global.wait_ready(global_admin).await;
    bbr.wait_ready(bbr_metrics).await;
    // Through the body-based router: the adapter routed, a model its file does not list refused.
    let envoy = Envoy::connect(bbr_grpc).await;
    let routed = serde_json::to_vec(&chat(ADAPTER, "hello", false)).unwrap();
    let answer = ext_proc_answer(&envoy, &routed).await;
    assert!(
        matches!(answer.response, Some(Answer::RequestHeaders(_))),
        "the body-based router did not route {ADAPTER}: {answer:?}"
    );
    let unknown = serde_json::to_vec(&chat("no-such-model", "hello", false)).unwrap();
    let answer = ext_proc_answer(&envoy, &unknown).await;
    let status = immediate(&answer).status.as_ref().map_or(0, |s| s.code);
    assert_eq!(status, 404, "{answer:?}");
    // A model no cluster serves: the router answers it with an error of its own.
    let body = chat("no-such-model", "hello", false);
    let (status, answer) = http(global_front, "POST", "/v1/chat/completions", Some(&body))
        .await
        .unwrap();
    assert!(
        status >= 400,
        "the global router answered {status} for an unknown model: {answer}"
    );

    let ports = [
        ("gateway", doors.gateway_admin),
        ("picker", doors.picker_metrics),
        ("body-based router", bbr_metrics),
        ("tls gateway", tls_admin),
        ("global router", global_admin),
    ];
    let merged = |pages: &[String]| {
        let mut all: BTreeMap<String, BTreeSet<String>> = operator_families();
        for page in pages {
            for (name, labels) in series_labels(page) {
                all.entry(name).or_default().extend(labels);
            }
        }
        all
    };
    let covered = |all: &BTreeMap<String, BTreeSet<String>>| {
        used.iter().all(|(name, (labels, _))| {
            all.get(name)
                .is_some_and(|have| labels.iter().all(|l| have.contains(l)))
        })
    };
    let pages = scrape_until(&ports, Duration::from_secs(15), |pages| {
        covered(&merged(pages))
    })
    .await;
    doors.assert_running();
    bbr.assert_running();
    tls_gateway.assert_running();
    global.assert_running();
    let all = merged(&pages);

    let mut problems = Vec::new();
    for (name, (labels, alerts)) in &used {
        let alerts = alerts.iter().cloned().collect::<Vec<_>>().join(", ");
        match all.get(name) {
            None => problems.push(format!("{name} (in {alerts}) is exported by no process")),
            Some(have) => {
                for l in labels.difference(have) {
                    problems.push(format!(
                        "{name}{{{l}=…}} (in {alerts}): its samples have no label {l} (they have: {})",
                        have.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    // Each label an alert's aggregations keep or drop is on one of the families it selects.
    for r in &rules {
        let selected: BTreeSet<&String> = selectors(&r.expr)
            .into_iter()
            .filter_map(|s| all.get(&s.name))
            .flatten()
            .collect();
        for l in grouping_labels(&r.expr) {
            if !TARGET_LABELS.contains(&l.as_str()) && !selected.contains(&l) {
                problems.push(format!(
                    "{}: groups by `{l}`, a label none of its families has",
                    r.alert
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the alerting rules select what the processes do not export:\n  {}",
        problems.join("\n  ")
    );
    eprintln!(
        "{} alerts; {} families selected, all exported with their matched labels: {}",
        rules.len(),
        used.len(),
        used.keys().cloned().collect::<Vec<_>>().join(", ")
    );
}
