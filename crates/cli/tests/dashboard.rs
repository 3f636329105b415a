//! The Grafana dashboard of the Helm chart (`charts/infergate/dashboards/infergate.json`) asks
//! only for metric families that infergate really exports.
//!
//! Emulated vLLM pods (`infergate-sim`, with a LoRA adapter) run on 127.0.0.1; the real
//! `infergate gateway` and `infergate picker` binaries are started in front of them as a user
//! would, each with its own free ports. Requests go through both — plain and streamed chat through
//! the gateway's front door, one request through the picker's ext_proc stream, one unknown model —
//! so counters and histograms have series. One listed endpoint has nothing behind it (scrape
//! errors, a stale pod), the picker gets a body that is not JSON (a rejection) and the gateway's
//! file is changed once (a reload): families that appear only once counted appear. Then every metric name referenced by a PromQL
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
#[path = "../../extproc/tests/common/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{Envoy, immediate, request_body, request_headers};
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, serve_fleet};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long a process may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The emulated pods' profile.
const PROFILE: &str = "llama-3.1-8b/a10g";

/// The LoRA adapter every pod serves.
const ADAPTER: &str = "sql-lora";

/// Fewest distinct metric names the dashboard must reference (so the check cannot pass on an
/// empty or truncated dashboard).
const MIN_REFERENCED: usize = 10;

/// Identifiers of PromQL (and Grafana's templating functions) that are not metric names. A name
/// directly followed by `(` is a function and skipped anyway; this list covers the keywords and
/// aggregations that are followed by something else (`sum by (le) (...)`, `a or b`).
const NOT_METRICS: &[&str] = &[
    "abs",
    "absent",
    "and",
    "atan2",
    "avg",
    "avg_over_time",
    "bool",
    "bottomk",
    "by",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count",
    "count_values",
    "delta",
    "deriv",
    "floor",
    "group",
    "group_left",
    "group_right",
    "histogram_quantile",
    "idelta",
    "ignoring",
    "increase",
    "inf",
    "irate",
    "label_join",
    "label_replace",
    "label_values",
    "le",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "nan",
    "offset",
    "on",
    "or",
    "quantile",
    "quantile_over_time",
    "query_result",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "stddev",
    "stdvar",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "unless",
    "vector",
    "without",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn dashboard_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/infergate/dashboards/infergate.json")
}

/// A started `infergate` process, killed when dropped.
struct Proc {
    what: &'static str,
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(what: &'static str, args: &[&str], dir: &Path) -> Proc {
        let log = dir.join(format!("{what}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        Proc { what, child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the process's log if it has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}) with:\n{}", self.what, self.log());
        }
    }

    /// Waits until `GET /readyz` on `admin` answers 200.
    async fn wait_ready(&mut self, admin: SocketAddr) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            self.assert_running();
            if let Ok((200, _)) = http(admin, "GET", "/readyz", None).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready on {admin} within {READY_WITHIN:?}:\n{}",
                self.what,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `n` distinct free ports on 127.0.0.1 (all held until every one is chosen).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// One HTTP/1.1 exchange with `connection: close`: the status and the body (chunked bodies are
/// left encoded; the callers only look for names in them).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let body = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(&body).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_owned();
    Ok((status, body))
}

fn chat(model: &str, user: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 8,
        "stream": stream,
        "stream_options": { "include_usage": true },
        "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": user },
        ],
    })
}

/// Every sample name a Prometheus / OpenMetrics text page exports: each `# TYPE` family expanded
/// to the names its samples carry (`_total` for a counter, `_bucket`/`_sum`/`_count` for a
/// histogram), and the names of the sample lines themselves. Also returns the sample names that
/// have at least one sample.
fn exported(page: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut with_samples = BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            for s in suffixes {
                let full = if name.ends_with(s) {
                    name.to_owned()
                } else {
                    format!("{name}{s}")
                };
                names.insert(full);
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if !name.is_empty() {
                names.insert(name.clone());
                with_samples.insert(name);
            }
        }
    }
    (names, with_samples)
}

