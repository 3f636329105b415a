//! docs/metrics.md says which families each process of infergate exports, with their types and
//! labels: this test starts the processes and holds the page to what they serve.
//!
//! The real `infergate gateway` and `infergate picker` run over emulated vLLM pods and a dead
//! endpoint, driven as `common/front_doors.rs` says (requests of each kind, an error, a reload, a
//! stale pod, pods' answers judged by outlier detection); beside them `infergate bbr` with a
//! models file, and `infergate global --config` over three clusters: the gateway, and two whose
//! front doors refuse connections (one over TLS), so that the router fails over, drains,
//! returns, ejects one and holds the other's ejection back. Each process gets requests routed
//! and refused; the router's file is changed once. Then each metrics port is read, and every
//! family a process exports must be documented for that process in docs/metrics.md, with the
//! same type and labels, and have help text; and every family documented for it must be
//! exported, with series (except those in [`CONDITIONAL`] and [`WITHOUT_SERIES`]).
//!
//! How the page is read: its tables whose first column is `Metric` and that have a `Type` column
//! list families, one a row, as `` `name{label, label}` ``. The components table (first column
//! `Component`) gives each `infergate_<component>_*` prefix the processes that export it
//! (`Exported by`) and the labels every family of it carries (`Every family also carries`;
//! "the front door's" is `model` at the gateway, `pool` at the picker). A family table may name
//! its own processes in an `Exported by` column.

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

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use front_doors::{
    ADAPTER, FrontDoors, Proc, assert_unknown_model_refused, chat, ext_proc_answer, http, local,
    sample_name, scrape_until, start_ext_proc, suffixes,
};
use harness::{Envoy, headers_answer, immediate};
use serde_json::json;

/// The processes this test starts: how the test calls each, and how the page's `Exported by`
/// columns name it.
const PROCESSES: [(&str, &str); 4] = [
    ("gateway", "gateway"),
    ("picker", "picker"),
    ("bbr", "body-based router"),
    ("global", "global router"),
];

/// Documented families that appear only under a condition this test does not make, with the
/// condition. They are not asked of the processes; when one is exported all the same it is
/// checked as any other.
const CONDITIONAL: &[(&str, &str)] = &[];

/// Families that are exported declared, but have a series only at moments this test cannot
/// hold: their labels are not compared (the rest of the check applies).
const WITHOUT_SERIES: &[(&str, &str)] = &[(
    "infergate_pod_lora_adapter_info",
    "a series per adapter only while the pod reports it with requests; idle, the pods report none",
)];

/// Fewest families the page must document (so the check cannot pass on a page that lost its
/// tables).
const MIN_DOCUMENTED: usize = 60;

/// How long the processes get to export everything asked of them after the traffic.
const EXPORTED_WITHIN: Duration = Duration::from_secs(15);

/// One family as the page documents it.
#[derive(Debug)]
struct Documented {
    kind: String,
    /// Its own labels and those of its component, the front door's excepted.
    labels: BTreeSet<String>,
    /// Whether it carries the front door's label too.
    door: bool,
    /// The processes exporting it, as [`PROCESSES`] names them.
    processes: BTreeSet<&'static str>,
}

/// One family as a process exports it.
#[derive(Debug, Default)]
struct Exported {
    kind: String,
    help: String,
    /// The labels of its samples (`le` and `quantile` left out); `None` without samples.
    labels: Option<BTreeSet<String>>,
}

fn doc_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md")
}

/// The cells of a Markdown table row (`\|` is a bar inside a cell).
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = row.strip_suffix('|').unwrap_or(row);
    let mut out = vec![String::new()];
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The page's tables: each a header and its rows, as cells.
fn tables(text: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let is_row = |l: &str| l.trim_start().starts_with('|');
        let is_rule = |l: &&str| {
            let l = l.trim();
            l.starts_with('|') && l.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
        };
        if !is_row(line) || !lines.peek().is_some_and(is_rule) {
            continue;
        }
        lines.next();
        let header = cells(line);
        let mut rows = Vec::new();
        while let Some(row) = lines.next_if(|l| is_row(l)) {
            rows.push(cells(row));
        }
        out.push((header, rows));
    }
    out
}

