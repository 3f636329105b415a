//! Stale metrics through the real gateway (`staleMetrics`): emulated vLLM pods whose `/metrics`
//! stalls while they keep serving requests. Fail-open keeps dispatching on in-flight
//! accounting, within its per-pod cap; fail-closed answers 503; a pod nothing answers at is
//! never routed to either way. When the only fresh pod is overloaded, fail-open sends the request
//! to a pod that answers without a page rather than shedding it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the latencies are printed for the record"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use infergate_proxy::{Gateway, GatewayConfig};
use infergate_sim::{Faults, FleetSpec, MetricsFault, ServedFleet, serve_fleet};
use tokio::time::Instant;
use upstream::{client, get, post, refused_addr, send, serve_gateway};

/// Everything the test binary logs, for the fail-open log lines.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Writer(Arc::clone(&writer)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buf
    })
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One emulated pod `a` plus a second endpoint (an address where nothing listens, or another
/// server), behind a gateway with a short late window (a stalled page fails the pod's scrapes
/// after 400 ms).
struct Rig {
    gw: Gateway,
    fleet: Option<ServedFleet>,
    fleet_stop: Option<tokio::sync::oneshot::Sender<()>>,
    _stop: tokio::sync::oneshot::Sender<()>,
    pod: SocketAddr,
    /// The second endpoint: an address where nothing listens, or another server.
    other: SocketAddr,
}

impl Rig {
    async fn start(stale: &str) -> Rig {
        let dead = refused_addr().await;
        let rig = Rig::start_with(stale, dead).await;
        // The dead address is stale from the start.
        rig.wait_metric("infergate_metrics_stale_targets", 1.0)
            .await;
        rig
    }

    /// The emulated pod and `other` behind the gateway (`staleMetrics: stale`), once ready.
    async fn start_with(stale: &str, other: SocketAddr) -> Rig {
        logs();
        let spec = FleetSpec::from_yaml(
            "seed: 5\npods:\n  - { name: a, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama }\n",
        )
        .unwrap();
        let (fleet_stop, fleet_rx) = tokio::sync::oneshot::channel::<()>();
        let fleet = serve_fleet(&spec, async move {
            let _ = fleet_rx.await;
        })
        .await
        .unwrap();
        let pod = fleet.addrs()[0].1;
        let config = GatewayConfig::from_yaml(&format!(
            "auth: none\nexplainHeader: true\nretries: {{ maxAttempts: 1 }}\nscrape: {{ intervalMs: 50, staleAfterMs: 200, timeoutMs: 200, maxLateMs: 400 }}\nmodels:\n  - name: llama\n    scheduler: {{ preset: infergate, staleMetrics: {stale} }}\n    endpoints: [{pod}, {other}]\n"
        ))
        .unwrap();
        let (gw, stop) = serve_gateway(config).await;
        let rig = Rig {
            gw,
            fleet: Some(fleet),
            fleet_stop: Some(fleet_stop),
            _stop: stop,
            pod,
            other,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(rig.admin(), "/readyz").await.0 != 200 {
            assert!(Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        rig
    }

    fn admin(&self) -> SocketAddr {
        self.gw.admin_addr().unwrap()
    }

    fn set_metrics(&self, metrics: MetricsFault) {
        let h = self.fleet.as_ref().unwrap().handle("a").unwrap();
        h.set_faults(Faults {
            metrics,
            ..h.faults()
        });
    }

    /// Waits until the first sample of `family` reads `value`.
    async fn wait_metric(&self, family: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = get(self.admin(), "/metrics").await.1;
            if sample(&m, family) == Some(value) {
                return;
            }
            assert!(Instant::now() < deadline, "{family} never {value}\n{m}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until both pods have a fresh page (`infergate_pod_stale` 0 for each): `/readyz`
    /// needs only one, and a pick made before the other's first page judges that one alone.
    async fn wait_both_fresh(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = get(self.admin(), "/metrics").await.1;
            let fresh = |pod: SocketAddr| {
                m.lines().any(|l| {
                    l.starts_with("infergate_pod_stale{")
                        && l.contains(&format!("pod=\"{pod}\""))
                        && l.ends_with(" 0")
                })
            };
            if fresh(self.pod) && fresh(self.other) {
                return;
            }
            assert!(Instant::now() < deadline, "both pods never fresh\n{m}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(mut self) {
        self.fleet_stop.take().unwrap().send(()).unwrap();
        self.fleet.take().unwrap().wait().await;
    }
}

fn sample(m: &str, family: &str) -> Option<f64> {
    m.lines()
        .find(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const CHAT: &str =
    r#"{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;

/// Median latency of `n` sequential requests to `addr`, every one answered 200 by `from` when
/// given (the gateway's `x-infergate-endpoint`).
async fn median_ms(addr: SocketAddr, n: usize, from: Option<SocketAddr>) -> f64 {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (status, headers, body) = post(addr, "/v1/chat/completions", CHAT).await;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        if let Some(from) = from {
            assert_eq!(headers["x-infergate-endpoint"], from.to_string().as_str());
        }
    }
    ms.sort_by(f64::total_cmp);
    ms[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_metrics_page_keeps_serving_fail_open_near_the_direct_latency() {
    let rig = Rig::start("{ mode: failOpen, maxInflightPerEndpoint: 4 }").await;
    let direct = median_ms(rig.pod, 20, None).await;
    let fresh = median_ms(rig.gw.http_addr(), 20, Some(rig.pod)).await;
    rig.set_metrics(MetricsFault::Stall);
    // Late first (routed on its last page), then failed at maxLateMs: both targets stale.
    rig.wait_metric("infergate_metrics_stale_targets", 2.0)
        .await;
    let open = median_ms(rig.gw.http_addr(), 20, Some(rig.pod)).await;
    println!(
        "median of 20 requests: direct {direct:.1} ms, gateway on fresh metrics {fresh:.1} ms, gateway fail-open on stalled metrics {open:.1} ms"
    );
    assert!(
        open < direct * 2.0 + 10.0,
        "fail-open {open} ms vs direct {direct} ms"
    );
    let m = get(rig.admin(), "/metrics").await.1;
    assert_eq!(sample(&m, "infergate_pool_fail_open"), Some(1.0), "{m}");
    assert!(
        m.contains(r#"infergate_pool_fail_open{model="llama"} 1"#),
        "{m}"
    );
    assert_eq!(
        sample(&m, "infergate_pool_fail_open_requests_total"),
        Some(20.0),
        "{m}"
    );
    // Still ready: the pool can dispatch.
    assert_eq!(get(rig.admin(), "/readyz").await.0, 200);
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(text.contains("dispatching fail-open"), "{text}");
    // The page comes back: routing on metrics again, said in the gauge and the log.
    rig.set_metrics(MetricsFault::Normal);
    rig.wait_metric("infergate_metrics_stale_targets", 1.0)
        .await;
    let (status, _, _) = post(rig.gw.http_addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    let m = get(rig.admin(), "/metrics").await.1;
    assert_eq!(sample(&m, "infergate_pool_fail_open"), Some(0.0), "{m}");
    assert_eq!(
        sample(&m, "infergate_pool_fail_open_requests_total"),
        Some(20.0),
        "{m}"
    );
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(text.contains("fail-open ended"), "{text}");
    // The dead address was never routed to: every answer above named the live pod.
    assert_ne!(rig.pod, rig.other);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_on_the_same_stall() {
    let rig = Rig::start("{ mode: failClosed }").await;
    rig.set_metrics(MetricsFault::Stall);
    rig.wait_metric("infergate_metrics_stale_targets", 2.0)
        .await;
    let (status, headers, body) = post(rig.gw.http_addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["retry-after"], "1");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "no_fresh_endpoints", "{v}");
    assert_eq!(get(rig.admin(), "/readyz").await.0, 503);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_open_cap_holds_exactly() {
    let rig = Rig::start("{ mode: failOpen, maxInflightPerEndpoint: 3 }").await;
    rig.set_metrics(MetricsFault::Stall);
    rig.wait_metric("infergate_metrics_stale_targets", 2.0)
        .await;
    // Three long streams, held open (their bodies unread).
    let c = client();
    let long = r#"{"model":"llama","max_tokens":4000,"stream":true,"messages":[{"role":"user","content":"tell me everything"}]}"#;
    let mut held = Vec::new();
    for _ in 0..3 {
        let req = http::Request::post(format!("http://{}/v1/chat/completions", rig.gw.http_addr()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(long.as_bytes())))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    assert_eq!(rig.gw.handle().inflight("llama"), Some(3));
    // The fourth and fifth are shed at the cap, with Retry-After.
    for _ in 0..2 {
        let (status, headers, body) = post(rig.gw.http_addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers["retry-after"], "1");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "shed", "{v}");
    }
    assert_eq!(rig.gw.handle().inflight("llama"), Some(3));
    // One stream ends (the client leaves): exactly one more fits.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.gw.handle().inflight("llama") != Some(2) {
        assert!(
            Instant::now() < deadline,
            "the dropped stream never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _, _) = post(rig.gw.http_addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert_eq!(rig.gw.handle().inflight("llama"), Some(2));
    drop(held);
    rig.stop().await;
}

/// A pod whose process is dying: it answered one metrics page, then its scrapes connect and get
/// no answer (the kernel completes connections its frozen process never serves), and the test
/// closes its listening socket while those scrapes hang. Its scrapes say it is reachable; its
/// port refuses. Returns the address, the count of `/metrics` connections accepted, and the
/// listener's task (abort it to close the port; the hanging connections stay open).
async fn dying_pod() -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let n = count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                if n == 0 {
                    let page = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"llama\"} 0\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"llama\"} 0\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"llama\"} 0.1\n";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        page.len()
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(page.as_bytes()).await;
                    return;
                }
                // Never answers; holds the connection open until the test ends.
                std::future::pending::<()>().await;
                drop(s);
            });
        }
    });
    (addr, accepted, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_refuses_the_request_leaves_fail_open_at_once_and_the_answer_says_retry() {
    use std::sync::atomic::Ordering;
    logs();
    let (pod, accepted, listener) = dying_pod().await;
    // Scrapes that connect and hang fail only at the 3 s timeout, still "reachable": a window
    // in which only the request path can learn that the port refuses.
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nretries: {{ maxAttempts: 2 }}\nscrape: {{ intervalMs: 50, staleAfterMs: 200, timeoutMs: 3000, maxLateMs: 3000 }}\nmodels:\n  - name: llama\n    scheduler: {{ preset: infergate, staleMetrics: {{ mode: failOpen }} }}\n    endpoints: [{pod}]\n"
    ))
    .unwrap();
    let (gw, _stop) = serve_gateway(config).await;
    let admin = gw.admin_addr().unwrap();
    // Failed at the end of its second scrape (3 s), reachable; the third scrape hangs.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(admin, "/metrics").await.1;
        if sample(&m, "infergate_metrics_stale_targets") == Some(1.0)
            && accepted.load(Ordering::SeqCst) >= 3
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod never failed reachable\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Fail-open would route to it: the gateway is ready.
    assert_eq!(get(admin, "/readyz").await.0, 200);
    listener.abort();
    let _ = listener.await;
    // The port refuses now; the scraper still waits on its hanging scrape.
    let (status, headers, body) = post(gw.http_addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["retry-after"], "1");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_refused", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("cannot connect to {pod}")),
        "{v}"
    );
    // The refusal took the pod out at once: the next request is not sent there, and the
    // gateway is no longer ready, before any scrape has said so.
    let (status, headers, body) = post(gw.http_addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["retry-after"], "1");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "no_fresh_endpoints", "{v}");
    assert_eq!(get(admin, "/readyz").await.0, 503);
    let m = get(admin, "/metrics").await.1;
    assert_eq!(
        sample(&m, "infergate_pool_endpoint_refusals_total"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "no scrape connected since the port closed"
    );
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(
        text.contains("connection to the endpoint refused") && text.contains(&pod.to_string()),
        "{text}"
    );
}

/// A pod whose every page says it is overloaded (a queue of 70, its KV cache 99.5% full): served
/// on keep-alive connections for as long as the test runs. Requests sent to it get the same
/// page, which no test here expects.
async fn overloaded_pod() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let page = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"llama\"} 70\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"llama\"} 256\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"llama\"} 0.995\n";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{page}",
                    page.len()
                );
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_fresh_pod_is_overloaded_a_pod_that_answers_without_a_page_takes_the_request() {
    logs();
    let hot = overloaded_pod().await;
    for (mode, want) in [("failOpen", 200), ("failClosed", 429)] {
        let rig = Rig::start_with(&format!("{{ mode: {mode} }}"), hot).await;
        rig.wait_both_fresh().await;
        let pod = rig.pod;
        // Both fresh: the overloaded pod is passed over for the idle one.
        let (status, headers, body) = post(rig.gw.http_addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers["x-infergate-endpoint"], pod.to_string().as_str());
        // The idle pod's page stalls until its scrapes fail (reachable: they connect and wait).
        rig.set_metrics(MetricsFault::Stall);
        rig.wait_metric("infergate_metrics_stale_targets", 1.0)
            .await;
        let (status, headers, body) = send(
            rig.gw.http_addr(),
            "POST",
            "/v1/chat/completions",
            CHAT,
            &[("x-infergate-explain", "1")],
        )
        .await;
        assert_eq!(
            status.as_u16(),
            want,
            "{mode}: {}",
            String::from_utf8_lossy(&body)
        );
        let m = get(rig.admin(), "/metrics").await.1;
        if want == 200 {
            // Fail-open: sent to the pod that answers, said in the metrics and in the decision:
            // the overloaded pod would have shed it, the other was ranked without a page.
            assert_eq!(headers["x-infergate-endpoint"], pod.to_string().as_str());
            let why = headers["x-infergate-explain"].to_str().unwrap();
            assert!(why.contains(" fail_open"), "{why}");
            assert!(why.contains(&format!("filtered={hot}:admission")), "{why}");
            assert!(
                why.contains(&format!(" {pod} total=")) && why.contains(" scrape=failed"),
                "{why}"
            );
            assert_eq!(
                sample(&m, "infergate_pool_fail_open_requests_total"),
                Some(1.0),
                "{m}"
            );
        } else {
            // Fail-closed: shed, as before, with the overloaded pod's drain time.
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], "shed", "{v}");
            assert!(headers.contains_key("retry-after"));
            assert_eq!(
                sample(&m, "infergate_pool_fail_open_requests_total"),
                Some(0.0),
                "{m}"
            );
        }
        rig.stop().await;
    }
}
