//! Local "clusters" for the global router's tests: each a real infergate gateway
//! (`infergate_proxy::serve_workers`) in front of its own emulated fleet (`infergate_sim`), and
//! a load generator that records which cluster answered each request.
#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig, WorkerListeners, serve_workers};
use infergate_sim::{Faults, FleetSpec, MetricsFault, ServedFleet, serve_fleet};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// One cluster: an emulated fleet and the gateway in front of it.
pub struct TestCluster {
    pub name: String,
    pub fleet: ServedFleet,
    _fleet_stop: oneshot::Sender<()>,
    gateway: Option<(Gateway, oneshot::Sender<()>)>,
    config: String,
    pub http: SocketAddr,
    pub admin: SocketAddr,
}

impl TestCluster {
    /// `pods` pods of `profile` serving `llama`, behind a gateway on port 0.
    pub async fn start(name: &str, profile: &str, pods: usize, seed: u64) -> TestCluster {
        Self::start_with(name, profile, pods, seed, "").await
    }

    /// [`Self::start`] with `front` (top-level gateway YAML, e.g. `tls:`) added to the
    /// gateway's configuration.
    pub async fn start_with(
        name: &str,
        profile: &str,
        pods: usize,
        seed: u64,
        front: &str,
    ) -> TestCluster {
        Self::launch(name, profile, pods, seed, front, None).await
    }

    /// One pod of `profile` whose gateway endpoint declares the GPU type `gpu` (the scheduler
    /// scales its cold-start rate by it until it learns the pod's own).
    pub async fn start_on_gpu(name: &str, profile: &str, gpu: &str, seed: u64) -> TestCluster {
        Self::launch(name, profile, 1, seed, "", Some(gpu)).await
    }

