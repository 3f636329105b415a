//! Mutual TLS on the ext_proc port of `infergate picker` and `infergate bbr`, as they run: the
//! real binary, started with `--tls-client-ca-file` (or its variable) beside the TLS flags, in
//! front of an emulated pod. A client presenting a certificate of the bundle's CA completes an
//! ext_proc exchange; one presenting none, or another CA's, is refused at the handshake, counted
//! and warned of once; a bundle replaced on disk is followed without a restart; an unusable
//! bundle, or one given without TLS, stops the start naming the flag.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "../../extproc/tests/common/harness.rs"]
mod harness;
#[path = "common/one_pod.rs"]
mod one_pod;
#[path = "common/printed_error.rs"]
mod printed_error;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{Envoy, Route, headers_answer, request_body, request_headers};
use infergate_extproc::wire;
use infergate_testkit::tls::{Leaf, TestCa, accept_any_config, connect};
use one_pod::one_pod;
use printed_error::{assert_said_once, printed_chain};
use tokio::io::AsyncReadExt as _;

/// What the picker logs, once a minute at most, for a client refused for its certificate.
const REFUSED_LINE: &str = "ext_proc client refused";

/// A process of the binary, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The certificates of one test: the port's own (for `localhost`, from `server_ca`), the
/// client CA bundle the port is given (`client_ca`'s certificate, in `bundle`), and another CA
/// whose certificates the port must refuse.
struct Pki {
    dir: tempfile::TempDir,
    server_ca: TestCa,
    client_ca: TestCa,
    other_ca: TestCa,
    cert: PathBuf,
    key: PathBuf,
    bundle: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("ext_proc server ca");
        let (cert, key) = server_ca.issue(&["localhost"]).write(dir.path());
        let client_ca = TestCa::new("envoy clients ca");
        let bundle = dir.path().join("client-ca.pem");
        std::fs::write(&bundle, client_ca.cert_pem()).unwrap();
        Pki {
            dir,
            server_ca,
            client_ca,
            other_ca: TestCa::new("another ca"),
            cert,
            key,
            bundle,
        }
    }

    /// Replaces the client CA bundle with `ca`'s certificate in one rename, as a Secret's
    /// update swaps its files.
    fn replace_bundle(&self, ca: &TestCa) {
        let tmp = self.bundle.with_extension("tmp");
        std::fs::write(&tmp, ca.cert_pem()).unwrap();
        std::fs::rename(&tmp, &self.bundle).unwrap();
    }

    fn log(&self, name: &str) -> (PathBuf, std::fs::File) {
        let path = self.dir.path().join(name);
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}

/// A TLS handshake with the ext_proc port at `addr`, verifying its certificate for `localhost`
/// against `pki`'s server CA and presenting `leaf` when given, then the first bytes the server
/// sends. `Ok` when they are an HTTP/2 SETTINGS frame (the server admitted the client and
/// speaks); `Err` with the client's error otherwise: with TLS 1.3 the client's handshake is over
/// before the server has checked its certificate, so a refusal is the alert its first read gets.
async fn hello(pki: &Pki, addr: SocketAddr, leaf: Option<&Leaf>) -> Result<(), String> {
    let config = pki.server_ca.client_config_presenting(&[b"h2"], leaf);
    first_frame(connect(addr, "localhost", config).await).await
}

/// The first 9 bytes the server sends on `stream` (a finished handshake, or its error): `Ok`
/// for an HTTP/2 SETTINGS frame's header.
async fn first_frame<S>(stream: std::io::Result<S>) -> Result<(), String>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut tls = stream.map_err(|e| e.to_string())?;
    let mut head = [0_u8; 9];
    match tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut head)).await {
        Err(_) => Err("nothing from the server within 10 s".to_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(_)) if head[3] == 0x4 => Ok(()),
        Ok(Ok(_)) => Err(format!("not an HTTP/2 SETTINGS frame: {head:?}")),
    }
}

/// One ext_proc exchange over a new connection presenting `leaf` (trusting `pki`'s server
/// CA): the request headers and a body naming `model`, and the processor's answer to them.
async fn exchange(pki: &Pki, addr: SocketAddr, leaf: &Leaf, model: &str) -> Route {
    let config = pki.server_ca.client_config_presenting(&[b"h2"], Some(leaf));
    let tls = connect(addr, "localhost", config)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let envoy = Envoy::over(tls, format!("https://{addr}")).await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    ex.send(request_body(body.as_bytes(), true)).await;
    headers_answer(&ex.next().await)
}

