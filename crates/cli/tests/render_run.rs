//! Render and run: what the operator renders for every example is *executed*.
//!
//! For each file in `deploy/examples/`, `infergate render` (the real binary) prints the objects.
//! For every rendered Deployment the test starts the real `infergate` binary with the rendered
//! container's command line and environment, each mounted ConfigMap file written to its mount path
//! under a temporary folder of the pod's own. Each "pod" gets its own loopback address
//! (`INFERGATE_LISTEN_ADDRESS`), standing in for its network namespace, so the rendered ports are
//! used as they are. The picker's pod discovery talks to a fake Kubernetes API over real HTTP
//! that serves the rendered InferencePool and pods pointing at emulated model servers. Then:
//! - every rendered readiness and liveness probe answers SERVING on its rendered port and service;
//! - every rendered metrics port serves `/metrics`;
//! - an Envoy-side ext_proc client sends a request through the BBR, follows the rendered
//!   HTTPRoute that matches the header the BBR set to its InferencePool, and through that pool's
//!   picker to a pick, which must name an emulated pod of that pool;
//! - a picker started with a rendered `--quotas` file enforces it: the tenant with the smallest
//!   request limit gets exactly that many answered requests (forwarded to the emulated pod and
//!   streamed back through the picker, as Envoy does), then the picker's own 429 — with
//!   `spec.auth`, sent as the tenant header Envoy builds from the rendered ClientTrafficPolicy
//!   and SecurityPolicy for a client that names another tenant, so the token's tenant is the
//!   one charged; a picker started with a rendered `--flow-control` file serves its queues'
//!   series.
//!
//! A flag, port, probe, mount path or ConfigMap format changed on one side only fails here.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "../../extproc/tests/common/forward.rs"]
mod forward;
#[path = "../../extproc/tests/common/harness.rs"]
mod harness;
#[path = "common/kube_api.rs"]
mod kube_api;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use harness::{
    Envoy, body_answer, headers_answer, immediate_parts, request_body, request_headers, split,
    with_modes,
};
use infergate_extproc::wire;
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, serve_fleet_at};
use kube_api::FakeKube;
use serde::Deserialize as _;
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Envoy Gateway's per-connection buffer limit when no ClientTrafficPolicy sets one: what a
/// `Buffered` ext_proc body must fit in.
const ENVOY_GATEWAY_BUFFER_LIMIT: usize = 32_768;

/// How long a rendered process may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_infergate")
}

/// `infergate render -f PATH`, parsed.
fn render(path: &Path) -> Vec<Value> {
    let out = Command::new(bin())
        .args(["render", "-f"])
        .arg(path)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "infergate render -f {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The tenant headers Envoy would pass a picker for a client that sent
/// `x-llm-d-inference-fairness-id: forged`, applying the rendered objects as Envoy does. With
/// `spec.auth` (a SecurityPolicy), the token names `tenant` in the claim the policy's
/// `claimToHeaders` copies: the Gateway's ClientTrafficPolicy first removes the headers its
/// `headers.earlyRequestHeaders.remove` lists (the HTTP connection manager's early header
/// mutation, before any filter), then the JWT filter appends the claim to the header named
/// (Envoy's `addJWTClaimToHeader` uses `addCopy`). Without auth, the client's header is passed
/// as sent, so the caller must use `forged` as the tenant.
const FAIRNESS_ID: &str = infergate_pool::tenant::FAIRNESS_ID_HEADER;

fn envoy_tenant_headers(objects: &[Value], forged: &str, tenant: &str) -> Vec<(String, String)> {
    let mut headers = vec![(FAIRNESS_ID.to_owned(), forged.to_owned())];
    let Some(sp) = of_kind(objects, "SecurityPolicy").first().copied() else {
        return headers;
    };
    for ctp in of_kind(objects, "ClientTrafficPolicy") {
        let removed = ctp["spec"]["headers"]["earlyRequestHeaders"]["remove"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        headers.retain(|(k, _)| {
            !removed
                .iter()
                .any(|r| r.as_str().is_some_and(|r| r.eq_ignore_ascii_case(k)))
        });
    }
    for c in sp["spec"]["jwt"]["providers"][0]["claimToHeaders"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        // The token's payload carries `tenant` under the (possibly nested) claim named.
        assert!(c["claim"].as_str().is_some_and(|c| !c.is_empty()), "{c}");
        headers.push((
            c["header"].as_str().unwrap().to_ascii_lowercase(),
            tenant.to_owned(),
        ));
    }
    headers
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap()
}

/// A started process; killed when dropped.
struct Proc {
    deployment: String,
    host: IpAddr,
    child: Child,
    log: PathBuf,
    /// The pod's own filesystem: where its mounted files were written.
    fs: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the process's log if it has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{} exited ({status}) with:\n{}",
                self.deployment,
                self.log()
            );
        }
    }
}

