//! Load benchmark of the endpoint picker: an open-loop client plays Envoy at a fixed request rate
//! through the full ext_proc conversation (headers, body, routing answer, re-sent body, response
//! headers and an SSE body with usage), against the picker on the live pool scraping emulated
//! vLLM pods.
//!
//! Reports the picker's added latency — from the request body's last chunk sent to the routing
//! answer received, which is what Envoy waits for before forwarding — and the picker's CPU time
//! per 1,000 requests, read from `/proc/self/task/*/stat` for the picker's threads only: its
//! runtime (ext_proc serving, the pool) and, when the pool scrapes on a thread of its own, that
//! thread. The client and the emulated pods run on their own threads.
//!
//! ```text
//! cargo run --release -p infergate-extproc --example load -- [--rps 2000] [--seconds 60] [--pods 4]
//!     [--picker-threads 0]   (0: a current-thread runtime on a thread of its own, as
//!                             `infergate picker` runs by default; N: N workers)
//!     [--pin]                (the picker's threads on the last CPU, everything else — the
//!                             Envoy stand-in, the emulated pods — on the others, with `taskset`:
//!                             the picker with a core of its own, as in a deployment where Envoy
//!                             and the model servers run elsewhere)
//!     [--paced]              (each request at its own time, start + i / rate, handed to the
//!                             client by a pacing thread of its own, as arrivals from many
//!                             independent clients reach Envoy; by default each millisecond's
//!                             requests go out together, as tokio's timers tick)
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a benchmark binary: failures abort, results go to stdout"
)]

#[path = "../tests/common/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::*;
use infergate_extproc::{EndpointPicker, PickerConfig, Telemetry};
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, EngineType};
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, serve_fleet};

const PICKER_THREAD: &str = "picker-rt";
/// The metrics scraper's own thread, when the pool runs one (`infergate-scraper`, as the kernel
/// truncates thread names to 15 bytes).
const SCRAPER_THREAD: &str = "infergate-scrap";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// utime + stime (clock ticks) of this process's threads whose name starts with one of
/// `prefixes` (every thread when `None`).
fn cpu_ticks(prefixes: Option<&[&str]>) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = entry.unwrap().path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        if prefixes.is_some_and(|ps| !ps.iter().any(|p| comm.starts_with(p))) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // Fields after the command: state is index 0, utime 11, stime 12 (proc(5) 14 and 15).
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    total
}

fn ticks_per_sec() -> f64 {
    // Linux's USER_HZ is 100 on every mainstream architecture.
    100.0
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Puts the picker's threads on the last CPU and every other thread of this process on the rest.
fn pin_threads() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "--pin needs at least two CPUs");
    let last = (cpus - 1).to_string();
    let rest = if cpus == 2 {
        "0".to_owned()
    } else {
        format!("0-{}", cpus - 2)
    };
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = entry.unwrap().path();
        let tid = path.file_name().unwrap().to_string_lossy().into_owned();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let picker = comm.starts_with(PICKER_THREAD) || comm.starts_with(SCRAPER_THREAD);
        let list = if picker { &last } else { &rest };
        let status = std::process::Command::new("taskset")
            .args(["-p", "-c", list, &tid])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("taskset (util-linux) is needed for --pin");
        assert!(status.success(), "taskset failed for thread {tid}");
    }
    println!("pinned: picker threads on CPU {last}, the rest on CPU {rest}");
}

/// What every request of the client shares.
#[derive(Clone)]
struct Shared {
    envoy: Envoy,
    bodies: Arc<Vec<Vec<u8>>>,
    sse: Arc<Vec<u8>>,
    tx: tokio::sync::mpsc::UnboundedSender<u32>,
    errors: Arc<AtomicU64>,
    /// What the first answer that was not a routing decision said (it says why requests fail).
    first_error: Arc<std::sync::Mutex<Option<String>>>,
}

