//! Active-active pickers as they run: two `infergate picker` processes (the real binary, started
//! with the `--peer*` flags) in front of the same two emulated pods, exchanging their load over
//! the peer port. Requests held open through replica A on one pod steer replica B's picks to
//! the other; a replica holding another key is refused and counted.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "../../extproc/tests/common/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{Envoy, headers_answer, request_body, request_headers, with_metadata};
use infergate_extproc::wire;
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, serve_fleet};

/// A picker process, killed when dropped.
struct Picker(Child);

impl Drop for Picker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Ports {
    grpc: u16,
    metrics: u16,
    peer: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ports() -> Ports {
    Ports {
        grpc: free_port(),
        metrics: free_port(),
        peer: free_port(),
    }
}

fn start(dir: &Path, name: &str, p: &Ports, key: &Path, peers: &[u16]) -> Picker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.args([
        "picker",
        "--pool-name",
        "llama",
        "--listen-address",
        "127.0.0.1",
    ])
    .arg(format!(
        "--endpoints-file={}",
        dir.join("endpoints.yaml").display()
    ))
    .arg(format!("--grpc-port={}", p.grpc))
    .arg(format!("--grpc-health-port={}", free_port()))
    .arg(format!("--metrics-port={}", p.metrics))
    .arg(format!("--peer-key-file={}", key.display()))
    .arg(format!("--peer-port={}", p.peer))
    .arg(format!("--replica-name={name}"))
    .env("RUST_LOG", "info")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    for port in peers {
        cmd.arg(format!("--peer=127.0.0.1:{port}"));
    }
    Picker(cmd.spawn().unwrap())
}