/// The loopback address standing in for replica `replica`'s pod of the `index`th Deployment of
/// example `example`.
fn pod_host(example: u8, replica: usize, index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        100 + example,
        replica as u8,
        1 + index as u8,
    ))
}

/// Replicas started per Deployment: a picker with the peer exchange runs them all (they must
/// find and authenticate each other); anything else one.
fn replicas_to_run(deployment: &Value) -> usize {
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    if flag(args, "--peer-key-file").is_some() {
        deployment["spec"]["replicas"].as_u64().unwrap() as usize
    } else {
        1
    }
}

/// Starts replica `replica` of `replicas` of the container of `deployment` as a process on
/// `host`, files under `root`. `peer_host(r)` is where replica `r` runs: the headless Service's
/// name in `--peer` stands for those addresses (no cluster DNS here).
#[allow(clippy::too_many_arguments)]
fn start(
    deployment: &Value,
    objects: &[Value],
    root: &Path,
    host: IpAddr,
    kubeconfig: &Path,
    (replica, replicas): (usize, usize),
    peer_host: impl Fn(usize) -> IpAddr,
) -> Proc {
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{}: one container", name(deployment));
    let c = &containers[0];
    assert!(
        c["command"].is_null(),
        "the image's entrypoint is the binary"
    );
    // Mounted ConfigMap files, written where the container would see them: under a folder of
    // this replica's own, as every pod has its own filesystem (one shared folder let a replica
    // starting later rewrite a file while an earlier one read it, finding it empty).
    let fs = root.join(format!("{}-{replica}", name(deployment)));
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let mount_path = m["mountPath"].as_str().unwrap();
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume {}", m["name"]));
        if let Some(secret) = volume["secret"].as_object() {
            // kubelet writes the Secret's keys; there is no Secret store here, so a stand-in key
            // (the same for every replica, as the one Secret is) where the container reads it.
            let dir = fs.join(mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            for item in secret["items"].as_array().unwrap() {
                std::fs::write(
                    dir.join(item["path"].as_str().unwrap()),
                    format!(
                        "stand-in-key-of-{}-{}\n",
                        secret["secretName"].as_str().unwrap(),
                        item["key"].as_str().unwrap()
                    ),
                )
                .unwrap();
            }
            mounts.push(mount_path.to_owned());
            continue;
        }
        // The user's tokenizer volume (precise prefix routing): not rendered, so the test's
        // tiny tokenizer stands in for the ConfigMap's or the claim's files.
        let users = volume["persistentVolumeClaim"].is_object()
            || (volume["configMap"]["items"].is_null()
                && !objects.iter().any(|o| {
                    o["kind"] == "ConfigMap" && volume["configMap"]["name"] == o["metadata"]["name"]
                }));
        if users {
            let dir = fs.join(mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            let fixture =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny");
            for f in std::fs::read_dir(fixture).unwrap() {
                let f = f.unwrap();
                if f.file_name() != "expected.json" {
                    std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
                }
            }
            mounts.push(mount_path.to_owned());
            continue;
        }
        let cm_name = volume["configMap"]["name"]
            .as_str()
            .expect("a ConfigMap or Secret volume");
        let cm = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && name(o) == cm_name)
            .unwrap_or_else(|| panic!("ConfigMap {cm_name} is mounted but not rendered"));
        let dir = fs.join(mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        for item in volume["configMap"]["items"].as_array().unwrap() {
            let key = item["key"].as_str().unwrap();
            let text = cm["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"));
            std::fs::write(dir.join(item["path"].as_str().unwrap()), text).unwrap();
        }
        mounts.push(mount_path.to_owned());
    }
    // A flag naming a file under a mount reads it under the temporary root; the peers' DNS
    // name stands for the other replicas' addresses.
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| {
            let a = a.as_str().unwrap();
            if let Some(target) = a.strip_prefix("--peer=") {
                let port = target.rsplit_once(':').unwrap().1;
                return (0..replicas)
                    .filter(|r| *r != replica)
                    .map(|r| format!("--peer={}:{port}", peer_host(r)))
                    .collect::<Vec<_>>();
            }
            vec![match a.split_once('=') {
                Some((flag, value)) if mounts.iter().any(|m| value.starts_with(m.as_str())) => {
                    format!(
                        "{flag}={}",
                        fs.join(value.trim_start_matches('/')).display()
                    )
                }
                _ => a.to_owned(),
            }]
        })
        .collect();
    let mut cmd = Command::new(bin());
    cmd.args(&args).env_clear();
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let key = e["name"].as_str().unwrap();
        let secret = &e["valueFrom"]["secretKeyRef"];
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            // kubelet reads the Secret's key; there is no Secret store here, so a stand-in of
            // the same Secret and key (the process needs the variable set, not a real password).
            (_, Value::Null) if secret.is_object() => format!(
                "stand-in-{}-{}",
                secret["name"].as_str().unwrap(),
                secret["key"].as_str().unwrap()
            ),
            (_, Value::String(f)) if f == "metadata.namespace" => {
                deployment["metadata"]["namespace"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            }
            (_, Value::String(f)) if f == "metadata.name" => {
                format!("{}-{replica}", name(deployment))
            }
            other => panic!("env {key}: cannot provide {other:?}"),
        };
        cmd.env(key, value);
    }
    // Quiet logs keep the test output small; errors still show.
    cmd.env("RUST_LOG", "warn");
    cmd.env("KUBECONFIG", kubeconfig);
    cmd.env("INFERGATE_LISTEN_ADDRESS", host.to_string());
    let log = root.join(format!("{}-{replica}.log", name(deployment)));
    let file = std::fs::File::create(&log).unwrap();
    cmd.stdout(Stdio::null()).stderr(file);
    let child = cmd.spawn().unwrap();
    Proc {
        deployment: name(deployment).to_owned(),
        host,
        child,
        log,
        fs,
    }
}

