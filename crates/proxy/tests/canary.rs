//! Model rewrites and canary splits (`rewrites:`) through the real gateway, in front of emulated
//! vLLM pods (`infergate-sim`) that answer 404 for any model they do not serve — so a request
//! that reached a pod under the wrong name fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the counts are printed for the record"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig};
use infergate_sim::{FleetSpec, ServedFleet, serve_fleet};
use infergate_testkit::eventually;
use upstream::{get, send, serve_gateway};

const KEY_A: &str = "sk-canary-team-a";
const KEY_B: &str = "sk-canary-team-b";

fn sha256_hex(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Pod `a` serves `llama-v1`, pod `b` serves `llama-v2`; the gateway serves both as models of
/// their own, and `llama` as a rewrite with weights `v1`/`v2` (team-b always gets `v2`).
struct Rig {
    gw: Gateway,
    fleet: Option<ServedFleet>,
    fleet_stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pods: HashMap<SocketAddr, &'static str>,
    addrs: [SocketAddr; 2],
    path: tempfile::NamedTempFile,
}

fn config(addrs: [SocketAddr; 2], v1: u32, v2: u32) -> String {
    let (a, b) = (sha256_hex(KEY_A), sha256_hex(KEY_B));
    let (pa, pb) = (addrs[0], addrs[1]);
    [
        "auth:".to_owned(),
        "  apiKeys:".to_owned(),
        "    keys:".to_owned(),
        format!("      - {{ sha256: {a}, tenant: team-a, models: [llama] }}"),
        format!("      - {{ sha256: {b}, tenant: team-b, models: [llama] }}"),
        "reloadIntervalMs: 20".to_owned(),
        "retries: { maxAttempts: 1 }".to_owned(),
        "models:".to_owned(),
        format!("  - {{ name: llama-v1, scheduler: {{ preset: infergate }}, endpoints: [{pa}] }}"),
        format!("  - {{ name: llama-v2, scheduler: {{ preset: infergate }}, endpoints: [{pb}] }}"),
        "rewrites:".to_owned(),
        "  - name: llama-canary".to_owned(),
        "    matches: [{ model: { type: Exact, value: llama } }]".to_owned(),
        format!(
            "    targets: [{{ modelRewrite: llama-v1, weight: {v1} }}, {{ modelRewrite: llama-v2, weight: {v2} }}]"
        ),
        "  - name: team-b-on-v2".to_owned(),
        "    matches: [{ model: { type: Exact, value: llama } }]".to_owned(),
        "    tenants: [team-b]".to_owned(),
        "    targets: [{ modelRewrite: llama-v2 }]".to_owned(),
    ]
    .join("\n")
}

impl Rig {
    async fn start(v1: u32, v2: u32) -> Rig {
        let spec = FleetSpec::from_yaml(
            "seed: 11\npods:\n  - { name: a, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama-v1 }\n  - { name: b, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama-v2 }\n",
        )
        .unwrap();
        let (fleet_stop, fleet_rx) = tokio::sync::oneshot::channel::<()>();
        let fleet = serve_fleet(&spec, async move {
            let _ = fleet_rx.await;
        })
        .await
        .unwrap();
        let a = fleet.addrs();
        let addrs = [a[0].1, a[1].1];
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), config(addrs, v1, v2)).unwrap();
        let cfg = GatewayConfig::from_file(path.path()).unwrap();
        let (gw, stop) = serve_gateway(cfg).await;
        let admin = gw.admin_addr().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while get(admin, "/readyz").await.0 != 200 {
            assert!(tokio::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pods = HashMap::from([(addrs[0], "llama-v1"), (addrs[1], "llama-v2")]);
        Rig {
            gw,
            fleet: Some(fleet),
            fleet_stop: Some(fleet_stop),
            stop: Some(stop),
            pods,
            addrs,
            path,
        }
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.gw.wait().await;
        self.fleet_stop.take().unwrap().send(()).unwrap();
        self.fleet.take().unwrap().wait().await;
    }
}

/// One request for `llama` as `key`: the served model that answered (by the pod that did),
/// after checking the status and that the answer names `llama`.
async fn ask(
    gw: SocketAddr,
    pods: &HashMap<SocketAddr, &'static str>,
    key: &str,
    stream: bool,
) -> Result<&'static str, String> {
    let body = format!(
        r#"{{"model":"llama","max_tokens":2,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let auth = format!("Bearer {key}");
    let (status, headers, body) = send(
        gw,
        "POST",
        "/v1/chat/completions",
        &body,
        &[("authorization", &auth)],
    )
    .await;
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        return Err(format!("{status}: {text}"));
    }
    if !text.contains(r#""model":"llama""#) || text.contains("llama-v") {
        return Err(format!(
            "the answer does not name the requested model: {text}"
        ));
    }
    let ep: SocketAddr = headers["x-infergate-endpoint"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    Ok(pods[&ep])
}

/// `n` requests from `tasks` concurrent clients; counts per served model and the failures.
async fn burst(
    rig: &Rig,
    key: &'static str,
    n: usize,
    tasks: usize,
) -> HashMap<&'static str, usize> {
    let gw = rig.gw.http_addr();
    let pods = Arc::new(rig.pods.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (pods, next) = (Arc::clone(&pods), Arc::clone(&next));
        handles.push(tokio::spawn(async move {
            let mut seen: HashMap<&'static str, usize> = HashMap::new();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let served = ask(gw, &pods, key, false).await.unwrap();
                *seen.entry(served).or_default() += 1;
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
async fn a_90_10_split_holds_over_10000_requests_and_tenants_get_their_override() {
    let rig = Rig::start(90, 10).await;
    let c = burst(&rig, KEY_A, 10_000, 32).await;
    let (v1, v2) = (
        c.get("llama-v1").copied().unwrap_or(0),
        c.get("llama-v2").copied().unwrap_or(0),
    );
    println!("90/10 over 10000 requests: llama-v1 {v1}, llama-v2 {v2}");
    assert_eq!(v1 + v2, 10_000);
    // The split is a deterministic weighted round-robin: exact over whole cycles of ten.
    assert!((8_800..=9_200).contains(&v1), "v1 {v1} outside 90% ± 2%");
    assert_eq!((v1, v2), (9_000, 1_000));
    // team-b's own rule sends all of its requests to v2.
    let c = burst(&rig, KEY_B, 200, 8).await;
    println!("team-b override over 200 requests: {c:?}");
    assert_eq!(c.get("llama-v2").copied(), Some(200));
    assert_eq!(c.get("llama-v1"), None);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_whole_answers_keep_the_requested_name() {
    let rig = Rig::start(1, 1).await;
    let gw = rig.gw.http_addr();
    let mut served = Vec::new();
    for stream in [false, true, false, true] {
        served.push(ask(gw, &rig.pods, KEY_A, stream).await.unwrap());
    }
    // 1/1 alternates, so both served models answered both kinds.
    assert_eq!(served, ["llama-v1", "llama-v2", "llama-v1", "llama-v2"]);
    // A streamed answer: every chunk names `llama`, and the stream ends with [DONE].
    let body = r#"{"model":"llama","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let auth = format!("Bearer {KEY_B}");
    let (status, headers, bytes) = send(
        gw,
        "POST",
        "/v1/chat/completions",
        body,
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(status, 200);
    assert!(headers.get("content-length").is_none());
    let text = String::from_utf8_lossy(&bytes);
    let chunks: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .collect();
    assert!(chunks.len() >= 3, "{text}");
    for c in &chunks {
        let v: serde_json::Value = serde_json::from_str(c).unwrap();
        assert_eq!(v["model"], "llama", "{c}");
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The served names stay callable as themselves, unrewritten.
    let (status, _, bytes) = send(
        gw,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"llama-v2","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#,
        &[("authorization", &auth)],
    )
    .await;
    // team-b may call `llama` only.
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&bytes));
    rig.stop().await;
}

async fn reloads_ok(admin: SocketAddr) -> u64 {
    let (_, m) = get(admin, "/metrics").await;
    m.lines()
        .find(|l| l.starts_with(r#"infergate_gateway_config_reloads_total{result="ok"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_90_10_to_0_100_by_reload_under_load_fails_no_request() {
    let rig = Rig::start(90, 10).await;
    let (stop_watch, watch_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = rig
        .gw
        .handle()
        .watch_file(rig.path.path().to_owned(), async move {
            let _ = watch_rx.await;
        });
    let gw = rig.gw.http_addr();
    let admin = rig.gw.admin_addr().unwrap();
    let pods = Arc::new(rig.pods.clone());
    // 0 before the reload is seen, 1 after.
    let phase = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Answers per (phase, model), as they come: the test moves on when enough have been served,
    // not after a fixed time (a loaded machine serves fewer in any given time).
    let counts: Arc<Mutex<HashMap<(usize, &'static str), usize>>> = Arc::default();
    let count = |p: usize, m: &'static str| {
        let counts = Arc::clone(&counts);
        move || counts.lock().unwrap().get(&(p, m)).copied().unwrap_or(0)
    };
    let mut handles = Vec::new();
    for _ in 0..16 {
        let (pods, phase, done) = (Arc::clone(&pods), Arc::clone(&phase), Arc::clone(&done));
        let counts = Arc::clone(&counts);
        handles.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let p = phase.load(Ordering::Acquire);
                match ask(gw, &pods, KEY_A, false).await {
                    Ok(served) => *counts.lock().unwrap().entry((p, served)).or_default() += 1,
                    Err(e) => failed.push(e),
                }
            }
            failed
        }));
    }
    let (v1_before, v2_before) = (count(0, "llama-v1"), count(0, "llama-v2"));
    eventually(
        "over 100 answers from v1 and 10 from v2 before the reload",
        || v1_before() > 100 && v2_before() > 10,
    )
    .await;
    write_atomically(rig.path.path(), &config(rig.addrs, 0, 100));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while reloads_ok(admin).await < 1 {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    phase.store(1, Ordering::Release);
    let v2_after = count(1, "llama-v2");
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
    let get = |p, m| seen.get(&(p, m)).copied().unwrap_or(0);
    println!(
        "before the reload: llama-v1 {}, llama-v2 {}; after: llama-v1 {}, llama-v2 {}; failed {}",
        get(0, "llama-v1"),
        get(0, "llama-v2"),
        get(1, "llama-v1"),
        get(1, "llama-v2"),
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        get(0, "llama-v1") > 100 && get(0, "llama-v2") > 10,
        "{seen:?}"
    );
    // Requests sent once the reload was seen all go to v2.
    assert_eq!(get(1, "llama-v1"), 0, "{seen:?}");
    assert!(get(1, "llama-v2") > 100, "{seen:?}");
    stop_watch.send(()).unwrap();
    watcher.await.unwrap();
    rig.stop().await;
}

/// Replaces `path`'s contents in one rename, so the watcher never reads half a file.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
