//! The router's HTTP behaviour on 127.0.0.1 in front of one recording "cluster"
//! (`infergate_testkit::recorder`): what it passes on in each direction, and its answers to
//! requests it does not route.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/clusters.rs"]
mod clusters;
#[path = "common/scripted.rs"]
mod scripted;

use std::net::SocketAddr;

use bytes::Bytes;
use clusters::router_with;
use infergate_global::{GlobalConfig, Listeners, Router, serve};
use infergate_testkit::Response;
use infergate_testkit::recorder::{HOP_REQUEST_HEADERS, HOP_RESPONSE_HEADERS, Recorder};
use infergate_testkit::scripted::scripted_server;
use scripted::{HeldStream, finish_stream, open_stream};
use tokio::sync::oneshot;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The router in front of `cluster` (its models configured, no heartbeat), and its stop switch.
async fn router(cluster: SocketAddr) -> (Router, oneshot::Sender<()>) {
    router_with(&format!(
        "auth: none\nclusters:\n  - {{ name: a, url: 'http://{cluster}', region: r, models: [m], cost: {{ inputPerMillion: 1, outputPerMillion: 1 }} }}\n"
    ))
    .await
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
/// message name the methods it takes, `OPTIONS` included since the router answers it (RFC 9110
/// §15.5.6); an unknown path stays a 404.
#[tokio::test]
async fn a_wrong_method_is_405_naming_the_allowed_one() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    for (method, path, allowed) in [
        ("GET", "/v1/chat/completions", "POST, OPTIONS"),
        ("POST", "/v1/models", "GET, HEAD, OPTIONS"),
        ("DELETE", "/v1/models", "GET, HEAD, OPTIONS"),
        ("PUT", "/v1/models/m", "GET, HEAD, OPTIONS"),
    ] {
        let r = send(router.http_addr(), method, path, &[]).await;
        assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
        assert_eq!(r.header("allow"), Some(allowed), "{method} {path}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("which takes {allowed}")), "{msg}");
    }
    let r = send(router.http_addr(), "POST", "/v2/whatever", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("allow"), None);
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}

/// `OPTIONS *` and `OPTIONS` on a path the router serves are answered by the router itself: 204
/// with the methods the target takes in `Allow` (RFC 9110 §9.3.7) and an `x-request-id`, on one
/// HTTP/1.1 keep-alive connection (the asterisk form sent as is), a browser's CORS preflight
/// included: without a CORS setting it gets no `Access-Control-*` header. No cluster hears of
/// it; a path the router does not serve stays a 404.
#[tokio::test]
async fn options_is_204_naming_the_methods_the_target_takes() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    let mut conn = tokio::net::TcpStream::connect(router.http_addr())
        .await
        .unwrap();
    for (target, allow) in [
        ("*", "GET, HEAD, POST, OPTIONS"),
        ("/v1/chat/completions", "POST, OPTIONS"),
        ("/v1/models", "GET, HEAD, OPTIONS"),
        ("/v1/models/meta-llama/Llama-3.1-8B", "GET, HEAD, OPTIONS"),
    ] {
        // One keep-alive connection for every case: a 204 has no body to frame.
        let head = infergate_testkit::options_preflight(&mut conn, target).await;
        assert!(head.starts_with("http/1.1 204 "), "{target}: {head}");
        let allow = allow.to_ascii_lowercase();
        assert!(head.contains(&format!("\r\nallow: {allow}\r\n")), "{head}");
        assert!(head.contains("\r\nx-request-id: "), "{target}: {head}");
        assert!(!head.contains("access-control-"), "{target}: {head}");
    }
    let r = send(router.http_addr(), "OPTIONS", "/v2/whatever", &[]).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}

/// With authentication on, `OPTIONS` on a path the router serves needs no credential (a
/// browser's preflight carries none, and the answer depends on the path alone, the same for
/// every model name); on any other path it is authenticated like every request.
#[tokio::test]
async fn options_needs_no_credential_and_reveals_nothing() {
    let cluster = Recorder::start(&[]).await;
    // SHA-256 of `key-m`.
    let (router, _stop) = router_with(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: 289c642a857aceb1b7e6f7ee74a11b4a5fb07f43d1e390a71251d611ebe36cd0, tenant: t, models: [m] }}]\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    ))
    .await;
    for (path, allow) in [
        ("/v1/chat/completions", "POST, OPTIONS"),
        ("/v1/models/m", "GET, HEAD, OPTIONS"),
        ("/v1/models/no-such-model", "GET, HEAD, OPTIONS"),
    ] {
        let r = send(router.http_addr(), "OPTIONS", path, &[]).await;
        assert_eq!(r.status, 204, "{path}: {}", r.text());
        assert_eq!(r.header("allow"), Some(allow), "{path}");
        assert!(r.body.is_empty(), "{path}");
    }
    let r = send(router.http_addr(), "OPTIONS", "/v2/whatever", &[]).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}

