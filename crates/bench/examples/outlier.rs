//! What outlier detection buys, live: the release `infergate gateway` in front of an emulated
//! fleet in which one pod answers every inference request with 500 while its `/metrics` page
//! stays normal, run without and with `outlierDetection` on the same seeded arrivals.
//!
//! ```text
//! cargo build --release -p infergate-cli
//! cargo run --release -p infergate-bench --example outlier
//! ```
//!
//! The fleet and the workload are a scenario file's (`--scenario`, default
//! `benches/outlier/one-failing-pod-llama-8b.yaml`); the pod named by `--failing` (default the
//! fleet's last) gets `error_rate: 1.0`. For each run the example serves a fresh fleet in this
//! process, writes `OUT/gateway-RUN.yaml` (`--out`, default `target/outlier`; `scheduler: {
//! preset: infergate }`, `retries: { maxAttempts: --max-attempts }`, default 3; for the first
//! run `outlierDetection: null` (off: the preset has it on), for the second `outlierDetection: {
//! consecutive5xx: --consecutive5xx }`, default 5, the other fields at their defaults), starts the gateway binary (`--bin`, default
//! `target/release/infergate`) on it, its warnings (`endpoint ejected`) in
//! `OUT/gateway-RUN.log`, and sends the scenario's arrivals for `--seed` (default the
//! scenario's first) open loop as streamed chat requests, with the bench's live-mode client
//! ([`infergate_bench::live::one_request`]: TTFT from sending to the first SSE event with text).
//! Once every answer is in it reads the gateway's `/metrics` (attempts per endpoint, retries,
//! ejections) and the failing pod's own (`http_requests_total` with status `5xx`), saved as
//! `OUT/gateway-metrics-RUN.txt` and `OUT/failing-pod-metrics-RUN.txt`, and writes the table to
//! `OUT/summary.md` and stdout.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool"
)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infergate_bench::Scenario;
use infergate_bench::live::{GatewayScrape, Outcome, gateway_endpoints, one_request};
use infergate_bench::stats::Percentiles;
use infergate_bench::workload::{self, Arrival};
use infergate_sim::{Catalog, FleetSpec};
use tokio::task::JoinSet;

#[path = "common/process.rs"]
mod process;

use process::{free_port, stop};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Args {
    scenario: PathBuf,
    failing: Option<String>,
    seed: Option<u64>,
    consecutive_5xx: u32,
    max_attempts: u32,
    bin: PathBuf,
    out: PathBuf,
}

fn args() -> Result<Args, BoxError> {
    let mut a = Args {
        scenario: PathBuf::from("benches/outlier/one-failing-pod-llama-8b.yaml"),
        failing: None,
        seed: None,
        consecutive_5xx: 5,
        max_attempts: 3,
        bin: PathBuf::from("target/release/infergate"),
        out: PathBuf::from("target/outlier"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--scenario" => a.scenario = value()?.into(),
            "--failing" => a.failing = Some(value()?),
            "--seed" => a.seed = Some(value()?.parse()?),
            "--consecutive5xx" => a.consecutive_5xx = value()?.parse()?,
            "--max-attempts" => a.max_attempts = value()?.parse()?,
            "--bin" => a.bin = value()?.into(),
            "--out" => a.out = value()?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: outlier [--scenario FILE] [--failing POD] \
                     [--seed N] [--consecutive5xx 5] [--max-attempts 3] [--bin PATH] [--out DIR]"
                )
                .into());
            }
        }
    }
    Ok(a)
}

/// What one run measured.
struct Measured {
    requests: usize,
    completed: usize,
    rejected: usize,
    failed: usize,
    ttft: Percentiles,
    /// The failing pod's own count of inference requests it answered 5xx.
    failing_5xx: f64,
    /// Attempts the gateway sent to the failing pod, and to every pod.
    failing_picks: f64,
    picks: f64,
    retries: f64,
    ejections: f64,
    held_back: f64,
}

