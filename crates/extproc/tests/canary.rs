//! Model rewrites and canary splits through the endpoint picker: emulated vLLM pods serving two
//! LoRA adapters (`v1`, `v2`; any other name is a 404), the live pool, and the harness playing
//! Envoy end to end — routing, forwarding the (rewritten) body, streaming the answer back through
//! the picker, which gives it the requested name again. The rules come from a rewrites file the
//! picker reloads while it serves.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the counts are printed for the record"
)]

#[path = "common/forward.rs"]
mod forward;
#[path = "common/harness.rs"]
mod harness;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forward::{Forwarded, forward_with};
use harness::*;
use infergate_extproc::PickerConfig;
use infergate_extproc::canary::{FAIRNESS_ID_HEADER, RewriteTable};
use infergate_extproc::run::{Membership, PickerListeners, run_picker};
use infergate_metrics::ScraperConfig;
use infergate_pool::PoolConfig;
use infergate_scheduler::{EndpointMeta, EngineType, SchedulerConfig};
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, ServedFleet, serve_fleet};
use infergate_testkit::eventually;
use infergate_testkit::metric;

const PROFILE: &str = "llama-3.1-8b/h100";

fn rules(v1: u32, v2: u32) -> String {
    format!(
        "- name: canary\n  matches: [{{ model: {{ type: Exact, value: llama-canary }} }}]\n  targets: [{{ modelRewrite: v1, weight: {v1} }}, {{ modelRewrite: v2, weight: {v2} }}]\n\
- name: team-b\n  matches: [{{ model: {{ value: llama-canary }} }}]\n  tenants: [team-b]\n  targets: [{{ modelRewrite: v2 }}]\n"
    )
}

struct Picker {
    envoy: Envoy,
    table: RewriteTable,
    path: tempfile::NamedTempFile,
    _fleet: ServedFleet,
    _fleet_stop: tokio::sync::oneshot::Sender<()>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _watch_stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(v1: u32, v2: u32) -> Picker {
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get(PROFILE).unwrap().clone();
    let spec = FleetSpec {
        seed: 3,
        pods: (0..2)
            .map(|i| PodSpec {
                lora_adapters: vec!["v1".into(), "v2".into()],
                max_loras: 2,
                ..PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm)
            })
            .collect(),
    }
    .finish()
    .unwrap();
    let (fleet_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), rules(v1, v2)).unwrap();
    let table = RewriteTable::new(RewriteTable::read_file(path.path()).unwrap());
    let (watch_stop, watch_rx) = tokio::sync::oneshot::channel::<()>();
    table.watch(
        path.path().to_owned(),
        Duration::from_millis(20),
        async move {
            let _ = watch_rx.await;
        },
    );
    let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let listeners = PickerListeners {
        grpc: bind().await,
        health: bind().await,
        metrics: bind().await,
        tls: None,
        metrics_tls: None,
        peers: None,
    };
    let grpc = listeners.grpc.local_addr().unwrap();
    let metrics = listeners.metrics.local_addr().unwrap();
    let endpoints = fleet
        .pods
        .iter()
        .map(|p| EndpointMeta {
            namespace: "default".into(),
            pod: p.name.clone(),
            addr: p.addr,
            engine: EngineType::Vllm,
            gpu: None,
            labels: BTreeMap::new(),
        })
        .collect();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(run_picker(
        listeners,
        PickerConfig {
            pool_name: "llama-pool".into(),
            rewrites: table.clone(),
            ..PickerConfig::default()
        },
        PoolConfig {
            scheduler: SchedulerConfig::default(),
            scrape: ScraperConfig::default(),
            seed: 11,
        },
        Membership::Static(endpoints),
        async move {
            let _ = rx.await;
        },
    ));
    // Ready once both pods are scraped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = http_get(metrics, "/metrics").await;
        let fresh = (0..2).all(|i| {
            let name = format!("default/pod-{i}");
            metric(&m, "infergate_pod_stale", &[("name", name.as_str())]) == Some(0.0)
        });
        if fresh {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never scraped\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Picker {
        envoy: Envoy::connect(grpc).await,
        table,
        path,
        _fleet: fleet,
        _fleet_stop: fleet_stop,
        _stop: stop,
        _watch_stop: watch_stop,
    }
}

fn body(stream: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "llama-canary",
        "max_tokens": 2,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }))
    .unwrap()
}

/// The adapter a forwarded request was sent as, after checking the answer names the model the
/// client asked for.
fn served(f: &Forwarded) -> Result<&'static str, String> {
    let text = String::from_utf8_lossy(&f.body);
    if f.status != 200 {
        return Err(format!("{}: {text}", f.status));
    }
    if !text.contains(r#""model":"llama-canary""#) || text.contains(r#""model":"v"#) {
        return Err(format!(
            "the answer does not name the requested model: {text}"
        ));
    }
    let sent: serde_json::Value = serde_json::from_slice(&f.sent).unwrap();
    match sent["model"].as_str() {
        Some("v1") => Ok("v1"),
        Some("v2") => Ok("v2"),
        other => Err(format!("sent as {other:?}")),
    }
}