/// A request without `x-request-id` gets one (32 hex digits) that the cluster sees and the
/// client gets back; a client's own id is passed on and returned unchanged.
#[tokio::test]
async fn one_request_id_from_the_client_to_the_cluster() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.header("x-request-id").unwrap().to_owned();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let seen = cluster.heads().join("\n").to_ascii_lowercase();
    assert!(seen.contains(&format!("x-request-id: {id}")), "{seen}");
    let mine = [("x-request-id", "client-7")];
    let r = send(router.http_addr(), "POST", "/v1/chat/completions", &mine).await;
    assert_eq!(r.header("x-request-id"), Some("client-7"));
    let seen = cluster.heads().join("\n").to_ascii_lowercase();
    assert!(seen.contains("x-request-id: client-7"), "{seen}");
    // An answer of the router's own carries it too.
    let r = send(router.http_addr(), "POST", "/v2/nothing", &mine).await;
    assert_eq!(
        (r.status.as_u16(), r.header("x-request-id")),
        (404, Some("client-7"))
    );
}

/// `HEAD /v1/models` is its `GET` without the body; a compressed request body is 415 before it
/// is read, naming the coding, a body chunked under another coding 501, and neither reaches a
/// cluster.
#[tokio::test]
async fn head_on_the_model_list_and_a_compressed_body() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    let got = send(router.http_addr(), "GET", "/v1/models", &[]).await;
    let head = send(router.http_addr(), "HEAD", "/v1/models", &[]).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "{:?}", head.body);
    let length = got.body.len().to_string();
    assert_eq!(head.header("content-length"), Some(length.as_str()));
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("content-encoding", "br")],
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "unsupported_content_encoding", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`br`"),
        "{v}"
    );
    // A body chunked under another coding: 501, before it is read.
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("transfer-encoding", "deflate, chunked")],
    )
    .await;
    assert_eq!(r.status, 501, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "unsupported_transfer_encoding", "{v}");
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}

/// At shutdown the router stops accepting but lets a running stream finish: the client gets
/// every event, and `Router::wait` returns only once that answer has ended (the binary exits
/// when it returns, which would cut the stream).
#[tokio::test]
async fn a_stream_running_at_shutdown_is_finished_before_the_router_stops() {
    let held = HeldStream::start().await;
    let (router, stop) = router(held.addr).await;
    let addr = router.http_addr();
    let (mut client, got) = open_stream(addr).await;
    let _ = stop.send(());
    let mut waiting = tokio::spawn(router.wait());
    // Stopped accepting: a new connection is refused (or closed unanswered) once the listener
    // is gone.
    infergate_testkit::eventually("the front door closes", || {
        std::net::TcpStream::connect(addr).is_err()
    })
    .await;
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "the router stopped while a stream was running"
    );
    let _ = held.release.send(());
    finish_stream(&mut client, got).await;
    tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the router did not stop once its last answer ended")
        .unwrap();
}

/// A caller allowed only some models sees only those: in `GET /v1/models` and in the list an
/// unknown model's 404 gives (a model it may call that no cluster serves), as on the gateway:
/// the others are no business of its own. A caller allowed every model sees every model some
/// cluster serves.
#[tokio::test]
async fn a_caller_sees_only_the_models_it_may_call() {
    // SHA-256 of `key-m` and `key-all` (`printf %s key-m | sha256sum`).
    let key_m = "289c642a857aceb1b7e6f7ee74a11b4a5fb07f43d1e390a71251d611ebe36cd0";
    let key_all = "7a8399757846cd741227ce8306d45f2433844fc4cc5897cfb21e12671f92ed2b";
    let cluster = Recorder::start(&[]).await;
    let yaml = format!(
        "auth:\n  apiKeys:\n    keys:\n      - {{ sha256: {}, tenant: t-m, models: [m, gone] }}\n      - {{ sha256: {}, tenant: t-all, models: ['*'] }}\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m, secret-model], cost: {{ inputPerMillion: 1 }} }}\n",
        key_m, key_all, cluster.addr
    );
    let (router, _stop) = router_with(&yaml).await;
    let ids = |r: &Response| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let limited = [("authorization", "Bearer key-m")];
    let r = send(router.http_addr(), "GET", "/v1/models", &limited).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ids(&r), ["m"]);
    let all = [("authorization", "Bearer key-all")];
    let r = send(router.http_addr(), "GET", "/v1/models", &all).await;
    assert_eq!(ids(&r), ["m", "secret-model"]);
    // Every field of OpenAI's model object (`created` was missing; typed clients need it).
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["object"], "list", "{v}");
    for m in v["data"].as_array().unwrap() {
        assert!(m["id"].is_string() && m["owned_by"].is_string(), "{m}");
        assert_eq!(m["object"], "model", "{m}");
        assert!(m["created"].is_u64(), "{m}");
    }

    let unknown = |key: &'static str| {
        http::Request::post("/v1/chat/completions")
            .header("authorization", key)
            .header("content-type", "application/json")
            .body(Bytes::from_static(
                br#"{"model":"gone","messages":[{"role":"user","content":"hi"}]}"#,
            ))
            .unwrap()
    };
    let r = infergate_testkit::send(router.http_addr(), unknown("Bearer key-m"))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(
        r.text().contains("(m)") && !r.text().contains("secret-model"),
        "{}",
        r.text()
    );
    let r = infergate_testkit::send(router.http_addr(), unknown("Bearer key-all"))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("m, secret-model"), "{}", r.text());
    assert!(cluster.heads().is_empty(), "{:?}", cluster.heads());
}

