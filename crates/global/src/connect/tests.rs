use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::GlobalConfig;

fn cluster(url: &str, tls: &str) -> ClusterConfig {
    let yaml = format!(
        "auth: none\nclusters:\n  - {{ name: a, url: '{url}', region: r, cost: {{ inputPerMillion: 1 }}{tls} }}\n"
    );
    GlobalConfig::from_yaml(&yaml).unwrap().clusters.remove(0)
}

async fn fail(url: &str, tls: &str, timeout: Duration) -> Failure {
    let (client, _) = Connector::new(&cluster(url, tls), timeout, &mut SystemRoots::new(), None)
        .unwrap()
        .clients();
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = format!("{url}/v1/models").parse().unwrap();
    // Bounded: a handshake that is not would hang here.
    let e = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("the connection attempt ended")
        .expect_err("no answer expected");
    failure(&e)
}

/// A server that accepts connections, reads nothing and never answers.
async fn silent() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

/// A plaintext HTTP server: answers its first bytes with an HTTP/1.1 400.
async fn plaintext() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    addr
}

#[tokio::test]
async fn a_handshake_that_never_finishes_is_a_tls_connect_failure() {
    let addr = silent().await;
    let started = std::time::Instant::now();
    let f = fail(
        &format!("https://{addr}"),
        ", tls: { serverName: gw.internal }",
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(
        f,
        Failure::Connect {
            tls: Some("TLS handshake not completed within 200 ms".into())
        }
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_plaintext_server_is_a_tls_connect_failure_with_rustls_reason() {
    let addr = plaintext().await;
    let f = fail(&format!("https://{addr}"), "", Duration::from_secs(2)).await;
    let Failure::Connect { tls: Some(why) } = f else {
        panic!("{f:?}")
    };
    assert!(why.starts_with("TLS handshake failed: "), "{why}");
    assert!(why.contains("corrupt message"), "{why}");
}

#[tokio::test]
async fn a_refused_connection_is_a_tcp_connect_failure_and_http_stays_plain() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    assert_eq!(
        fail(&format!("https://{addr}"), "", Duration::from_secs(2)).await,
        Failure::Connect { tls: None }
    );
    // A plain server reached over http:// answers (no TLS in the way).
    let addr = plaintext().await;
    let (client, _) = Connector::new(
        &cluster(&format!("http://{addr}"), ""),
        Duration::from_secs(2),
        &mut SystemRoots::new(),
        None,
    )
    .unwrap()
    .clients();
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = format!("http://{addr}/v1/models").parse().unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 400);
}

#[test]
fn an_unreadable_ca_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let c = cluster(
        "https://gw.example.com",
        &format!(", tls: {{ caFile: '{}' }}", missing.display()),
    );
    let Err(e) = Connector::new(&c, Duration::from_secs(1), &mut SystemRoots::new(), None) else {
        panic!("accepted a missing CA file")
    };
    let text = infergate_pool::ErrorChain(&e).to_string();
    assert!(text.contains("missing.pem"), "{text}");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let c = cluster(
        "https://gw.example.com",
        &format!(", tls: {{ caFile: '{}' }}", empty.display()),
    );
    let Err(e) = Connector::new(&c, Duration::from_secs(1), &mut SystemRoots::new(), None) else {
        panic!("accepted a CA file without a certificate")
    };
    let text = infergate_pool::ErrorChain(&e).to_string();
    assert!(
        text.contains("empty.pem") && text.contains("no PEM certificate"),
        "{text}"
    );
}

#[test]
fn a_token_to_a_remote_http_url_is_plaintext() {
    let token = ", credentials: { bearerTokenFile: /t }";
    assert!(token_in_plaintext(&cluster("http://10.0.0.1:8080", token)));
    assert!(!token_in_plaintext(&cluster(
        "http://127.0.0.1:8080",
        token
    )));
    assert!(!token_in_plaintext(&cluster(
        "https://10.0.0.1:8443",
        token
    )));
    assert!(!token_in_plaintext(&cluster("http://10.0.0.1:8080", "")));
}

/// A certificate whose extended key usage does not allow its use is named with what to issue:
/// the cluster's not for servers (rustls' `InvalidPurpose`), the router's refused by the gateway
/// (the `UnsupportedCertificate` alert rustls sends for it).
#[test]
fn a_certificate_of_the_wrong_purpose_says_what_to_issue() {
    let server = rustls::Error::InvalidCertificate(rustls::CertificateError::InvalidPurpose);
    assert!(
        with_remedy("invalid peer certificate".to_owned(), &server)
            .ends_with("(the cluster's certificate is not issued for server authentication: reissue it with extendedKeyUsage serverAuth, or none)"),
    );
    let client = rustls::Error::AlertReceived(rustls::AlertDescription::UnsupportedCertificate);
    assert!(
        with_remedy("received fatal alert".to_owned(), &client)
            .contains("issue tls.certFile with extendedKeyUsage clientAuth"),
    );
}
