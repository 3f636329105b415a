//! HTTPS and mutual TLS on the metrics port of `infergate picker` and `infergate bbr`
//! (`--metrics-tls-cert-file`, `--metrics-tls-key-file`, `--metrics-tls-client-ca-file`), as
//! they run: the real binary in front of an emulated pod. A client presenting a certificate of
//! the client CA reads `/heartbeat`; one presenting none is refused and counted under
//! `port="metrics"`; plain HTTP gets no answer; the real consumer, the `infergate global`
//! binary, reads the pool's heartbeat over `https://` with its cluster's `tls`. Unusable files
//! stop the start naming their flag.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/one_pod.rs"]
mod one_pod;
#[path = "common/printed_error.rs"]
mod printed_error;
#[path = "common/running.rs"]
mod running;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use infergate_testkit::Response;
use infergate_testkit::tls::{Leaf, TestCa};
use one_pod::one_pod;
use printed_error::{assert_said_once, printed_chain};
use running::{Running, free_addr, path};

/// The name the metrics port's certificate is issued for, and the router verifies.
const SERVER_NAME: &str = "picker.test";

/// The certificates of a test: the metrics port's own (from `servers`, for [`SERVER_NAME`]),
/// the client CA the port trusts (`clients`, written to `client_ca`) and one client of it.
struct Pki {
    dir: tempfile::TempDir,
    servers: TestCa,
    servers_ca: PathBuf,
    client_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client: Leaf,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let servers = TestCa::new("pickers ca");
        let servers_ca = servers.write_ca(d);
        let port_dir = d.join("metrics-tls");
        std::fs::create_dir_all(&port_dir).unwrap();
        let (cert, key) = servers.issue(&[SERVER_NAME]).write(&port_dir);
        let clients = TestCa::new("routers ca");
        let client_ca = d.join("routers-ca.pem");
        std::fs::write(&client_ca, clients.cert_pem()).unwrap();
        let client = clients.issue(&["router"]);
        Pki {
            dir,
            servers,
            servers_ca,
            client_ca,
            cert,
            key,
            client,
        }
    }

    /// `GET path` over HTTPS (HTTP/1.1) to `addr`, verifying the port for [`SERVER_NAME`] and
    /// presenting `leaf` when given.
    async fn get(
        &self,
        addr: SocketAddr,
        path: &str,
        leaf: Option<&Leaf>,
    ) -> Result<Response, String> {
        let mut request = http::Request::new(bytes::Bytes::new());
        *request.uri_mut() = path.parse().unwrap();
        infergate_testkit::tls::send_within(
            addr,
            SERVER_NAME,
            self.servers.client_config_presenting(&[b"http/1.1"], leaf),
            request,
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| format!("{e:#}"))
    }

    /// The metrics page read over mutual TLS with the client's certificate.
    async fn metrics(&self, addr: SocketAddr) -> String {
        let page = self
            .get(addr, "/metrics", Some(&self.client))
            .await
            .unwrap();
        assert_eq!(page.status, 200, "{}", page.text());
        page.text()
    }
}

/// `infergate picker` over the pod at `pod`, its metrics port at `metrics` with the TLS flags
/// of `pki` (mutual: with its client CA), its ext_proc port TLS too (self-signed): two TLS
/// ports whose series share families on one page.
fn start_picker(pki: &Pki, pod: SocketAddr, metrics: SocketAddr) -> Running {
    let d = pki.dir.path();
    let endpoints = d.join("endpoints.yaml");
    std::fs::write(
        &endpoints,
        format!("engine: vllm\nendpoints:\n  - {{ address: \"{pod}\", name: pod-0 }}\n"),
    )
    .unwrap();
    let args = [
        "picker".to_owned(),
        "--pool-name=llama".to_owned(),
        "--listen-address=127.0.0.1".to_owned(),
        format!("--endpoints-file={}", path(&endpoints)),
        format!("--grpc-port={}", free_addr().port()),
        format!("--grpc-health-port={}", free_addr().port()),
        format!("--metrics-port={}", metrics.port()),
        format!("--metrics-tls-cert-file={}", path(&pki.cert)),
        format!("--metrics-tls-key-file={}", path(&pki.key)),
        format!("--metrics-tls-client-ca-file={}", path(&pki.client_ca)),
        "--tls-self-signed".to_owned(),
    ];
    Running::start(d, "picker", &args)
}