/// A cluster's `credentials.bearerTokenFile` is what the cluster gets as `Authorization`, in
/// place of the client's; a token file that cannot be used at start (missing, empty) stops the
/// start naming the cluster and the file, instead of a router that sends its requests without
/// credentials and logs a warning at every discovery.
#[tokio::test]
async fn a_clusters_bearer_token_replaces_the_clients_and_must_load_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let cluster = Recorder::start(&[]).await;
    let yaml = |file: &std::path::Path| {
        format!(
            "auth: none\nclusters:\n  - {{ name: east, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, credentials: {{ bearerTokenFile: '{}' }} }}\n",
            cluster.addr,
            file.display()
        )
    };
    let (router, _stop) = router_with(&yaml(&token)).await;
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer client-credential")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let head = cluster.heads().pop().unwrap().to_ascii_lowercase();
    assert!(
        head.contains("authorization: bearer s3cret-token\r\n")
            || head.ends_with("authorization: bearer s3cret-token"),
        "{head}"
    );
    assert!(!head.contains("client-credential"), "{head}");

    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    for (file, why) in [
        (dir.path().join("missing"), "No such file"),
        (empty, "empty"),
    ] {
        let config = GlobalConfig::from_yaml(&yaml(&file)).unwrap();
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let Err(e) = serve(
            config,
            Listeners { http, admin: None },
            std::future::pending(),
        )
        .await
        else {
            panic!("started with the token file {}", file.display());
        };
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        assert!(
            chain.contains("`east`")
                && chain.contains(&file.display().to_string())
                && chain.contains(why),
            "{chain}"
        );
    }
}

/// A cluster whose front door accepts connections but never answers, while its heartbeat (on
/// its admin port) stays good: the first request routed there waits `firstByteMs` and gets
/// 504 (not retried: the cluster might be working on it). That wait counts as the cluster's
/// measured TTFT and as a failed heartbeat, so the requests after it go to a cluster that
/// answers, instead of each waiting out its own 504 on the cheapest cluster.
#[tokio::test]
async fn a_cluster_that_times_out_is_not_chosen_again_at_once() {
    let heartbeat = good_heartbeat().await;
    let hung_addr = hung_cluster().await;
    let good = Recorder::start(&[]).await;
    let yaml = format!(
        "auth: none\ntimeouts: {{ firstByteMs: 300 }}\nrouting: {{ ttftObjectiveMs: 200 }}\n\
         heartbeat: {{ intervalMs: 500, staleAfterMs: 3000, slowStartMs: 0 }}\nclusters:\n\
         \x20 - {{ name: hung, url: 'http://{hung_addr}', heartbeatUrl: 'http://{heartbeat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: 0.01 }} }}\n\
         \x20 - {{ name: good, url: 'http://{}', heartbeatUrl: 'http://{heartbeat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        good.addr
    );
    let (router, _stop) = router_with(&yaml).await;
    // Both up on their first heartbeat; the cheaper, hung, one comes first.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(r.status, 504, "{}", r.text());
    // The cluster and the timeout that elapsed are named, as the 502 names every cluster
    // tried (it said "the model server did not answer within 300 ms").
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_timeout", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "cluster `hung` sent no response headers within 300 ms (timeouts.firstByteMs)"
        ),
        "{msg}"
    );
    for i in 0..5 {
        let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-infergate-cluster"), Some("good"), "request {i}");
    }
}

/// A heartbeat page showing the model `m` with one ready pod, every time.
async fn good_heartbeat() -> SocketAddr {
    infergate_testkit::pages::page_server(std::sync::Arc::new(|| {
        r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
            "models":[{"name":"m","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,
            "inflight":0,"estimatedTtftMs":20.0,"prefillMs":20.0,"drainMs":0.0}]}"#
            .to_owned()
    }))
    .await
}

/// A "cluster" that accepts connections and never answers on them.
async fn hung_cluster() -> SocketAddr {
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hung.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hung.accept().await {
            held.push(s);
        }
    });
    addr
}

/// A token file the clusters do not accept (`stale-token`), in a folder kept while the guard
/// lives.
fn token_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "stale-token").unwrap();
    (dir, token)
}

/// A "cluster" answering every request with `status` and an OpenAI-style error body, on
/// keep-alive connections.
async fn refusing_cluster(status: u16) -> SocketAddr {
    let body = r#"{"error":{"message":"authentication failed: the API key is not known","type":"authentication_error","param":null,"code":"unauthorized"}}"#;
    scripted_server(std::sync::Arc::new(move |_: &str| {
        (status, "application/json", body.to_owned())
    }))
    .await
}