/// The value of the sample `name{labels}` (`labels` as written in the page, or empty) on the
/// metrics page at `port`.
async fn metric(port: u16, sample: &str) -> Option<f64> {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let page = infergate_testkit::try_get(addr, "/metrics")
        .await
        .ok()?
        .text();
    page.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const CLIENT_CERTIFICATE_FAILURES: &str =
    "infergate_tls_handshake_failures_total{reason=\"client_certificate\"}";

/// `infergate picker` with TLS from `pki`'s files and `--tls-client-ca-file` of its bundle,
/// over the pod at `pod`; the grpc and metrics ports, and the file its output goes to.
async fn start_picker(pki: &Pki, pod: SocketAddr) -> (Running, SocketAddr, u16, PathBuf) {
    let endpoints = pki.dir.path().join("endpoints.yaml");
    std::fs::write(
        &endpoints,
        format!("engine: vllm\nendpoints:\n  - {{ address: \"{pod}\", name: pod-0 }}\n"),
    )
    .unwrap();
    let (grpc, metrics) = (free_port(), free_port());
    let (log, out) = pki.log("picker.log");
    let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args([
            "picker",
            "--pool-name",
            "llama",
            "--listen-address",
            "127.0.0.1",
        ])
        .arg(format!("--endpoints-file={}", endpoints.display()))
        .arg(format!("--grpc-port={grpc}"))
        .arg(format!("--grpc-health-port={}", free_port()))
        .arg(format!("--metrics-port={metrics}"))
        .arg(format!("--tls-cert-file={}", pki.cert.display()))
        .arg(format!("--tls-key-file={}", pki.key.display()))
        .arg(format!("--tls-client-ca-file={}", pki.bundle.display()))
        .args(["--log-format", "text"])
        .env("RUST_LOG", "info")
        .env_remove("INFERGATE_TLS_CLIENT_CA_FILE")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let running = Running(child);
    let ready: SocketAddr = format!("127.0.0.1:{metrics}").parse().unwrap();
    eventually("the picker is ready (its pod scraped)", || async {
        infergate_testkit::try_get(ready, "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    let grpc = format!("127.0.0.1:{grpc}").parse().unwrap();
    (running, grpc, metrics, log)
}

/// The picker with `--tls-client-ca-file`: a client presenting a certificate of the bundle's CA
/// is routed to the pod; one presenting none is refused with `CertificateRequired`, one of
/// another CA with `UnknownCA`, both counted (`reason="client_certificate"`) and warned of in a
/// single line. The bundle replaced on disk by the other CA's admits that CA's client and
/// refuses the first, without a restart. The metrics port stays plaintext throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_admits_only_clients_of_its_client_ca_and_follows_a_replaced_bundle() {
    let (fleet, _stop) = one_pod(3).await;
    let pod = fleet.pods[0].addr;
    let pki = Pki::new();
    let (_picker, grpc, metrics, log) = start_picker(&pki, pod).await;
    assert_eq!(
        metric(metrics, CLIENT_CERTIFICATE_FAILURES).await,
        Some(0.0)
    );

    let ours = pki.client_ca.issue(&["envoy"]);
    let answer = exchange(&pki, grpc, &ours, "llama").await;
    assert_eq!(
        answer.header(wire::DESTINATION_HEADER),
        Some(pod.to_string().as_str()),
        "{answer:?}"
    );

    let theirs = pki.other_ca.issue(&["envoy"]);
    let first_refusal = Instant::now();
    let none = hello(&pki, grpc, None).await.unwrap_err();
    assert!(none.contains("CertificateRequired"), "{none}");
    let other = hello(&pki, grpc, Some(&theirs)).await.unwrap_err();
    assert!(other.contains("UnknownCA"), "{other}");
    eventually("two client_certificate failures counted", || async {
        metric(metrics, CLIENT_CERTIFICATE_FAILURES).await == Some(2.0)
    })
    .await;

    // The other CA's bundle written over the file: its client is admitted within the poll (1 s),
    // routed, and the first CA's client is refused from then on.
    pki.replace_bundle(&pki.other_ca);
    eventually("the replaced bundle admits its CA's client", || async {
        hello(&pki, grpc, Some(&theirs)).await.is_ok()
    })
    .await;
    let answer = exchange(&pki, grpc, &theirs, "llama").await;
    assert_eq!(
        answer.header(wire::DESTINATION_HEADER),
        Some(pod.to_string().as_str())
    );
    let old = hello(&pki, grpc, Some(&ours)).await.unwrap_err();
    assert!(old.contains("UnknownCA"), "{old}");
    assert_eq!(
        metric(
            metrics,
            "infergate_tls_certificate_reloads_total{result=\"ok\"}"
        )
        .await,
        Some(1.0)
    );

    // A warning line for the first refusal, naming the client, and at most one a minute after
    // it (one in all unless this machine took a minute over the above).
    let minutes = first_refusal.elapsed().as_secs() / 60;
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(REFUSED_LINE)).collect();
    assert!(
        !lines.is_empty() && lines.len() as u64 <= 1 + minutes,
        "{} lines in {minutes} min: {text}",
        lines.len()
    );
    assert!(lines[0].contains("WARN"), "{text}");
    assert!(lines[0].contains("peer=127.0.0.1:"), "{text}");
    assert!(text.contains("mutual TLS"), "{text}");
}

/// `infergate bbr` with `--models` of `models` written in `pki`'s folder, TLS from `tls`,
/// `env` set: its grpc port once it accepts connections.
async fn start_bbr(pki: &Pki, tls: &[String], env: &[(&str, &Path)]) -> (Running, SocketAddr) {
    let models = pki.dir.path().join("models.yaml");
    std::fs::write(&models, "llama-3-8b: [sql-lora]\n").unwrap();
    let grpc = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["bbr", "--listen-address", "127.0.0.1"])
        .arg(format!("--models={}", models.display()))
        .arg(format!("--grpc-port={grpc}"))
        .args(["--grpc-health-port=0", "--metrics-port=0"])
        .args(tls)
        .env_remove("INFERGATE_TLS_CLIENT_CA_FILE")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let running = Running(child);
    let addr: SocketAddr = format!("127.0.0.1:{grpc}").parse().unwrap();
    eventually("the BBR listens", || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    (running, addr)
}

/// The body-based router asks for client certificates too: with certificate files and
/// `--tls-client-ca-file`, a client of the CA has its LoRA request routed and one without a
/// certificate is refused; with `--tls-self-signed` and the bundle from
/// `INFERGATE_TLS_CLIENT_CA_FILE`, a client that accepts any server certificate (as Envoy AI
/// Gateway does) but presents none is refused as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bbr_asks_for_a_client_certificate_with_files_or_self_signed() {
    let pki = Pki::new();
    let files = [
        format!("--tls-cert-file={}", pki.cert.display()),
        format!("--tls-key-file={}", pki.key.display()),
        format!("--tls-client-ca-file={}", pki.bundle.display()),
    ];
    let (bbr, grpc) = start_bbr(&pki, &files, &[]).await;
    let ours = pki.client_ca.issue(&["envoy"]);
    let answer = exchange(&pki, grpc, &ours, "sql-lora").await;
    assert_eq!(answer.header(wire::MODEL_HEADER), Some("sql-lora"));
    assert_eq!(answer.header(wire::BASE_MODEL_HEADER), Some("llama-3-8b"));
    let none = hello(&pki, grpc, None).await.unwrap_err();
    assert!(none.contains("CertificateRequired"), "{none}");
    drop(bbr);

    let self_signed = ["--tls-self-signed".to_owned()];
    let (_bbr, grpc) = start_bbr(
        &pki,
        &self_signed,
        &[("INFERGATE_TLS_CLIENT_CA_FILE", &pki.bundle)],
    )
    .await;
    let refused = first_frame(connect(grpc, "localhost", accept_any_config(&[b"h2"])).await)
        .await
        .unwrap_err();
    assert!(refused.contains("CertificateRequired"), "{refused}");
}

/// `infergate SUBCOMMAND` with `extra` flags on free-or-unused loopback ports, over a static
/// endpoint (picker) or a one-model file (bbr), run to its end: whether it succeeded, and what
/// it printed.
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
    let out = cmd
        .args(["--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0"])
        .args(extra)
        .env_remove("INFERGATE_TLS_CLIENT_CA_FILE")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    printed_error::outcome(&out)
}