/// The value of `family{cluster="east"}` on the router's plain admin port, when it answers.
async fn east(admin: SocketAddr, family: &str) -> Option<f64> {
    let page = infergate_testkit::try_get(admin, "/metrics")
        .await
        .ok()?
        .text();
    infergate_testkit::metric(&page, family, &[("cluster", "east")])
}

/// The picker with the three `--metrics-tls-*` flags: `/heartbeat` over HTTPS with a client
/// certificate of the CA is the pool's JSON document; without a certificate the port refuses
/// the handshake and counts it `{port="metrics",reason="client_certificate"}`; plain HTTP gets no
/// answer. `infergate global`, whose cluster polls `https://.../heartbeat` with `tls: { caFile,
/// serverName, certFile, keyFile }`, reads the heartbeat (its age and the cluster's weight are
/// set); a router presenting no certificate never has one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_router_reads_the_picker_s_heartbeat_over_mutual_tls_and_nothing_else_does() {
    let pki = Pki::new();
    let d = pki.dir.path();
    let (fleet, _stop_pods) = one_pod(5).await;
    let metrics = free_addr();
    let mut picker = start_picker(&pki, fleet.pods[0].addr, metrics);

    // Ready once its pod is scraped; the probe itself needs a client certificate.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        picker.assert_running();
        let ready = pki.get(metrics, "/readyz", Some(&pki.client)).await;
        if ready.as_ref().is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready over mutual TLS within 30 s ({ready:?}):\n{}",
            picker.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let heartbeat = pki
        .get(metrics, "/heartbeat", Some(&pki.client))
        .await
        .unwrap();
    assert_eq!(heartbeat.status, 200, "{}", heartbeat.text());
    assert_eq!(heartbeat.header("content-type"), Some("application/json"));
    let doc: serde_json::Value = serde_json::from_slice(&heartbeat.body).unwrap();
    assert!(doc.is_object(), "{doc}");
    assert!(heartbeat.text().contains("llama"), "{doc}");

    // No client certificate: refused at the handshake, no HTTP answer.
    let refused = pki.get(metrics, "/heartbeat", None).await;
    assert!(
        refused.is_err(),
        "answered without a certificate: {refused:?}"
    );
    // Another CA's certificate: refused as well.
    let stranger = TestCa::new("another ca").issue(&["router"]);
    let refused = pki.get(metrics, "/heartbeat", Some(&stranger)).await;
    assert!(
        refused.is_err(),
        "answered another CA's client: {refused:?}"
    );
    // Plain HTTP: no answer either.
    let plain = infergate_testkit::try_get(metrics, "/heartbeat").await;
    assert!(
        plain.is_err(),
        "answered plain HTTP: {:?}",
        plain.map(|r| r.status)
    );
    let page = pki.metrics(metrics).await;
    let counted = |reason: &str| {
        infergate_testkit::metric(
            &page,
            "infergate_tls_handshake_failures_total",
            &[("port", "metrics"), ("reason", reason)],
        )
    };
    assert_eq!(counted("client_certificate"), Some(2.0), "{page}");
    assert!(counted("error").is_some_and(|n| n >= 1.0), "{page}");
    // Both ports' series, each family once on the page (the ext_proc port's unlabelled).
    for family in [
        "infergate_tls_handshake_failures",
        "infergate_tls_certificate_reloads",
        "infergate_tls_certificate_not_after_timestamp_seconds",
    ] {
        let kind = format!("# TYPE {family} ");
        assert_eq!(page.matches(kind.as_str()).count(), 1, "{family}:\n{page}");
    }
    assert!(
        page.contains("infergate_tls_handshake_failures_total{reason=\"client_certificate\"} 0"),
        "{page}"
    );

    // The real consumer: `infergate global` polling the picker's heartbeat over mutual TLS.
    let router_dir = d.join("router");
    std::fs::create_dir_all(&router_dir).unwrap();
    let (router_cert, router_key) = pki.client.write(&router_dir);
    let router_file = |name: &str, client: Option<(&Path, &Path)>| {
        let client = client.map_or(String::new(), |(c, k)| {
            format!(", certFile: {}, keyFile: {}", path(c), path(k))
        });
        let (http, admin) = (free_addr(), free_addr());
        let file = d.join(format!("{name}.yaml"));
        // `url` is where Envoy in front of the picker would listen; only the heartbeat is read.
        std::fs::write(
            &file,
            format!(
                "listen: {http}\nadmin: {admin}\nauth: none\nheartbeat: {{ intervalMs: 200, staleAfterMs: 1000, slowStartMs: 0 }}\nclusters:\n  - name: east\n    url: http://127.0.0.1:9\n    heartbeatUrl: https://{metrics}/heartbeat\n    region: r\n    cost: {{ inputPerMillion: 1 }}\n    tls: {{ caFile: {}, serverName: {SERVER_NAME}{client} }}\n",
                path(&pki.servers_ca)
            ),
        )
        .unwrap();
        (file, admin)
    };
    let global = |name: &str, file: &Path| {
        Running::start(
            d,
            name,
            &["global".to_owned(), "--config".to_owned(), path(file)],
        )
    };
    let (with_file, with_admin) = router_file("with", Some((&router_cert, &router_key)));
    let (without_file, without_admin) = router_file("without", None);
    let mut with = global("with", &with_file);
    let mut without = global("without", &without_file);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        picker.assert_running();
        with.assert_running();
        let age = east(with_admin, "infergate_global_heartbeat_age_seconds").await;
        let weight = east(with_admin, "infergate_global_cluster_weight").await;
        if age.is_some_and(|a| a >= 0.0) && weight.is_some_and(|w| w > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat over mutual TLS within 30 s (age {age:?}, weight {weight:?}):\nrouter:\n{}\npicker:\n{}",
            with.log(),
            picker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The router without one: once the picker has refused it (a refusal beyond the two above)
    // and its admin port answers, it has never had a heartbeat.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        without.assert_running();
        let page = pki.metrics(metrics).await;
        let refused = infergate_testkit::metric(
            &page,
            "infergate_tls_handshake_failures_total",
            &[("port", "metrics"), ("reason", "client_certificate")],
        );
        let age = east(without_admin, "infergate_global_heartbeat_age_seconds").await;
        if refused.is_some_and(|n| n > 2.0) && age.is_some() {
            assert_eq!(age, Some(-1.0), "{}", without.log());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the router without a certificate was not refused within 30 s ({refused:?}, age \
             {age:?}):\n{}",
            without.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `infergate bbr` with a certificate and no client CA serves `/metrics` over HTTPS to any
/// client (its metrics port's TLS series labelled `port="metrics"`, the ext_proc port's absent:
/// it is plaintext) and nothing over plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bbr_serves_its_metrics_over_https() {
    let pki = Pki::new();
    let d = pki.dir.path();
    let models = d.join("models.yaml");
    std::fs::write(&models, "llama: []\n").unwrap();
    let metrics = free_addr();
    let args = [
        "bbr".to_owned(),
        "--listen-address=127.0.0.1".to_owned(),
        format!("--models={}", path(&models)),
        format!("--grpc-port={}", free_addr().port()),
        "--grpc-health-port=0".to_owned(),
        format!("--metrics-port={}", metrics.port()),
        format!("--metrics-tls-cert-file={}", path(&pki.cert)),
        format!("--metrics-tls-key-file={}", path(&pki.key)),
    ];
    let mut bbr = Running::start(d, "bbr", &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        bbr.assert_running();
        if let Ok(r) = pki.get(metrics, "/metrics", None).await {
            assert_eq!(r.status, 200, "{}", r.text());
            break r.text();
        }
        assert!(Instant::now() < deadline, "no HTTPS answer:\n{}", bbr.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        infergate_testkit::metric(
            &page,
            "infergate_tls_handshake_failures_total",
            &[("port", "metrics"), ("reason", "client_certificate")],
        ),
        Some(0.0),
        "{page}"
    );
    assert!(
        !page.contains("infergate_tls_handshake_failures_total{reason="),
        "an unlabelled ext_proc series on a plaintext ext_proc port:\n{page}"
    );
    assert!(
        infergate_testkit::try_get(metrics, "/healthz")
            .await
            .is_err()
    );
}

/// `infergate SUBCOMMAND` with `extra` flags on port 0 (metrics on a free port unless `extra`
/// gives one), over an
/// endpoint that never answers (picker) or a one-model file (bbr), run to its end: whether it
/// succeeded, and what it printed.
fn run_to_end(subcommand: &str, dir: &Path, extra: &[String]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.arg(subcommand).args(["--listen-address", "127.0.0.1"]);
    if subcommand == "picker" {
        let endpoints = dir.join("endpoints.yaml");
        std::fs::write(
            &endpoints,
            "engine: vllm\nendpoints:\n  - address: 127.0.0.1:9\n",
        )
        .unwrap();
        cmd.arg(format!("--endpoints-file={}", endpoints.display()));
    } else {
        let models = dir.join("models.yaml");
        std::fs::write(&models, "m: []\n").unwrap();
        cmd.arg(format!("--models={}", models.display()));
    }
    cmd.args(["--grpc-port=0", "--grpc-health-port=0"]);
    if !extra.iter().any(|a| a.starts_with("--metrics-port")) {
        cmd.arg(format!("--metrics-port={}", free_addr().port()));
    }
    let out = cmd
        .args(extra)
        .env_remove("INFERGATE_METRICS_TLS_CLIENT_CA_FILE")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    printed_error::outcome(&out)
}

/// A missing certificate, a key that is not one, or an unusable client CA bundle stops either
/// process before it listens, the error opening with the flag and the file, each cause said
/// once; a client CA without a certificate is refused by the parser naming
/// `--metrics-tls-cert-file`; the BBR refuses the flags with its metrics port off.
#[test]
fn unusable_metrics_tls_files_stop_the_start_naming_the_flag() {
    let pki = Pki::new();
    let d = pki.dir.path();
    let missing = d.join("no-such.pem");
    let garbage = d.join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let files = |cert: &Path, key: &Path| {
        vec![
            format!("--metrics-tls-cert-file={}", path(cert)),
            format!("--metrics-tls-key-file={}", path(key)),
        ]
    };
    let pair = |cert: &Path, key: &Path| {
        format!(
            "--metrics-tls-cert-file {}, --metrics-tls-key-file {}: ",
            path(cert),
            path(key)
        )
    };
    let cases = [
        (
            files(&missing, &pki.key),
            pair(&missing, &pki.key),
            "cannot read",
        ),
        (
            files(&pki.cert, &garbage),
            pair(&pki.cert, &garbage),
            "garbage.pem",
        ),
        (
            [
                files(&pki.cert, &pki.key),
                vec![format!("--metrics-tls-client-ca-file={}", path(&garbage))],
            ]
            .concat(),
            format!("--metrics-tls-client-ca-file {}: ", path(&garbage)),
            "holds no PEM certificate",
        ),
        (
            [
                files(&pki.cert, &pki.key),
                vec![format!("--metrics-tls-client-ca-file={}", path(&missing))],
            ]
            .concat(),
            format!("--metrics-tls-client-ca-file {}: ", path(&missing)),
            "cannot read",
        ),
    ];
    for subcommand in ["picker", "bbr"] {
        for (extra, opening, expected) in &cases {
            let (ok, text) = run_to_end(subcommand, d, extra);
            assert!(!ok, "{subcommand} {extra:?} started: {text}");
            let chain = printed_chain(&text);
            assert!(
                chain[0].starts_with(opening.as_str()),
                "{subcommand}: {text}"
            );
            assert!(text.contains(expected), "{subcommand} {extra:?}: {text}");
            assert!(!text.contains("listening"), "{subcommand}: {text}");
            assert_said_once(&chain, &text);
        }
        let ca = format!("--metrics-tls-client-ca-file={}", path(&pki.client_ca));
        let (ok, text) = run_to_end(subcommand, d, &[ca]);
        assert!(!ok, "{subcommand} started without a certificate: {text}");
        assert!(
            text.contains("--metrics-tls-cert-file"),
            "{subcommand}: {text}"
        );
    }
    let (ok, text) = run_to_end(
        "bbr",
        d,
        &[
            files(&pki.cert, &pki.key),
            vec!["--metrics-port=0".to_owned()],
        ]
        .concat(),
    );
    assert!(!ok, "bbr started with TLS on no metrics port: {text}");
    assert!(
        text.contains("--metrics-tls-cert-file") && text.contains("--metrics-port 0"),
        "{text}"
    );
}