/// A cluster that refuses the router's own credentials (its `bearerTokenFile`, or none while
/// the router's authentication keeps the client's from being forwarded) answers 401 or 403
/// about the router, not the client: the client was told its API key was not known and to
/// send one. The request now moves on to the next cluster (`failovers_total{reason=
/// "credentials"}`) and, when no cluster is left, is a 502 naming the cluster that refused the
/// router. With the client's own credentials forwarded (no authentication on the router and
/// no token for the cluster) the cluster's 401 is the client's, and passes through.
#[tokio::test]
async fn a_cluster_refusing_the_routers_credentials_is_not_the_clients_401() {
    let (_dir, token) = token_file();
    let good = Recorder::start(&[]).await;
    for status in [401, 403] {
        let locked = refusing_cluster(status).await;
        let cluster = |name: &str, addr: SocketAddr, cost: f64, with_token: bool| {
            let credentials = if with_token {
                format!(
                    ", credentials: {{ bearerTokenFile: '{}' }}",
                    token.display()
                )
            } else {
                String::new()
            };
            format!(
                "  - {{ name: {name}, url: 'http://{addr}', region: r, models: [m], cost: {{ inputPerMillion: {cost} }}{credentials} }}\n"
            )
        };
        // The cheaper cluster refuses the router's token; the next one answers.
        let yaml = format!(
            "auth: none\nclusters:\n{}{}",
            cluster("locked", locked, 0.1, true),
            cluster("good", good.addr, 1.0, false)
        );
        let (router, _stop) = router_with(&yaml).await;
        let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
        assert_eq!(r.status, 200, "{status}: {}", r.text());
        assert_eq!(r.header("x-infergate-cluster"), Some("good"));
        let metrics = infergate_testkit::get(router.admin_addr().unwrap(), "/metrics").await;
        assert!(
            metrics.text().contains(
                r#"infergate_global_failovers_total{cluster="locked",reason="credentials"} 1"#
            ),
            "{}",
            metrics.text()
        );

        // No cluster left: a 502 about the router, not a 401 telling the client to send a key.
        let yaml = format!(
            "auth: none\nclusters:\n{}",
            cluster("locked", locked, 0.1, true)
        );
        let (router, _stop) = router_with(&yaml).await;
        let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
        assert_eq!(r.status, 502, "{status}: {}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "upstream_unavailable", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("`locked`") && msg.contains("credentials"),
            "{msg}"
        );

        // The router's authentication on and no token: the cluster got no credentials at all.
        let yaml = format!(
            "auth:\n  apiKeys:\n    keys: [{{ sha256: 289c642a857aceb1b7e6f7ee74a11b4a5fb07f43d1e390a71251d611ebe36cd0, tenant: t, models: ['*'] }}]\nclusters:\n{}",
            cluster("locked", locked, 0.1, false)
        );
        let (router, _stop) = router_with(&yaml).await;
        let r = send(
            router.http_addr(),
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer key-m")],
        )
        .await;
        assert_eq!(r.status, 502, "{status}: {}", r.text());

        // The client's own credentials forwarded: the cluster's answer is the client's.
        let yaml = format!(
            "auth: none\nclusters:\n{}",
            cluster("locked", locked, 0.1, false)
        );
        let (router, _stop) = router_with(&yaml).await;
        let r = send(
            router.http_addr(),
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer client-key")],
        )
        .await;
        assert_eq!(r.status, status, "{}", r.text());
        assert_eq!(r.header("x-infergate-cluster"), Some("locked"));
    }
}

/// When no cluster answers, the 502 says what each cluster tried did: `busy` was reached and
/// answered 503, then `dead` could not be reached. The last failure alone read as if `busy` had
/// not been tried, or had been unreachable too.
#[tokio::test]
async fn the_502_when_no_cluster_answers_names_every_cluster_tried() {
    let busy = refusing_cluster(503).await;
    // A port nothing listens on: connections to it are refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "auth: none\nclusters:\n  - {{ name: busy, url: 'http://{busy}', region: r, models: [m], cost: {{ inputPerMillion: 0.1 }} }}\n  - {{ name: dead, url: 'http://{dead}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n"
    );
    let (router, _stop) = router_with(&yaml).await;
    let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable", "{v}");
    assert_eq!(
        v["error"]["message"],
        "the model server could not be reached: cluster `busy` answered 503 Service \
         Unavailable; cannot connect to cluster `dead`",
        "{v}"
    );
}

/// A TTFT objective header the router cannot read (not a positive integer of milliseconds) is
/// a 400 naming the header: it was ignored, and the request routed by the default objective
/// without a word. A good one is served.
#[tokio::test]
async fn an_unreadable_objective_header_is_refused_naming_it() {
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    for bad in ["abc", "0", "500ms", "-5", "1.5"] {
        let r = send(
            router.http_addr(),
            "POST",
            "/v1/chat/completions",
            &[("x-infergate-ttft-objective-ms", bad)],
        )
        .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_field", "{v}");
        assert_eq!(v["error"]["param"], "x-infergate-ttft-objective-ms", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("a positive integer"),
            "{v}"
        );
    }
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("x-infergate-ttft-objective-ms", " 500 ")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `/readyz` says whether the router has somewhere to send traffic: a cluster up by its
/// heartbeat is, whether or not its `/v1/models` could be read (it was 503 while discovery
/// failed, requests being routed all the while).
#[tokio::test]
async fn readyz_follows_the_heartbeats_not_the_model_discovery() {
    let heartbeat = good_heartbeat().await;
    let refusing = refusing_cluster(401).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 100, staleAfterMs: 1000 }}\nclusters:\n\
         \x20 - {{ name: a, url: 'http://{refusing}', heartbeatUrl: 'http://{heartbeat}/heartbeat', region: r, cost: {{ inputPerMillion: 1 }} }}\n"
    );
    let (router, _stop) = router_with(&yaml).await;
    let admin = router.admin_addr().unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = infergate_testkit::get(admin, "/readyz").await;
        if r.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A client that goes away half way through its body is not a request timeout: it was counted
