//! The router reaching clusters over HTTPS: each secure cluster is a real infergate gateway with
//! `tls:` on its front door (a certificate of a private CA made for the test), in front of an
//! emulated fleet; its admin port (the heartbeat) stays plain HTTP, as the gateway serves it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/clusters.rs"]
mod clusters;

use std::path::Path;
use std::time::Duration;

use clusters::{TestCluster, counter, router_with, wait_ready};
use infergate_global::{GlobalConfig, Listeners, serve};
use infergate_testkit::tls::TestCa;
use tokio::time::Instant;

const CHAT: &str =
    r#"{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;

/// A cluster whose gateway serves HTTPS with a certificate of `ca` for `names`.
async fn secure_cluster(name: &str, ca: &TestCa, names: &[&str], dir: &Path) -> TestCluster {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let (cert, key) = ca.issue(names).write(&sub);
    TestCluster::start_with(
        name,
        "llama-3.1-8b/h100",
        1,
        7,
        &format!(
            "tls: {{ certFile: '{}', keyFile: '{}' }}\n",
            cert.display(),
            key.display()
        ),
    )
    .await
}

/// A router cluster entry: `url` on the cluster's front door, its heartbeat over plain HTTP,
/// models discovered, and `extra` (`, tls: {…}`).
fn entry(c: &TestCluster, url: &str, price: f64, extra: &str) -> String {
    format!(
        "  - {{ name: {}, url: '{url}', heartbeatUrl: 'http://{}/heartbeat', region: r, cost: {{ inputPerMillion: {price}, outputPerMillion: {price} }}{extra} }}\n",
        c.name, c.admin
    )
}

fn router_yaml(entries: &str) -> String {
    format!(
        "auth: none\nheartbeat: {{ intervalMs: 100, staleAfterMs: 2000, slowStartMs: 0, discoveryIntervalMs: 100 }}\nclusters:\n{entries}"
    )
}

/// Waits until the router lists `llama` (read from some cluster's `/v1/models`).
async fn wait_discovered(router: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = infergate_testkit::get(router, "/v1/models").await;
        if r.text().contains("\"llama\"") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "llama never discovered: {}",
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The router's answer when its only cluster's handshake failed: 502, its body naming `why`.
fn assert_refused_by_tls(r: &infergate_testkit::Response, why: &str) {
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains(why), "{}", r.text());
}

async fn chat(router: std::net::SocketAddr) -> infergate_testkit::Response {
    infergate_testkit::post(router, "/v1/chat/completions", "application/json", CHAT).await
}

/// With the cluster's CA as `tls.caFile`, its models are discovered over HTTPS and a chat
/// request is served through it.
#[tokio::test]
async fn a_cluster_is_reached_over_https_with_its_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("cluster CA");
    let secure = secure_cluster("secure", &ca, &["127.0.0.1"], dir.path()).await;
    let ca_file = ca.write_ca(dir.path());
    let (router, _stop) = router_with(&router_yaml(&entry(
        &secure,
        &format!("https://{}", secure.http),
        1.0,
        &format!(", tls: {{ caFile: '{}' }}", ca_file.display()),
    )))
    .await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    let r = chat(router.http_addr()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some("secure"));
    assert!(r.text().contains("chat.completion"), "{}", r.text());
}

/// Without the CA the certificate is verified against the system roots, which do not know it:
/// the handshake fails, the request moves on to the plain cluster, and the log, the failover
/// counter and (with no other cluster) the error say it was TLS and why.
#[tokio::test]
async fn an_untrusted_certificate_fails_over_and_says_tls() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("cluster CA");
    let secure = secure_cluster("secure", &ca, &["127.0.0.1"], dir.path()).await;
    let plain = TestCluster::start("plain", "llama-3.1-8b/h100", 1, 8).await;
    // `secure` is cheaper: every request tries it first.
    let entries = entry(&secure, &format!("https://{}", secure.http), 0.1, "")
        + &entry(&plain, &format!("http://{}", plain.http), 1.0, "");
    let (router, _stop) = router_with(&router_yaml(&entries)).await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    let r = chat(router.http_addr()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some("plain"));
    let page = infergate_testkit::get(router.admin_addr().unwrap(), "/metrics")
        .await
        .text();
    assert_eq!(
        counter(
            &page,
            "infergate_global_failovers_total{cluster=\"secure\",reason=\"connect\"}"
        ),
        1.0,
        "{page}"
    );
    let text = out.text();
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains("cannot connect to the cluster"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    assert!(
        warning.contains("secure")
            && warning.contains("TLS handshake failed")
            && warning.contains("UnknownIssuer"),
        "{warning}"
    );

    // The secure cluster alone: the client's error names the cluster and the TLS failure.
    let (router, _stop) = router_with(&router_yaml(&entry(
        &secure,
        &format!("https://{}", secure.http),
        0.1,
        ", models: [llama]",
    )))
    .await;
    wait_ready(router.admin_addr().unwrap()).await;
    let r = chat(router.http_addr()).await;
    assert_refused_by_tls(
        &r,
        "cannot connect to cluster `secure`: TLS handshake failed: invalid peer certificate: UnknownIssuer",
    );
}