/// The sum of the samples of `family` on the picker's `/metrics` (`family{label="v"` matches
/// the samples with that label among the others).
async fn metric(port: u16, family: &str) -> Option<f64> {
    let (name, label) = match family.split_once('{') {
        Some((n, l)) => (n, Some(l)),
        None => (family, None),
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let r = infergate_testkit::try_get(addr, "/metrics").await.ok()?;
    let text = r.text();
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && label.is_none_or(|lb| l.contains(lb))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A chat request whose prompt starts with `tag` (prompts of different tags share no prefix
/// block) and repeats a sentence `n` times (about 11 tokens each).
fn body(tag: &str, n: usize) -> Vec<u8> {
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(n);
    format!(
        r#"{{"model":"llama","max_tokens":256,"messages":[{{"role":"user","content":"{tag}: {prompt}"}}]}}"#
    )
    .into_bytes()
}

/// One request's pick through the picker at `grpc`, with an optional subset hint; the stream is
/// returned open (the request stays in flight on the picker until it is dropped).
async fn pick(
    envoy: &Envoy,
    body: &[u8],
    subset: Option<SocketAddr>,
) -> (SocketAddr, harness::Exchange) {
    let mut ex = envoy.open().await;
    let headers = request_headers("/v1/chat/completions", &[], false);
    let headers = match subset {
        Some(a) => with_metadata(headers, wire::subset_metadata(&[a])),
        None => headers,
    };
    ex.send(headers).await;
    ex.send(request_body(body, true)).await;
    let answer = headers_answer(&ex.next().await);
    let dest = answer
        .header(wire::DESTINATION_HEADER)
        .unwrap_or_else(|| panic!("no destination in {answer:?}"));
    (dest.split(',').next().unwrap().parse().unwrap(), ex)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_picker_processes_share_their_load_and_refuse_a_replica_with_another_key() {
    let catalog = Catalog::builtin().unwrap();
    let profile = catalog.get("llama-3.1-8b/a10g").unwrap().clone();
    let spec = FleetSpec {
        seed: 5,
        pods: (0..2)
            .map(|i| PodSpec {
                model: "llama".into(),
                ..PodSpec::new(format!("pod-{i}"), &profile, EngineKind::Vllm)
            })
            .collect(),
    }
    .finish()
    .unwrap();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let pods: Vec<SocketAddr> = fleet.addrs().into_iter().map(|(_, a)| a).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut eps = String::from("engine: vllm\nendpoints:\n");
    for (i, a) in pods.iter().enumerate() {
        eps.push_str(&format!("  - {{ address: \"{a}\", name: pod-{i} }}\n"));
    }
    std::fs::write(dir.path().join("endpoints.yaml"), eps).unwrap();
    let key = dir.path().join("peer.key");
    std::fs::write(&key, "7f3e0c9a5b2d4e6f8a1c3b5d7e9f0a2b\n").unwrap();

    let (pa, pb) = (ports(), ports());
    let _a = start(dir.path(), "picker-a", &pa, &key, &[pb.peer]);
    let _b = start(dir.path(), "picker-b", &pb, &key, &[pa.peer]);
    for (name, p) in [("A", &pa), ("B", &pb)] {
        eventually(&format!("{name} connected both ways"), || async {
            metric(p.metrics, "infergate_peer_connections_inbound").await == Some(1.0)
                && metric(p.metrics, "infergate_peer_connections_outbound").await == Some(1.0)
        })
        .await;
    }

    // B's own history points it at pod 0: one pick there (subset hint) leaves its prompt (about
    // 2,000 tokens, half a second of prefill at the default rate) in B's prefix index, so without
    // A's load B's picks of that prompt would go to pod 0 again.
    let envoy_b = Envoy::connect(format!("127.0.0.1:{}", pb.grpc).parse().unwrap()).await;
    let b_body = body("b", 180);
    let (dest, ex) = pick(&envoy_b, &b_body, Some(pods[0])).await;
    assert_eq!(dest, pods[0]);
    drop(ex);

    // Six requests through A, all on pod 0 (subset hint), held open: six prompts of about 4,000
    // tokens sharing no prefix, six seconds of prefill, which B ages at that rate from A's report.
    let envoy_a = Envoy::connect(format!("127.0.0.1:{}", pa.grpc).parse().unwrap()).await;
    let mut held = Vec::new();
    for i in 0..6 {
        let (dest, ex) = pick(&envoy_a, &body(&format!("a{i}"), 360), Some(pods[0])).await;
        assert_eq!(dest, pods[0]);
        held.push(ex);
    }
    // B must have read a report of A's six. The connection is long up, so B's count of reports
    // says nothing by itself (keepalives), and a fixed sleep is no bound on a loaded machine.
    // A's third write after this read carries a report made after the picks (the write in
    // progress, and the next, may carry older ones); then B must read as many as A wrote.
    let sent = || async { metric(pa.metrics, "infergate_peer_reports_sent_total").await };
    let before = sent().await.unwrap();
    eventually("A writes three reports after its picks", || async {
        sent().await.is_some_and(|n| n >= before + 3.0)
    })
    .await;
    let written = sent().await.unwrap();
    eventually("B has read them", || async {
        metric(pb.metrics, "infergate_peer_reports_received_total")
            .await
            .is_some_and(|n| n >= written)
    })
    .await;
    // B's own picks avoid the pod A loaded, every time, its prefix there notwithstanding.
    for i in 0..5 {
        let (dest, ex) = pick(&envoy_b, &b_body, None).await;
        assert_eq!(
            dest, pods[1],
            "B's pick {i} went to the pod A holds six requests on"
        );
        drop(ex);
    }
    drop(held);

    // A third replica with another key: refused by both, counted, its load never counts.
    let bad_key = dir.path().join("other.key");
    std::fs::write(&bad_key, "another key, at least sixteen bytes\n").unwrap();
    let pc = ports();
    let _c = start(dir.path(), "picker-c", &pc, &bad_key, &[pa.peer, pb.peer]);
    for p in [&pa, &pb] {
        eventually("the bad-key replica refused", || async {
            metric(
                p.metrics,
                "infergate_peer_connection_failures_total{reason=\"bad-mac\"",
            )
            .await
            .is_some_and(|n| n >= 1.0)
        })
        .await;
        // The gauge is refreshed every expire-after / 4 (375 ms).
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            metric(p.metrics, "infergate_peer_replicas").await,
            Some(1.0),
            "only the other good replica counts"
        );
    }
}

#[test]
fn a_picker_refuses_a_short_key_and_a_peer_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("endpoints.yaml"),
        "engine: vllm\nendpoints:\n  - address: 127.0.0.1:9\n",
    )
    .unwrap();
    let short = dir.path().join("short.key");
    std::fs::write(&short, "short\n").unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["picker", "--listen-address", "127.0.0.1"])
            .arg(format!(
                "--endpoints-file={}",
                dir.path().join("endpoints.yaml").display()
            ))
            .args(["--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[
        &format!("--peer-key-file={}", short.display()),
        "--replica-name=a",
    ]);
    assert!(err.contains("at least 16 bytes"), "{err}");
    let err = run(&["--peer=127.0.0.1:9006"]);
    assert!(err.contains("--peer-key-file"), "{err}");
    let err = run(&[&format!(
        "--peer-key-file={}",
        dir.path().join("missing").display()
    )]);
    assert!(err.contains("cannot read"), "{err}");
}
