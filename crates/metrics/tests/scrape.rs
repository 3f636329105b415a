//! The scraper against real HTTP servers on 127.0.0.1.
//!
//! These tests run on the real clock: the scraper talks to real sockets, and tokio's paused clock
//! would jump timers forward while a loopback reply is in flight. Intervals are short and the
//! assertions carry the margins the contract gives (threshold + one interval), not sleeps tuned
//! to pass.
#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

#[path = "common/server.rs"]
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use infergate_metrics::{
    Clock, ScrapeMetrics, ScrapeState, Scraper, ScraperConfig, Target, Update,
};
use infergate_scheduler::{
    EndpointMeta, EngineType, Preset, RequestContext, Scheduler, SchedulerConfig,
};
use prometheus_client::registry::Registry;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use server::{Mode, TestServer, closed_port};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

const VLLM_QUEUED: &[u8] = include_bytes!("fixtures/vllm-queued-lora.txt");
const VLLM_IDLE: &[u8] = include_bytes!("fixtures/vllm-idle.txt");
const TGI_BUSY: &[u8] = include_bytes!("fixtures/tgi-busy.txt");

type Events = mpsc::UnboundedReceiver<(u32, Update, Instant)>;

fn page(bytes: &[u8]) -> Mode {
    Mode::Page(Arc::new(bytes.to_vec()))
}

fn start(config: ScraperConfig, metrics: ScrapeMetrics) -> (Scraper<u32>, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    let scraper = Scraper::spawn(
        config,
        Clock::starting_now(),
        metrics,
        move |id: &u32, u: Update| {
            let _ = tx.send((*id, u, Instant::now()));
        },
    )
    .unwrap();
    (scraper, rx)
}

async fn next_for(rx: &mut Events, id: u32, within: Duration) -> (Update, Instant) {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, rx.recv()).await {
            Ok(Some((got, u, at))) if got == id => return (u, at),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("no update for target {id} within {within:?}"),
        }
    }
}

fn fast() -> ScraperConfig {
    ScraperConfig {
        interval: Duration::from_millis(20),
        stale_after: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        ..ScraperConfig::default()
    }
}