/// A client CA bundle that is missing, not PEM, or a private key rather than a certificate
/// stops either process before it listens, with an error that opens with
/// `--tls-client-ca-file` and the file and says each cause once; given without TLS on the port
/// it is refused by the parser, naming the flags that turn TLS on.
#[test]
fn an_unusable_client_ca_file_or_one_without_tls_stops_the_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new("server")
        .issue(&["localhost"])
        .write(dir.path());
    let missing = dir.path().join("no-such-ca.pem");
    let garbage = dir.path().join("garbage-ca.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let broken = dir.path().join("broken-ca.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n!!! not base64 !!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let a_key = dir.path().join("key-not-ca.pem");
    std::fs::copy(&key, &a_key).unwrap();
    let cases = [
        (&missing, "cannot read"),
        (&garbage, "holds no PEM certificate"),
        (&broken, "is not valid PEM"),
        (&a_key, "holds no PEM certificate"),
    ];
    for subcommand in ["picker", "bbr"] {
        for (file, expected) in &cases {
            let extra = [
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-key-file={}", key.display()),
                format!("--tls-client-ca-file={}", file.display()),
            ];
            let (ok, text) = run_to_end(subcommand, dir.path(), &extra);
            assert!(!ok, "{subcommand} {file:?} started: {text}");
            let chain = printed_chain(&text);
            assert!(
                chain[0].starts_with(&format!("--tls-client-ca-file {}: ", file.display())),
                "{subcommand}: {text}"
            );
            assert!(text.contains(expected), "{subcommand} {file:?}: {text}");
            assert!(!text.contains("listening"), "{subcommand}: {text}");
            assert_said_once(&chain, &text);
        }
        let ca = format!("--tls-client-ca-file={}", garbage.display());
        let (ok, text) = run_to_end(subcommand, dir.path(), &[ca]);
        assert!(!ok, "{subcommand} started without TLS: {text}");
        assert!(
            text.contains("--tls-cert-file") && text.contains("--tls-self-signed"),
            "{subcommand}: {text}"
        );
        assert!(!text.contains("listening"), "{subcommand}: {text}");
    }
}
