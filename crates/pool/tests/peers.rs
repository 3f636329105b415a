//! Active-active replicas over real TCP on 127.0.0.1: two (or three) live pools of the same pods,
//! each with its own peer exchange, as separate picker processes would run them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a failed test

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infergate_metrics::ScraperConfig;
use infergate_pool::peers::{PeerExchange, PeerKey, PeerSettings, PeerTarget};
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, EngineType, RequestContext, SchedulerConfig};
use infergate_testkit::eventually;
use infergate_testkit::pages::{page_server, vllm_page};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &[u8] = b"a shared key of the pool's replicas\n";

/// A metrics server answering every request with the same idle vLLM page.
async fn idle_pod() -> SocketAddr {
    page_server(Arc::new(|| vllm_page(0))).await
}

fn meta(addr: SocketAddr, name: &str) -> EndpointMeta {
    EndpointMeta {
        namespace: "default".into(),
        pod: name.into(),
        addr,
        engine: EngineType::Vllm,
        gpu: None,
        labels: BTreeMap::new(),
    }
}

/// A pool of `pods`, ready (every page scraped once).
async fn pool(pods: &[SocketAddr], seed: u64) -> LivePool {
    let config = PoolConfig {
        scheduler: SchedulerConfig::default(),
        scrape: ScraperConfig {
            interval: Duration::from_millis(50),
            stale_after: Duration::from_secs(2),
            timeout: Duration::from_millis(500),
            ..ScraperConfig::default()
        },
        seed,
    };
    let p = LivePool::start(config, None).unwrap();
    p.set_endpoints(
        pods.iter()
            .enumerate()
            .map(|(i, a)| meta(*a, &format!("pod-{i}"))),
    )
    .unwrap();
    eventually("every page scraped", || {
        p.endpoints_info().iter().all(|e| e.metrics.is_some())
    })
    .await;
    p
}

fn key() -> PeerKey {
    PeerKey::from_bytes(KEY).unwrap()
}

/// A free loopback port, for a replica that must be named before it listens.
async fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

async fn exchange(
    pool: &LivePool,
    replica: &str,
    listen: SocketAddr,
    peers: &[SocketAddr],
    key: PeerKey,
    registry: &mut Registry,
) -> PeerExchange {
    let settings = PeerSettings::new(
        replica,
        "llama",
        Some(listen),
        peers.iter().map(|a| PeerTarget::Addr(*a)).collect(),
        key,
    );
    PeerExchange::start(pool.clone(), settings, Some(registry))
        .await
        .unwrap()
}

fn peer_inflight(pool: &LivePool, addr: SocketAddr) -> u32 {
    pool.endpoints_info()
        .iter()
        .find(|e| e.meta.addr == addr)
        .map_or(0, |e| e.peer_inflight)
}