/// The container port named `port_name` (probes may name a port or give its number).
fn port_of(c: &Value, port: &Value) -> u16 {
    match port {
        Value::Number(n) => u16::try_from(n.as_u64().unwrap()).unwrap(),
        Value::String(n) => c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == *n)
            .map(|p| u16::try_from(p["containerPort"].as_u64().unwrap()).unwrap())
            .unwrap_or_else(|| panic!("no container port named {n}")),
        other => panic!("port {other:?}"),
    }
}

async fn grpc_health(addr: SocketAddr, service: &str) -> Result<ServingStatus, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|e| e.to_string())?;
    ServingStatus::try_from(answer.into_inner().status).map_err(|e| e.to_string())
}

/// Waits until the probe `probe` of container `c` answers SERVING.
async fn wait_probe(p: &mut Proc, c: &Value, probe: &str) {
    let spec = &c[probe];
    assert!(spec.is_object(), "{}: no {probe}", p.deployment);
    let grpc = &spec["grpc"];
    assert!(
        grpc.is_object(),
        "{}: {probe} is not a gRPC probe",
        p.deployment
    );
    let addr = SocketAddr::new(p.host, port_of(c, &grpc["port"]));
    let service = grpc["service"].as_str().unwrap_or("");
    let deadline = Instant::now() + READY_WITHIN;
    let mut last = String::new();
    while Instant::now() < deadline {
        p.assert_running();
        match grpc_health(addr, service).await {
            Ok(ServingStatus::Serving) => return,
            Ok(s) => last = format!("{s:?}"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{}: {probe} ({addr}, service {service:?}) never SERVING: {last}\n{}",
        p.deployment,
        p.log()
    );
}

/// GET `/metrics` on the rendered metrics port (the `prometheus.io/port` annotation and the
/// container port named `metrics` must agree).
async fn check_metrics(p: &Proc, deployment: &Value, c: &Value) -> String {
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    let port = port_of(c, &json!("metrics"));
    if let Some(annotated) = annotations["prometheus.io/port"].as_str() {
        assert_eq!(
            annotated,
            port.to_string(),
            "{}: the scrape annotation",
            p.deployment
        );
    }
    let path = annotations["prometheus.io/path"]
        .as_str()
        .unwrap_or("/metrics");
    let answer = infergate_testkit::get(SocketAddr::new(p.host, port), path).await;
    let body = answer.text();
    assert_eq!(answer.status, 200, "{}: GET {path}: {body}", p.deployment);
    assert!(body.contains("# TYPE "), "{}: {body}", p.deployment);
    body
}

/// The emulated engine for a rendered picker's `--default-engine`.
fn engine_of(args: &[Value]) -> EngineKind {
    let e = args
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--default-engine="))
        .next()
        .unwrap_or("vllm");
    match e {
        "vllm" => EngineKind::Vllm,
        "sglang" => EngineKind::Sglang,
        "tgi" => EngineKind::Tgi,
        other => panic!("engine {other}"),
    }
}

fn flag<'a>(args: &'a [Value], flag: &str) -> Option<&'a str> {
    args.iter()
        .filter_map(|a| a.as_str()?.strip_prefix(flag)?.strip_prefix('='))
        .next()
}

