//! The admin port over TLS, as a scraper sees it: an HTTPS scrape with an allowed token, a
//! plain-HTTP client refused, the self-signed certificate's names, a rotated certificate served
//! without a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use infergate_operator::metrics_auth::MetricsAuth;
use infergate_operator::serve::MetricsTls;
use infergate_testkit::Response;
use infergate_testkit::tls::{Leaf, TestCa, peer_certificate};
use rustls_pki_types::CertificateDer;

use super::{admin_over, assert_metric};

/// The certificate files a Secret mount holds, in a scratch directory kept as long as the test.
struct Files {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

fn files(leaf: &Leaf) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = leaf.write(dir.path());
    Files {
        _dir: dir,
        cert,
        key,
    }
}

/// The port's TLS for these files, as `--metrics-tls-cert-file` and `--metrics-tls-key-file`
/// choose it.
fn from_files(files: &Files) -> MetricsTls {
    MetricsTls::choose(
        MetricsAuth::Kubernetes,
        None,
        Some((files.cert.clone(), files.key.clone())),
        Vec::new(),
    )
    .unwrap()
}

async fn https_get(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    path: &str,
    authorization: Option<&str>,
) -> Result<Response, infergate_testkit::Error> {
    let mut req = http::Request::get(path);
    if let Some(a) = authorization {
        req = req.header(http::header::AUTHORIZATION, a);
    }
    let req = req.body(Bytes::new()).unwrap();
    infergate_testkit::tls::send_within(addr, name, config, req, Duration::from_secs(10)).await
}

#[tokio::test]
async fn an_https_scrape_with_an_allowed_token_gets_the_page_and_plain_http_gets_nothing() {
    let ca = TestCa::new("metrics CA");
    let files = files(&ca.issue(&["localhost", "127.0.0.1"]));
    let tls = from_files(&files).load().unwrap();
    let (addr, _fake, _stop) = admin_over(true, tls).await;
    let verified = ca.client_config(&[b"http/1.1"]);

    // The client verifies the certificate against the CA, then sends Prometheus's token.
    let r = https_get(
        addr,
        "localhost",
        Arc::clone(&verified),
        "/metrics",
        Some("Bearer prometheus-token"),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_metric(&r, "infergate_operator_reconciliations_total", &[], 1.0);
    // The port's certificate is watched like every infergate TLS port's.
    let not_after = infergate_testkit::metric(
        &r.text(),
        "infergate_tls_certificate_not_after_timestamp_seconds",
        &[],
    );
    assert!(not_after.is_some_and(|t| t > 0.0), "{}", r.text());
    // Over TLS the token is still checked.
    let r = https_get(addr, "localhost", Arc::clone(&verified), "/metrics", None)
        .await
        .unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    // The probes answer over HTTPS without a token.
    for path in ["/healthz", "/readyz"] {
        let r = https_get(addr, "localhost", Arc::clone(&verified), path, None)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }

    // A plain-HTTP scrape, token and all, gets no HTTP answer: its bytes are not a ClientHello.
    let started = Instant::now();
    let mut req = http::Request::get("/metrics");
    req = req.header(http::header::AUTHORIZATION, "Bearer prometheus-token");
    let plain = infergate_testkit::send_within(
        addr,
        req.body(Bytes::new()).unwrap(),
        Duration::from_secs(8),
    )
    .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed at once, not at the handshake timeout: {:?}",
        started.elapsed()
    );
    // ... and the failed handshake is counted where the operator's metrics are.
    let r = https_get(
        addr,
        "localhost",
        verified,
        "/metrics",
        Some("Bearer prometheus-token"),
    )
    .await
    .unwrap();
    assert_metric(
        &r,
        "infergate_tls_handshake_failures_total",
        &[("reason", "error")],
        1.0,
    );
}

