#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::time::Duration;

use tokio::time::Instant;

use infergate_testkit::tls::{Leaf, TestCa, accept_any_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

fn opts(reload: Duration) -> ServerTlsOptions {
    ServerTlsOptions {
        reload_interval: reload,
        ..ServerTlsOptions::new(port::FRONT, &ALPN_HTTP)
    }
}

/// Serves `tls` on 127.0.0.1: each connection's handshake result goes to the channel.
async fn serve(
    tls: ServerTls,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                match accept_tls(Some(&tls), stream).await {
                    Ok(mut s) => {
                        let _ = tx.send(Ok(()));
                        let _ = s.write_all(b"hello").await;
                        let _ = s.shutdown().await;
                    }
                    Err(e) => {
                        let label = e.metric_label().unwrap_or("closed");
                        let _ = tx.send(Err(label.to_owned()));
                    }
                }
            });
        }
    });
    (addr, rx)
}

use std::net::SocketAddr;

#[tokio::test]
async fn a_pair_from_files_is_served_and_checked_against_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let leaf = ca.issue(&["gateway.test", "127.0.0.1"]);
    let (cert, key) = leaf.write(dir.path());
    let tls = ServerTls::new(&Certificate::Files { cert, key }, &opts(Duration::ZERO)).unwrap();
    let (addr, mut results) = serve(tls).await;
    let mut s = infergate_testkit::tls::connect(addr, "gateway.test", ca.client_config(&[b"h2"]))
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let peer = s.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(peer, leaf.der);
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"hello");
    assert_eq!(results.recv().await.unwrap(), Ok(()));
    // A name the certificate does not carry is refused by the client.
    let wrong = infergate_testkit::tls::connect(addr, "other.test", ca.client_config(&[])).await;
    assert!(wrong.is_err());
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_handshakes() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let first = ca.issue(&["gateway.test"]);
    let (cert, key) = first.write(dir.path());
    let tls = ServerTls::new(
        &Certificate::Files { cert, key },
        &opts(Duration::from_millis(20)),
    )
    .unwrap();
    let mut registry = Registry::default();
    tls.register(&mut registry);
    assert_eq!(tls.certificate_chain()[0], first.der);
    // Another CA's certificate: the replacement need not share the old one's issuer.
    let second = TestCa::new("other ca").issue(&["gateway.test"]);
    second.write(dir.path());
    let mut waited = Duration::ZERO;
    while tls.certificate_chain()[0] != second.der {
        assert!(
            waited < Duration::from_secs(10),
            "the new certificate was never loaded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    let (addr, _results) = serve(tls.clone()).await;
    assert_eq!(
        infergate_testkit::tls::peer_certificate(addr, "gateway.test").await,
        second.der
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("infergate_tls_certificate_reloads_total{result=\"ok\"} 1"),
        "{text}"
    );
}

/// The served certificate's `notAfter` is exported, at start and after a reload, so an alert
/// can fire before it expires; an expired one is still served (with a warning).
#[tokio::test]
async fn the_served_certificates_expiry_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let expired = ca.issue_valid(&["gateway.test"], (2020, 1, 1), (2021, 1, 1));
    let (cert, key) = expired.write(dir.path());
    let tls = ServerTls::new(
        &Certificate::Files { cert, key },
        &opts(Duration::from_millis(20)),
    )
    .unwrap();
    let mut registry = Registry::default();
    tls.register(&mut registry);
    let gauge = |registry: &Registry| {
        let text = page(registry);
        text.lines()
            .find_map(|l| {
                l.strip_prefix("infergate_tls_certificate_not_after_timestamp_seconds ")
                    .map(|v| v.parse::<i64>().unwrap())
            })
            .unwrap_or_else(|| panic!("no gauge in {text}"))
    };
    // 2021-01-01T00:00:00Z.
    assert_eq!(gauge(&registry), 1_609_459_200);
    let fresh = ca.issue(&["gateway.test"]);
    fresh.write(dir.path());
    let want = Validity::of(&fresh.der).unwrap().not_after;
    let mut waited = Duration::ZERO;
    while gauge(&registry) != want {
        assert!(waited < Duration::from_secs(10), "the reload never set it");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    // A generated certificate has one too.
    let generated = ServerTls::new(
        &Certificate::SelfSigned {
            names: vec!["picker.test".to_owned()],
        },
        &opts(Duration::ZERO),
    )
    .unwrap();
    let mut registry = Registry::default();
    generated.register(&mut registry);
    assert!(gauge(&registry) > 1_609_459_200);
}

#[tokio::test]
async fn a_broken_replacement_keeps_the_old_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let first = ca.issue(&["gateway.test"]);
    let (cert, key) = first.write(dir.path());
    let tls = ServerTls::new(
        &Certificate::Files {
            cert: cert.clone(),
            key,
        },
        &opts(Duration::from_millis(20)),
    )
    .unwrap();
    let mut registry = Registry::default();
    tls.register(&mut registry);
    // A new certificate whose key was not replaced: the pair does not match.
    std::fs::write(&cert, ca.issue(&["gateway.test"]).cert_pem).unwrap();
    let mut text = String::new();
    for _ in 0..1000 {
        text.clear();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // The series exists at 0 from the start: wait for the count.
        if text.contains("infergate_tls_certificate_reloads_total{result=\"error\"} 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        text.contains("infergate_tls_certificate_reloads_total{result=\"error\"} 1"),
        "{text}"
    );
    assert_eq!(tls.certificate_chain()[0], first.der);
}

/// Counters of `registry` as text.
fn page(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// A port asking for client certificates of the bundle `bundle` (holding `client_ca`), polled
/// every `reload`, served on 127.0.0.1 with a certificate of `server_ca`.
struct Mutual {
    _dir: tempfile::TempDir,
    server_ca: TestCa,
    bundle: PathBuf,
    registry: Registry,
    addr: SocketAddr,
    results: tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
}

impl Mutual {
    async fn start(client_ca: &TestCa, reload: Duration) -> Mutual {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("server ca");
        let (cert, key) = server_ca.issue(&["gateway.test"]).write(dir.path());
        let bundle = dir.path().join("clients.pem");
        std::fs::write(&bundle, client_ca.cert_pem()).unwrap();
        let options = ServerTlsOptions {
            client_ca: Some(bundle.clone()),
            ..opts(reload)
        };
        let tls = ServerTls::new(&Certificate::Files { cert, key }, &options).unwrap();
        let mut registry = Registry::default();
        tls.register(&mut registry);
        let (addr, results) = serve(tls).await;
        Mutual {
            _dir: dir,
            server_ca,
            bundle,
            registry,
            addr,
            results,
        }
    }

    /// What a client presenting `leaf` reads from the port: `hello`, or the error that ended
    /// its handshake or its read.
    async fn hello(&self, leaf: Option<&Leaf>) -> std::io::Result<Vec<u8>> {
        let config = self.server_ca.client_config_presenting(&[], leaf);
        let mut s = infergate_testkit::tls::connect(self.addr, "gateway.test", config).await?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.map(|_| got)
    }

    fn page(&self) -> String {
        page(&self.registry)
    }
}

/// A port with a client CA serves a client presenting a certificate of that CA; one presenting
/// none, or one of another CA, fails its handshake, counted as `client_certificate`.
#[tokio::test]
async fn a_client_ca_admits_only_clients_with_its_certificates() {
    let (client_ca, other_ca) = (TestCa::new("client ca"), TestCa::new("other ca"));
    let mut port = Mutual::start(&client_ca, Duration::ZERO).await;
    let failures = |n: u32| {
        format!("infergate_tls_handshake_failures_total{{reason=\"client_certificate\"}} {n}")
    };
    assert!(port.page().contains(&failures(0)), "{}", port.page());
    let admitted = port
        .hello(Some(&client_ca.issue(&["router"])))
        .await
        .unwrap();
    assert_eq!(admitted, b"hello");
    assert_eq!(port.results.recv().await.unwrap(), Ok(()));
    // TLS 1.3: the client's handshake ends before the server has read its certificate; the
    // refusal is the alert its first read gets.
    for (leaf, alert) in [
        (None, "CertificateRequired"),
        (Some(other_ca.issue(&["router"])), "UnknownCA"),
    ] {
        let refused = port.hello(leaf.as_ref()).await.unwrap_err();
        assert!(refused.to_string().contains(alert), "{refused}");
        assert_eq!(
            port.results.recv().await.unwrap(),
            Err("client_certificate".to_owned())
        );
    }
    assert!(port.page().contains(&failures(2)), "{}", port.page());
}

/// A client CA bundle replaced on disk verifies the next handshakes; a replacement holding no
/// certificate keeps the last good bundle and is counted as a failed reload.
#[tokio::test]
async fn a_replaced_client_ca_verifies_new_handshakes() {
    let (first, second) = (TestCa::new("client ca 1"), TestCa::new("client ca 2"));
    let port = Mutual::start(&first, Duration::from_millis(20)).await;
    let (one, two) = (first.issue(&["router"]), second.issue(&["router"]));
    let port = &port;
    let admits = |leaf| async move { port.hello(Some(leaf)).await.is_ok() };
    assert!(admits(&one).await && !admits(&two).await);
    std::fs::write(&port.bundle, second.cert_pem()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !admits(&two).await {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!admits(&one).await, "the old CA is no longer trusted");
    assert!(
        port.page()
            .contains("infergate_tls_certificate_reloads_total{result=\"ok\"} 1")
    );

    std::fs::write(&port.bundle, "no certificate\n").unwrap();
    while !port
        .page()
        .contains("infergate_tls_certificate_reloads_total{result=\"error\"} 1")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw the spoilt bundle"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(admits(&two).await && !admits(&one).await);
}

#[tokio::test]
async fn a_plaintext_client_is_refused_at_once() {
    let tls = ServerTls::new(
        &Certificate::SelfSigned {
            names: vec!["localhost".into()],
        },
        &ServerTlsOptions::new(port::EXT_PROC, &ALPN_GRPC),
    )
    .unwrap();
    let mut registry = Registry::default();
    tls.register(&mut registry);
    let (addr, mut results) = serve(tls).await;
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // rustls answers a non-TLS record with an alert (or nothing) and closes: the read ends.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was not closed");
    assert!(!got.starts_with(b"HTTP/"), "{got:?}");
    assert_eq!(results.recv().await.unwrap(), Err("error".to_owned()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("infergate_tls_handshake_failures_total{reason=\"error\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_is_cut_at_the_handshake_timeout() {
    let tls = ServerTls::new(
        &Certificate::SelfSigned {
            names: vec!["localhost".into()],
        },
        &ServerTlsOptions::new(port::EXT_PROC, &ALPN_GRPC),
    )
    .unwrap();
    let (server, _client) = tokio::io::duplex(1024);
    let started = tokio::time::Instant::now();
    let err = tls.accept(server).await.unwrap_err();
    assert!(matches!(err, HandshakeError::Timeout(t) if t == DEFAULT_HANDSHAKE_TIMEOUT));
    assert_eq!(started.elapsed(), DEFAULT_HANDSHAKE_TIMEOUT);
}

#[tokio::test]
async fn a_self_signed_certificate_carries_its_names() {
    let tls = ServerTls::new(
        &Certificate::SelfSigned {
            names: vec!["picker.default.svc".into()],
        },
        &ServerTlsOptions::new(port::EXT_PROC, &ALPN_GRPC),
    )
    .unwrap();
    let (addr, _results) = serve(tls.clone()).await;
    let s = infergate_testkit::tls::connect(addr, "anything", accept_any_config(&[b"h2"]))
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        s.get_ref().1.peer_certificates().unwrap()[0],
        tls.certificate_chain()[0]
    );
}

#[test]
fn bad_files_get_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let leaf = ca.issue(&["a.test"]);
    let (cert, key) = leaf.write(dir.path());
    let p = provider();
    let missing = dir.path().join("missing.pem");
    assert!(matches!(
        load_pair(&missing, &key, &p),
        Err(TlsError::Read { path, .. }) if path == missing
    ));
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not pem at all\n").unwrap();
    assert!(matches!(
        load_pair(&garbage, &key, &p),
        Err(TlsError::NoCertificate { .. })
    ));
    assert!(matches!(
        load_pair(&cert, &garbage, &p),
        Err(TlsError::NoPrivateKey { .. })
    ));
    let cut = dir.path().join("cut.pem");
    std::fs::write(&cut, "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
    assert!(matches!(
        load_pair(&cut, &key, &p),
        Err(TlsError::Pem { .. })
    ));
    let other_key = dir.path().join("other-key.pem");
    std::fs::write(&other_key, ca.issue(&["a.test"]).key_pem).unwrap();
    let err = load_pair(&cert, &other_key, &p).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("does not match"), "{err}");
    assert!(load_pair(&cert, &key, &p).is_ok());
    // A client CA bundle: the same typed errors, naming the file.
    assert!(matches!(
        client_verifier(&missing),
        Err(TlsError::Read { path, .. }) if path == missing
    ));
    assert!(matches!(
        client_verifier(&garbage),
        Err(TlsError::NoCertificate { path }) if path == garbage
    ));
    assert!(client_verifier(&ca.write_ca(dir.path())).is_ok());
}

#[test]
fn a_ca_file_and_server_name_make_a_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca");
    let path = ca.write_ca(dir.path());
    let tls = client_tls(&path, Some("model.test")).unwrap();
    assert_eq!(
        tls.server_name("10.0.0.1:8000".parse().unwrap()),
        ServerName::try_from("model.test").unwrap()
    );
    let by_ip = client_tls(&path, None).unwrap();
    assert_eq!(
        by_ip.server_name("10.0.0.1:8000".parse().unwrap()),
        ServerName::try_from("10.0.0.1").unwrap()
    );
    assert!(matches!(
        client_tls(&path, Some("not a name!")),
        Err(TlsError::ServerName { .. })
    ));
    assert!(matches!(
        client_tls(&dir.path().join("nope.pem"), None),
        Err(TlsError::Read { .. })
    ));
}

/// The first refusal is logged at once; the next ones within the interval are not, and are
/// counted into the first line after it; the interval then runs from that line.
#[test]
fn refusals_are_logged_at_most_once_per_interval_with_the_ones_left_out() {
    let start = Instant::now();
    let at = |secs: u64| start + Duration::from_secs(secs);
    let mut r = Refusals::default();
    assert_eq!(r.record(at(0)), Some(1));
    assert_eq!(r.record(at(1)), None);
    assert_eq!(r.record(at(59)), None);
    assert_eq!(r.record(at(60)), Some(3));
    assert_eq!(r.record(at(61)), None);
    assert_eq!(r.record(at(119)), None);
    assert_eq!(r.record(at(120)), Some(3));
    assert_eq!(r.record(at(1000)), Some(1));
}

/// The lines of `log` that contain `what`.
fn lines_with(log: &infergate_testkit::CapturedLog, what: &str) -> Vec<String> {
    log.text()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_owned)
        .collect()
}

/// A TCP connect closed (or reset) before its first byte — a liveness probe — is counted in its
/// own counter, not as a failed handshake, and warned of by nobody; a plaintext client still
/// is a failure (`error`).
#[tokio::test]
async fn a_connection_closed_before_its_first_byte_is_no_handshake_failure() {
    let log = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber(tracing::Level::INFO));
    let port = Mutual::start(&TestCa::new("client ca"), Duration::ZERO).await;
    let mut port = port;
    // A FIN, then a reset (linger 0), each before any byte.
    drop(tokio::net::TcpStream::connect(port.addr).await.unwrap());
    let reset = tokio::net::TcpStream::connect(port.addr).await.unwrap();
    #[expect(
        deprecated,
        reason = "a linger of 0 resets the connection at once; it does not block"
    )]
    reset.set_linger(Some(Duration::ZERO)).unwrap();
    drop(reset);
    for _ in 0..2 {
        assert_eq!(port.results.recv().await.unwrap(), Err("closed".to_owned()));
    }
    let page = port.page();
    assert!(
        page.contains("infergate_tls_connections_closed_before_handshake_total 2"),
        "{page}"
    );
    for reason in HandshakeError::METRIC_LABELS {
        let failures = format!("infergate_tls_handshake_failures_total{{reason=\"{reason}\"}} 0");
        assert!(page.contains(&failures), "{page}");
    }
    let mut plain = tokio::net::TcpStream::connect(port.addr).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(port.results.recv().await.unwrap(), Err("error".to_owned()));
    let page = port.page();
    assert!(
        page.contains("infergate_tls_handshake_failures_total{reason=\"error\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("infergate_tls_connections_closed_before_handshake_total 2"),
        "{page}"
    );
    assert!(!log.text().contains("WARN"), "{}", log.text());
}