/// A certificate that names only a DNS name, reached at 127.0.0.1: verified with
/// `tls.serverName`, refused without it (the URL's host, an IP address, is not in it).
#[tokio::test]
async fn server_name_is_verified_when_the_url_is_an_ip_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("cluster CA");
    let secure = secure_cluster("secure", &ca, &["gateway.test"], dir.path()).await;
    let ca_file = ca.write_ca(dir.path());
    let url = format!("https://{}", secure.http);
    let named = format!(
        ", tls: {{ caFile: '{}', serverName: gateway.test }}",
        ca_file.display()
    );
    let (router, _stop) = router_with(&router_yaml(&entry(&secure, &url, 1.0, &named))).await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    let r = chat(router.http_addr()).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let unnamed = format!(
        ", models: [llama], tls: {{ caFile: '{}' }}",
        ca_file.display()
    );
    let (router, _stop) = router_with(&router_yaml(&entry(&secure, &url, 1.0, &unnamed))).await;
    wait_ready(router.admin_addr().unwrap()).await;
    let r = chat(router.http_addr()).await;
    assert_refused_by_tls(
        &r,
        "TLS handshake failed: invalid peer certificate: certificate not valid for name \\\"127.0.0.1\\\"",
    );
}

/// A `tls.caFile` that cannot be read or holds no certificate stops the start, naming the
/// cluster and the file.
#[tokio::test]
async fn an_unusable_ca_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "\n").unwrap();
    for (file, why) in [
        (dir.path().join("missing.pem"), "No such file"),
        (empty, "no PEM certificate"),
    ] {
        let yaml = format!(
            "auth: none\nclusters:\n  - {{ name: east, url: 'https://127.0.0.1:1', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, tls: {{ caFile: '{}' }} }}\n",
            file.display()
        );
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let Err(e) = serve(
            GlobalConfig::from_yaml(&yaml).unwrap(),
            Listeners { http, admin: None },
            std::future::pending(),
        )
        .await
        else {
            panic!("started with the CA file {}", file.display());
        };
        let chain = infergate_pool::ErrorChain(&e).to_string();
        assert!(
            chain.contains("cluster `east`: tls.caFile")
                && chain.contains(&file.display().to_string())
                && chain.contains(why),
            "{chain}"
        );
    }
}

/// A `tls.caFile` rewritten in place, the configuration file unchanged: the cluster's gateway
/// comes back with a certificate reissued by a new private CA, which the old bundle does not
/// verify (502, `UnknownIssuer`); once the bundle holds the new CA the requests succeed again,
/// without a restart. A bundle that holds no certificate keeps the last good one. And the
/// connections made under a bundle are not reused once it is replaced: back to the old CA, the
/// next request's handshake is verified against it, and fails, though a kept-alive connection
/// verified under the new one was there to take it.
#[tokio::test]
async fn a_rotated_ca_bundle_is_trusted_without_a_restart() {
    // Captured here too, not only to read: tracing caches each log line's interest across
    // threads, and this test hitting the TLS failure warning with no subscriber of its own, while
    // `an_untrusted_certificate_fails_over_and_says_tls` captures it, was seen to leave that
    // test without its warning.
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new("cluster CA 1"), TestCa::new("cluster CA 2"));
    let mut secure = secure_cluster("secure", &old_ca, &["127.0.0.1"], dir.path()).await;
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, old_ca.cert_pem()).unwrap();
    let yaml = format!(
        "reloadIntervalMs: 50\n{}",
        router_yaml(&entry(
            &secure,
            &format!("https://{}", secure.http),
            1.0,
            &format!(", tls: {{ caFile: '{}' }}", bundle.display()),
        ))
    );
    let (router, _stop) = router_with(&yaml).await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    assert_eq!(chat(router.http_addr()).await.status, 200);
    let reloads = |result: &'static str| {
        let admin = router.admin_addr().unwrap();
        async move {
            let page = infergate_testkit::get(admin, "/metrics").await.text();
            counter(
                &page,
                &format!(
                    "infergate_global_credential_reloads_total{{cluster=\"secure\",file=\"ca\",result=\"{result}\"}}"
                ),
            )
        }
    };

    // The certificate reissued by the new CA; the gateway restarted with it (the router's
    // kept-alive connections to the old one end with it).
    new_ca
        .issue(&["127.0.0.1"])
        .write(&dir.path().join("secure"));
    secure.kill().await;
    secure.restart().await;
    until_chat(router.http_addr(), |r| {
        r.status == 502 && r.text().contains("UnknownIssuer")
    })
    .await;

    std::fs::write(&bundle, new_ca.cert_pem()).unwrap();
    until_chat(router.http_addr(), |r| r.status == 200).await;
    assert_eq!(reloads("ok").await, 1.0);

    // No certificate in it: the last good bundle stays.
    std::fs::write(&bundle, "not a certificate\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads("error").await != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the spoilt bundle was never seen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert_eq!(chat(router.http_addr()).await.status, 200);
    }
    let text = out.text();
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains("tls.caFile changed but cannot be used"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    assert!(
        warning.contains("secure")
            && warning.contains(&bundle.display().to_string())
            && warning.contains("no PEM certificate"),
        "{warning}"
    );

    // Back to the old CA: the pooled connection (verified under the new one) is not used.
    std::fs::write(&bundle, old_ca.cert_pem()).unwrap();
    until_chat(router.http_addr(), |r| {
        r.status == 502 && r.text().contains("UnknownIssuer")
    })
    .await;
    assert_eq!(reloads("ok").await, 2.0);
}

/// Sends a chat request every 20 ms until one's answer is what `wanted` says.
async fn until_chat(
    router: std::net::SocketAddr,
    wanted: impl Fn(&infergate_testkit::Response) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = chat(router).await;
        if wanted(&r) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never the answer wanted; the last: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