/// Sums the samples of family `name` whose labels include every `key="value"` of `labels`, in a
/// Prometheus text page.
fn sum(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (family, rest) = series.split_once('{').unwrap_or((series, ""));
            (family == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

async fn get(client: &HttpClient, url: &str) -> Result<(u16, String), BoxError> {
    let req = http::Request::get(url).body(Full::new(Bytes::new()))?;
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn gateway_yaml(
    scenario: &Scenario,
    spec: &FleetSpec,
    pods: &[(String, SocketAddr)],
    ports: (u16, u16),
    seed: u64,
    max_attempts: u32,
    outlier: Option<u32>,
) -> Result<String, BoxError> {
    let scrape = GatewayScrape::for_scenario(&scenario.scrape);
    let endpoints = gateway_endpoints(spec, pods);
    // The preset turns outlier detection on: the run without it says `null`.
    let mut scheduler = serde_json::json!({ "preset": "infergate" });
    scheduler["outlierDetection"] = match outlier {
        Some(n) => serde_json::json!({ "consecutive5xx": n }),
        None => serde_json::Value::Null,
    };
    let model = spec.pods.first().map(|p| p.model.to_string());
    let cfg = serde_json::json!({
        "listen": format!("127.0.0.1:{}", ports.0),
        "admin": format!("127.0.0.1:{}", ports.1),
        "seed": seed,
        "auth": "none",
        "retries": { "maxAttempts": max_attempts },
        "scrape": {
            "intervalMs": scrape.interval_ms,
            "staleAfterMs": scrape.stale_after_ms,
            "timeoutMs": scrape.timeout_ms,
            "maxLateMs": scrape.max_late_ms,
        },
        "models": [{ "name": model, "scheduler": scheduler, "endpoints": endpoints }],
    });
    Ok(serde_yaml::to_string(&cfg)?)
}

/// One run: a fresh fleet with the failing pod, the gateway on its own configuration, the
/// arrivals, then both metrics pages.
async fn run(
    a: &Args,
    scenario: &Scenario,
    spec: &FleetSpec,
    failing: usize,
    arrivals: &Arc<Vec<Arrival>>,
    seed: u64,
    (label, outlier): (&str, Option<u32>),
) -> Result<Measured, BoxError> {
    let (stop_fleet, fleet_stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = infergate_sim::serve_fleet(spec, async {
        let _ = fleet_stopped.await;
    })
    .await?;
    let pods = fleet.addrs();
    let ports = (free_port()?, free_port()?);
    let config = a.out.join(format!("gateway-{label}.yaml"));
    std::fs::write(
        &config,
        gateway_yaml(scenario, spec, &pods, ports, seed, a.max_attempts, outlier)?,
    )?;
    let checked = Command::new(&a.bin)
        .args(["gateway", "--check", "-c"])
        .arg(&config)
        .output()?;
    if !checked.status.success() {
        return Err(format!(
            "{} rejects {}: {}",
            a.bin.display(),
            config.display(),
            String::from_utf8_lossy(&checked.stderr)
        )
        .into());
    }
    let log = std::fs::File::create(a.out.join(format!("gateway-{label}.log")))?;
    let mut child = Command::new(&a.bin)
        .args(["gateway", "-c"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    let admin = format!("http://127.0.0.1:{}", ports.1);
    // Ready once every pod's metrics are fresh (`/readyz` asks for one), then a few more scrapes.
    let ready = async {
        while !matches!(get(&client, &format!("{admin}/readyz")).await, Ok((200, _))) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), ready)
        .await
        .is_err()
    {
        stop(&mut child);
        return Err("the gateway was not ready within 30 s".into());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let url: Arc<str> = format!("http://127.0.0.1:{}/v1/chat/completions", ports.0).into();
    let model: Arc<str> = spec
        .pods
        .first()
        .map(|p| p.model.clone())
        .unwrap_or_default();
    eprintln!(
        "outlier: run {label}: {} requests over {} s to {url}, pod {} failing",
        arrivals.len(),
        scenario.workload.duration_s,
        pods[failing].0
    );
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = JoinSet::new();
    for arrival in arrivals.iter() {
        let (client, url, model, arrival) =
            (client.clone(), url.clone(), model.clone(), arrival.clone());
        tasks.spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(arrival.at)).await;
            one_request(&client, &url, &model, &arrival, start).await
        });
    }
    let mut ttft = Vec::new();
    let (mut rejected, mut failed) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Outcome::Done { ttft: t, .. }) => ttft.push(t * 1000.0),
            Ok(Outcome::Rejected) => rejected += 1,
            Ok(Outcome::Failed(_)) | Err(_) => failed += 1,
        }
    }
    let gateway_page = get(&client, &format!("{admin}/metrics")).await;
    let pod_page = get(&client, &format!("http://{}/metrics", pods[failing].1)).await;
    stop(&mut child);
    let _ = stop_fleet.send(());
    fleet.wait().await;
    let (_, gateway_page) = gateway_page?;
    let (_, pod_page) = pod_page?;
    std::fs::write(
        a.out.join(format!("gateway-metrics-{label}.txt")),
        &gateway_page,
    )?;
    std::fs::write(
        a.out.join(format!("failing-pod-metrics-{label}.txt")),
        &pod_page,
    )?;
    let failing_addr = pods[failing].1.to_string();
    Ok(Measured {
        requests: arrivals.len(),
        completed: ttft.len(),
        rejected,
        failed,
        ttft: Percentiles::of(&mut ttft),
        failing_5xx: sum(
            &pod_page,
            "http_requests_total",
            &[("handler", "/v1/chat/completions"), ("status", "5xx")],
        ),
        failing_picks: sum(
            &gateway_page,
            "infergate_gateway_picks_total",
            &[("endpoint", &failing_addr)],
        ),
        picks: sum(&gateway_page, "infergate_gateway_picks_total", &[]),
        retries: sum(&gateway_page, "infergate_gateway_retries_total", &[]),
        ejections: sum(
            &gateway_page,
            "infergate_pool_endpoint_ejections_total",
            &[],
        ),
        held_back: sum(
            &gateway_page,
            "infergate_pool_endpoint_ejections_held_back_total",
            &[],
        ),
    })
}