/// A burst of clients refused for their certificate gives one warning per port, naming the port,
/// the client and the bundle; each port has its own rate limit.
#[tokio::test]
async fn a_burst_of_refusals_is_warned_of_once_per_port() {
    let log = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber(tracing::Level::INFO));
    let client_ca = TestCa::new("client ca");
    let mut ports = [
        Mutual::start(&client_ca, Duration::ZERO).await,
        Mutual::start(&client_ca, Duration::ZERO).await,
    ];
    let other = TestCa::new("other ca").issue(&["router"]);
    for port in &mut ports {
        for leaf in [None, Some(&other), None, Some(&other), None] {
            assert!(port.hello(leaf).await.is_err());
            assert_eq!(
                port.results.recv().await.unwrap(),
                Err("client_certificate".to_owned())
            );
        }
    }
    let lines = lines_with(&log, "client refused");
    assert_eq!(lines.len(), 2, "{}", log.text());
    for (line, port) in lines.iter().zip(&ports) {
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("front client refused: "), "{line}");
        assert!(line.contains("port=\"front\""), "{line}");
        assert!(line.contains("peer=127.0.0.1:"), "{line}");
        assert!(line.contains("refused=1"), "{line}");
        assert!(line.contains(&port.bundle.display().to_string()), "{line}");
        assert!(
            port.page().contains(
                "infergate_tls_handshake_failures_total{reason=\"client_certificate\"} 5"
            ),
            "{}",
            port.page()
        );
    }
}

