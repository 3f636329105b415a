//! The Grafana dashboard of the Helm chart (`charts/infergate/dashboards/infergate.json`) asks
//! only for metric families that infergate really exports.
//!
//! The real `infergate gateway` and `infergate picker` binaries run over emulated vLLM pods and
//! are driven so that counters and histograms have series and families that appear only once
//! counted appear (`common/front_doors.rs` says how). Then every metric name referenced by a PromQL
//! expression of the dashboard (panel targets and templating queries) must be one that the
//! gateway's admin port or the picker's metrics port exports, and every name either exports must
//! be under `infergate_` (docs/metrics.md, "Names of infergate's own series").

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

use front_doors::{FrontDoors, exported, scrape_until};
use promql::referenced;
use serde_json::Value;

/// Fewest distinct metric names the dashboard must reference (so the check cannot pass on an
/// empty or truncated dashboard).
const MIN_REFERENCED: usize = 10;

fn dashboard_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/infergate/dashboards/infergate.json")
}

/// Every PromQL expression of the dashboard: each `expr` anywhere (panel targets, rows' nested
/// panels) and each templating variable's query.
fn expressions(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if var["type"] != "query" {
            continue;
        }
        let q = match &var["query"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o["query"].as_str().unwrap_or_default().to_owned(),
            _ => String::new(),
        };
        // `label_values(selector, label)`: the selector is PromQL, the label is not a metric.
        let q = match q.trim().strip_prefix("label_values(") {
            Some(args) => match args.trim_end().strip_suffix(')') {
                Some(args) => match args.rsplit_once(',') {
                    Some((selector, _label)) => selector.to_owned(),
                    None => String::new(),
                },
                None => panic!("templating query {q:?} is malformed"),
            },
            None => q,
        };
        if !q.trim().is_empty() {
            out.push(q);
        }
    }
    out
}

/// Panel ids, nested rows' panels included.
fn panel_ids(panels: &[Value], out: &mut Vec<u64>) {
    for p in panels {
        out.push(
            p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("panel without a numeric id: {p}")),
        );
        if let Some(nested) = p["panels"].as_array() {
            panel_ids(nested, out);
        }
    }
}

#[test]
fn the_expression_parser_finds_metric_names_only() {
    let e = r#"histogram_quantile(0.99, sum by (le, model) (rate(a_bucket{job=~"$job",x="y{z}"}[$__rate_interval]))) / on (pod) group_left (name) b_total offset 5m or vector(0) + count(max without (le) (c:d) == 1) and sum(e)"#;
    let got: Vec<String> = referenced(e).into_iter().collect();
    assert_eq!(got, ["a_bucket", "b_total", "c:d", "e"]);
    let (names, with_samples) = exported(
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\n# TYPE c counter\n# TYPE g gauge\ng 2\n# EOF\n",
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(names, ["c_total", "g", "h_bucket", "h_count", "h_sum"]);
    assert!(with_samples.contains("g") && !with_samples.contains("c_total"));
}

#[test]
fn the_dashboard_is_well_formed() {
    let text = std::fs::read_to_string(dashboard_path()).unwrap();
    let d: Value = serde_json::from_str(&text).expect("the dashboard is valid JSON");
    let panels = d["panels"].as_array().expect("a `panels` list");
    assert!(panels.len() >= 10, "only {} panels", panels.len());
    let mut ids = Vec::new();
    panel_ids(panels, &mut ids);
    let mut seen = BTreeSet::new();
    let dup: Vec<u64> = ids.iter().copied().filter(|i| !seen.insert(*i)).collect();
    assert!(dup.is_empty(), "panel ids used twice: {dup:?}");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus `datasource` templating variable"
    );
    // Every query panel reads from the variable, so the dashboard works with any data source.
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {:?} does not use the datasource variable",
            p["title"]
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {:?} has no targets", p["title"]);
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {:?}: a target without an expression",
                p["title"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_on_the_dashboard_is_exported() {
    let text = std::fs::read_to_string(dashboard_path()).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let exprs = expressions(&dashboard);
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &exprs {
        for name in referenced(e) {
            used.entry(name).or_default().push(e.clone());
        }
    }
    assert!(
        used.len() >= MIN_REFERENCED,
        "the dashboard references only {} metric names: {:?}",
        used.len(),
        used.keys()
    );

    let mut doors = FrontDoors::start(0).await;
    doors.drive().await;

    // What both processes export, read until it holds everything asked for or until the
    // deadline, and the last reading is checked. The traffic gave these families series: the
    // check is about real series, not only declarations.
    let sampled = [
        "infergate_gateway_ttft_seconds_bucket",
        "infergate_gateway_request_duration_seconds_bucket",
        "infergate_gateway_tokens_total",
        "infergate_gateway_rejections_total",
        "infergate_gateway_config_reloads_total",
        "infergate_extproc_requests_total",
        "infergate_extproc_rejections_total",
        "infergate_extproc_pick_duration_seconds_bucket",
        "infergate_extproc_ttft_seconds_bucket",
        "infergate_extproc_request_duration_seconds_bucket",
        "infergate_pod_kv_cache_usage_ratio",
        "infergate_pod_lora_adapters",
        "infergate_metrics_scrape_duration_seconds_bucket",
        "infergate_metrics_scrape_errors_total",
    ];
    let both = |pages: &[String]| {
        let mut names = BTreeSet::new();
        let mut with_samples = BTreeSet::new();
        for page in pages {
            let (n, s) = exported(page);
            names.extend(n);
            with_samples.extend(s);
        }
        (names, with_samples)
    };
    let pages = scrape_until(
        &[
            ("gateway", doors.gateway_admin),
            ("picker", doors.picker_metrics),
        ],
        Duration::from_secs(15),
        |pages| {
            let (names, with_samples) = both(pages);
            used.keys().all(|n| names.contains(n))
                && sampled.iter().all(|n| with_samples.contains(*n))
        },
    )
    .await;
    let (names, with_samples) = both(&pages);
    doors.assert_running();
    assert!(!names.is_empty(), "nothing exported");
    for name in sampled {
        assert!(
            with_samples.contains(name),
            "no samples of {name} after the requests\ngateway:\n{}\npicker:\n{}",
            doors.gateway.log(),
            doors.picker.log()
        );
    }

    let outside: Vec<&String> = names
        .iter()
        .filter(|n| !n.starts_with("infergate_"))
        .collect();
    assert!(
        outside.is_empty(),
        "exported outside the `infergate_` namespace: {outside:?}"
    );

    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| !names.contains(name.as_str()))
        .map(|(name, exprs)| format!("  {name}  (in: {})", exprs[0]))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard references {} metric name(s) that neither the gateway nor the picker \
         exports:\n{}\nexported:\n  {}",
        missing.len(),
        missing.join("\n"),
        names.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );
    eprintln!(
        "{} expressions, {} distinct metric names, all exported: {}",
        exprs.len(),
        used.len(),
        used.keys().cloned().collect::<Vec<_>>().join(", ")
    );
}