#[tokio::test]
async fn scrapes_a_real_page_over_one_kept_alive_connection() {
    let server = TestServer::start(page(VLLM_QUEUED)).await;
    let (scraper, mut rx) = start(fast(), ScrapeMetrics::default());
    scraper
        .upsert(Target::new(1, server.addr, EngineType::Vllm))
        .unwrap();
    let mut last = None;
    for _ in 0..5 {
        match next_for(&mut rx, 1, Duration::from_secs(2)).await.0 {
            Update::Snapshot(s) => {
                assert_eq!((s.waiting, s.running), (6, 2));
                assert_eq!(s.lora.as_ref().unwrap().running, vec!["lora-a".to_owned()]);
                if let Some(prev) = last {
                    assert!(s.sampled_at > prev, "timestamps move forward");
                }
                last = Some(s.sampled_at);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(server.requests() >= 5);
    assert_eq!(server.connections(), 1, "one keep-alive connection per pod");
}

#[tokio::test]
async fn scrapes_on_the_callers_runtime_when_asked() {
    let server = TestServer::start(page(VLLM_QUEUED)).await;
    let config = ScraperConfig {
        own_thread: false,
        ..fast()
    };
    let (scraper, mut rx) = start(config, ScrapeMetrics::default());
    scraper
        .upsert(Target::new(1, server.addr, EngineType::Vllm))
        .unwrap();
    for _ in 0..3 {
        let (u, _) = next_for(&mut rx, 1, Duration::from_secs(2)).await;
        assert!(
            matches!(u, Update::Snapshot(ref s) if s.waiting == 6),
            "{u:?}"
        );
    }
    assert_eq!(server.connections(), 1);
}

/// A scraper thread that cannot run its timers (blocked here; in production a gateway short of
/// CPU) is measured, and counted as a stall once per stall past the staleness threshold, however
/// many targets it scrapes; a shorter hiccup is measured, not counted. The pods it judged late
/// meanwhile are not failed for it.
#[tokio::test]
async fn a_stalled_scraper_thread_is_counted_once_per_stall_and_fails_no_pod() {
    let (a, b) = (
        TestServer::start(page(VLLM_IDLE)).await,
        TestServer::start(page(VLLM_IDLE)).await,
    );
    let mut registry = Registry::default();
    let metrics = ScrapeMetrics::register(&mut registry);
    // The wake-up delays as exported: (count, sum in seconds).
    let delays = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let sample = |name: &str| -> f64 {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        (
            sample("infergate_metrics_scraper_wakeup_delay_seconds_count "),
            sample("infergate_metrics_scraper_wakeup_delay_seconds_sum "),
        )
    };
    let config = ScraperConfig {
        // On the test's own thread, so that blocking it starves the scraper.
        own_thread: false,
        // Long, so that this machine's own hiccups stay below it.
        stale_after: Duration::from_secs(1),
        ..fast()
    };
    let (scraper, mut rx) = start(config, metrics.clone());
    for (id, server) in [(1, &a), (2, &b)] {
        scraper
            .upsert(Target::new(id, server.addr, EngineType::Vllm))
            .unwrap();
        next_for(&mut rx, id, Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (woken, _) = delays();
    assert!(woken > 0.0, "every tick is measured");

    std::thread::sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (after_hiccup, delay_hiccup) = delays();
    assert!(after_hiccup > woken);
    assert_eq!(metrics.stalls(), 0, "300 ms is below the 1 s threshold");

    for round in 1..=2 {
        std::thread::sleep(Duration::from_millis(1_500));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(metrics.stalls(), round, "one stall, however many targets");
        let text = {
            let mut t = String::new();
            prometheus_client::encoding::text::encode(&mut t, &registry).unwrap();
            t
        };
        assert!(text.contains(&format!("infergate_metrics_scraper_stalls_total {round}\n")));
    }
    let (_, delay) = delays();
    // Each of the two stalls held up a tick by 1.5 s less at most an interval.
    assert!(
        delay - delay_hiccup >= 2.0 * 1.48,
        "{delay:?} after {delay_hiccup:?}"
    );

    // Both pods were late at most, never failed, and are read again.
    drop(scraper);
    let mut stale = Vec::new();
    while let Ok((id, u, _)) = rx.try_recv() {
        if matches!(u, Update::Stale { .. }) {
            stale.push(id);
        }
    }
    assert!(
        stale.is_empty(),
        "pods failed for the scraper's stall: {stale:?}"
    );
    assert_eq!(metrics.stale_targets(), 0);
}

/// With its own thread the scraper needs no runtime from the caller, and the last handle going
/// away stops it.
#[test]
fn the_own_thread_needs_no_runtime_and_stops_with_the_last_handle() {
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = servers.block_on(TestServer::start(page(VLLM_QUEUED)));
    let (tx, rx) = std::sync::mpsc::channel();
    let scraper = Scraper::spawn(
        fast(),
        Clock::starting_now(),
        ScrapeMetrics::default(),
        move |id: &u32, u: Update| {
            let _ = tx.send((*id, u));
        },
    )
    .unwrap();
    scraper
        .upsert(Target::new(1, server.addr, EngineType::Vllm))
        .unwrap();
    for _ in 0..3 {
        let (id, u) = rx.recv_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!(id, 1);
        assert!(
            matches!(u, Update::Snapshot(ref s) if s.waiting == 6),
            "{u:?}"
        );
    }
    let other = scraper.clone();
    drop(scraper);
    assert!(
        rx.recv_timeout(Duration::from_secs(2)).is_ok(),
        "a clone keeps it running"
    );
    drop(other);
    // Whatever was in flight may still land (the scraper's thread may be slow to get to its
    // end on a loaded machine, so no fixed quiet time proves it stopped); then the sink, and
    // with it the scraper's tasks, is gone. A scraper still running keeps its sink.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => assert!(
                std::time::Instant::now() < deadline,
                "the sink (and with it the scraper's tasks) still held 10 s after the last handle went"
            ),
        }
    }
}

#[tokio::test]
async fn a_server_that_closes_kept_alive_connections_costs_no_scrape() {
    let server = TestServer::start(Mode::PageThenClose(Arc::new(VLLM_QUEUED.to_vec()))).await;
    let metrics = ScrapeMetrics::default();
    let (scraper, mut rx) = start(fast(), metrics.clone());
    scraper
        .upsert(Target::new(1, server.addr, EngineType::Vllm))
        .unwrap();
    for _ in 0..5 {
        let (u, _) = next_for(&mut rx, 1, Duration::from_secs(2)).await;
        assert!(matches!(u, Update::Snapshot(_)), "{u:?}");
    }
    // Each scrape found the old connection closed and retried at once on a new one.
    assert!(server.connections() >= 5);
    assert_eq!(metrics.errors("http"), 0);
    assert_eq!(metrics.errors("connect"), 0);
}

#[tokio::test]
async fn chunked_pages_are_read_too() {
    let server = TestServer::start(Mode::Chunked(Arc::new(TGI_BUSY.to_vec()))).await;
    let (scraper, mut rx) = start(fast(), ScrapeMetrics::default());
    scraper
        .upsert(Target::new(1, server.addr, EngineType::Tgi))
        .unwrap();
    let (u, _) = next_for(&mut rx, 1, Duration::from_secs(2)).await;
    let Update::Snapshot(s) = u else {
        panic!("{u:?}")
    };
    assert_eq!((s.waiting, s.running, s.kv_cache_usage), (5, 12, None));
}

/// The contract of the issue: a pod that stops answering is excluded from picking within the
/// staleness threshold plus one interval, and readmitted once it answers again.
/// Two pods behind a scheduler, fed by the scraper the way the pool feeds it.
struct Routed {
    a: TestServer,
    b: TestServer,
    scraper: Scraper<u32>,
    rx: Events,
    sched: Scheduler,
    rng: SmallRng,
    metrics: ScrapeMetrics,
    registry: Registry,
    /// Every late and stale report: (target, "late" | "stale", when, unreachable).
    log: Vec<(u32, &'static str, Instant, bool)>,
    /// Stale reports that said the server was still reachable.
    reachable_reports: usize,
}

impl Routed {
    async fn start(config: ScraperConfig) -> Routed {
        let stale_after = config.stale_after;
        let a = TestServer::start(page(VLLM_IDLE)).await;
        let b = TestServer::start(page(VLLM_QUEUED)).await;
        let mut registry = Registry::default();
        let metrics = ScrapeMetrics::register(&mut registry);
        let (scraper, rx) = start(config, metrics.clone());
        let mut sched_cfg = SchedulerConfig::preset(Preset::Infergate);
        sched_cfg.max_metrics_age = Some(stale_after);
        let mut sched = Scheduler::new(sched_cfg).unwrap();
        for (id, addr) in [a.addr, b.addr].into_iter().enumerate() {
            sched.upsert_endpoint(EndpointMeta {
                namespace: "default".to_owned(),
                pod: format!("pod-{id}"),
                addr,
                engine: EngineType::Vllm,
                gpu: None,
                labels: Default::default(),
            });
            let id = u32::try_from(id).unwrap();
            scraper
                .upsert(Target::new(id, addr, EngineType::Vllm))
                .unwrap();
        }
        Routed {
            a,
            b,
            scraper,
            rx,
            sched,
            rng: SmallRng::seed_from_u64(7),
            metrics,
            registry,
            log: Vec::new(),
            reachable_reports: 0,
        }
    }

    /// Drains the scraper's reports into the scheduler and picks once, as the pool does.
    fn pick(&mut self) -> Vec<SocketAddr> {
        let addrs = [self.a.addr, self.b.addr];
        while let Ok((id, u, at)) = self.rx.try_recv() {
            let addr = addrs[id as usize];
            match u {
                Update::Snapshot(s) => self.sched.apply_metrics(addr, s).unwrap(),
                Update::Late { last_sampled, .. } => {
                    assert!(last_sampled.is_some());
                    self.sched
                        .set_scrape_state(addr, ScrapeState::Late)
                        .unwrap();
                    self.log.push((id, "late", at, false));
                }
                Update::Stale {
                    last_sampled,
                    unreachable,
                    reachable,
                    ..
                } => {
                    assert!(last_sampled.is_some());
                    assert!(!(unreachable && reachable));
                    self.reachable_reports += usize::from(reachable);
                    self.sched
                        .set_scrape_state(addr, ScrapeState::Failed)
                        .unwrap();
                    self.log.push((id, "stale", at, unreachable));
                }
            }
        }
        let now = self.scraper.clock().now();
        let d = self
            .sched
            .pick(&RequestContext::new("tiny", 16), now, &mut self.rng)
            .unwrap();
        let chosen = d.endpoints.as_slice().to_vec();
        self.sched.cancel(d.ticket, now);
        chosen
    }

    /// Picks every 5 ms until `a`'s presence in the pick is `present`; panics after `bound`
    /// from `since`. Returns when.
    async fn until_a(&mut self, present: bool, since: Instant, bound: Duration) -> Instant {
        loop {
            if self.pick().contains(&self.a.addr) == present {
                return Instant::now();
            }
            assert!(
                since.elapsed() <= bound,
                "A {} after {:?}",
                if present { "still out" } else { "still picked" },
                since.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A pod whose page is slow (connected, answering nothing) is late, not failed: it stays a
/// candidate on its last page until `max_late`, then fails; it is readmitted with its next page.
#[tokio::test]
async fn a_slow_pod_is_late_and_still_picked_then_failed_after_max_late() {
    let config = ScraperConfig {
        interval: Duration::from_millis(50),
        stale_after: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        max_late: Duration::from_millis(700),
        ..ScraperConfig::default()
    };
    let (stale_after, interval, max_late) = (config.stale_after, config.interval, config.max_late);
    let mut r = Routed::start(config).await;

    // Both pods answer: both are candidates.
    tokio::time::sleep(interval * 3).await;
    let chosen = r.pick();
    assert!(
        chosen.contains(&r.a.addr) && chosen.contains(&r.b.addr),
        "{chosen:?}"
    );

    // Pod A stops answering (accepts, reads the request, never replies) on its kept-alive
    // connection: late after the staleness threshold, and still picked.
    r.a.set(Mode::Hang);
    let stopped = Instant::now();
    tokio::time::sleep(stale_after + interval * 2).await;
    assert!(r.pick().contains(&r.a.addr), "a late pod stays a candidate");
    assert_eq!(r.log.len(), 1, "{:?}", r.log);
    let (id, what, late_at, _) = r.log[0];
    assert_eq!((id, what), (0, "late"));
    assert!(
        late_at - stopped <= stale_after + interval,
        "late after {:?}",
        late_at - stopped
    );
    assert_eq!(
        (r.metrics.late_targets(), r.metrics.stale_targets()),
        (1, 0)
    );

    // The hung scrape gives up at max_late (it started at most one interval after the stop):
    // failed, out of the candidates, reported once.
    let out_at = r.until_a(false, stopped, max_late + interval * 2).await;
    assert!(
        out_at - stopped >= max_late - interval,
        "failed early: {:?}",
        out_at - stopped
    );
    tokio::time::sleep(interval * 4).await;
    assert!(!r.pick().contains(&r.a.addr));
    assert_eq!(r.log.len(), 2, "{:?}", r.log);
    assert_eq!((r.log[1].0, r.log[1].1, r.log[1].3), (0, "stale", false));
    assert_eq!(
        (r.metrics.late_targets(), r.metrics.stale_targets()),
        (0, 1)
    );
    assert!(r.metrics.errors("timeout") >= 1);

    // A answers again: readmitted with its next good scrape (a failed pod's scrape in flight
    // gives up at `timeout`, not `max_late`, then one interval).
    r.a.set(page(VLLM_IDLE));
    let resumed = Instant::now();
    r.until_a(true, resumed, Duration::from_millis(100) + interval * 2)
        .await;
    assert_eq!(
        (r.metrics.late_targets(), r.metrics.stale_targets()),
        (0, 0)
    );

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r.registry).unwrap();
    assert!(text.contains("infergate_metrics_scrape_duration_seconds_bucket"));
    assert!(text.contains("infergate_metrics_scrape_errors_total{reason=\"timeout\"}"));
    assert!(text.contains("infergate_metrics_stale_targets 0"));
    assert!(text.contains("infergate_metrics_late_targets 0"));
    assert!(text.contains("infergate_metrics_targets 2"));
}

/// A pod whose process dies (its connections close, its port refuses) fails at once: within
/// about one interval, well before the staleness threshold, and reported unreachable.
#[tokio::test]
async fn a_dead_pod_fails_at_once_not_after_the_threshold() {
    let config = ScraperConfig {
        interval: Duration::from_millis(50),
        stale_after: Duration::from_millis(500),
        timeout: Duration::from_millis(100),
        ..ScraperConfig::default()
    };
    let interval = config.interval;
    let mut r = Routed::start(config).await;
    tokio::time::sleep(interval * 3).await;
    assert!(r.pick().contains(&r.a.addr));

    // The process dies: open connections close unanswered, nothing listens any more.
    r.a.set(Mode::Close);
    r.a.stop_listening();
    let died = Instant::now();
    // On real sockets and a shared machine: "at once" is asserted as well under the 500 ms
    // threshold (a few intervals), not to the millisecond; the paused-clock test below checks
    // the exact times.
    let bound = interval * 6;
    let out_at = r.until_a(false, died, bound).await;
    assert!(
        out_at - died <= bound,
        "out after {:?} (threshold 500 ms)",
        out_at - died
    );
    // The scrape in flight when the process died may see its open connection reset first
    // (reported stale, not reachable: a broken connection is no sign of life), the next one a
    // refused connection (reported again, once, unreachable); on an idle connection the refusal
    // is the first and only report.
    while !r.log.iter().any(|e| e.3) {
        assert!(
            died.elapsed() <= bound,
            "never reported unreachable: {:?}",
            r.log
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        r.pick();
    }
    assert!((1..=2).contains(&r.log.len()), "{:?}", r.log);
    assert!(
        r.log.iter().all(|e| (e.0, e.1) == (0, "stale")),
        "{:?}",
        r.log
    );
    let (_, _, at, unreachable) = r.log[r.log.len() - 1];
    assert!(unreachable, "{:?}", r.log);
    assert_eq!(r.reachable_reports, 0, "a dying pod was reported reachable");
    assert!(r.log[0].2 - died <= bound, "{:?}", r.log[0].2 - died);
    assert!(at - died <= bound, "{:?}", at - died);
    assert_eq!(r.metrics.stale_targets(), 1);
    assert!(r.metrics.errors("connect") >= 1);
    // B never left.
    assert!(r.pick().contains(&r.b.addr));
}

/// Every way a page can go wrong, side by side with a healthy pod: the healthy pod keeps its
/// rhythm, no bad pod ever yields a snapshot, each failure is counted under its reason, and each
/// bad pod is reported stale once.
#[tokio::test]
async fn bad_pods_are_counted_reported_stale_and_never_delay_a_healthy_one() {
    let config = ScraperConfig {
        interval: Duration::from_millis(50),
        stale_after: Duration::from_millis(200),
        timeout: Duration::from_millis(150),
        max_body_bytes: 64 * 1024,
        ..ScraperConfig::default()
    };
    let interval = config.interval;
    let mut huge = VLLM_QUEUED.to_vec();
    while huge.len() <= 64 * 1024 {
        huge.extend_from_slice(VLLM_QUEUED);
    }
    let huge = Arc::new(huge);
    let garbage: Vec<u8> = (0..=255u8).cycle().take(5000).chain([b'\n']).collect();
    let healthy = TestServer::start(page(VLLM_QUEUED)).await;
    let bad = [
        (TestServer::start(Mode::Hang).await, "timeout"),
        (TestServer::start(Mode::Drip).await, "timeout"),
        (TestServer::start(Mode::Status500).await, "status"),
        (TestServer::start(Mode::Page(Arc::clone(&huge))).await, "body_too_large"),
        (TestServer::start(Mode::Chunked(huge)).await, "body_too_large"),
        (TestServer::start(Mode::Page(Arc::new(garbage))).await, "parse_missing_family"),
        (TestServer::start(page(b"vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\n")).await, "parse_invalid_value"),
        (TestServer::start(page(b"vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:num_requests_running 1\n")).await, "parse_duplicate_series"),
        (TestServer::start(page(b"vllm:num_requests_waiting 1\nvllm:num_requests_running 12")).await, "parse_truncated"),
    ];
    let metrics = ScrapeMetrics::default();
    let (scraper, mut rx) = start(config, metrics.clone());
    scraper
        .upsert(Target::new(0, healthy.addr, EngineType::Vllm))
        .unwrap();
    for (i, (server, _)) in bad.iter().enumerate() {
        let id = u32::try_from(i).unwrap() + 1;
        scraper
            .upsert(Target::new(id, server.addr, EngineType::Vllm))
            .unwrap();
    }
    let refused = closed_port().await;
    scraper
        .upsert(Target::new(99, refused, EngineType::Vllm))
        .unwrap();

    let window = Duration::from_millis(1000);
    let started = Instant::now();
    let mut healthy_times = Vec::new();
    let mut stale = std::collections::BTreeMap::<u32, usize>::new();
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        let Ok(Some((id, u, at))) = timeout(left, rx.recv()).await else {
            break;
        };
        match (id, u) {
            (0, Update::Snapshot(_)) => healthy_times.push(at),
            (0, other) => panic!("healthy pod reported {other:?}"),
            (id, Update::Snapshot(s)) => panic!("bad pod {id} yielded a snapshot {s:?}"),
            (id, Update::Stale { last_sampled, .. }) => {
                assert_eq!(last_sampled, None, "pod {id} never had a good page");
                *stale.entry(id).or_default() += 1;
            }
            (id, late @ Update::Late { .. }) => {
                panic!("pod {id} never answered, so it cannot be late: {late:?}")
            }
        }
    }
    // Healthy pod: about one snapshot per interval, and no gap near the bad pods' timeout.
    assert!(
        healthy_times.len() >= 14,
        "only {} snapshots in {window:?}",
        healthy_times.len()
    );
    let worst_gap = healthy_times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(worst_gap < interval * 2, "healthy pod waited {worst_gap:?}");
    // Every bad pod stale exactly once (a state change is reported once, not every interval).
    let expected: std::collections::BTreeMap<u32, usize> = (1..=u32::try_from(bad.len()).unwrap())
        .chain([99])
        .map(|id| (id, 1))
        .collect();
    assert_eq!(stale, expected);
    assert_eq!(
        metrics.stale_targets(),
        i64::try_from(bad.len()).unwrap() + 1
    );
    for (_, reason) in &bad {
        assert!(metrics.errors(reason) >= 1, "no {reason} error counted");
    }
    assert!(metrics.errors("connect") >= 1);

    // Removing targets stops them and releases their gauges.
    for id in 1..=u32::try_from(bad.len()).unwrap() {
        assert!(scraper.remove(&id));
    }
    assert!(scraper.remove(&99));
    assert!(!scraper.remove(&99));
    // Aborted tasks release their gauges when the runtime drops them, on its next turn (the
    // scraper's own thread: not within any fixed time on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.stale_targets() != 0 {
        assert!(
            Instant::now() < deadline,
            "the removed targets' gauges still held after 10 s: {} stale",
            metrics.stale_targets()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(scraper.target_ids(), vec![0]);
}

#[tokio::test]
async fn targets_can_be_replaced_and_shut_down() {
    let vllm = TestServer::start(page(VLLM_QUEUED)).await;
    let tgi = TestServer::start(page(TGI_BUSY)).await;
    let (scraper, mut rx) = start(fast(), ScrapeMetrics::default());
    scraper
        .set_targets([Target::new(1, vllm.addr, EngineType::Vllm)])
        .unwrap();
    let (u, _) = next_for(&mut rx, 1, Duration::from_secs(2)).await;
    assert!(
        matches!(u, Update::Snapshot(ref s) if s.waiting == 6),
        "{u:?}"
    );
    // Same id, new address and engine: the target follows.
    scraper
        .set_targets([Target::new(1, tgi.addr, EngineType::Tgi)])
        .unwrap();
    let switched = loop {
        let (u, _) = next_for(&mut rx, 1, Duration::from_secs(2)).await;
        if let Update::Snapshot(s) = u
            && s.waiting == 5
        {
            break s;
        }
    };
    assert_eq!(switched.kv_cache_usage, None);
    // An unchanged target keeps its connection.
    let connections = tgi.connections();
    scraper
        .set_targets([Target::new(1, tgi.addr, EngineType::Tgi)])
        .unwrap();
    let _ = next_for(&mut rx, 1, Duration::from_secs(2)).await;
    assert_eq!(tgi.connections(), connections);

    let bad_path = Target {
        path: "bad path".to_owned(),
        ..Target::new(2, tgi.addr, EngineType::Tgi)
    };
    assert!(scraper.set_targets([bad_path]).is_err());
    assert_eq!(
        scraper.target_ids(),
        vec![1],
        "a rejected set changes nothing"
    );

    scraper.run_until(async {}).await;
    assert!(scraper.target_ids().is_empty());
    // Drain what was in flight, then nothing more arrives.
    tokio::time::sleep(Duration::from_millis(50)).await;
    while rx.try_recv().is_ok() {}
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err());
}

/// The same contract on tokio's paused clock, where the timings are exact: a pod that answered
/// and then hangs is late exactly `stale_after` after its last page and failed exactly
/// `max_late` after the hung scrape started. (Only this test runs on the paused clock: the
/// hung server sends nothing, so no loopback reply is in flight while timers jump.)
#[tokio::test(start_paused = true)]
async fn late_and_failed_happen_at_exact_times_on_the_paused_clock() {
    let config = ScraperConfig {
        interval: Duration::from_millis(50),
        stale_after: Duration::from_millis(250),
        timeout: Duration::from_millis(250),
        max_late: Duration::from_secs(20),
        own_thread: false,
        ..ScraperConfig::default()
    };
    let slow = TestServer::start(page(VLLM_IDLE)).await;
    let (scraper, mut rx) = start(config, ScrapeMetrics::default());
    let clock = scraper.clock();
    scraper
        .upsert(Target::new(0, slow.addr, EngineType::Vllm))
        .unwrap();
    let (u, _) = next_for(&mut rx, 0, Duration::from_secs(1)).await;
    let Update::Snapshot(first) = u else {
        panic!("{u:?}")
    };
    // Hang from the next request on: the last good page is the one just read, or the one after.
    slow.set(Mode::Hang);
    let mut last_good = first.sampled_at;
    let late = loop {
        match next_for(&mut rx, 0, Duration::from_secs(30)).await.0 {
            Update::Snapshot(s) => last_good = s.sampled_at,
            other => break other,
        }
    };
    let Update::Late {
        at,
        last_sampled,
        scrape_started,
    } = late
    else {
        panic!("{late:?}")
    };
    assert_eq!(last_sampled, Some(last_good));
    assert_eq!(at.saturating_since(last_good), Duration::from_millis(250));
    let (failed, seen) = next_for(&mut rx, 0, Duration::from_secs(30)).await;
    let Update::Stale {
        last_sampled,
        unreachable,
        reachable,
        ..
    } = failed
    else {
        panic!("{failed:?}")
    };
    // The scrape that timed out had connected: the server is alive (a fail-open may use it).
    assert_eq!(
        (last_sampled, unreachable, reachable),
        (Some(last_good), false, true)
    );
    assert_eq!(
        clock.at(seen).saturating_since(scrape_started),
        Duration::from_secs(20)
    );
}
