//! The router's HTTP behaviour on 127.0.0.1 in front of one recording "cluster"
//! (`infergate_testkit::recorder`): what it passes on in each direction, and its answers to
//! requests it does not route.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::net::SocketAddr;

use bytes::Bytes;
use infergate_global::{GlobalConfig, Listeners, Router, serve};
use infergate_testkit::Response;
use infergate_testkit::recorder::{HOP_REQUEST_HEADERS, HOP_RESPONSE_HEADERS, Recorder};
use tokio::sync::oneshot;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The router in front of `cluster` (its models configured, no heartbeat), and its stop switch.
async fn router(cluster: SocketAddr) -> (Router, oneshot::Sender<()>) {
    let yaml = format!(
        "auth: none\nclusters:\n  - {{ name: a, url: 'http://{cluster}', region: r, models: [m], cost: {{ inputPerMillion: 1, outputPerMillion: 1 }} }}\n"
    );
    let config = GlobalConfig::from_yaml(&yaml).unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let router = serve(config, Listeners { http, admin: None }, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (router, stop)
}

async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = if method == "POST" { CHAT } else { "" };
    infergate_testkit::send(addr, b.body(Bytes::from_static(body.as_bytes())).unwrap())
        .await
        .unwrap()
}

/// Headers the `Connection` header names are hop-by-hop (RFC 9110 §7.6.1): neither the client's
/// nor the cluster's reach the other side, whichever `Connection` line names them and in
/// whatever case; the other headers do.
#[tokio::test]
async fn headers_named_by_connection_are_not_forwarded_either_way() {
    let cluster = Recorder::start(&HOP_RESPONSE_HEADERS).await;
    let (router, _stop) = router(cluster.addr).await;
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &HOP_REQUEST_HEADERS,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    cluster.assert_hop_by_hop_dropped(&r.headers);
}

/// A path the router serves, asked with another method, is a 405 whose `Allow` header and
/// message name the method it takes; an unknown path stays a 404.
#[tokio::test]
async fn a_wrong_method_is_405_naming_the_allowed_one() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    for (method, path, allowed) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/v1/models", "GET"),
    ] {
        let r = send(router.http_addr(), method, path, &[]).await;
        assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
        assert_eq!(r.header("allow"), Some(allowed), "{method} {path}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("use {allowed}")), "{msg}");
    }
    let r = send(router.http_addr(), "POST", "/v2/whatever", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("allow"), None);
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}