/// The spans of a cell between backticks.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The processes a cell of an `Exported by` column names (others, such as the operator, are
/// not started here and left out).
fn processes(cell: &str) -> BTreeSet<&'static str> {
    cell.split(',')
        .filter_map(|p| {
            PROCESSES
                .iter()
                .find(|(_, named)| p.trim() == *named)
                .map(|(ours, _)| *ours)
        })
        .collect()
}

/// `name{a, b}` as a name and its labels.
fn name_and_labels(span: &str) -> (String, BTreeSet<String>) {
    match span.split_once('{') {
        Some((name, labels)) => {
            let labels = labels.trim_end_matches('}');
            let labels = labels
                .split(',')
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect();
            (name.to_owned(), labels)
        }
        None => (span.to_owned(), BTreeSet::new()),
    }
}

/// Every family the page documents, by name; or what is wrong with its tables.
fn documented(text: &str) -> Result<BTreeMap<String, Documented>, Vec<String>> {
    let tables = tables(text);
    let column = |header: &[String], name: &str| header.iter().position(|h| h == name);
    // Component prefix → (processes, labels, front door's label).
    let mut components: Vec<(String, BTreeSet<&'static str>, BTreeSet<String>, bool)> = vec![];
    for (header, rows) in tables.iter().filter(|(h, _)| h[0] == "Component") {
        let families = column(header, "Families").expect("a Families column");
        let by = column(header, "Exported by").expect("an Exported by column");
        let carries = column(header, "Every family also carries");
        for row in rows {
            let (labels, door) = carries.map_or((BTreeSet::new(), false), |c| {
                let cell = &row[c];
                let labels = code_spans(cell).into_iter().map(str::to_owned).collect();
                (labels, cell.contains("the front door's"))
            });
            for prefix in code_spans(&row[families]) {
                let prefix = prefix.trim_end_matches('*').to_owned();
                components.push((prefix, processes(&row[by]), labels.clone(), door));
            }
        }
    }
    let mut problems = Vec::new();
    if components.is_empty() {
        problems.push("no components table (first column `Component`)".to_owned());
    }
    let mut out = BTreeMap::new();
    for (header, rows) in tables.iter().filter(|(h, _)| h[0] == "Metric") {
        let Some(kind) = column(header, "Type") else {
            continue;
        };
        let by = column(header, "Exported by");
        for row in rows {
            let Some(span) = code_spans(&row[0]).first().copied() else {
                problems.push(format!("a row without a metric name: {row:?}"));
                continue;
            };
            let (name, mut labels) = name_and_labels(span);
            let component = components
                .iter()
                .filter(|(prefix, ..)| name.starts_with(prefix.as_str()))
                .max_by_key(|(prefix, ..)| prefix.len());
            let Some((_, component_processes, common, door)) = component else {
                problems.push(format!("{name}: no row of the components table covers it"));
                continue;
            };
            labels.extend(common.iter().cloned());
            let processes = match by {
                Some(by) => processes(&row[by]),
                None => component_processes.clone(),
            };
            let family = Documented {
                kind: row[kind].clone(),
                labels,
                door: *door,
                processes,
            };
            if out.insert(name.clone(), family).is_some() {
                problems.push(format!("{name}: documented twice"));
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The label names of a sample line (after the metric name), skipping the values.
fn sample_labels(line: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(rest) = line.strip_prefix(sample_name(line)) else {
        return out;
    };
    let Some(rest) = rest.strip_prefix('{') else {
        return out;
    };
    let mut chars = rest.chars();
    let mut name = String::new();
    while let Some(c) = chars.next() {
        match c {
            '=' => {
                // The quoted value.
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                out.insert(std::mem::take(&mut name));
            }
            '}' => break,
            ',' | ' ' => {}
            c => name.push(c),
        }
    }
    out
}

/// Every family a Prometheus / OpenMetrics text page exports, by the name the page documents it
/// under: a counter's with `_total`.
fn exported(page: &str) -> BTreeMap<String, Exported> {
    let mut help = BTreeMap::new();
    // Sample name → family name.
    let mut samples = BTreeMap::new();
    let mut out: BTreeMap<String, Exported> = BTreeMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_owned(), text.trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let family = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            for s in suffixes(kind) {
                let sample = if name.ends_with(s) {
                    name.to_owned()
                } else {
                    format!("{name}{s}")
                };
                samples.insert(sample, family.clone());
            }
            out.insert(
                family,
                Exported {
                    kind: kind.to_owned(),
                    help: help.get(name).cloned().unwrap_or_default(),
                    labels: None,
                },
            );
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let sample = sample_name(line);
            let family = samples.get(sample).cloned().unwrap_or(sample.to_owned());
            let mut labels = sample_labels(line);
            labels.remove("le");
            labels.remove("quantile");
            out.entry(family)
                .or_default()
                .labels
                .get_or_insert_with(BTreeSet::new)
                .extend(labels);
        }
    }
    out
}

/// The front door's own label of a process.
fn door_label(process: &str) -> Option<&'static str> {
    match process {
        "gateway" => Some("model"),
        "picker" => Some("pool"),
        _ => None,
    }
}

/// The labels `family` must have at `process`.
fn expected_labels(family: &Documented, process: &str) -> BTreeSet<String> {
    let mut labels = family.labels.clone();
    if family.door
        && let Some(door) = door_label(process)
    {
        labels.insert(door.to_owned());
    }
    labels
}

fn listed(list: &[(&str, &str)], name: &str) -> bool {
    list.iter().any(|(n, _)| *n == name)
}

/// What is wrong between the page and what `process` exports.
fn compare(
    docs: &BTreeMap<String, Documented>,
    process: &str,
    got: &BTreeMap<String, Exported>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, e) in got {
        let Some(d) = docs.get(name).filter(|d| d.processes.contains(process)) else {
            problems.push(format!(
                "{process} exports {name} ({}), not documented for it",
                e.kind
            ));
            continue;
        };
        if d.kind != e.kind {
            problems.push(format!(
                "{process}: {name} is documented as a {}, exported as a {}",
                d.kind, e.kind
            ));
        }
        if e.help.is_empty() {
            problems.push(format!("{process}: {name} is exported without help text"));
        }
        match &e.labels {
            Some(labels) => {
                let want = expected_labels(d, process);
                if *labels != want {
                    problems.push(format!(
                        "{process}: {name} is documented with labels {want:?}, exported with \
                         {labels:?}"
                    ));
                }
            }
            None if !listed(WITHOUT_SERIES, name) => problems.push(format!(
                "{process}: {name} is exported without a series after the traffic (its labels \
                 cannot be compared)"
            )),
            None => {}
        }
    }
    for (name, d) in docs {
        if d.processes.contains(process) && !got.contains_key(name) && !listed(CONDITIONAL, name) {
            problems.push(format!(
                "{process}: {name} is documented for it, not exported"
            ));
        }
    }
    problems
}

/// Whether `process`'s page has every family asked of it, with series where they can be had.
fn complete(docs: &BTreeMap<String, Documented>, process: &str, page: &str) -> bool {
    let got = exported(page);
    docs.iter()
        .filter(|(name, d)| d.processes.contains(process) && !listed(CONDITIONAL, name))
        .all(|(name, _)| {
            got.get(name)
                .is_some_and(|e| e.labels.is_some() || listed(WITHOUT_SERIES, name))
        })
}

#[test]
fn the_page_and_the_exposition_are_read_as_written() {
    let page = "\
| Component | Families | Registered by | Exported by | Every family also carries |
|---|---|---|---|---|
| `a` | `infergate_a_*` | a | gateway, picker | `pod`, the front door's |
| `b` | `infergate_b_*`, `infergate_b_c_*` | b | global router, operator | — |

| Engine | Metric | Type |
|---|---|---|
| vLLM | `vllm:x` | gauge |

| Metric | Type | Exported by | Meaning |
|---|---|---|---|
| `infergate_a_x_total{state}` | counter | picker | `a\\|b` |
| `infergate_b_c_y` | histogram | body-based router | |
| `infergate_b_z` | gauge | | |
";
    let docs = documented(page).unwrap();
    assert_eq!(
        docs.keys().collect::<Vec<_>>(),
        ["infergate_a_x_total", "infergate_b_c_y", "infergate_b_z"]
    );
    let x = &docs["infergate_a_x_total"];
    assert_eq!(x.kind, "counter");
    assert_eq!(x.processes, BTreeSet::from(["picker"]));
    assert_eq!(
        expected_labels(x, "picker"),
        BTreeSet::from(["pod", "pool", "state"].map(String::from))
    );
    assert_eq!(docs["infergate_b_c_y"].processes, BTreeSet::from(["bbr"]));
    assert_eq!(docs["infergate_b_z"].processes, BTreeSet::new());

    let got = exported(
        "# HELP c_total Counted.\n# TYPE c_total counter\nc_total{a=\"x,y\",b=\"}\\\"\"} 1\n\
         # HELP h Timed.\n# TYPE h histogram\nh_bucket{le=\"1\",pool=\"p\"} 1\nh_sum{pool=\"p\"} 1\n\
         # TYPE g gauge\n# EOF\n",
    );
    assert_eq!(
        got["c_total"].labels,
        Some(BTreeSet::from(["a", "b"].map(String::from)))
    );
    assert_eq!(got["h"].labels, Some(BTreeSet::from(["pool".to_owned()])));
    assert_eq!(
        (got["h"].kind.as_str(), got["h"].help.as_str()),
        ("histogram", "Timed.")
    );
    assert_eq!(
        (got["g"].labels.as_ref(), got["g"].help.as_str()),
        (None, "")
    );
}

#[test]
fn the_lists_of_exceptions_name_documented_families() {
    let docs = documented(&std::fs::read_to_string(doc_path()).unwrap())
        .unwrap_or_else(|problems| panic!("docs/metrics.md:\n  {}", problems.join("\n  ")));
    assert!(
        docs.len() >= MIN_DOCUMENTED,
        "docs/metrics.md documents only {} families",
        docs.len()
    );
    for (name, why) in CONDITIONAL.iter().chain(WITHOUT_SERIES) {
        assert!(docs.contains_key(*name), "{name} ({why}) is not documented");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exported_family_is_documented_and_every_documented_one_exported() {
    let docs = documented(&std::fs::read_to_string(doc_path()).unwrap())
        .unwrap_or_else(|problems| panic!("docs/metrics.md:\n  {}", problems.join("\n  ")));

    let mut doors = FrontDoors::start(5).await;
    let p = doors.spare_ports.clone();
    let (bbr_grpc, bbr_metrics) = (local(p[0]), local(p[2]));
    let (global_front, global_admin) = (local(p[3]), local(p[4]));
    let dir = doors.dir.path().to_owned();

    // The body-based router, for the pods' model and adapter.
    let models = dir.join("models.yaml");
    std::fs::write(&models, format!("{}: [{ADAPTER}]\n", doors.model)).unwrap();
    let models = models.to_str().unwrap();
    let mut bbr = start_ext_proc("bbr", &["--models", models], [p[0], p[1], p[2]], &dir);

    // The global router over three clusters, all with the gateway's heartbeat: the gateway,
    // with a token file (its reloads are exported), and two cheaper ones whose front doors refuse
    // connections, so that each request fails over from them; one is reached over TLS (its CA's
    // expiry is exported). Their refusals drain them, the next heartbeat returns them, and
    // outlier detection ejects the first and holds the second back (one cluster in three at
    // most); the failure percentage of each cluster's last interval is judged.
    let token = dir.join("east-token");
    std::fs::write(&token, "east-secret\n").unwrap();
    let ca = infergate_testkit::tls::TestCa::new("metrics doc CA").write_ca(&dir);
    let heartbeat = format!("http://{}/heartbeat", doors.gateway_admin);
    let models = [doors.model.as_str(), ADAPTER];
    let global_file = dir.join("global.yaml");
    let mut global_config = json!({
        "listen": global_front.to_string(),
        "admin": global_admin.to_string(),
        "auth": "none",
        "reloadIntervalMs": 100,
        "heartbeat": { "intervalMs": 100, "failuresToDrain": 1 },
        "retries": { "maxAttempts": 3 },
        "outlierDetection": {
            "consecutiveGatewayFailures": 1,
            "maxEjectionPercent": 50,
            "failurePercentage": { "minimumRequests": 1, "intervalMs": 1 },
        },
        "clusters": [
            {
                "name": "east",
                "url": format!("http://{}", doors.front),
                "heartbeatUrl": heartbeat,
                "region": "us-east",
                "cost": { "inputPerMillion": 0.5, "outputPerMillion": 1.0 },
                "credentials": { "bearerTokenFile": token.to_str().unwrap() },
            },
            {
                "name": "west",
                "url": format!("http://{}", doors.dead),
                "heartbeatUrl": heartbeat,
                "region": "us-west",
                "models": models,
                "cost": { "inputPerMillion": 0.05, "outputPerMillion": 0.1 },
            },
            {
                "name": "north",
                "url": format!("https://{}", doors.dead),
                "heartbeatUrl": heartbeat,
                "region": "us-north",
                "models": models,
                "cost": { "inputPerMillion": 0.1, "outputPerMillion": 0.2 },
                "tls": { "caFile": ca.to_str().unwrap() },
            },
        ],
    });
    std::fs::write(&global_file, serde_yaml::to_string(&global_config).unwrap()).unwrap();
    let mut global = Proc::start(
        "global",
        &["global", "--config", global_file.to_str().unwrap()],
        &dir,
    );
    bbr.wait_ready(bbr_metrics).await;
    global.wait_ready(global_admin).await;

    doors.drive().await;
    drive_bbr(bbr_grpc, &doors.model).await;
    global_config["clusters"][0]["cost"]["inputPerMillion"] = json!(0.6);
    std::fs::write(&global_file, serde_yaml::to_string(&global_config).unwrap()).unwrap();
    drive_global(global_front, global_admin, &doors.model).await;
    let ports: Vec<(&str, SocketAddr)> = vec![
        ("gateway", doors.gateway_admin),
        ("picker", doors.picker_metrics),
        ("bbr", bbr_metrics),
        ("global", global_admin),
    ];
    let pages = scrape_until(&ports, EXPORTED_WITHIN, |pages| {
        ports
            .iter()
            .zip(pages)
            .all(|((process, _), page)| complete(&docs, process, page))
    })
    .await;
    doors.assert_running();
    bbr.assert_running();
    global.assert_running();

    let mut problems = Vec::new();
    for ((process, _), page) in ports.iter().zip(&pages) {
        problems.extend(compare(&docs, process, &exported(page)));
    }
    assert!(
        problems.is_empty(),
        "docs/metrics.md and the processes disagree ({} problems):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
    let checked: usize = ports
        .iter()
        .zip(&pages)
        .map(|(_, page)| exported(page).len())
        .sum();
    eprintln!(
        "{} families documented; {checked} exported by the four processes, all as documented",
        docs.len()
    );
}

/// Through the body-based router, as Envoy sends it: the adapter routed, an unknown model and a
/// body that is not JSON refused.
async fn drive_bbr(grpc: SocketAddr, model: &str) {
    let envoy = Envoy::connect(grpc).await;
    let routed = serde_json::to_vec(&chat(ADAPTER, "hi", false)).unwrap();
    let unknown = serde_json::to_vec(&chat("no-such-model", "hi", false)).unwrap();
    for (body, status) in [
        (routed, None),
        (unknown, Some(404)),
        (b"not json".to_vec(), Some(400)),
    ] {
        let answer = ext_proc_answer(&envoy, &body).await;
        match status {
            None => {
                let route = headers_answer(&answer);
                let base = route.header("x-gateway-base-model-name");
                assert_eq!(base, Some(model), "{route:?}");
            }
            Some(status) => {
                let got = immediate(&answer).status.as_ref().map_or(0, |s| s.code);
                assert_eq!(got, status, "{answer:?}");
            }
        }
    }
}

/// Through the global router: plain and streamed requests (each failed over from the clusters
/// that refuse) until its page shows the failovers, drains, returns, ejection and held-back
/// ejection they lead to, and an unknown model refused.
async fn drive_global(front: SocketAddr, admin: SocketAddr, model: &str) {
    let wanted = [
        "infergate_global_failovers_total{",
        "infergate_global_cluster_drains_total{",
        "infergate_global_cluster_returns_total{",
        "infergate_global_cluster_ejections_total{",
        "infergate_global_cluster_ejections_held_back_total{",
        "infergate_global_cluster_failure_percent{",
    ];
    let deadline = std::time::Instant::now() + EXPORTED_WITHIN;
    for i in 0.. {
        let stream = i % 2 == 1;
        let (status, body) = http(
            front,
            "POST",
            "/v1/chat/completions",
            Some(&chat(model, "via the router", stream)),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{body}");
        let (_, page) = http(admin, "GET", "/metrics", None).await.unwrap();
        let missing: Vec<&&str> = wanted.iter().filter(|w| !page.contains(**w)).collect();
        if missing.is_empty() && i >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {missing:?} on the router's page after {} requests:\n{page}",
            i + 1
        );
    }
    assert_unknown_model_refused(front).await;
}