fn table(a: &Args, off: &Measured, on: &Measured) -> String {
    let ratio = |x: f64, y: f64| {
        if y > 0.0 {
            format!("{:.2}", x / y)
        } else {
            "–".to_owned()
        }
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| | without outlierDetection | with `{{ consecutive5xx: {} }}` | with / without |\n|---|---|---|---|",
        a.consecutive_5xx
    );
    let mut row = |k: &str, x: f64, y: f64, decimals: usize| {
        let _ = writeln!(
            md,
            "| {k} | {x:.decimals$} | {y:.decimals$} | {} |",
            ratio(y, x)
        );
    };
    let n = |v: usize| v as f64;
    row("requests sent", n(off.requests), n(on.requests), 0);
    row(
        "answered 200 with text",
        n(off.completed),
        n(on.completed),
        0,
    );
    row(
        "client-visible errors (other status, broken stream)",
        n(off.failed),
        n(on.failed),
        0,
    );
    row("rejected (429/503)", n(off.rejected), n(on.rejected), 0);
    row(
        "attempts sent to the failing pod (gateway picks_total)",
        off.failing_picks,
        on.failing_picks,
        0,
    );
    row(
        "500s the failing pod answered (its http_requests_total)",
        off.failing_5xx,
        on.failing_5xx,
        0,
    );
    row("attempts in all (picks_total)", off.picks, on.picks, 0);
    row("retries_total", off.retries, on.retries, 0);
    row(
        "pool_endpoint_ejections_total",
        off.ejections,
        on.ejections,
        0,
    );
    row(
        "pool_endpoint_ejections_held_back_total",
        off.held_back,
        on.held_back,
        0,
    );
    row("TTFT P50 (ms)", off.ttft.p50, on.ttft.p50, 1);
    row("TTFT P95 (ms)", off.ttft.p95, on.ttft.p95, 1);
    row("TTFT P99 (ms)", off.ttft.p99, on.ttft.p99, 1);
    md
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    std::fs::create_dir_all(&a.out)?;
    let origin = a.scenario.display().to_string();
    let scenario = Scenario::from_file(&a.scenario)?;
    let mut spec = scenario.fleet_spec(&Catalog::builtin()?, &origin)?;
    let failing = match &a.failing {
        Some(name) => spec
            .pods
            .iter()
            .position(|p| &p.name == name)
            .ok_or_else(|| format!("no pod named {name} in {origin}"))?,
        None => spec
            .pods
            .len()
            .checked_sub(1)
            .ok_or("the fleet has no pods")?,
    };
    spec.pods[failing].faults.error_rate = 1.0;
    let seed = a
        .seed
        .or_else(|| scenario.seeds.first().copied())
        .unwrap_or(1);
    let arrivals = Arc::new(workload::generate(&scenario.workload, seed));
    let load = |when: &str| {
        let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        format!(
            "load average {when}: {}",
            l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        )
    };
    let load_before = load("before");
    let mut measured = Vec::new();
    for run_as in [("off", None), ("on", Some(a.consecutive_5xx))] {
        measured.push(run(&a, &scenario, &spec, failing, &arrivals, seed, run_as).await?);
    }
    let [off, on] = <[Measured; 2]>::try_from(measured).map_err(|_| "two runs")?;
    let mut md = format!(
        "Outlier detection, live: {origin}, seed {seed}, pod {} answering 500 to every \
         inference request, `scheduler: {{ preset: infergate }}`, `retries: {{ maxAttempts: {} }}`, \
         gateway {}.\n\n",
        spec.pods[failing].name,
        a.max_attempts,
        a.bin.display()
    );
    md.push_str(&table(&a, &off, &on));
    let _ = writeln!(md, "\n{load_before}; {}", load("after"));
    std::fs::write(a.out.join("summary.md"), &md)?;
    println!("{md}");
    Ok(())
}
