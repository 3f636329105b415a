//! The real `infergate gateway` and `infergate picker` over emulated vLLM pods, started as a user
//! would and driven with the traffic that makes their conditional families appear, for the tests
//! that read what the binaries export (the dashboard's, docs/metrics.md's).
//!
//! Emulated vLLM pods (`infergate-sim`, with a LoRA adapter) run on 127.0.0.1; the gateway and
//! the picker are started in front of them, each with its own free ports. One listed endpoint
//! has nothing behind it (scrape errors, a stale pod). Both judge the pods' answers by
//! outlier detection's failure percentage, over 1 ms intervals. [`FrontDoors::drive`] sends plain and
//! streamed chat through the gateway's front door and through the picker's ext_proc stream, one
//! unknown model, a body that is not JSON (a rejection), and changes the gateway's file once (a
//! reload).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers: a failed unwrap is a failed test; each test binary uses a part"
)]

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, ServedFleet, serve_fleet};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::forward;
use crate::harness::{Envoy, immediate, request_body, request_headers};
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;

/// How long a process may take to become ready.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// The emulated pods' profile.
pub const PROFILE: &str = "llama-3.1-8b/a10g";

/// The LoRA adapter every pod serves.
pub const ADAPTER: &str = "sql-lora";

/// A started `infergate` process, killed when dropped.
pub struct Proc {
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
    /// Starts `infergate ARGS`, its output in `DIR/WHAT.log`.
    pub fn start(what: &'static str, args: &[&str], dir: &Path) -> Proc {
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

    /// What it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the process's log if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}) with:\n{}", self.what, self.log());
        }
    }

    /// Waits until `GET /readyz` on `admin` answers 200.
    pub async fn wait_ready(&mut self, admin: SocketAddr) {
        self.wait_answering(admin, "/readyz").await;
    }

    /// Waits until `GET path` on `admin` answers 200, for [`READY_WITHIN`] (`/metrics` answers
    /// before `/readyz` does, and without a live pod).
    pub async fn wait_answering(&mut self, admin: SocketAddr, path: &str) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            self.assert_running();
            if let Ok((200, _)) = http(admin, "GET", path, None).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer {path} on {admin} with 200 within {READY_WITHIN:?}:\n{}",
                self.what,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `n` distinct free ports on 127.0.0.1 (all held until every one is chosen).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// `127.0.0.1:port`.
pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One HTTP/1.1 exchange with `connection: close`: the status and the body (chunked bodies are
/// left encoded; the callers only look for names in them).
pub async fn http(
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

/// A chat completion request for `model`.
pub fn chat(model: &str, user: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 8,
        "stream": stream,
        "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": user },
        ],
    });
    // vLLM refuses stream options on a request that is not streamed.
    if stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    body
}

/// Every sample name a Prometheus / OpenMetrics text page exports: each `# TYPE` family expanded
/// to the names its samples carry (`_total` for a counter, `_bucket`/`_sum`/`_count` for a
/// histogram), and the names of the sample lines themselves. Also returns the sample names that
/// have at least one sample.
pub fn exported(page: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut with_samples = BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            for s in suffixes(kind) {
                let full = if name.ends_with(s) {
                    name.to_owned()
                } else {
                    format!("{name}{s}")
                };
                names.insert(full);
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = sample_name(line);
            if !name.is_empty() {
                names.insert(name.to_owned());
                with_samples.insert(name.to_owned());
            }
        }
    }
    (names, with_samples)
}

/// The suffixes the samples of a family of type `kind` add to its name.
pub fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total"],
        "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
        "summary" => &["", "_sum", "_count"],
        "info" => &["_info"],
        _ => &[""],
    }
}

/// The metric name a sample line starts with.
pub fn sample_name(line: &str) -> &str {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    &line[..end]
}

/// Reads `/metrics` from each address every 100 ms until `done` accepts the pages (in the order
/// of `addrs`), or for `within`; the last pages read. Some series appear a moment after the
/// traffic that makes them (a reload, learned rates, a failed scrape).
pub async fn scrape_until(
    addrs: &[(&str, SocketAddr)],
    within: Duration,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let mut pages = Vec::new();
        for (what, addr) in addrs {
            let (status, page) = http(*addr, "GET", "/metrics", None).await.unwrap();
            assert_eq!(status, 200, "{what} /metrics: {page}");
            pages.push(page);
        }
        if done(&pages) || Instant::now() > deadline {
            return pages;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts `infergate picker` or `infergate bbr` (`command`) with `args`, on 127.0.0.1 with its
/// ext_proc, gRPC health and metrics ports at `ports`.
pub fn start_ext_proc(command: &'static str, args: &[&str], ports: [u16; 3], dir: &Path) -> Proc {
    let [grpc, health, metrics] = ports.map(|p| p.to_string());
    let mut all = vec![command, "--listen-address", "127.0.0.1"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--grpc-port",
        &grpc,
        "--grpc-health-port",
        &health,
        "--metrics-port",
        &metrics,
    ]);
    Proc::start(command, &all, dir)
}

/// The first answer of an ext_proc stream to a chat completion's headers and `body`, as Envoy
/// sends them.
pub async fn ext_proc_answer(envoy: &Envoy, body: &[u8]) -> ProcessingResponse {
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(body, true)).await;
    ex.next().await
}

/// Asserts that an OpenAI-compatible front door answers a chat completion for a model it does
/// not serve with 404.
pub async fn assert_unknown_model_refused(front: SocketAddr) {
    let (status, body) = http(
        front,
        "POST",
        "/v1/chat/completions",
        Some(&chat("no-such-model", "hi", false)),
    )
    .await
    .unwrap();
    assert_eq!(status, 404, "{body}");
}