fn series(registry: &Registry, name: &str) -> f64 {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The start line names the bound address and the peers as text: it logged
/// `listen="Some(127.0.0.1:24651)"` and a quoted Debug list. Without a listen address the field
/// is left out.
#[tokio::test]
async fn the_start_line_logs_the_listen_address_and_the_peers_as_text() {
    let out = infergate_testkit::CapturedLog::default();
    let _logs = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let pool = pool(&[], 1).await;
    let (listen, peer_a, peer_b) = (free_addr().await, free_addr().await, free_addr().await);
    let mut registry = Registry::default();
    let ex = exchange(&pool, "a", listen, &[peer_a, peer_b], key(), &mut registry).await;
    ex.shutdown();
    let settings = PeerSettings::new("b", "llama", None, vec![PeerTarget::Addr(peer_a)], key());
    let quiet = PeerExchange::start(pool.clone(), settings, None)
        .await
        .unwrap();
    quiet.shutdown();
    let text = out.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("peer exchange started"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(&format!("listen={listen} peers={peer_a},{peer_b}")),
        "{}",
        lines[0]
    );
    assert!(!lines[1].contains("listen"), "{}", lines[1]);
    assert!(
        lines[1].contains(&format!("peers={peer_a}")),
        "{}",
        lines[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_requests_count_in_picks_within_milliseconds_and_expire_when_it_stops() {
    let (x, y) = (idle_pod().await, idle_pod().await);
    let (a, b) = (pool(&[x, y], 1).await, pool(&[x, y], 2).await);
    let (addr_a, addr_b) = (free_addr().await, free_addr().await);
    let (mut reg_a, mut reg_b) = (Registry::default(), Registry::default());
    let ex_a = exchange(&a, "picker-a", addr_a, &[addr_b], key(), &mut reg_a).await;
    let _ex_b = exchange(&b, "picker-b", addr_b, &[addr_a], key(), &mut reg_b).await;
    eventually("both connected", || {
        series(&reg_a, "infergate_peer_connections_inbound") == 1.0
            && series(&reg_b, "infergate_peer_connections_inbound") == 1.0
    })
    .await;

    // Replica A sends eight requests to pod X (held in flight, no first token yet).
    let only_x = [x];
    let held: Vec<_> = (0..8)
        .map(|_| {
            a.pick(&RequestContext::new("m", 500).with_subset(Some(&only_x)))
                .unwrap()
        })
        .collect();
    assert!(held.iter().all(|h| h.endpoint() == x));
    let sent = Instant::now();
    eventually("B counts A's eight requests on X", || {
        peer_inflight(&b, x) == 8
    })
    .await;
    let lag = sent.elapsed();
    // One interval (5 ms) plus the loopback and a busy test machine's scheduling.
    assert!(lag < Duration::from_millis(500), "took {lag:?}");
    assert_eq!(peer_inflight(&b, y), 0);
    assert_eq!(
        peer_inflight(&a, x),
        0,
        "a replica never counts itself as a peer"
    );

    // B's own picks now go to Y, every time: X carries A's eight.
    for _ in 0..6 {
        let p = b.pick(&RequestContext::new("m", 500)).unwrap();
        assert_eq!(p.endpoint(), y, "B herded onto the pod A loaded");
        drop(p);
    }

    // A's requests end: B sees X empty again within an interval or so.
    drop(held);
    eventually("B sees A's requests gone", || peer_inflight(&b, x) == 0).await;

    // A stops (crashed, partitioned): its last report stops counting after expire-after.
    let _again = a
        .pick(&RequestContext::new("m", 500).with_subset(Some(&only_x)))
        .unwrap();
    eventually("B counts A's new request", || peer_inflight(&b, x) == 1).await;
    ex_a.shutdown();
    let stopped = Instant::now();
    eventually("B drops silent A", || peer_inflight(&b, x) == 0).await;
    let gone = stopped.elapsed();
    assert!(
        gone >= Duration::from_millis(1000) && gone < Duration::from_secs(4),
        "dropped after {gone:?} (expire-after 1.5 s)"
    );
    eventually("B's gauge shows no peer", || {
        series(&reg_b, "infergate_peer_replicas") == 0.0
    })
    .await;
    assert!(series(&reg_b, "infergate_peer_expired_total") >= 1.0);
    assert!(series(&reg_b, "infergate_peer_reports_received_total") >= 3.0);
    assert!(series(&reg_a, "infergate_peer_reports_sent_total") >= 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_or_another_pool_is_refused_and_counted() {
    let x = idle_pod().await;
    let (a, b) = (pool(&[x], 1).await, pool(&[x], 2).await);
    let addr_b = free_addr().await;
    let mut reg_b = Registry::default();
    let _ex_b = exchange(&b, "picker-b", addr_b, &[], key(), &mut reg_b).await;

    // A holds another key.
    let mut reg_a = Registry::default();
    let other = PeerKey::from_bytes(b"not the pool's key, but long enough").unwrap();
    let ex_a = exchange(
        &a,
        "picker-a",
        free_addr().await,
        &[addr_b],
        other,
        &mut reg_a,
    )
    .await;
    let _held = a.pick(&RequestContext::new("m", 500)).unwrap();
    eventually("B refuses A's hello", || {
        series(
            &reg_b,
            "infergate_peer_connection_failures_total{reason=\"bad-mac\"",
        ) >= 1.0
    })
    .await;
    eventually("A is told", || {
        series(
            &reg_a,
            "infergate_peer_connection_failures_total{reason=\"refused-by-peer\"",
        ) >= 1.0
    })
    .await;
    assert_eq!(peer_inflight(&b, x), 0);
    drop(ex_a);

    // C has the key but serves another pool.
    let mut reg_c = Registry::default();
    let settings = PeerSettings::new(
        "picker-c",
        "qwen",
        None,
        vec![PeerTarget::Addr(addr_b)],
        key(),
    );
    let _ex_c = PeerExchange::start(a.clone(), settings, Some(&mut reg_c))
        .await
        .unwrap();
    eventually("B refuses another pool", || {
        series(
            &reg_b,
            "infergate_peer_connection_failures_total{reason=\"other-pool\"",
        ) >= 1.0
    })
    .await;
    assert_eq!(peer_inflight(&b, x), 0);
    assert_eq!(series(&reg_b, "infergate_peer_replicas"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bytes_are_refused_and_the_listener_keeps_serving() {
    let x = idle_pod().await;
    let (a, b) = (pool(&[x], 1).await, pool(&[x], 2).await);
    let addr_b = free_addr().await;
    let mut reg_b = Registry::default();
    let _ex_b = exchange(&b, "picker-b", addr_b, &[], key(), &mut reg_b).await;

    // Not a peer: garbage after the greeting, a name of 65,535 bytes, a silent client.
    let mut greeting = [0u8; 8 + 32 + 2 + 8];
    for hostile in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0u8; 32].repeat(3)[..],
        &[0xff; 40][..],
    ] {
        let mut s = TcpStream::connect(addr_b).await.unwrap();
        s.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting[..8], b"IGPEER01");
        let _ = s.write_all(hostile).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    }
    let mut silent = TcpStream::connect(addr_b).await.unwrap();
    silent.read_exact(&mut greeting).await.unwrap();
    // A replay of a recorded hello against a fresh nonce.
    let mut s = TcpStream::connect(addr_b).await.unwrap();
    s.read_exact(&mut greeting).await.unwrap();
    let mut hello = vec![7u8; 32];
    for name in ["picker-a", "llama"] {
        hello.extend_from_slice(&(name.len() as u16).to_be_bytes());
        hello.extend_from_slice(name.as_bytes());
    }
    hello.extend_from_slice(&[1u8; 32]);
    s.write_all(&hello).await.unwrap();
    let mut answer = [0u8; 2];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, [1, 1], "refused: bad mac");

    // A real peer still gets through, its load counts.
    let mut reg_a = Registry::default();
    let _ex_a = exchange(
        &a,
        "picker-a",
        free_addr().await,
        &[addr_b],
        key(),
        &mut reg_a,
    )
    .await;
    let _held = a.pick(&RequestContext::new("m", 500)).unwrap();
    eventually("B counts A's request", || peer_inflight(&b, x) == 1).await;
    assert!(series(&reg_b, "infergate_peer_connection_failures_total") >= 3.0);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_listed_among_its_own_peers_skips_itself() {
    let x = idle_pod().await;
    let (a, b) = (pool(&[x], 1).await, pool(&[x], 2).await);
    let (addr_a, addr_b) = (free_addr().await, free_addr().await);
    let (mut reg_a, mut reg_b) = (Registry::default(), Registry::default());
    // Both given the same list, as a headless Service's name resolves for every replica.
    let all = [addr_a, addr_b];
    let _ex_a = exchange(&a, "picker-a", addr_a, &all, key(), &mut reg_a).await;
    let _ex_b = exchange(&b, "picker-b", addr_b, &all, key(), &mut reg_b).await;
    let _held = a.pick(&RequestContext::new("m", 500)).unwrap();
    eventually("B counts A's request", || peer_inflight(&b, x) == 1).await;
    eventually("both connected out", || {
        series(&reg_a, "infergate_peer_connections_outbound") == 1.0
            && series(&reg_b, "infergate_peer_connections_outbound") == 1.0
    })
    .await;
    // A dialled B before B listened: those refused connects are the only failures there may be.
    let failures = "infergate_peer_connection_failures_total";
    let io_failures_a = series(&reg_a, &format!("{failures}{{reason=\"io\""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(series(&reg_a, "infergate_peer_connections_outbound"), 1.0);
    assert_eq!(series(&reg_b, "infergate_peer_connections_outbound"), 1.0);
    assert_eq!(
        peer_inflight(&a, x),
        0,
        "A's own load came back to it as a peer's"
    );
    assert_eq!(
        series(&reg_a, failures),
        io_failures_a,
        "A failed on itself"
    );
    assert_eq!(series(&reg_b, failures), 0.0, "B failed on itself");
}

#[test]
fn peer_targets_parse_addresses_and_names_and_refuse_the_rest() {
    assert_eq!(
        "10.0.0.7:9006".parse::<PeerTarget>().unwrap(),
        PeerTarget::Addr("10.0.0.7:9006".parse().unwrap())
    );
    assert!(matches!(
        "[fd00::7]:9006".parse::<PeerTarget>(),
        Ok(PeerTarget::Addr(_))
    ));
    assert_eq!(
        "pickers.ns.svc.cluster.local:9006"
            .parse::<PeerTarget>()
            .unwrap(),
        PeerTarget::Dns {
            host: "pickers.ns.svc.cluster.local".into(),
            port: 9006
        }
    );
    for bad in [
        "pickers",
        "pickers:",
        "pickers:http",
        "pi ckers:9006",
        ":9006",
        "a:0",
        "a:70000",
    ] {
        assert!(bad.parse::<PeerTarget>().is_err(), "{bad}");
    }
}

#[test]
fn settings_out_of_range_are_refused() {
    let base = || {
        PeerSettings::new(
            "picker-a",
            "llama",
            Some("127.0.0.1:0".parse().unwrap()),
            vec![],
            key(),
        )
    };
    assert!(base().validate().is_ok());
    let mut s = base();
    s.listen = None;
    assert!(s.validate().is_err(), "nothing to exchange");
    let mut s = base();
    s.replica = String::new();
    assert!(s.validate().is_err());
    let mut s = base();
    s.interval = Duration::from_secs(2);
    assert!(s.validate().is_err());
    let mut s = base();
    s.expire_after = s.keepalive;
    assert!(s.validate().is_err());
    assert!(PeerKey::from_bytes(b"too short\n").is_none());
}
