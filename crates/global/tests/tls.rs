//! The router reaching clusters over HTTPS: each secure cluster is a real infergate gateway with
//! `tls:` on its front door (a certificate of a private CA made for the test), in front of an
//! emulated fleet; its admin port (the heartbeat) stays plain HTTP, as the gateway serves it.
//! With `tls.clientCaFile` on the gateway, mutual TLS: the router presents its `certFile`.
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
    mutual_cluster(name, ca, names, dir, None).await
}

/// A cluster whose gateway serves HTTPS with a certificate of `ca` for `names`, and with
/// `client_ca` (a bundle file) asks every client for a certificate chained to it.
async fn mutual_cluster(
    name: &str,
    ca: &TestCa,
    names: &[&str],
    dir: &Path,
    client_ca: Option<&Path>,
) -> TestCluster {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let (cert, key) = ca.issue(names).write(&sub);
    let client_ca = client_ca
        .map(|c| format!(", clientCaFile: '{}'", c.display()))
        .unwrap_or_default();
    TestCluster::start_with(
        name,
        "llama-3.1-8b/h100",
        1,
        7,
        &format!(
            "tls: {{ certFile: '{}', keyFile: '{}'{client_ca} }}\n",
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

/// The answer to one chat request through a router of the cluster `entries` (their models
/// named: nothing is discovered), started for it.
async fn chat_through(entries: &str) -> infergate_testkit::Response {
    let (router, _stop) = router_with(&router_yaml(entries)).await;
    wait_ready(router.admin_addr().unwrap()).await;
    chat(router.http_addr()).await
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
    let r = chat_through(&entry(
        &secure,
        &format!("https://{}", secure.http),
        0.1,
        ", models: [llama]",
    ))
    .await;
    assert_refused_by_tls(
        &r,
        "cannot connect to cluster `secure`: TLS handshake failed: invalid peer certificate: \
         UnknownIssuer (the cluster's certificate is not issued by a CA the router trusts: put \
         that CA in the cluster's tls.caFile)",
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
    let r = chat_through(&entry(&secure, &url, 1.0, &unnamed)).await;
    assert_refused_by_tls(
        &r,
        "TLS handshake failed: invalid peer certificate: certificate not valid for name \\\"127.0.0.1\\\"",
    );
    assert_refused_by_tls(&r, "set the cluster's tls.serverName to a name it carries");
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
    let admin = router.admin_addr().unwrap();
    let reloads = |result| credential_reloads(admin, "ca", result);

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

/// The router's count of loads of the cluster `secure`'s changed `file` that ended in `result`.
async fn credential_reloads(admin: std::net::SocketAddr, file: &str, result: &str) -> f64 {
    let page = infergate_testkit::get(admin, "/metrics").await.text();
    counter(
        &page,
        &format!(
            "infergate_global_credential_reloads_total{{cluster=\"secure\",file=\"{file}\",result=\"{result}\"}}"
        ),
    )
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

/// The cluster `secure`: a gateway with a certificate of its own CA (`ca_file`) that asks every
/// client for a certificate of `client_ca`; `other_ca` is a CA it does not trust.
struct Mutual {
    dir: tempfile::TempDir,
    client_ca: TestCa,
    other_ca: TestCa,
    ca_file: std::path::PathBuf,
    secure: TestCluster,
}

impl Mutual {
    async fn start() -> Mutual {
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("cluster CA");
        let client_ca = TestCa::new("router CA");
        let bundle = dir.path().join("clients.pem");
        std::fs::write(&bundle, client_ca.cert_pem()).unwrap();
        let secure = mutual_cluster(
            "secure",
            &server_ca,
            &["127.0.0.1"],
            dir.path(),
            Some(&bundle),
        )
        .await;
        Mutual {
            ca_file: server_ca.write_ca(dir.path()),
            dir,
            client_ca,
            other_ca: TestCa::new("another CA"),
            secure,
        }
    }
}

/// The router's client certificate: `dir/current/{cert,key}.pem`, `current` a symbolic link to
/// the folder of the pair in force, swapped in one rename as Kubernetes swaps a mounted
/// Secret's `..data` (so that no check reads a new certificate beside the old key).
struct ClientFiles {
    dir: std::path::PathBuf,
    versions: usize,
}

impl ClientFiles {
    fn new(dir: &Path, leaf: &infergate_testkit::tls::Leaf) -> ClientFiles {
        let mut files = ClientFiles {
            dir: dir.join("router"),
            versions: 0,
        };
        std::fs::create_dir_all(&files.dir).unwrap();
        files.install(&leaf.cert_pem, &leaf.key_pem);
        files
    }

    /// Puts `cert` and `key` in force at once.
    fn install(&mut self, cert: &str, key: &str) {
        self.versions += 1;
        let version = self.dir.join(format!("v{}", self.versions));
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("cert.pem"), cert).unwrap();
        std::fs::write(version.join("key.pem"), key).unwrap();
        let link = self.dir.join("current.tmp");
        std::os::unix::fs::symlink(&version, &link).unwrap();
        std::fs::rename(&link, self.dir.join("current")).unwrap();
    }

    /// `, tls: { caFile, certFile, keyFile }` for a cluster entry.
    fn entry(&self, server_ca: &Path) -> String {
        let current = self.dir.join("current");
        format!(
            ", tls: {{ caFile: '{}', certFile: '{}', keyFile: '{}' }}",
            server_ca.display(),
            current.join("cert.pem").display(),
            current.join("key.pem").display()
        )
    }
}

/// The gateway's count of handshakes refused for their client certificate.
async fn refused_client_certificates(cluster: &TestCluster) -> f64 {
    let page = infergate_testkit::get(cluster.admin, "/metrics")
        .await
        .text();
    counter(
        &page,
        "infergate_tls_handshake_failures_total{reason=\"client_certificate\"}",
    )
}

/// Mutual TLS: a gateway with `tls.clientCaFile` as the cluster. The router presenting a
/// certificate of that CA (`tls.certFile`, `tls.keyFile`) discovers the cluster's models and is
/// served; without a certificate, or with one of another CA, the gateway refuses the handshake
/// (and counts it) and the router's 502 names the TLS failure.
#[tokio::test]
async fn a_cluster_asking_for_a_client_certificate_is_served_only_with_one_of_its_ca() {
    let Mutual {
        dir,
        client_ca,
        other_ca,
        ca_file,
        secure,
    } = Mutual::start().await;
    let url = format!("https://{}", secure.http);
    let ours = ClientFiles::new(dir.path(), &client_ca.issue(&["router"]));
    let (router, _stop) = router_with(&router_yaml(&entry(
        &secure,
        &url,
        1.0,
        &ours.entry(&ca_file),
    )))
    .await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    let r = chat(router.http_addr()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some("secure"));
    assert_eq!(refused_client_certificates(&secure).await, 0.0);

    // No client certificate: the gateway asks for one and gets none.
    let plain_entry = format!(
        ", models: [llama], tls: {{ caFile: '{}' }}",
        ca_file.display()
    );
    let r = chat_through(&entry(&secure, &url, 1.0, &plain_entry)).await;
    assert_refused_by_tls(
        &r,
        "cannot connect to cluster `secure`: TLS handshake failed: received fatal alert: \
         CertificateRequired (the cluster asks for a client certificate: set the cluster's \
         tls.certFile and tls.keyFile)",
    );
    assert_eq!(refused_client_certificates(&secure).await, 1.0);

    // Another CA's certificate.
    let theirs = ClientFiles::new(&dir.path().join("other"), &other_ca.issue(&["router"]));
    let r = chat_through(&entry(
        &secure,
        &url,
        1.0,
        &format!(", models: [llama]{}", theirs.entry(&ca_file)),
    ))
    .await;
    assert_refused_by_tls(
        &r,
        "cannot connect to cluster `secure`: TLS handshake failed: received fatal alert: \
         UnknownCA (the cluster does not trust the router's client certificate: issue \
         tls.certFile from a CA in the gateway's tls.clientCaFile)",
    );
    assert_eq!(refused_client_certificates(&secure).await, 2.0);

    // A certificate of the right CA issued for servers only (extendedKeyUsage serverAuth): the
    // gateway refuses it as unsupported, and the router says what to issue instead.
    let server_only = ClientFiles::new(
        &dir.path().join("server-only"),
        &client_ca.issue_for_servers_only(&["router"]),
    );
    let r = chat_through(&entry(
        &secure,
        &url,
        1.0,
        &format!(", models: [llama]{}", server_only.entry(&ca_file)),
    ))
    .await;
    assert_refused_by_tls(
        &r,
        "cannot connect to cluster `secure`: TLS handshake failed: received fatal alert: \
         UnsupportedCertificate (the cluster does not accept the router's client certificate \
         for client authentication: issue tls.certFile with extendedKeyUsage clientAuth, or \
         none, from a CA in the gateway's tls.clientCaFile)",
    );
    assert_eq!(refused_client_certificates(&secure).await, 3.0);
}

/// Waits until the router's 503 for a model no cluster serves says `why` (a failing heartbeat
/// or `/v1/models` is named there once it has failed), and returns its body.
async fn until_unknown_model_says(router: std::net::SocketAddr, why: &str) -> String {
    const OTHER: &str =
        r#"{"model":"other","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = infergate_testkit::post(router, "/v1/chat/completions", "application/json", OTHER)
            .await;
        if r.status == 503 && r.text().contains(why) {
            return r.text();
        }
        assert!(
            Instant::now() < deadline,
            "never said {why:?}: {}",
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A heartbeat over HTTPS (`heartbeatUrl: https://…`) and a `/v1/models` read refused by a
/// gateway asking for a client certificate say what to change, as a request's 502 does: before,
/// their messages ended at rustls' `CertificateRequired` (the heartbeat's warning, the 503's
/// reasons), leaving out that the cluster's `tls.certFile` and `tls.keyFile` are missing.
#[tokio::test]
async fn a_heartbeat_refused_for_want_of_a_client_certificate_says_what_to_set() {
    let Mutual {
        dir: _dir,
        ca_file,
        secure,
        ..
    } = Mutual::start().await;
    let url = format!("https://{}", secure.http);
    let remedy = "CertificateRequired (the cluster asks for a client certificate: set the \
                  cluster's tls.certFile and tls.keyFile)";
    // The heartbeat alone: the models are named, so only the heartbeat reads the cluster.
    let heartbeat_entry = format!(
        "  - {{ name: secure, url: '{url}', heartbeatUrl: '{url}/heartbeat', models: [llama], \
         region: r, cost: {{ inputPerMillion: 1 }}, tls: {{ caFile: '{}' }} }}\n",
        ca_file.display()
    );
    let (router, _stop) = router_with(&router_yaml(&heartbeat_entry)).await;
    let body =
        until_unknown_model_says(router.http_addr(), "the heartbeat failed on `secure`").await;
    assert!(body.contains(remedy), "{body}");

    // `/v1/models`: the models discovered through the front door.
    let (router, _stop) = router_with(&router_yaml(&entry(
        &secure,
        &url,
        1.0,
        &format!(", tls: {{ caFile: '{}' }}", ca_file.display()),
    )))
    .await;
    let body =
        until_unknown_model_says(router.http_addr(), "GET /v1/models failed on `secure`").await;
    assert!(body.contains(remedy), "{body}");
}

/// The router's `tls.certFile` and `tls.keyFile` rotated on disk, the configuration unchanged:
/// a pair of a CA the cluster does not trust makes the next requests fail (502, `UnknownCA`),
/// the first pair again serves them, without a restart; a pair whose key is not the
/// certificate's keeps the last good one, warned of and counted once.
#[tokio::test]
async fn a_rotated_client_certificate_is_presented_without_a_restart() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let Mutual {
        dir,
        client_ca,
        other_ca,
        ca_file,
        secure,
    } = Mutual::start().await;
    let good = client_ca.issue(&["router"]);
    let mut files = ClientFiles::new(dir.path(), &good);
    let yaml = format!(
        "reloadIntervalMs: 50\n{}",
        router_yaml(&entry(
            &secure,
            &format!("https://{}", secure.http),
            1.0,
            &files.entry(&ca_file),
        ))
    );
    let (router, _stop) = router_with(&yaml).await;
    wait_ready(router.admin_addr().unwrap()).await;
    wait_discovered(router.http_addr()).await;
    assert_eq!(chat(router.http_addr()).await.status, 200);
    let admin = router.admin_addr().unwrap();
    let reloads = |result| credential_reloads(admin, "client_cert", result);
    // Both series exported at 0 from the start.
    let page = infergate_testkit::get(admin, "/metrics").await.text();
    for result in ["ok", "error"] {
        let series = format!(
            "infergate_global_credential_reloads_total{{cluster=\"secure\",file=\"client_cert\",result=\"{result}\"}} 0"
        );
        assert!(
            page.lines().any(|l| l == series),
            "{series} missing:\n{page}"
        );
    }

    let stranger = other_ca.issue(&["router"]);
    files.install(&stranger.cert_pem, &stranger.key_pem);
    until_chat(router.http_addr(), |r| {
        r.status == 502 && r.text().contains("received fatal alert: UnknownCA")
    })
    .await;
    files.install(&good.cert_pem, &good.key_pem);
    until_chat(router.http_addr(), |r| r.status == 200).await;
    assert_eq!(reloads("ok").await, 2.0);

    // The certificate of one pair, the key of another: the last good pair stays.
    files.install(&stranger.cert_pem, &good.key_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads("error").await != 1.0 {
        assert!(Instant::now() < deadline, "the broken pair was never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert_eq!(chat(router.http_addr()).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((reloads("ok").await, reloads("error").await), (2.0, 1.0));
    let text = out.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("tls.certFile/tls.keyFile changed but cannot be used")
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("secure") && warnings[0].contains("does not match"),
        "{}",
        warnings[0]
    );
}

/// The date of the cluster `secure`'s TLS `file` on the router's admin `/metrics` (Unix
/// seconds; 0 when the series is absent).
async fn tls_not_after(admin: std::net::SocketAddr, file: &str) -> f64 {
    let page = infergate_testkit::get(admin, "/metrics").await.text();
    counter(
        &page,
        &format!(
            "infergate_global_cluster_tls_not_after_timestamp_seconds{{cluster=\"secure\",file=\"{file}\"}}"
        ),
    )
}

/// The expiry of the router's TLS files for a cluster is on its admin port's `/metrics`: the
/// client certificate's notAfter, and the CA bundle's earliest certificate's. A client
/// certificate renewed on disk shows its new date. A reload that replaces the cluster keeps the
/// dates, and one that drops `tls.caFile` drops its series.
#[tokio::test]
async fn the_expiry_of_a_clusters_tls_files_is_exported() {
    // 2080-06-01, 2090-01-01 and 2095-01-01, 00:00 UTC.
    const RETIRING_CA: f64 = 3_484_425_600.0;
    const CLIENT_CERT: f64 = 3_786_912_000.0;
    const RENEWED: f64 = 3_944_678_400.0;
    let Mutual {
        dir,
        client_ca,
        ca_file,
        secure,
        ..
    } = Mutual::start().await;
    // The cluster's CA, and another that expires first.
    let bundle = dir.path().join("bundle.pem");
    let retiring = TestCa::new("retiring CA").issue_valid(&["old"], (2020, 1, 1), (2080, 6, 1));
    let cluster_ca = std::fs::read_to_string(&ca_file).unwrap();
    std::fs::write(&bundle, format!("{cluster_ca}{}", retiring.cert_pem)).unwrap();
    let mut files = ClientFiles::new(
        dir.path(),
        &client_ca.issue_valid(&["router"], (2020, 1, 1), (2090, 1, 1)),
    );
    let url = format!("https://{}", secure.http);
    let yaml = |extra: &str| {
        format!(
            "reloadIntervalMs: 50\n{}",
            router_yaml(&entry(&secure, &url, 1.0, extra))
        )
    };
    let (router, _stop) = router_with(&yaml(&files.entry(&bundle))).await;
    let admin = router.admin_addr().unwrap();
    wait_ready(admin).await;
    assert_eq!(tls_not_after(admin, "client_cert").await, CLIENT_CERT);
    assert_eq!(tls_not_after(admin, "ca").await, RETIRING_CA);
    wait_discovered(router.http_addr()).await;
    assert_eq!(chat(router.http_addr()).await.status, 200);

    let renewed = client_ca.issue_valid(&["router"], (2020, 1, 1), (2095, 1, 1));
    files.install(&renewed.cert_pem, &renewed.key_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tls_not_after(admin, "client_cert").await != RENEWED {
        assert!(Instant::now() < deadline, "the renewed date never shown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tls_not_after(admin, "ca").await, RETIRING_CA);
    until_chat(router.http_addr(), |r| r.status == 200).await;

    // Replaced by a reload (its models now named): the new cluster's dates, read anew.
    let named = format!(", models: [llama]{}", files.entry(&bundle));
    let handle = router.handle();
    handle
        .reload(GlobalConfig::from_yaml(&yaml(&named)).unwrap())
        .unwrap();
    assert_eq!(tls_not_after(admin, "client_cert").await, RENEWED);
    assert_eq!(tls_not_after(admin, "ca").await, RETIRING_CA);

    // No tls.caFile any more: no `ca` series.
    let current = dir.path().join("router").join("current");
    let without_ca = format!(
        ", models: [llama], tls: {{ certFile: '{}', keyFile: '{}' }}",
        current.join("cert.pem").display(),
        current.join("key.pem").display()
    );
    handle
        .reload(GlobalConfig::from_yaml(&yaml(&without_ca)).unwrap())
        .unwrap();
    let page = infergate_testkit::get(admin, "/metrics").await.text();
    let dates: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("infergate_global_cluster_tls_not_after_timestamp_seconds{"))
        .collect();
    assert_eq!(
        dates,
        [format!(
            "infergate_global_cluster_tls_not_after_timestamp_seconds{{cluster=\"secure\",file=\"client_cert\"}} {RENEWED}"
        )],
        "{page}"
    );
}

/// A client certificate that cannot be used stops the start, naming the cluster and the file;
/// `certFile` without `keyFile` (or the reverse) is refused at load, naming the missing field.
#[tokio::test]
async fn an_unusable_client_certificate_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("router CA");
    let (cert, key) = ca.issue(&["router"]).write(dir.path());
    let not_pem = dir.path().join("not-pem.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let other_key = dir.path().join("other-key.pem");
    std::fs::write(&other_key, ca.issue(&["router"]).key_pem).unwrap();
    let missing = dir.path().join("missing.pem");
    let yaml = |tls: &str| {
        format!(
            "auth: none\nclusters:\n  - {{ name: east, url: 'https://127.0.0.1:1', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, tls: {tls} }}\n"
        )
    };
    for (c, k, named, why) in [
        (&missing, &key, &missing, "cannot read"),
        (&cert, &missing, &missing, "cannot read"),
        (&not_pem, &key, &not_pem, "holds no PEM certificate"),
        (&cert, &other_key, &other_key, "does not match"),
    ] {
        let tls = format!(
            "{{ certFile: '{}', keyFile: '{}' }}",
            c.display(),
            k.display()
        );
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let Err(e) = serve(
            GlobalConfig::from_yaml(&yaml(&tls)).unwrap(),
            Listeners { http, admin: None },
            std::future::pending(),
        )
        .await
        else {
            panic!("started with {tls}");
        };
        let chain = infergate_pool::ErrorChain(&e).to_string();
        assert!(
            chain.contains("cluster `east`: tls.certFile/tls.keyFile")
                && chain.contains(&named.display().to_string())
                && chain.contains(why),
            "{chain}"
        );
    }
    for (tls, field) in [
        (
            format!("{{ certFile: '{}' }}", cert.display()),
            "clusters[0].tls.keyFile",
        ),
        (
            format!("{{ keyFile: '{}' }}", key.display()),
            "clusters[0].tls.certFile",
        ),
    ] {
        let e = GlobalConfig::from_yaml(&yaml(&tls)).unwrap_err();
        let text = infergate_pool::ErrorChain(&e).to_string();
        assert!(text.contains(&format!("{field}: is missing")), "{text}");
    }
}

/// The router's own front door takes the gateway's `tls.clientCaFile`: a client presenting a
/// certificate of that CA is answered, one presenting none is refused at the handshake. Three
/// refusals give one warning naming the router's port; a TCP probe (connect, close) is counted
/// apart from the handshake failures and warned of by nobody.
#[tokio::test]
async fn the_router_front_door_asks_for_client_certificates_with_client_ca_file() {
    let log = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (TestCa::new("router server CA"), TestCa::new("clients CA"));
    let (cert, key) = server_ca.issue(&["localhost"]).write(dir.path());
    let bundle = dir.path().join("clients.pem");
    std::fs::write(&bundle, client_ca.cert_pem()).unwrap();
    let plain = TestCluster::start("plain", "llama-3.1-8b/h100", 1, 8).await;
    let yaml = format!(
        "tls: {{ certFile: '{}', keyFile: '{}', clientCaFile: '{}' }}\n{}",
        cert.display(),
        key.display(),
        bundle.display(),
        router_yaml(&entry(&plain, &format!("http://{}", plain.http), 1.0, ""))
    );
    let (router, _stop) = router_with(&yaml).await;
    wait_ready(router.admin_addr().unwrap()).await;
    let models = || {
        let mut r = http::Request::new(bytes::Bytes::new());
        *r.uri_mut() = "/v1/models".parse().unwrap();
        r
    };
    let leaf = client_ca.issue(&["client"]);
    let admitted = infergate_testkit::tls::send_within(
        router.http_addr(),
        "localhost",
        server_ca.client_config_presenting(&[b"http/1.1"], Some(&leaf)),
        models(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(admitted.status, 200, "{}", admitted.text());
    for _ in 0..3 {
        let refused = infergate_testkit::tls::send_within(
            router.http_addr(),
            "localhost",
            server_ca.client_config(&[b"http/1.1"]),
            models(),
            Duration::from_secs(10),
        )
        .await;
        assert!(refused.is_err(), "{refused:?}");
    }
    drop(
        tokio::net::TcpStream::connect(router.http_addr())
            .await
            .unwrap(),
    );
    let closed = "infergate_tls_connections_closed_before_handshake_total";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let page = loop {
        let page = infergate_testkit::get(router.admin_addr().unwrap(), "/metrics")
            .await
            .text();
        if counter(&page, closed) == 1.0 {
            break page;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        counter(
            &page,
            "infergate_tls_handshake_failures_total{reason=\"client_certificate\"}"
        ),
        3.0,
        "{page}"
    );
    assert_eq!(
        counter(
            &page,
            "infergate_tls_handshake_failures_total{reason=\"error\"}"
        ),
        0.0,
        "{page}"
    );
    infergate_testkit::one_refusal_warning(&log.text(), "router", &bundle);
}

/// `infergate global --check` gives the warnings the start gives: a cluster's token sent over
/// plain `http://` to another machine was warned of at start, while `--check` called the file
/// valid without a word. `check` now logs the same warning, files read or not (`--no-files`);
/// a token to this machine is warned of by neither.
#[tokio::test]
async fn check_gives_the_warnings_the_start_gives() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "secret\n").unwrap();
    let entry = |name: &str, url: &str| {
        format!(
            "  - {{ name: {name}, url: '{url}', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, credentials: {{ bearerTokenFile: '{}' }} }}\n",
            token.display()
        )
    };
    let yaml = format!(
        "auth: none\nclusters:\n{}{}",
        entry("far", "http://10.0.0.1:8080"),
        entry("near", "http://127.0.0.1:9")
    );
    // The warning lines since `from`, without their timestamps.
    let warnings = |from: usize| -> Vec<String> {
        out.text()[from..]
            .lines()
            .filter_map(|l| l.split_once(" WARN ").map(|(_, w)| w.to_owned()))
            .filter(|w| w.contains("plaintext"))
            .collect()
    };
    let config = GlobalConfig::from_yaml(&yaml).unwrap();
    let (router, stop) = router_with(&yaml).await;
    let at_start = warnings(0);
    assert_eq!(at_start.len(), 1, "{}", out.text());
    assert!(at_start[0].contains("cluster=far"), "{at_start:?}");
    drop(stop);
    router.wait().await;
    for read_files in [true, false] {
        let from = out.text().len();
        infergate_global::check(&config, read_files).unwrap();
        assert_eq!(warnings(from), at_start, "read_files: {read_files}");
    }
}