/// The admin port (`adminTls`, `--metrics-tls-*` with a client CA) warns once of a burst of
/// refused clients, naming itself, and counts a TCP probe apart from the handshake failures.
#[tokio::test]
async fn the_admin_port_warns_once_of_refusals_and_counts_probes_apart() {
    let log = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (TestCa::new("server ca"), TestCa::new("client ca"));
    let (cert, key) = server_ca.issue(&["gateway.test"]).write(dir.path());
    let options = ServerTlsOptions {
        client_ca: Some(client_ca.write_ca(dir.path())),
        reload_interval: Duration::ZERO,
        ..ServerTlsOptions::new(port::ADMIN, &ALPN_HTTP)
    };
    let tls = ServerTls::new(&Certificate::Files { cert, key }, &options).unwrap();
    let mut registry = Registry::default();
    tls.register(&mut registry);
    let registry = Arc::new(registry);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let scraped = Arc::clone(&registry);
    tokio::spawn(crate::admin::serve_tls_with_heartbeat(
        listener,
        Some(tls),
        move || Ok(page(&scraped)),
        || true,
        || None,
        std::future::pending(),
    ));
    let counted = |what: &str| page(&registry).contains(what);
    // A probe: connect, close.
    drop(tokio::net::TcpStream::connect(addr).await.unwrap());
    infergate_testkit::eventually("the probe counted", || {
        counted("infergate_tls_connections_closed_before_handshake_total 1")
    })
    .await;
    assert!(counted(
        "infergate_tls_handshake_failures_total{reason=\"error\"} 0"
    ));
    // A burst of clients without a certificate.
    for _ in 0..4 {
        let config = server_ca.client_config_presenting(&[b"http/1.1"], None);
        if let Ok(mut s) = infergate_testkit::tls::connect(addr, "gateway.test", config).await {
            let _ = s
                .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                .await;
            let mut got = Vec::new();
            assert!(s.read_to_end(&mut got).await.is_err() || got.is_empty());
        }
    }
    infergate_testkit::eventually("the refusals counted", || {
        counted("infergate_tls_handshake_failures_total{reason=\"client_certificate\"} 4")
    })
    .await;
    let lines = lines_with(&log, "client refused");
    assert_eq!(lines.len(), 1, "{}", log.text());
    assert!(lines[0].contains("admin client refused: "), "{}", lines[0]);
    assert!(lines[0].contains("port=\"admin\""), "{}", lines[0]);
    assert_eq!(log.text().matches("WARN").count(), 1, "{}", log.text());
}