/// in `rejections_total{reason="request_timeout"}` at once, though `bodyReadTimeoutMs` had not
/// passed, and nothing reached a cluster.
#[tokio::test]
async fn a_client_leaving_mid_body_is_not_counted_as_a_timeout() {
    use tokio::io::AsyncWriteExt;
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router(cluster.addr).await;
    let mut client = tokio::net::TcpStream::connect(router.http_addr())
        .await
        .unwrap();
    client
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 100\r\n\r\n{\"model\":",
        )
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    drop(client);
    // A request answered after it: the router has seen the first end by then, or soon after.
    let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..20 {
        let metrics = infergate_testkit::get(router.admin_addr().unwrap(), "/metrics").await;
        assert!(
            !metrics.text().contains("request_timeout"),
            "{}",
            metrics.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(cluster.heads().len(), 1, "{:?}", cluster.heads());
}

/// Before any cluster has listed its models (none reachable yet, no `models:` configured) a
/// request is a 503 the client may retry, not a permanent-looking 404 saying the model "does
/// not exist here" and listing "()" as the served models. It said the gateway's "no ready
/// endpoint serves the model", which the router has no endpoints to mean: it now says no
/// cluster has reported the model yet, naming each cluster whose discovery failed and why (a
/// refused connection, a 401 to the router's token) and those not answered yet; the same for
/// `GET /v1/models/{model}`.
#[tokio::test]
async fn no_known_model_yet_is_a_503_not_a_404() {
    let (_dir, token) = token_file();
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let locked = refusing_cluster(401).await;
    // Its first discovery is under way for `timeoutMs`.
    let hung_addr = hung_cluster().await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ timeoutMs: 30000 }}\nclusters:\n\
         \x20 - {{ name: down, url: 'http://{closed}', region: r, cost: {{ inputPerMillion: 1 }} }}\n\
         \x20 - {{ name: locked, url: 'http://{locked}', region: r, cost: {{ inputPerMillion: 1 }}, credentials: {{ bearerTokenFile: '{}' }} }}\n\
         \x20 - {{ name: slow, url: 'http://{hung_addr}', region: r, cost: {{ inputPerMillion: 1 }} }}\n",
        token.display()
    );
    let (router, _stop) = router_with(&yaml).await;
    // Both failures seen (the first discovery runs at start).
    let mut text = String::new();
    for _ in 0..100 {
        let r = send(router.http_addr(), "POST", "/v1/chat/completions", &[]).await;
        assert_eq!(r.status, 503, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "no_endpoints", "{v}");
        text = v["error"]["message"].as_str().unwrap().to_owned();
        if text.contains("`down` (") && text.contains("`locked` (") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        text.starts_with("no cluster has reported the model `m` yet: GET /v1/models failed on `down` (the request failed: "),
        "{text}"
    );
    assert!(!text.contains("no ready endpoint"), "{text}");
    assert!(!text.contains("()"), "{text}");
    assert!(
        text.contains(", `locked` (it answered 401 Unauthorized: the cluster refuses the router's token from credentials.bearerTokenFile); "),
        "{text}"
    );
    assert!(
        text.ends_with("; `slow` has not answered it yet: retry shortly"),
        "{text}"
    );
    let r = send(router.http_addr(), "GET", "/v1/models/m", &[]).await;
    assert_eq!(r.status, 503, "{}", r.text());
    // Retry after the next poll (`intervalMs`, 1 s by default).
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        r.text()
            .contains("no cluster has reported the model `m` yet"),
        "{}",
        r.text()
    );
}

/// A "cluster" whose `/v1/models` answers 500 and which answers every other request with a
/// chat completion: its model list cannot be read, its requests are served.
async fn unlisting_cluster() -> SocketAddr {
    scripted_server(std::sync::Arc::new(|head: &str| {
        if head.starts_with("GET /v1/models") {
            (
                500,
                "application/json",
                r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#
                    .to_owned(),
            )
        } else {
            (
                200,
                "application/json",
                infergate_testkit::recorder::CHAT_JSON.to_owned(),
            )
        }
    }))
    .await
}

/// Polls `path` until its status is `status` (the router's first reads take a moment).
async fn until_status(router: &Router, method: &str, path: &str, status: u16) -> Response {
    let mut r = send(router.http_addr(), method, path, &[]).await;
    for _ in 0..200 {
        if r.status == status {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        r = send(router.http_addr(), method, path, &[]).await;
    }
    r
}

/// A model only a heartbeat names (the cluster's `/v1/models` failing) is routed to, so the
/// model list shows it and `GET /v1/models/{model}` answers it: both left it out, and retrieve
/// answered 503 "no cluster has reported the model" while chat for it was served.
#[tokio::test]
async fn a_model_known_from_a_heartbeat_is_listed_and_retrieved_as_it_is_routed() {
    let heartbeat = good_heartbeat().await;
    let cluster = unlisting_cluster().await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 100, staleAfterMs: 1000, discoveryIntervalMs: 5000 }}\nclusters:\n\
         \x20 - {{ name: a, url: 'http://{cluster}', heartbeatUrl: 'http://{heartbeat}/heartbeat', region: r, cost: {{ inputPerMillion: 1 }} }}\n"
    );
    let (router, _stop) = router_with(&yaml).await;
    let r = until_status(&router, "POST", "/v1/chat/completions", 200).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(router.http_addr(), "GET", "/v1/models/m", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["id"], "m", "{v}");
    let r = send(router.http_addr(), "GET", "/v1/models", &[]).await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["data"][0]["id"], "m", "{v}");
    // Another model may be on that cluster, whose list could not be read: a 503 to retry
    // when the list is read again (`discoveryIntervalMs`), not a 404.
    let r = send(router.http_addr(), "GET", "/v1/models/other", &[]).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("5"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["error"]["message"],
        "no cluster has reported the model `other` yet: GET /v1/models failed on `a` (it answered 500 Internal Server Error); the others serve m",
        "{v}"
    );
}

