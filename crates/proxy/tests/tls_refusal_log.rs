//! The front door's warning of clients refused for their certificate, read from a log subscriber
//! of the test's own. In a test binary of its own: with the other TLS tests running beside it
//! (`tls.rs`, whose admin-port tests refuse clients through the same warning), the subscriber
//! missed the warning in about 1 of 20 runs of that binary, and never in 40 runs alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/tls_gateway.rs"]
mod tls_gateway;
#[path = "common/upstream.rs"]
mod upstream;

use std::time::Duration;

use infergate_testkit::tls::TestCa;
use tls_gateway::{pki, start, tls_config};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use upstream::{Behaviour, Upstream};

/// The front door with `tls.clientCaFile`: a burst of clients refused for their certificate
/// gives one warning naming the front door, the client and the bundle (and no more within the
/// minute), every refusal counted; a TCP probe (connect, close) is counted in
/// `infergate_tls_connections_closed_before_handshake_total`, not as a failed handshake, and
/// logs nothing at info level. On the current-thread runtime, so that the test's log subscriber
/// sees the connections' tasks.
#[tokio::test]
async fn the_front_door_warns_once_of_a_burst_of_refusals_and_counts_probes_apart() {
    let log = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber(tracing::Level::INFO));
    let pki = pki();
    let clients = TestCa::new("client ca");
    let client_ca = pki.dir.path().join("clients.pem");
    std::fs::write(&client_ca, clients.cert_pem()).unwrap();
    let a = Upstream::start(Behaviour::Ok).await;
    let mut config = tls_config(&pki, &[a.addr]);
    config.tls.as_mut().unwrap().client_ca_file = Some(client_ca.clone());
    let (gw, stop) = start(config).await;
    let admin = gw.admin_addr().unwrap();
    let sample = |page: &str, family: &str, labels: &[(&str, &str)]| {
        infergate_testkit::metric(page, family, labels).unwrap_or(-1.0)
    };

    drop(
        tokio::net::TcpStream::connect(gw.http_addr())
            .await
            .unwrap(),
    );
    let closed = "infergate_tls_connections_closed_before_handshake_total";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = infergate_testkit::get(admin, "/metrics").await.text();
        if sample(&page, closed, &[]) == 1.0 {
            assert_eq!(
                sample(
                    &page,
                    "infergate_tls_handshake_failures_total",
                    &[("reason", "error")]
                ),
                0.0,
                "{page}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let stranger = TestCa::new("stranger ca").issue(&["router"]);
    for leaf in [None, Some(&stranger), None, Some(&stranger), None] {
        let config = pki.ca.client_config_presenting(&[b"http/1.1"], leaf);
        if let Ok(mut s) =
            infergate_testkit::tls::connect(gw.http_addr(), "localhost", config).await
        {
            let _ = s
                .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
                .await;
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            assert!(!got.starts_with(b"HTTP/"), "{got:?}");
        }
    }
    let page = infergate_testkit::get(admin, "/metrics").await.text();
    let failures = |reason| {
        sample(
            &page,
            "infergate_tls_handshake_failures_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(failures("client_certificate"), 5.0, "{page}");
    assert_eq!(failures("error"), 0.0, "{page}");
    assert_eq!(sample(&page, closed, &[]), 1.0, "{page}");
    let text = log.text();
    let line = infergate_testkit::one_refusal_warning(&text, "front", &client_ca);
    assert!(line.contains("peer=127.0.0.1:"), "{text}");
    assert_eq!(text.matches(" WARN ").count(), 1, "{text}");
    stop.send(()).unwrap();
    gw.wait().await;
}