/// The emulated pods, the gateway and the picker in front of them.
pub struct FrontDoors {
    /// The gateway process.
    pub gateway: Proc,
    /// The picker process.
    pub picker: Proc,
    /// The gateway's front door.
    pub front: SocketAddr,
    /// The gateway's admin port (`/metrics`, `/heartbeat`).
    pub gateway_admin: SocketAddr,
    /// The picker's ext_proc port.
    pub grpc: SocketAddr,
    /// The picker's metrics port.
    pub picker_metrics: SocketAddr,
    /// The listed endpoint nothing listens on.
    pub dead: SocketAddr,
    /// The pods' base model.
    pub model: String,
    /// Free ports asked for beside these, for the caller's own processes.
    pub spare_ports: Vec<u16>,
    /// Where the files and logs are.
    pub dir: tempfile::TempDir,
    gateway_config: PathBuf,
    config: Value,
    fleet: ServedFleet,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for FrontDoors {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl FrontDoors {
    /// Starts two emulated vLLM pods (each serving the base model and [`ADAPTER`]), the gateway
    /// and the picker over them and a dead endpoint, and waits until both are ready; with
    /// `spare` more free ports for the caller.
    pub async fn start(spare: usize) -> FrontDoors {
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
        let ports = free_ports(6 + spare);
        let front = local(ports[0]);
        let gateway_admin = local(ports[1]);
        let (grpc, grpc_health, picker_metrics) = (ports[2], ports[3], ports[4]);
        // Nothing listens here: its scrapes fail (`connect`) and it stays stale.
        let dead = local(ports[5]);

        // Both judge each pod's answers over intervals of 1 ms (so that the share of failures
        // of each closed interval is exported); only all of them failing would eject it.
        let scheduler = json!({
            "preset": "infergate",
            "outlierDetection": {
                "failurePercentage": { "threshold": 100, "minimumRequests": 1, "intervalMs": 1 },
            },
        });

        // The gateway in front of the pods.
        let endpoints: Vec<Value> = fleet
            .pods
            .iter()
            .map(|p| json!({ "address": p.addr.to_string(), "name": p.name }))
            .chain(std::iter::once(
                json!({ "address": dead.to_string(), "name": "dead" }),
            ))
            .collect();
        let gateway_config = dir.path().join("gateway.yaml");
        let config = json!({
            "listen": front.to_string(),
            "admin": gateway_admin.to_string(),
            "reloadIntervalMs": 100,
            "retries": { "maxAttempts": 3 },
            "auth": "none",
            "models": [{
                "name": model,
                "engine": "vllm",
                "loraAdapters": [ADAPTER],
                "scheduler": scheduler.clone(),
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

        // A picker on the same pods.
        let endpoints_file = dir.path().join("endpoints.yaml");
        let file = json!({ "engine": "vllm", "endpoints": endpoints });
        std::fs::write(&endpoints_file, serde_yaml::to_string(&file).unwrap()).unwrap();
        let scheduler_file = dir.path().join("scheduler.yaml");
        std::fs::write(&scheduler_file, serde_yaml::to_string(&scheduler).unwrap()).unwrap();
        let (endpoints_file, scheduler_file) = (
            endpoints_file.to_str().unwrap(),
            scheduler_file.to_str().unwrap(),
        );
        let mut picker = start_ext_proc(
            "picker",
            &[
                "--pool-name",
                "llama",
                "--endpoints-file",
                endpoints_file,
                "--config",
                scheduler_file,
            ],
            [grpc, grpc_health, picker_metrics],
            dir.path(),
        );
        gateway.wait_ready(gateway_admin).await;
        picker.wait_ready(local(picker_metrics)).await;
        FrontDoors {
            gateway,
            picker,
            front,
            gateway_admin,
            grpc: local(grpc),
            picker_metrics: local(picker_metrics),
            dead,
            model,
            spare_ports: ports[6..].to_vec(),
            dir,
            gateway_config,
            config,
            fleet,
            stop: Some(stop),
        }
    }

    /// Changes the gateway's file (a reload), then sends the traffic: through the gateway plain
    /// and streamed, base model and adapter, and one unknown model (a rejection); through the
    /// picker, as Envoy sends it, plain and streamed, and a body that is not JSON (a rejection).
    /// On each, some pod answers twice, which closes its interval of answers.
    pub async fn drive(&mut self) {
        self.config["retries"]["maxAttempts"] = json!(2);
        std::fs::write(
            &self.gateway_config,
            serde_yaml::to_string(&self.config).unwrap(),
        )
        .unwrap();

        let model = self.model.clone();
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
                self.front,
                "POST",
                "/v1/chat/completions",
                Some(&chat(m, &format!("hello {i}"), stream)),
            )
            .await
            .unwrap();
            assert_eq!(status, 200, "{m} (stream {stream}): {body}");
            assert!(body.contains("usage"), "{body}");
        }
        assert_unknown_model_refused(self.front).await;

        let envoy = Envoy::connect(self.grpc).await;
        // Three, so that one pod answers twice (its interval is judged).
        for stream in [false, true, false] {
            let body = serde_json::to_vec(&chat(&model, "via ext_proc", stream)).unwrap();
            let f = forward::forward(&envoy, "/v1/chat/completions", &body, 64).await;
            assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
            assert_ne!(f.endpoint, self.dead);
        }
        let answer = ext_proc_answer(&envoy, b"not json").await;
        let status = immediate(&answer).status.as_ref().map_or(0, |s| s.code);
        assert_eq!(status, 400, "{answer:?}");
    }

    /// Fails the test if either process has exited.
    pub fn assert_running(&mut self) {
        self.gateway.assert_running();
        self.picker.assert_running();
    }
}