/// While a cluster cannot be read (its heartbeat or its `/v1/models` failing), a model no other
/// cluster lists may well be on it: 503 with `Retry-After`, naming the cluster and why, where
/// it was a 404 `model_not_found` once some other cluster had listed a model. With every
/// cluster read, an unknown model is still a 404.
#[tokio::test]
async fn an_unknown_model_while_a_cluster_cannot_be_read_is_a_503_naming_it() {
    let good = infergate_testkit::recorder::Recorder::start(&[]).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let top = "auth: none\nheartbeat: { intervalMs: 100, staleAfterMs: 1000 }\nclusters:\n";
    let good_entry = format!(
        "  - {{ name: good, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        good.addr
    );
    let cases = [
        // Its models configured, its heartbeat failing.
        (
            format!(
                "  - {{ name: beat, url: 'http://{closed}', heartbeatUrl: 'http://{closed}/heartbeat', region: r, models: [x], cost: {{ inputPerMillion: 1 }} }}\n"
            ),
            "the heartbeat failed on `beat` (",
            // Its own configured models are known too.
            "; the others serve m, x",
        ),
        // Discovered, its `/v1/models` (its heartbeat) failing.
        (
            format!(
                "  - {{ name: list, url: 'http://{closed}', region: r, cost: {{ inputPerMillion: 1 }} }}\n"
            ),
            "GET /v1/models failed on `list` (",
            "; the others serve m",
        ),
    ];
    for (entry, named, known) in cases {
        let (router, _stop) = router_with(&format!("{top}{good_entry}{entry}")).await;
        for (method, path) in [
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models/other"),
        ] {
            // Until the cluster's first read has failed.
            let mut r = send_other(router.http_addr(), method, path).await;
            for _ in 0..200 {
                if r.status == 503 && r.text().contains(named) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                r = send_other(router.http_addr(), method, path).await;
            }
            assert_eq!(r.status, 503, "{path}: {}", r.text());
            assert_eq!(r.header("retry-after"), Some("1"), "{path}");
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["error"]["code"], "no_endpoints", "{v}");
            let text = v["error"]["message"].as_str().unwrap();
            assert!(
                text.starts_with(&format!(
                    "no cluster has reported the model `other` yet: {named}"
                )),
                "{text}"
            );
            assert!(text.ends_with(known), "{text}");
        }
    }
    // Every cluster read: an unknown model is a 404.
    let (router, _stop) = router_with(&format!("{top}{good_entry}")).await;
    let r = send_other(router.http_addr(), "POST", "/v1/chat/completions").await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = send_other(router.http_addr(), "GET", "/v1/models/other").await;
    assert_eq!(r.status, 404, "{}", r.text());
}

/// [`send`] for the model `other`.
async fn send_other(addr: SocketAddr, method: &str, path: &str) -> Response {
    let body = if method == "POST" {
        CHAT.replace("\"m\"", "\"other\"")
    } else {
        String::new()
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Bytes::from(body))
        .unwrap();
    infergate_testkit::send(addr, req).await.unwrap()
}

/// `limits.maxBufferedRequestBytes` bounds the request bodies held at once, every connection
/// together, as on the gateway: the router buffers each body whole (to retry it), and the
/// field was accepted and ignored, so `maxRequestsInFlight` large uploads could all be held.
/// A body that does not fit is a 503 `buffer_budget_exhausted` with `Retry-After: 1`; the
/// budget is given back once a cluster has answered.
#[tokio::test]
async fn request_bodies_held_at_once_are_bounded() {
    use tokio::io::AsyncWriteExt;
    let cluster = Recorder::start(&[]).await;
    let yaml = format!(
        "auth: none\nlimits: {{ maxRequestBodyBytes: 1000, maxBufferedRequestBytes: 1500 }}\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    );
    let (router, _stop) = router_with(&yaml).await;
    let body = format!(
        "{},\"user\":\"{}\"}}",
        &CHAT[..CHAT.len() - 1],
        "x".repeat(900)
    );
    assert!(body.len() <= 1000, "{}", body.len());
    // A declares its body and sends half of it: it holds its declared length.
    let mut a = tokio::net::TcpStream::connect(router.http_addr())
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    a.write_all(head.as_bytes()).await.unwrap();
    a.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    let post = |b: &str| {
        http::Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Bytes::from(b.to_owned()))
            .unwrap()
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let r = loop {
        // Until A's head has been read and charged.
        let r = infergate_testkit::send(router.http_addr(), post(&body))
            .await
            .unwrap();
        if r.status != 200 || tokio::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "buffer_budget_exhausted", "{v}");
    // A small body still fits beside A's.
    let r = infergate_testkit::send(router.http_addr(), post(CHAT))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // A completes: its charge is given back and a large body fits again.
    a.write_all(&body.as_bytes()[body.len() / 2..])
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::io::AsyncReadExt::read(&mut a, &mut answer)
        .await
        .unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let r = infergate_testkit::send(router.http_addr(), post(&body))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A heartbeat URL that does not answer a heartbeat (a wrong path, say: 404) left the cluster
/// drained without a word: it had never been up, so no drain was logged, and failed fetches
/// are not. The first failure after a good fetch (or since the start) is a warning naming the
/// cluster, the URL fetched (a wrong `heartbeatUrl` is what it most often is: it was not
/// named) and the cause; the failures after it are not repeated.
#[tokio::test]
async fn a_failing_heartbeat_says_why_once() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let wrong = refusing_cluster(404).await;
    let cluster = Recorder::start(&[]).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, staleAfterMs: 1000 }}\nclusters:\n  - {{ name: east, url: 'http://{}', heartbeatUrl: 'http://{wrong}/', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    );
    let (_router, _stop) = router_with(&yaml).await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let text = out.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("heartbeat"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("east") && warnings[0].contains("404"),
        "{text}"
    );
    assert!(
        warnings[0].contains(&format!("heartbeat_url=http://{wrong}/")),
        "{text}"
    );
}