    async fn launch(
        name: &str,
        profile: &str,
        pods: usize,
        seed: u64,
        front: &str,
        gpu: Option<&str>,
    ) -> TestCluster {
        let mut spec = format!("seed: {seed}\npods:\n");
        for i in 0..pods {
            spec.push_str(&format!(
                "  - {{ name: {name}-{i}, profile: {profile}, engine: vllm, served_model_name: llama }}\n"
            ));
        }
        let spec = FleetSpec::from_yaml(&spec).unwrap();
        let (fleet_stop, rx) = oneshot::channel::<()>();
        let fleet = serve_fleet(&spec, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
        let mut config = format!(
            "{front}auth: none\nmodels:\n  - name: llama\n    scheduler: {{ preset: infergate }}\n    endpoints:\n",
        );
        for (pod, addr) in fleet.addrs() {
            let gpu = gpu.map_or(String::new(), |g| format!(", gpu: {g}"));
            config.push_str(&format!(
                "      - {{ address: {addr}, name: {pod}, engine: vllm{gpu} }}\n"
            ));
        }
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut c = TestCluster {
            name: name.to_owned(),
            fleet,
            _fleet_stop: fleet_stop,
            gateway: None,
            config,
            http: local,
            admin: local,
        };
        c.start_gateway(local, local).await;
        c
    }

    async fn start_gateway(&mut self, http: SocketAddr, admin: SocketAddr) {
        let config = GatewayConfig::from_yaml(&self.config).unwrap();
        // A restarted gateway rebinds the ports the router knows; the old sockets may linger
        // for a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let listeners = loop {
            match WorkerListeners::bind(http, Some(admin), 1) {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "rebinding {http}: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let (stop, rx) = oneshot::channel::<()>();
        let gw = serve_workers(config, listeners, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
        self.http = gw.http_addr();
        self.admin = gw.admin_addr().unwrap();
        self.gateway = Some((gw, stop));
    }

    /// Stops the gateway (its listeners close; the fleet keeps running).
    pub async fn kill(&mut self) {
        if let Some((gw, stop)) = self.gateway.take() {
            let _ = stop.send(());
            gw.wait().await;
        }
    }

    /// Starts the gateway again on the same ports.
    pub async fn restart(&mut self) {
        self.start_gateway(self.http, self.admin).await;
    }

    /// Sets every pod's `/metrics` fault: `Missing` makes them stale to the gateway while the
    /// gateway itself keeps answering (a gray failure).
    pub fn set_metrics(&self, fault: MetricsFault) {
        for p in &self.fleet.pods {
            p.handle.set_faults(Faults {
                metrics: fault,
                ..p.handle.faults()
            });
        }
    }

    /// The router's cluster entry for this cluster.
    pub fn entry(&self, region: &str, input: f64, output: f64) -> String {
        format!(
            "  - {{ name: {}, url: 'http://{}', heartbeatUrl: 'http://{}/heartbeat', region: {region}, cost: {{ inputPerMillion: {input}, outputPerMillion: {output} }} }}\n",
            self.name, self.http, self.admin
        )
    }
}

/// One request's outcome as the client saw it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When it was sent, since the load started.
    pub at: Duration,
    /// The status (`None`: the connection broke, which the router only lets happen after the
    /// answer started streaming).
    pub status: Option<u16>,
    /// `x-infergate-cluster`.
    pub cluster: Option<String>,
    /// Time to the whole answer.
    pub latency: Duration,
    /// Time to the first SSE event carrying generated text.
    pub ttft: Option<Duration>,
    /// Whether the SSE stream ended with `[DONE]`.
    pub complete: bool,
}

/// Closed-loop load: `clients` tasks each sending streamed chat requests one after another
/// until `stop` is set.
pub struct Load {
    pub outcomes: Arc<Mutex<Vec<Outcome>>>,
    pub start: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub const CHAT: &str = r#"{"model":"llama","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me a short story about a lighthouse keeper and the sea."}]}"#;

impl Load {
    pub fn start(router: SocketAddr, clients: usize, pause: Duration, body: &'static str) -> Load {
        Self::start_with(router, clients, pause, Arc::new(move |_| body.to_owned()))
    }

    /// As [`Load::start`], with each request's body made by `body` from a sequence number.
    pub fn start_with(
        router: SocketAddr,
        clients: usize,
        pause: Duration,
        body: Arc<dyn Fn(u64) -> String + Send + Sync>,
    ) -> Load {
        let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let start = Instant::now();
        let tasks = (0..clients)
            .map(|_| {
                let (outcomes, stop) = (Arc::clone(&outcomes), Arc::clone(&stop));
                let (body, seq) = (Arc::clone(&body), Arc::clone(&seq));
                tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let sent = Instant::now();
                        let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let o = match stream_chat(router, body(n)).await {
                            Some((status, cluster, ttft, complete)) => Outcome {
                                at: sent - start,
                                status: Some(status),
                                cluster,
                                latency: sent.elapsed(),
                                ttft,
                                complete,
                            },
                            None => Outcome {
                                at: sent - start,
                                status: None,
                                cluster: None,
                                latency: sent.elapsed(),
                                ttft: None,
                                complete: false,
                            },
                        };
                        outcomes.lock().unwrap().push(o);
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            outcomes,
            start,
            stop,
            tasks,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub async fn stop(self) -> Vec<Outcome> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut v = self.outcomes.lock().unwrap().clone();
        v.sort_by_key(|o| o.at);
        v
    }
}

/// One streamed chat request on a new HTTP/1.1 connection: status, `x-infergate-cluster`,
/// time to the first generated text, and whether the stream ended with `[DONE]`. `None` when
/// the connection failed or broke off.
pub async fn stream_chat(
    router: SocketAddr,
    body: String,
) -> Option<(u16, Option<String>, Option<Duration>, bool)> {
    use http_body_util::BodyExt;
    let sent = Instant::now();
    let work = async move {
        let tcp = tokio::net::TcpStream::connect(router).await.ok()?;
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .ok()?;
        tokio::spawn(conn);
        let req = http::Request::post("/v1/chat/completions")
            .header("host", router.to_string())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .ok()?;
        let resp = tx.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let cluster = resp
            .headers()
            .get("x-infergate-cluster")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = resp.into_body();
        let mut ttft = None;
        let mut text = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.ok()?;
            if let Some(d) = frame.data_ref() {
                text.extend_from_slice(d);
                if ttft.is_none() && memchr_content(&text) {
                    ttft = Some(sent.elapsed());
                }
            }
        }
        let complete = String::from_utf8_lossy(&text).contains("data: [DONE]");
        Some((status, cluster, ttft, complete))
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .ok()?
}

/// Whether an SSE event carried generated text (the first event's `"content":""` does not).
fn memchr_content(text: &[u8]) -> bool {
    text.windows(12)
        .any(|w| &w[..11] == br#""content":""# && w[11] != b'"')
}

/// The `q` quantile of `values` (nearest rank).
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// A counter's value in a Prometheus page (0 when absent).
pub fn counter(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Waits until `admin`'s `/readyz` answers 200.
pub async fn wait_ready(admin: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while infergate_testkit::try_get(admin, "/readyz")
        .await
        .map_or(true, |r| r.status != 200)
    {
        assert!(Instant::now() < deadline, "{admin} never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A gateway serving `yaml` (one worker, ports 0 on loopback), once its `/readyz` answers 200;
/// it stops when the sender is dropped.
pub async fn ready_gateway(yaml: &str) -> (Gateway, oneshot::Sender<()>) {
    let local = "127.0.0.1:0".parse().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let gw = serve_workers(
        GatewayConfig::from_yaml(yaml).unwrap(),
        WorkerListeners::bind(local, Some(local), 1).unwrap(),
        async move {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    let admin = gw.admin_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while infergate_testkit::get(admin, "/readyz").await.status != 200 {
        assert!(Instant::now() < deadline, "the gateway never got ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (gw, stop)
}

/// A global router with the configuration `yaml` on loopback ports 0, and its stop switch.
pub async fn router_with(yaml: &str) -> (infergate_global::Router, oneshot::Sender<()>) {
    let config = infergate_global::GlobalConfig::from_yaml(yaml).unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    let (stop, rx) = oneshot::channel::<()>();
    let router = infergate_global::serve(
        config,
        infergate_global::Listeners { http, admin },
        async move {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    (router, stop)
}