/// A client trusting `cert` itself, as a scraper given the self-signed certificate would.
fn trusting(cert: &CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[tokio::test]
async fn by_default_the_certificate_is_self_signed_for_localhost_the_pod_and_the_address() {
    let pod = "infergate-operator-7c9d5-x2k4q";
    let bound: SocketAddr = "127.0.0.1:9090".parse().unwrap();
    let names = MetricsTls::self_signed_names(pod, bound);
    assert_eq!(names, ["localhost", pod, "127.0.0.1"]);
    assert_eq!(
        MetricsTls::self_signed_names(pod, "0.0.0.0:9090".parse().unwrap()),
        ["localhost", pod],
        "every interface is no name"
    );
    // No flag but --metrics-auth=kubernetes (the default): HTTPS, self-signed.
    let tls = MetricsTls::choose(MetricsAuth::Kubernetes, None, None, names)
        .unwrap()
        .load()
        .unwrap();
    assert!(tls.is_some(), "the default serves HTTPS");
    let (addr, _fake, _stop) = admin_over(true, tls).await;
    let cert = peer_certificate(addr, "localhost").await;

    // The certificate verifies (as its own root) for each of its names, and for no other.
    for name in ["localhost", pod, "127.0.0.1"] {
        let r = https_get(
            addr,
            name,
            trusting(&cert),
            "/metrics",
            Some("Bearer prometheus-token"),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(r.status, 200, "{name}: {}", r.text());
    }
    let other = https_get(addr, "other.example", trusting(&cert), "/healthz", None).await;
    let err = format!("{:?}", other.unwrap_err());
    assert!(err.contains("NotValidForName"), "{err}");
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let (old_ca, new_ca) = (TestCa::new("old CA"), TestCa::new("new CA"));
    let first = old_ca.issue(&["localhost"]);
    let files = files(&first);
    let tls = from_files(&files).load().unwrap();
    let (addr, _fake, _stop) = admin_over(true, tls).await;
    assert_eq!(peer_certificate(addr, "localhost").await, first.der);

    // cert-manager renews the Secret: the kubelet swaps the mounted files.
    let renewed = new_ca.issue(&["localhost"]);
    let dir = files.cert.parent().unwrap();
    assert_eq!(renewed.write(dir), (files.cert.clone(), files.key.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while peer_certificate(addr, "localhost").await != renewed.der {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate is not served 10 s after the files changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A scraper trusting the new CA is let in; one trusting only the old no longer connects.
    let r = https_get(
        addr,
        "localhost",
        new_ca.client_config(&[b"http/1.1"]),
        "/metrics",
        Some("Bearer prometheus-token"),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_metric(
        &r,
        "infergate_tls_certificate_reloads_total",
        &[("result", "ok")],
        1.0,
    );
    let stale = https_get(
        addr,
        "localhost",
        old_ca.client_config(&[b"http/1.1"]),
        "/healthz",
        None,
    )
    .await;
    assert!(stale.is_err(), "{stale:?}");
}

#[tokio::test]
async fn a_certificate_file_that_does_not_load_stops_the_start_naming_the_flag_and_file() {
    let ca = TestCa::new("metrics CA");
    let files = files(&ca.issue(&["localhost"]));
    let missing = MetricsTls::choose(
        MetricsAuth::Kubernetes,
        Some(true),
        Some((files.cert.with_file_name("absent.crt"), files.key.clone())),
        Vec::new(),
    )
    .unwrap();
    let err = missing.load().unwrap_err();
    let text = err.report();
    for want in ["--metrics-tls-cert-file", "absent.crt", "cannot read"] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // A key of another certificate.
    let other = files_of_other_key(&ca, &files);
    let err = from_files(&other).load().unwrap_err().report();
    assert!(err.contains("does not match"), "{err}");
}

/// `files`' certificate with the key of another one.
fn files_of_other_key(ca: &TestCa, files: &Files) -> Files {
    let other = ca.issue(&["localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::copy(&files.cert, &cert).unwrap();
    std::fs::write(&key, &other.key_pem).unwrap();
    Files {
        _dir: dir,
        cert,
        key,
    }
}