/// A cluster up by its heartbeat whose `/v1/models` refuses the router's token (401, 403) left
/// the router's `GET /v1/models` empty with no reason given: the first refusals came before the
/// heartbeat had it up (logged at debug level), and later ones were warnings without the cause.
/// A refusal is now a warning at once, naming the cluster, the URL and the status with what it
/// means, given once per run of failures; and counted, from 0, in
/// `infergate_global_discoveries_total{result="refused"}`.
#[tokio::test]
async fn a_discovery_refusing_the_routers_token_is_warned_of_and_counted() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let (_dir, token) = token_file();
    let heartbeat = good_heartbeat().await;
    for status in [401, 403] {
        let from = out.text().len();
        let locked = refusing_cluster(status).await;
        let yaml = format!(
            "auth: none\nheartbeat: {{ intervalMs: 50, discoveryIntervalMs: 50 }}\nclusters:\n\
             \x20 - {{ name: locked, url: 'http://{locked}', heartbeatUrl: 'http://{heartbeat}/heartbeat', region: r, cost: {{ inputPerMillion: 1 }}, credentials: {{ bearerTokenFile: '{}' }} }}\n",
            token.display()
        );
        let (router, _stop) = router_with(&yaml).await;
        let admin = router.admin_addr().unwrap();
        let refused = r#"infergate_global_discoveries_total{cluster="locked",result="refused"}"#;
        let mut page = String::new();
        for _ in 0..200 {
            page = infergate_testkit::get(admin, "/metrics").await.text();
            if clusters::counter(&page, refused) >= 3.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(clusters::counter(&page, refused) >= 3.0, "{page}");
        assert!(
            page.contains("infergate_global_discoveries_total{cluster=\"locked\",result=\"ok\"} 0"),
            "{page}"
        );
        // Listed from the heartbeat alone, as it is routed.
        let models = send(router.http_addr(), "GET", "/v1/models", &[]).await;
        assert_eq!(models.status, 200);
        assert!(models.text().contains(r#""id":"m""#), "{}", models.text());
        let text = out.text()[from..].to_owned();
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("/v1/models"))
            .collect();
        assert_eq!(warnings.len(), 1, "{status}: {text}");
        assert!(
            warnings[0].contains("cluster=locked")
                && warnings[0].contains(&format!("models_url=http://{locked}/v1/models"))
                && warnings[0].contains(&format!("it answered {status} "))
                && warnings[0].contains("refuses the router's token"),
            "{text}"
        );
    }
}

/// A cluster without `heartbeatUrl` is up while its `/v1/models` answers: one whose `url` does
/// not answer it (a wrong port: 404) was never up and said nothing. Its failures are now warned
/// of as a heartbeat's are, once per run, naming the URL fetched, with `models:` set or not.
#[tokio::test]
async fn a_cluster_without_heartbeat_whose_models_fail_says_why_once() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let wrong = refusing_cluster(404).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, staleAfterMs: 1000 }}\nclusters:\n  - {{ name: listed, url: 'http://{wrong}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n  - {{ name: discovered, url: 'http://{wrong}', region: r, cost: {{ inputPerMillion: 1 }} }}\n"
    );
    let (_router, _stop) = router_with(&yaml).await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let text = out.text();
    for name in ["listed", "discovered"] {
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&format!("cluster={name} ")))
            .collect();
        assert_eq!(warnings.len(), 1, "{name}: {text}");
        assert!(
            warnings[0].contains(&format!("models_url=http://{wrong}/v1/models"))
                && warnings[0].contains("404"),
            "{text}"
        );
    }
}