/// The metric names a PromQL expression references: identifiers outside label matchers, range
/// selectors, strings and label lists, that are neither keywords nor functions.
fn referenced(expr: &str) -> BTreeSet<String> {
    let c: Vec<char> = expr.chars().collect();
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let skip_ws = |mut i: usize| {
        while i < c.len() && c[i].is_whitespace() {
            i += 1;
        }
        i
    };
    // Index just past the `close` that ends the group opened at `i`, stepping over strings.
    let skip_group = |mut i: usize, close: char| {
        i += 1;
        while i < c.len() && c[i] != close {
            if matches!(c[i], '"' | '\'' | '`') {
                let q = c[i];
                i += 1;
                while i < c.len() && c[i] != q {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
            }
            i += 1;
        }
        i + 1
    };
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if matches!(ch, '"' | '\'' | '`') {
            i += 1;
            while i < c.len() && c[i] != ch {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '{' {
            i = skip_group(i, '}');
        } else if ch == '[' {
            i = skip_group(i, ']');
        } else if ch == '$' {
            // A Grafana variable: `$__rate_interval`, `${datasource}`.
            i += 1;
            if i < c.len() && c[i] == '{' {
                i = skip_group(i, '}');
            }
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration (`0.95`, `1e-3`, `5m`).
            while i < c.len() && (ident(c[i]) || c[i] == '.') {
                i += 1;
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = skip_ws(i);
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                if c.get(next) == Some(&'(') {
                    i = skip_group(next, ')');
                }
            } else if NOT_METRICS.contains(&lower.as_str()) || c.get(next) == Some(&'(') {
                // A keyword or a function.
            } else {
                out.insert(word);
            }
        } else {
            i += 1;
        }
    }
    out
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

    // (a) Emulated vLLM pods, each serving the base model and one adapter.
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get(PROFILE).unwrap().clone();
    let model = profile.model.to_string();
    let spec = FleetSpec {
        seed: 5,
        pods: (0..2)
            .map(|i| {
                let mut p = PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm);
                p.lora_adapters = vec![ADAPTER.into()];
                p
            })
            .collect(),
    }
    .finish()
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(6);
    let front = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let gateway_admin = SocketAddr::from(([127, 0, 0, 1], ports[1]));
    let (grpc, grpc_health, picker_metrics) = (ports[2], ports[3], ports[4]);
    let picker_metrics_addr = SocketAddr::from(([127, 0, 0, 1], picker_metrics));
    // Nothing listens here: its scrapes fail (`connect`) and it stays stale.
    let dead = SocketAddr::from(([127, 0, 0, 1], ports[5]));

    // (b) The gateway in front of them.
    let endpoints: Vec<Value> = fleet
        .pods
        .iter()
        .map(|p| json!({ "address": p.addr.to_string(), "name": p.name }))
        .chain(std::iter::once(
            json!({ "address": dead.to_string(), "name": "dead" }),
        ))
        .collect();
    let gateway_config = dir.path().join("gateway.yaml");
    let mut config = json!({
        "listen": front.to_string(),
        "admin": gateway_admin.to_string(),
        "reloadIntervalMs": 100,
        "retries": { "maxAttempts": 3 },
        "auth": "none",
        "models": [{
            "name": model,
            "engine": "vllm",
            "loraAdapters": [ADAPTER],
            "scheduler": { "preset": "infergate" },
            "endpoints": endpoints,
        }],
    });
    std::fs::write(&gateway_config, serde_yaml::to_string(&config).unwrap()).unwrap();
    let mut gateway = Proc::start(
        "gateway",
        &[
            "gateway",
            "--config",
            gateway_config.to_str().unwrap(),
            "--workers",
            "1",
        ],
        dir.path(),
    );

    // (c) A picker on the same pods.
    let endpoints_file = dir.path().join("endpoints.yaml");
    let file = json!({ "engine": "vllm", "endpoints": endpoints });
    std::fs::write(&endpoints_file, serde_yaml::to_string(&file).unwrap()).unwrap();
    let (grpc_s, health_s, metrics_s) = (
        grpc.to_string(),
        grpc_health.to_string(),
        picker_metrics.to_string(),
    );
    let mut picker = Proc::start(
        "picker",
        &[
            "picker",
            "--pool-name",
            "llama",
            "--endpoints-file",
            endpoints_file.to_str().unwrap(),
            "--listen-address",
            "127.0.0.1",
            "--grpc-port",
            &grpc_s,
            "--grpc-health-port",
            &health_s,
            "--metrics-port",
            &metrics_s,
        ],
        dir.path(),
    );
    gateway.wait_ready(gateway_admin).await;
    picker.wait_ready(picker_metrics_addr).await;

    // A changed file is reloaded.
    config["retries"]["maxAttempts"] = json!(2);
    std::fs::write(&gateway_config, serde_yaml::to_string(&config).unwrap()).unwrap();

    // Traffic through the gateway: plain and streamed, base model and adapter, and one unknown
    // model (a rejection).
    for (i, (m, stream)) in [
        (model.as_str(), false),
        (model.as_str(), true),
        (ADAPTER, false),
        (ADAPTER, true),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = http(
            front,
            "POST",
            "/v1/chat/completions",
            Some(&chat(m, &format!("hello {i}"), stream)),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{m} (stream {stream}): {body}");
        assert!(body.contains("usage"), "{body}");
    }
    let (status, body) = http(
        front,
        "POST",
        "/v1/chat/completions",
        Some(&chat("no-such-model", "hi", false)),
    )
    .await
    .unwrap();
    assert_eq!(status, 404, "{body}");

    // Traffic through the picker, as Envoy sends it.
    let envoy = Envoy::connect(SocketAddr::from(([127, 0, 0, 1], grpc))).await;
    for stream in [false, true] {
        let body = serde_json::to_vec(&chat(&model, "via ext_proc", stream)).unwrap();
        let f = forward::forward(&envoy, "/v1/chat/completions", &body, 64).await;
        assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
        assert_ne!(f.endpoint, dead);
    }
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(b"not json", true)).await;
    let answer = ex.next().await;
    let status = immediate(&answer).status.as_ref().map_or(0, |s| s.code);
    assert_eq!(status, 400, "{answer:?}");

    // What both processes export. Some series appear a moment after the traffic that makes
    // them (the reload, the learned rates, a failed scrape), so the pages are read until they
    // hold everything asked for, or until the deadline, and the last reading is checked.
    // The traffic above gave these families series: the check is about real series, not only
    // declarations.
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
    let deadline = Instant::now() + Duration::from_secs(15);
    let (names, with_samples) = loop {
        let mut names = BTreeSet::new();
        let mut with_samples = BTreeSet::new();
        for (what, addr) in [("gateway", gateway_admin), ("picker", picker_metrics_addr)] {
            let (status, page) = http(addr, "GET", "/metrics", None).await.unwrap();
            assert_eq!(status, 200, "{what} /metrics: {page}");
            let (n, s) = exported(&page);
            names.extend(n);
            with_samples.extend(s);
        }
        let complete = used.keys().all(|n| names.contains(n))
            && sampled.iter().all(|n| with_samples.contains(*n));
        if complete || Instant::now() > deadline {
            break (names, with_samples);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    gateway.assert_running();
    picker.assert_running();
    assert!(!names.is_empty(), "nothing exported");
    for name in sampled {
        assert!(
            with_samples.contains(name),
            "no samples of {name} after the requests\ngateway:\n{}\npicker:\n{}",
            gateway.log(),
            picker.log()
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
    drop(gateway);
    drop(picker);
    let _ = stop.send(());
}
