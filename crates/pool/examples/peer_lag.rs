//! How old a peer's load is when a pick reads it: two live pools of the same idle pods, each
//! with its peer exchange on 127.0.0.1 at its defaults (changes pushed at once over a standing
//! connection, at most one report per 5 ms). Replica A changes its in-flight count on one pod,
//! replica B's view is polled until it shows the change; the time between is the staleness the
//! simulator models as `replicas.exchange` (`interval_ms: 5, delay_ms: 1`), for changes spaced
//! wider than the interval (pushed at once) and closer (coalesced).
//!
//! `cargo run --release -p infergate-pool --example peer_lag [-- CHANGES]` (default 2,000 of each).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a measurement command: its output is its report, a panic is a failure"
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infergate_metrics::ScraperConfig;
use infergate_pool::peers::{PeerExchange, PeerKey, PeerSettings, PeerTarget};
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, EngineType, RequestContext};
use infergate_testkit::pages::{page_server, vllm_page};
use tokio::net::TcpListener;

async fn idle_pod() -> SocketAddr {
    page_server(Arc::new(|| vllm_page(0))).await
}

async fn pool(pods: &[SocketAddr]) -> LivePool {
    let config = PoolConfig {
        scrape: ScraperConfig {
            interval: Duration::from_millis(50),
            stale_after: Duration::from_secs(2),
            ..ScraperConfig::default()
        },
        ..PoolConfig::default()
    };
    let p = LivePool::start(config, None).unwrap();
    p.set_endpoints(pods.iter().enumerate().map(|(i, a)| EndpointMeta {
        namespace: "default".into(),
        pod: format!("pod-{i}"),
        addr: *a,
        engine: EngineType::Vllm,
        gpu: None,
        labels: BTreeMap::new(),
    }))
    .unwrap();
    while !p.endpoints_info().iter().all(|e| e.metrics.is_some()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p
}

fn peer_inflight(pool: &LivePool, addr: SocketAddr) -> u32 {
    pool.endpoints_info()
        .iter()
        .find(|e| e.meta.addr == addr)
        .map_or(0, |e| e.peer_inflight)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let changes: usize = std::env::args()
        .nth(1)
        .map_or(2_000, |a| a.parse().expect("CHANGES: a number"));
    let pods = [idle_pod().await, idle_pod().await];
    let (a, b) = (pool(&pods).await, pool(&pods).await);
    let free = || async {
        TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (addr_a, addr_b) = (free().await, free().await);
    let key = PeerKey::from_bytes(b"a key for the measurement only").unwrap();
    let settings = |name: &str, listen, peer| {
        PeerSettings::new(
            name,
            "llama",
            Some(listen),
            vec![PeerTarget::Addr(peer)],
            key.clone(),
        )
    };
    let _ex_a = PeerExchange::start(a.clone(), settings("a", addr_a, addr_b), None)
        .await
        .unwrap();
    let _ex_b = PeerExchange::start(b.clone(), settings("b", addr_b, addr_a), None)
        .await
        .unwrap();
    // Connected once a first change gets through.
    let only = [pods[0]];
    let probe = a
        .pick(&RequestContext::new("m", 100).with_subset(Some(&only)))
        .unwrap();
    while peer_inflight(&b, pods[0]) != 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(probe);
    while peer_inflight(&b, pods[0]) != 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    // Sparse: each change more than an interval after the previous report (pushed at once).
    // Dense: changes 0–5 ms apart (coalesced to one report per interval).
    for (label, gap_us) in [
        ("sparse (10-15 ms apart)", 10_000u64),
        ("dense (0-5 ms apart)", 0),
    ] {
        let mut lags = Vec::with_capacity(changes);
        let mut held = Vec::new();
        for i in 0..changes {
            // Alternate: one more request in flight, then one fewer, at a spread of phases.
            let phase = Duration::from_micros(gap_us + (i as u64 * 7_919) % 5_000);
            tokio::time::sleep(phase).await;
            let changed = Instant::now();
            let want = if i % 2 == 0 {
                held.push(
                    a.pick(&RequestContext::new("m", 100).with_subset(Some(&only)))
                        .unwrap(),
                );
                1
            } else {
                held.clear();
                0
            };
            while peer_inflight(&b, pods[0]) != want {
                tokio::task::yield_now().await;
            }
            lags.push(changed.elapsed());
        }
        lags.sort();
        let mean = lags.iter().sum::<Duration>() / lags.len() as u32;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{label}, {changes} changes: mean {:.2} ms, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(mean),
            ms(pct(&lags, 0.5)),
            ms(pct(&lags, 0.9)),
            ms(pct(&lags, 0.99)),
            ms(lags[lags.len() - 1]),
        );
    }
    println!(
        "the simulator's model of the default (replicas.exchange: interval 5 ms, delay 1 ms, push): 1 ms after a change more than 5 ms after the previous report, else at the end of those 5 ms plus 1 ms"
    );
}