/// Request `i` through the whole ext_proc conversation, as Envoy plays it; sends its added
/// latency (µs) on `tx`.
async fn one_request(s: Shared, i: usize) {
    let body = &s.bodies[i % s.bodies.len()];
    let mut ex = s.envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(body, true)).await;
    let t0 = Instant::now();
    let answer = ex.next().await;
    let added = t0.elapsed();
    if !matches!(
        answer.response,
        Some(envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response::RequestHeaders(_))
    ) {
        s.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = s.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(format!("{:?}", answer.response));
        }
        return;
    }
    ex.streamed_body(true, usize::MAX).await;
    ex.send(response_headers(200, "text/event-stream", false))
        .await;
    ex.next().await;
    ex.send(response_body(&s.sse, true)).await;
    ex.next().await;
    let _ =
        s.tx.send(u32::try_from(added.as_micros()).unwrap_or(u32::MAX));
}

fn main() {
    // The same subscriber as the `infergate` binary (`RUST_LOG`, default `info`): what tracing
    // costs per request is part of what is measured.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rps = arg("--rps", 2000);
    let seconds = arg("--seconds", 60);
    let pods = arg("--pods", 4) as usize;

    // The emulated pods: their own thread, so their CPU is not counted as the picker's.
    let sim_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get("llama-3.1-8b/h100").unwrap().clone();
    let model = profile.model.to_string();
    let spec = FleetSpec {
        seed: 1,
        pods: (0..pods)
            .map(|i| PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm))
            .collect(),
    }
    .finish()
    .unwrap();
    let fleet = sim_rt
        .block_on(serve_fleet(&spec, std::future::pending()))
        .unwrap();
    let addrs: Vec<_> = fleet
        .pods
        .iter()
        .map(|p| (p.name.clone(), p.addr))
        .collect();
    std::thread::Builder::new()
        .name("sim".into())
        .spawn(move || sim_rt.block_on(std::future::pending::<()>()))
        .unwrap();

    // The picker: by default as `infergate picker` runs it, a current-thread runtime driven by a
    // thread of its own (`--picker-threads 0`); `--picker-threads N` gives it a multi-thread
    // runtime with N workers instead.
    let picker_threads = arg("--picker-threads", 0) as usize;
    let pin = std::env::args().any(|a| a == "--pin");
    let paced = std::env::args().any(|a| a == "--paced");
    let picker_rt = if picker_threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(picker_threads)
            .thread_name(PICKER_THREAD)
            .enable_all()
            .build()
            .unwrap()
    };
    let (pool, server) = picker_rt.block_on(async {
        let pool = LivePool::start(PoolConfig::default(), None).unwrap();
        pool.set_endpoints(addrs.iter().map(|(name, addr)| EndpointMeta {
            namespace: "default".into(),
            pod: name.clone(),
            addr: *addr,
            engine: EngineType::Vllm,
            gpu: None,
            labels: BTreeMap::new(),
        }))
        .unwrap();
        while !pool.is_ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let server = serve(EndpointPicker::new(
            PickerConfig::default(),
            pool.clone(),
            Telemetry::default(),
        ))
        .await;
        (pool, server)
    });
    // A current-thread runtime runs its tasks only inside `Runtime::block_on`: hand it to a
    // thread of its own for the rest of the run.
    let _picker_rt = if picker_threads == 0 {
        std::thread::Builder::new()
            .name(PICKER_THREAD.into())
            .spawn(move || picker_rt.block_on(std::future::pending::<()>()))
            .unwrap();
        None
    } else {
        Some(picker_rt)
    };

    // The client (Envoy's side): its own runtime.
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client")
        .enable_all()
        .build()
        .unwrap();
    let errors = Arc::new(AtomicU64::new(0));
    // What the first answer that was not a routing decision said (it says why requests fail).
    let first_error: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let (latencies, elapsed, cpu_picker, cpu_all) = client_rt.block_on(async {
        let envoy = Envoy::connect(server.addr).await;
        let bodies: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                serde_json::to_vec(&serde_json::json!({
                    "model": model,
                    "stream": true,
                    "max_tokens": 32,
                    "messages": [
                        {"role": "system", "content": format!("tenant {} ", i % 8).repeat(40)},
                        {"role": "user", "content": format!("question {i}: ").repeat(20)},
                    ],
                }))
                .unwrap()
            })
            .collect();
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n".to_vec();
        let bodies = Arc::new(bodies);
        let sse = Arc::new(sse);
        let total = rps * seconds;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let cpu = || {
            (
                cpu_ticks(Some(&[PICKER_THREAD])),
                cpu_ticks(Some(&[SCRAPER_THREAD])),
                cpu_ticks(None),
            )
        };
        if pin {
            pin_threads();
        }
        let cpu0 = cpu();
        let start = Instant::now();
        let shared = Shared {
            envoy,
            bodies,
            sse,
            tx,
            errors: Arc::clone(&errors),
            first_error: Arc::clone(&first_error),
        };
        if paced {
            // Each request at its own time, start + i / rate, from a thread of its own that
            // sleeps between them and hands each to the client's runtime: arrivals come one by
            // one, as from many independent clients, and the client's worker is never blocked
            // by the pacing (it only sends, reads and times). A late wake-up sends what is due.
            let handle = tokio::runtime::Handle::current();
            let gap = Duration::from_secs_f64(1.0 / rps as f64);
            let pacer = std::thread::Builder::new()
                .name("pacer".into())
                .spawn(move || {
                    let mut sent = 0_u64;
                    while sent < total {
                        let next = start + gap.mul_f64(sent as f64);
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        let due = ((start.elapsed().as_secs_f64() * rps as f64) as u64 + 1)
                            .min(total);
                        while sent < due {
                            handle.spawn(one_request(shared.clone(), sent as usize));
                            sent += 1;
                        }
                    }
                })
                .unwrap();
            tokio::task::spawn_blocking(move || pacer.join().unwrap())
                .await
                .unwrap();
        } else {
            // Each millisecond's requests together, as tokio's timers tick.
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sent = 0_u64;
            while sent < total {
                tick.tick().await;
                // Open loop: the number due by now, whatever the answers do.
                let due = ((start.elapsed().as_secs_f64() * rps as f64) as u64).min(total);
                while sent < due {
                    tokio::spawn(one_request(shared.clone(), sent as usize));
                    sent += 1;
                }
            }
            drop(shared);
        }
        let mut latencies = Vec::with_capacity(total as usize);
        while let Some(l) = rx.recv().await {
            latencies.push(l);
        }
        let elapsed = start.elapsed();
        let cpu1 = cpu();
        (
            latencies,
            elapsed,
            (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1),
            cpu1.2 - cpu0.2,
        )
    });
    let mut sorted = latencies;
    sorted.sort_unstable();
    let n = sorted.len() as f64;
    let per_k = |ticks: u64| ticks as f64 / ticks_per_sec() * 1000.0 / (n / 1000.0);
    println!(
        "picker load benchmark: {rps} req/s for {seconds} s, {pods} emulated vLLM pods, picker runtime {}",
        if picker_threads == 0 {
            String::from("current-thread")
        } else {
            format!("multi-thread with {picker_threads} worker(s)")
        }
    );
    println!(
        "completed {} requests in {:.1} s ({:.0} req/s), {} errors, {} in flight after",
        sorted.len(),
        elapsed.as_secs_f64(),
        n / elapsed.as_secs_f64(),
        errors.load(Ordering::Relaxed),
        pool.inflight()
    );
    if let Some(e) = first_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        println!(
            "first error answer: {}",
            e.chars().take(600).collect::<String>()
        );
    }
    println!(
        "added latency (last body chunk sent -> routing answer received): p50 {} us, p90 {} us, p99 {} us, p99.9 {} us, max {} us",
        percentile(&sorted, 0.50),
        percentile(&sorted, 0.90),
        percentile(&sorted, 0.99),
        percentile(&sorted, 0.999),
        sorted.last().copied().unwrap_or(0)
    );
    println!(
        "CPU per 1,000 requests: picker {:.1} ms (ext_proc runtime {:.1} ms + scraper thread {:.1} ms), whole process (client + pods included) {:.1} ms",
        per_k(cpu_picker.0 + cpu_picker.1),
        per_k(cpu_picker.0),
        per_k(cpu_picker.1),
        per_k(cpu_all)
    );
    drop(server);
}