/// A heartbeat fetch that hangs longer than the time left to `staleAfterMs` (`timeoutMs` is
/// the longer): routing drained the cluster as stale on time, since it reads the heartbeat's age
/// itself, but the drain was logged and exported only when the fetch gave up — here 5 s later,
/// the weight reading 1 all the while. The state is now ticked while the fetch hangs.
#[tokio::test]
async fn a_hanging_heartbeat_is_drained_stale_when_it_is() {
    let beat = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let beat_addr = beat.local_addr().unwrap();
    // The first fetch is answered; every later connection is held unanswered.
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut held = Vec::new();
        let (mut first, _) = beat.accept().await.unwrap();
        let mut buf = [0u8; 2048];
        let _ = first.read(&mut buf).await.unwrap();
        let body = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,"models":[{"name":"m","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,"inflight":0,"estimatedTtftMs":20.0,"prefillMs":20.0,"drainMs":0.0}]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        first.write_all(answer.as_bytes()).await.unwrap();
        drop(first);
        loop {
            let (s, _) = beat.accept().await.unwrap();
            held.push(s);
        }
    });
    let cluster = Recorder::start(&[]).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, timeoutMs: 5000, staleAfterMs: 300, slowStartMs: 0 }}\nclusters:\n  - {{ name: a, url: 'http://{}', heartbeatUrl: 'http://{beat_addr}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    );
    let (router, _stop) = router_with(&yaml).await;
    let admin = router.admin_addr().unwrap();
    let page = || async move { infergate_testkit::get(admin, "/metrics").await.text() };
    let weight = r#"infergate_global_cluster_weight{cluster="a"}"#;
    let stale = r#"infergate_global_cluster_drains_total{cluster="a",reason="stale"}"#;
    let start = std::time::Instant::now();
    while clusters::counter(&page().await, weight) != 1.0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(2),
            "never up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let up = std::time::Instant::now();
    loop {
        let text = page().await;
        if clusters::counter(&text, stale) == 1.0 {
            assert_eq!(clusters::counter(&text, weight), 0.0, "{text}");
            break;
        }
        assert!(
            up.elapsed() < std::time::Duration::from_millis(1500),
            "not drained stale 1.5 s after its last good heartbeat (staleAfterMs: 300): {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// With authentication on, the tenant the clusters see is the one the router authenticated:
/// the fairness-id header and the configured `tenancy.tenantHeader` a client sent (to be charged
/// or queued as another tenant behind the router) are replaced, every copy of them.
#[tokio::test]
async fn an_authenticated_client_cannot_name_another_tenant_to_the_clusters() {
    // SHA-256 of `key-m`.
    let key = "289c642a857aceb1b7e6f7ee74a11b4a5fb07f43d1e390a71251d611ebe36cd0";
    let cluster = Recorder::start(&[]).await;
    let (router, _stop) = router_with(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {key}, tenant: team-a, models: ['*'] }}]\ntenancy: {{ tenantHeader: x-tenant }}\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    ))
    .await;
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer key-m"),
            ("x-tenant", "team-b"),
            ("x-tenant", "team-c"),
            ("x-llm-d-inference-fairness-id", "team-b"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let head = cluster.heads().pop().unwrap().to_ascii_lowercase();
    let values = |name: &str| -> Vec<String> {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    };
    assert_eq!(values("x-tenant"), ["team-a"], "{head}");
    assert_eq!(
        values("x-llm-d-inference-fairness-id"),
        ["team-a"],
        "{head}"
    );

    // Without authentication the header is the client's own choice, and passes as sent.
    let (open, _stop) = router_with(&format!(
        "auth: none\ntenancy: {{ tenantHeader: x-tenant }}\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        cluster.addr
    ))
    .await;
    let r = send(
        open.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("x-tenant", "team-b")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let head = cluster.heads().pop().unwrap().to_ascii_lowercase();
    assert!(head.contains("\r\nx-tenant: team-b"), "{head}");
}

/// The same, end to end with the consumer the header is for: the router in front of a real
/// infergate gateway that finds the tenant by `tenancy.tenantHeader` (it trusts the router) and,
/// with flow control on, tells its model server the tenant in the fairness-id header. The
/// gateway sees the tenant the router authenticated, not the one the client named.
#[tokio::test]
async fn a_gateway_behind_the_router_sees_the_authenticated_tenant() {
    let pod = Recorder::start(&[]).await;
    let (gw, gw_stop) = clusters::ready_gateway(&format!(
        "auth: none\ntenancy: {{ tenantHeader: x-tenant }}\nflowControl: {{ enabled: true }}\nscrape: {{ intervalMs: 20 }}\nmodels:\n  - name: m\n    scheduler: {{ preset: infergate }}\n    endpoints: [{}]\n",
        pod.addr
    ))
    .await;
    // SHA-256 of `key-m`.
    let key = "289c642a857aceb1b7e6f7ee74a11b4a5fb07f43d1e390a71251d611ebe36cd0";
    let (router, _stop) = router_with(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {key}, tenant: team-a, models: ['*'] }}]\ntenancy: {{ tenantHeader: x-tenant }}\nclusters:\n  - {{ name: a, url: 'http://{}', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n",
        gw.http_addr()
    ))
    .await;
    let r = send(
        router.http_addr(),
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer key-m"), ("x-tenant", "team-b")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let head = pod.heads().pop().unwrap().to_ascii_lowercase();
    assert!(
        head.contains("\r\nx-llm-d-inference-fairness-id: team-a"),
        "{head}"
    );
    let _ = gw_stop.send(());
}