/// `n` requests from `tasks` concurrent clients (as `tenant`, when given): counts per adapter.
async fn burst(
    p: &Picker,
    n: usize,
    tasks: usize,
    tenant: Option<&'static str>,
) -> HashMap<&'static str, usize> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (envoy, next) = (p.envoy.clone(), Arc::clone(&next));
        handles.push(tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = tenant
                .map(|t| (FAIRNESS_ID_HEADER, t))
                .into_iter()
                .collect();
            let mut seen: HashMap<&'static str, usize> = HashMap::new();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let f = forward_with(&envoy, "/v1/chat/completions", &headers, &body(false), 4096)
                    .await;
                *seen.entry(served(&f).unwrap()).or_default() += 1;
            }
            seen
        }));
    }
    let mut total: HashMap<&'static str, usize> = HashMap::new();
    for h in handles {
        for (k, v) in h.await.unwrap() {
            *total.entry(k).or_default() += v;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_splits_90_10_over_10000_requests_and_honours_the_tenant_override() {
    let p = start(90, 10).await;
    let c = burst(&p, 10_000, 32, None).await;
    let (v1, v2) = (
        c.get("v1").copied().unwrap_or(0),
        c.get("v2").copied().unwrap_or(0),
    );
    println!("picker, 90/10 over 10000 requests: v1 {v1}, v2 {v2}");
    assert!((8_800..=9_200).contains(&v1), "v1 {v1} outside 90% ± 2%");
    assert_eq!((v1, v2), (9_000, 1_000));
    let c = burst(&p, 200, 8, Some("team-b")).await;
    println!("picker, team-b override over 200 requests: {c:?}");
    assert_eq!(c.get("v2").copied(), Some(200));
    // A streamed answer comes back under the requested name in every chunk.
    let f = forward_with(&p.envoy, "/v1/chat/completions", &[], &body(true), 4096).await;
    served(&f).unwrap();
    let text = String::from_utf8_lossy(&f.body);
    let chunks: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .collect();
    assert!(chunks.len() >= 2, "{text}");
    for c in chunks {
        let v: serde_json::Value = serde_json::from_str(c).unwrap();
        assert_eq!(v["model"], "llama-canary", "{c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_the_picker_from_90_10_to_0_100_by_reload_under_load_fails_no_request() {
    let p = start(90, 10).await;
    let phase = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Answers per (phase, adapter), as they come: the test moves on when enough have been
    // served, not after a fixed time (a loaded machine serves fewer in any given time).
    let counts: Arc<Mutex<HashMap<(usize, &'static str), usize>>> = Arc::default();
    let count = |ph: usize, m: &'static str| {
        let counts = Arc::clone(&counts);
        move || counts.lock().unwrap().get(&(ph, m)).copied().unwrap_or(0)
    };
    let mut handles = Vec::new();
    for _ in 0..16 {
        let (envoy, phase, done) = (p.envoy.clone(), Arc::clone(&phase), Arc::clone(&done));
        let counts = Arc::clone(&counts);
        handles.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let ph = phase.load(Ordering::Acquire);
                let f = forward_with(&envoy, "/v1/chat/completions", &[], &body(false), 4096).await;
                match served(&f) {
                    Ok(s) => *counts.lock().unwrap().entry((ph, s)).or_default() += 1,
                    Err(e) => failed.push(e),
                }
            }
            failed
        }));
    }
    let (v1_before, v2_before) = (count(0, "v1"), count(0, "v2"));
    eventually(
        "over 100 answers from v1 and 10 from v2 before the reload",
        || v1_before() > 100 && v2_before() > 10,
    )
    .await;
    let before = Arc::as_ptr(&*p.table.load());
    let tmp = p.path.path().with_extension("new");
    std::fs::write(&tmp, rules(0, 100)).unwrap();
    std::fs::rename(&tmp, p.path.path()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while Arc::as_ptr(&*p.table.load()) == before {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    phase.store(1, Ordering::Release);
    let v2_after = count(1, "v2");
    eventually("over 100 answers from v2 after the reload", || {
        v2_after() > 100
    })
    .await;
    done.store(true, Ordering::Relaxed);
    let mut failed = Vec::new();
    for h in handles {
        failed.extend(h.await.unwrap());
    }
    let seen = counts.lock().unwrap().clone();
    let get = |ph, m| seen.get(&(ph, m)).copied().unwrap_or(0);
    println!(
        "picker, before the reload: v1 {}, v2 {}; after: v1 {}, v2 {}; failed {}",
        get(0, "v1"),
        get(0, "v2"),
        get(1, "v1"),
        get(1, "v2"),
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(get(0, "v1") > 100 && get(0, "v2") > 10, "{seen:?}");
    assert_eq!(get(1, "v1"), 0, "{seen:?}");
    assert!(get(1, "v2") > 100, "{seen:?}");
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    infergate_testkit::get(addr, path).await.text()
}