/// One example, end to end.
async fn run_example(path: &Path, example_index: u8) {
    let objects = render(path);
    let root = tempfile::tempdir().unwrap();
    let kube = FakeKube::start().await;
    let kubeconfig = root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get("llama-3.1-8b/a10g").unwrap().clone();

    // The pools the render produced, served by the fake API, each with two emulated pods on
    // addresses of their own at the pool's target port.
    let mut pods_of_pool: BTreeMap<String, Vec<SocketAddr>> = BTreeMap::new();
    let mut fleets = Vec::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for (pi, pool) in of_kind(&objects, "InferencePool").into_iter().enumerate() {
        kube.put(pool.clone());
        let pool_name = name(pool).to_owned();
        let picker = of_kind(&objects, "Deployment")
            .into_iter()
            .find(|d| {
                let args = d["spec"]["template"]["spec"]["containers"][0]["args"]
                    .as_array()
                    .unwrap();
                flag(args, "--pool-name") == Some(pool_name.as_str())
            })
            .unwrap_or_else(|| panic!("no rendered picker serves pool {pool_name}"));
        let picker_args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .clone();
        let port =
            u16::try_from(pool["spec"]["targetPorts"][0]["number"].as_u64().unwrap()).unwrap();
        let engine = engine_of(&picker_args);
        // The pods serve the model the pool's route matches first, so a forwarded request for
        // it is answered (the emulator answers 404 for a name it does not serve).
        let model = of_kind(&objects, "HTTPRoute")
            .into_iter()
            .find(|r| r["spec"]["rules"][0]["backendRefs"][0]["name"] == pool_name.as_str())
            .and_then(|r| r["spec"]["rules"][0]["matches"][0]["headers"][0]["value"].as_str())
            .map(str::to_owned);
        let ns = pool["metadata"]["namespace"].as_str().unwrap();
        let labels = pool["spec"]["selector"]["matchLabels"].clone();
        let spec = FleetSpec {
            seed: 1,
            pods: (0..2)
                .map(|i| {
                    let pod = PodSpec::new(format!("{pool_name}-pod-{i}"), &profile, engine);
                    match &model {
                        Some(m) => PodSpec {
                            model: m.as_str().into(),
                            ..pod
                        },
                        None => pod,
                    }
                })
                .collect(),
        }
        .finish()
        .unwrap();
        let ip = |i: usize| {
            IpAddr::V4(Ipv4Addr::new(
                127,
                2 + example_index,
                1 + pi as u8,
                1 + i as u8,
            ))
        };
        let addrs: Vec<SocketAddr> = (0..spec.pods.len())
            .map(|i| SocketAddr::new(ip(i), port))
            .collect();
        let by_name: BTreeMap<String, SocketAddr> = spec
            .pods
            .iter()
            .zip(&addrs)
            .map(|(p, a)| (p.name.clone(), *a))
            .collect();
        let mut rx = stopped.clone();
        let fleet = serve_fleet_at(&spec, |p| by_name[&p.name], async move {
            let _ = rx.wait_for(|s| *s).await;
        })
        .await
        .unwrap();
        for (i, a) in addrs.iter().enumerate() {
            kube.put(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": format!("{pool_name}-pod-{i}"),
                    "namespace": ns,
                    "labels": labels,
                },
                "spec": { "containers": [{ "name": "server", "image": "model-server", "ports": [{ "containerPort": port }] }] },
                "status": {
                    "phase": "Running",
                    "podIP": a.ip().to_string(),
                    "conditions": [{ "type": "Ready", "status": "True" }],
                },
            }));
        }
        pods_of_pool.insert(pool_name, addrs);
        fleets.push(fleet);
    }

    // Every Deployment as a process, on an address of its own.
    let deployments = of_kind(&objects, "Deployment");
    assert!(!deployments.is_empty());
    let mut procs = Vec::new();
    // Replicas beyond the first, for the pickers that exchange their load: (Deployment, process).
    let mut siblings = Vec::new();
    for (i, d) in deployments.iter().enumerate() {
        let n = replicas_to_run(d);
        let host = |r: usize| pod_host(example_index, r, i);
        procs.push(start(
            d,
            &objects,
            root.path(),
            host(0),
            &kubeconfig,
            (0, n),
            host,
        ));
        for r in 1..n {
            siblings.push((
                i,
                start(d, &objects, root.path(), host(r), &kubeconfig, (r, n), host),
            ));
        }
    }
    // Every replica of a picker with the peer exchange counts each other one as a peer: the
    // rendered key file, port, names and flags work together.
    for (i, d) in deployments.iter().enumerate() {
        let n = replicas_to_run(d);
        if n < 2 {
            continue;
        }
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let metrics = port_of(c, &json!("metrics"));
        let deadline = Instant::now() + READY_WITHIN;
        for r in 0..n {
            let addr = SocketAddr::new(pod_host(example_index, r, i), metrics);
            loop {
                let text = infergate_testkit::try_get(addr, "/metrics")
                    .await
                    .map(|a| a.text())
                    .unwrap_or_default();
                let peers: f64 = text
                    .lines()
                    .filter(|l| l.starts_with("infergate_peer_replicas{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                if peers == (n - 1) as f64 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} replica {r}: {peers} peers of {}\n{}",
                    name(d),
                    n - 1,
                    text.lines()
                        .filter(|l| l.starts_with("infergate_peer_"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for (_, p) in &mut siblings {
        p.assert_running();
    }
    for (p, d) in procs.iter_mut().zip(&deployments) {
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        wait_probe(p, c, "livenessProbe").await;
        wait_probe(p, c, "readinessProbe").await;
        let metrics = check_metrics(p, d, c).await;
        let args = c["args"].as_array().unwrap();
        // The queues exist (the file was read and flow control is on), one series per band.
        if let Some(file) = flag(args, "--flow-control") {
            let pool = flag(args, "--pool-name").unwrap();
            let text = std::fs::read_to_string(p.fs.join(file.trim_start_matches('/'))).unwrap();
            let enabled =
                serde_yaml::from_str::<Value>(&text).unwrap()["flowControl"]["enabled"] == true;
            let series =
                format!("infergate_flow_queue_requests{{pool=\"{pool}\",priority=\"critical\"}} 0");
            assert_eq!(
                metrics.contains(&series),
                enabled,
                "{}: {series} (enabled: {enabled})\n{metrics}",
                p.deployment
            );
        }
        // Precise prefix routing is on: the tokenizer loaded from the mounted volume (the
        // picker exits otherwise) and the KV-event index serves its series.
        if flag(args, "--kv-events-port").is_some() {
            let pool = flag(args, "--pool-name").unwrap();
            let series = format!("infergate_kv_events_connected_pods{{pool=\"{pool}\"}}");
            assert!(
                metrics.contains(&series) && flag(args, "--tokenizer").is_some(),
                "{}: {series}\n{metrics}",
                p.deployment
            );
        }
        if flag(args, "--quotas").is_some() {
            assert!(
                metrics.contains("# TYPE infergate_quota_requests counter"),
                "{}: {metrics}",
                p.deployment
            );
        }
    }
    let ext_proc_addr = |deployment: &str| -> SocketAddr {
        let (p, d) = procs
            .iter()
            .zip(&deployments)
            .find(|(_, d)| name(d) == deployment)
            .unwrap_or_else(|| panic!("no Deployment {deployment}"));
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        SocketAddr::new(p.host, port_of(c, &json!("grpc")))
    };

    // A request for every route: through the BBR (when rendered) to the route it selects, its
    // pool, and that pool's picker.
    let bbr = deployments
        .iter()
        .find(|d| d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "bbr");
    // The body mode of the BBR's ext_proc filter, from its rendered policy.
    let bbr_mode = match of_kind(&objects, "EnvoyExtensionPolicy")
        .first()
        .map(|p| p["spec"]["extProc"][0]["processingMode"]["request"]["body"].clone())
    {
        None => BodySendMode::None,
        Some(Value::String(m)) if m == "FullDuplexStreamed" => BodySendMode::FullDuplexStreamed,
        Some(Value::String(m)) if m == "Buffered" => BodySendMode::Buffered,
        Some(other) => panic!("the BBR's policy has a body mode this test does not drive: {other}"),
    };
    for route in of_kind(&objects, "HTTPRoute") {
        let rule = &route["spec"]["rules"][0];
        let backend = &rule["backendRefs"][0];
        assert_eq!(backend["kind"], "InferencePool");
        let pool_name = backend["name"].as_str().unwrap();
        let pool = objects
            .iter()
            .find(|o| o["kind"] == "InferencePool" && name(o) == pool_name)
            .unwrap();
        // Every name the route matches: the model, its adapters, the names its rewrites match.
        for m in rule["matches"].as_array().unwrap() {
            let model_header = m["headers"][0].clone();
            let model = match &model_header["value"] {
                Value::String(m) => m.clone(),
                _ => "any-model".to_owned(),
            };
            // A prompt over 32 KiB, the listener buffer a `Buffered` policy would have to fit in.
            let prompt = "hello ".repeat(8_000);
            let body = serde_json::to_vec(&json!({
                "model": model,
                "max_tokens": 4,
                "messages": [{ "role": "user", "content": prompt }],
            }))
            .unwrap();
            if let Some(bbr) = bbr {
                // Envoy streams the body to the router as the rendered policy's mode says
                // (Envoy Gateway maps it onto the filter as written), announced in the stream's
                // first message.
                let envoy = Envoy::connect(ext_proc_addr(name(bbr))).await;
                let mut ex = envoy.open().await;
                ex.send(with_modes(
                    request_headers("/v1/chat/completions", &[], false),
                    bbr_mode,
                    BodySendMode::None,
                ))
                .await;
                let answer = if bbr_mode == BodySendMode::FullDuplexStreamed {
                    let chunks = split(&body, &[16_384, 16_384]);
                    let last = chunks.len() - 1;
                    for (i, c) in chunks.iter().enumerate() {
                        ex.send(request_body(c, i == last)).await;
                    }
                    headers_answer(&ex.next().await)
                } else {
                    // Envoy holds a `Buffered` body in the listener's connection buffer, which
                    // Envoy Gateway sets to 32 KiB unless a ClientTrafficPolicy raises it: a
                    // longer prompt is answered 413 by Envoy before the router sees it.
                    assert!(
                        body.len() <= ENVOY_GATEWAY_BUFFER_LIMIT,
                        "a {}-byte prompt would be answered 413 by Envoy under the rendered \
                         {bbr_mode:?} policy (Envoy Gateway's listener buffer is {} bytes)",
                        body.len(),
                        ENVOY_GATEWAY_BUFFER_LIMIT
                    );
                    let _ = headers_answer(&ex.next().await);
                    ex.send(request_body(&body, true)).await;
                    body_answer(&ex.next().await)
                };
                let header = model_header["name"].as_str().unwrap().to_ascii_lowercase();
                assert_eq!(
                    header,
                    wire::MODEL_HEADER,
                    "the route matches the header the BBR sets"
                );
                assert_eq!(answer.header(&header), Some(model.as_str()), "{answer:?}");
            }
            // The pool's picker: the Service the InferencePool names, to the Deployment it selects.
            let svc_name = pool["spec"]["endpointPickerRef"]["name"].as_str().unwrap();
            let svc_port = pool["spec"]["endpointPickerRef"]["port"]["number"]
                .as_u64()
                .unwrap();
            let svc = objects
                .iter()
                .find(|o| o["kind"] == "Service" && name(o) == svc_name)
                .unwrap_or_else(|| panic!("the pool's picker Service {svc_name} is not rendered"));
            let sp = svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["port"].as_u64() == Some(svc_port))
                .unwrap_or_else(|| panic!("Service {svc_name} has no port {svc_port}"));
            let selector = svc["spec"]["selector"].as_object().unwrap();
            let (p, d) = procs
                .iter()
                .zip(&deployments)
                .find(|(_, d)| {
                    selector
                        .iter()
                        .all(|(k, v)| d["spec"]["template"]["metadata"]["labels"][k] == *v)
                })
                .unwrap_or_else(|| panic!("Service {svc_name} selects no rendered pod"));
            let c = &d["spec"]["template"]["spec"]["containers"][0];
            let picker_addr = SocketAddr::new(p.host, port_of(c, &sp["targetPort"]));
            // Envoy AI Gateway reaches the picker over TLS, accepting any certificate: so does this
            // client, and it fails if the rendered command line serves plaintext there.
            let envoy = Envoy::connect_tls(picker_addr).await;
            let mut ex = envoy.open().await;
            let mut headers = vec![];
            if bbr.is_some() {
                headers.push((wire::MODEL_HEADER, model.as_str()));
            }
            ex.send(request_headers("/v1/chat/completions", &headers, false))
                .await;
            ex.send(request_body(&body, true)).await;
            let answer = headers_answer(&ex.next().await);
            let dest = answer
                .header(wire::DESTINATION_HEADER)
                .unwrap_or_else(|| panic!("{}: no destination in {answer:?}", p.deployment));
            // Envoy Gateway's ORIGINAL_DST cluster reads the header as one address.
            let first: SocketAddr = dest.parse().unwrap_or_else(|e| {
                panic!(
                    "{}: destination {dest:?} is not one ip:port: {e}",
                    p.deployment
                )
            });
            assert!(
                pods_of_pool[pool_name].contains(&first),
                "{}: picked {first}, pool {pool_name} has {:?}",
                p.deployment,
                pods_of_pool[pool_name]
            );
        }
    }
    // Quotas: the rendered file as the picker read it, enforced on the tenant with the smallest
    // request limit through that picker.
    for (p, d) in procs.iter().zip(&deployments) {
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let Some(file) = flag(c["args"].as_array().unwrap(), "--quotas") else {
            continue;
        };
        let text = std::fs::read_to_string(p.fs.join(file.trim_start_matches('/'))).unwrap();
        let quotas: Value = serde_yaml::from_str(&text).unwrap();
        let (tenant, limit) = quotas["tenants"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(t, l)| Some((t.clone(), l["requestsPerMinute"].as_u64()?)))
            .min_by_key(|(_, n)| *n)
            .unwrap_or_else(|| panic!("{}: no tenant with a request limit", p.deployment));
        assert!(
            limit <= 20,
            "{}: a smaller limit keeps this short",
            p.deployment
        );
        let pool = flag(c["args"].as_array().unwrap(), "--pool-name").unwrap();
        let route = of_kind(&objects, "HTTPRoute")
            .into_iter()
            .find(|r| r["spec"]["rules"][0]["backendRefs"][0]["name"] == pool)
            .unwrap();
        let model = route["spec"]["rules"][0]["matches"][0]["headers"][0]["value"]
            .as_str()
            .unwrap_or("any-model");
        let body = serde_json::to_vec(&json!({
            "model": model,
            "max_tokens": 2,
            "messages": [{ "role": "user", "content": "hello" }],
        }))
        .unwrap();
        // The headers Envoy passes the picker: a client naming another tenant, after the
        // rendered policies (with auth, the token's claim is the tenant; without, the
        // client's header is).
        let with_auth = !of_kind(&objects, "SecurityPolicy").is_empty();
        let forged = if with_auth { "someone-else" } else { &tenant };
        let tenant_headers = envoy_tenant_headers(&objects, forged, &tenant);
        if with_auth {
            // One value, the token's: the client's was removed before the claim was added.
            assert_eq!(
                tenant_headers,
                [(FAIRNESS_ID.to_owned(), tenant.clone())],
                "{}",
                p.deployment
            );
        }
        let mut headers: Vec<(&str, &str)> = tenant_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if bbr.is_some() {
            headers.push((wire::MODEL_HEADER, model));
        }
        let envoy = Envoy::connect_tls(SocketAddr::new(p.host, port_of(c, &json!("grpc")))).await;
        for i in 0..limit {
            let f =
                forward::forward_with(&envoy, "/v1/chat/completions", &headers, &body, 4096).await;
            assert_eq!(
                f.status,
                200,
                "{}: request {i} of tenant {tenant}: {}",
                p.deployment,
                String::from_utf8_lossy(&f.body)
            );
        }
        let mut ex = envoy.open().await;
        ex.send(request_headers("/v1/chat/completions", &headers, false))
            .await;
        ex.send(request_body(&body, true)).await;
        let (status, answer_headers, answer) = immediate_parts(&ex.next().await);
        assert_eq!(status, 429, "{}: {answer}", p.deployment);
        assert_eq!(
            answer_headers["x-llm-d-request-dropped-reason"],
            "rejected-quota-requests"
        );
        assert_eq!(answer["error"]["code"], "quota_exceeded");
    }
    assert!(
        kube.requests()
            .iter()
            .any(|r| r.contains("/inferencepools") && r.contains("watch")),
        "the picker watched its pool: {:?}",
        kube.requests()
    );
    for p in &mut procs {
        p.assert_running();
    }
    let _ = stop.send(true);
    drop(procs);
    drop(fleets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_renders_starts_and_routes() {
    let files = infergate_testkit::example_configs("");
    assert!(files.len() >= 3, "{files:?}");
    for (i, path) in files.iter().enumerate() {
        run_example(path, u8::try_from(i).unwrap()).await;
    }
}

/// `infergate render` refuses bad quota and flow-control sections with the message the operator
/// would write into `Accepted=False`, naming the field; nothing is printed to apply.
#[test]
fn bad_flow_control_and_quotas_are_refused_naming_the_field() {
    let invalid = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/invalid");
    let refuse = |path: &Path| -> String {
        let out = Command::new(bin())
            .args(["render", "-f"])
            .arg(path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{} rendered", path.display());
        assert!(out.stdout.is_empty(), "{}", path.display());
        String::from_utf8(out.stderr).unwrap()
    };
    for (file, field) in [
        (
            "flow-control-zero-band.yaml",
            "spec.flowControl.bands.sheddable.maxRequests: must be at least 1",
        ),
        (
            "objective-unknown-band.yaml",
            "spec.tenancy.objectives.interactive: must be critical, standard, sheddable",
        ),
        (
            "redis-password-env-undefined.yaml",
            "spec.quotas.redis.passwordEnv: names a variable spec.podDefaults.env does not define",
        ),
        (
            "redis-password-both.yaml",
            "spec.quotas.redis: spec.quotas.redis takes passwordEnv or passwordSecretRef",
        ),
    ] {
        let err = refuse(&invalid.join(file));
        assert!(err.contains(field), "{file}: {err}");
    }
    // Wrong types, names and bounds are refused by the CRD's schema, before any check, as the
    // API server refuses them: the message names the field and the value.
    let dir = tempfile::tempdir().unwrap();
    for (section, expect) in [
        (
            "flowControl: { enabled: true, fairness: lottery }",
            r#"spec.flowControl.fairness: "lottery" is not one of global-strict"#,
        ),
        (
            "flowControl: { maxRequests: -5 }",
            "spec.flowControl.maxRequests: must be at least 1 (is -5)",
        ),
        (
            "quotas: { tenants: { a: { requestsPerMinute: many } } }",
            r#"spec.quotas.tenants.a.requestsPerMinute: must be an integer, not the string "many""#,
        ),
    ] {
        let path = dir.path().join("bad.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\n\
                 metadata: {{name: x, namespace: y}}\n\
                 spec:\n  allowUnauthenticated: true\n  schedulers: [{{name: a, modelName: m, modelSelector: {{app: a}}}}]\n  {section}\n"
            ),
        )
        .unwrap();
        let err = refuse(&path);
        assert!(
            err.contains("does not pass the CRD's schema") && err.contains(expect),
            "{section}: {err}"
        );
    }
}
