//! The gateway's admin port over mutual TLS (`adminTls`), polled by its real consumer: the
//! `infergate global` binary, whose `heartbeatUrl` is `https://` and whose cluster `tls` trusts the
//! gateway's CA and presents a client certificate. With the certificate the router reads the
//! heartbeat and routes a chat to the cluster; a router presenting none never gets a heartbeat
//! and says why. Both binaries started as a user would, over one emulated vLLM pod.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/one_pod.rs"]
mod one_pod;
#[path = "common/running.rs"]
mod running;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use infergate_testkit::tls::TestCa;
use one_pod::one_pod;
use running::{Running, free_addr, path};

/// The value of the router's `family{cluster="east"}` sample, when its admin port answers.
async fn east(admin: SocketAddr, family: &str) -> Option<f64> {
    let page = infergate_testkit::try_get(admin, "/metrics")
        .await
        .ok()?
        .text();
    infergate_testkit::metric(&page, family, &[("cluster", "east")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_router_reads_the_heartbeat_over_mutual_tls_and_one_without_a_certificate_cannot()
{
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The gateway's admin certificate, for the name the router verifies; the routers' CA and
    // one router's certificate.
    let gateways = TestCa::new("gateways ca");
    let gateways_ca = gateways.write_ca(d);
    let admin_dir = d.join("admin");
    std::fs::create_dir_all(&admin_dir).unwrap();
    let (admin_cert, admin_key) = gateways.issue(&["gateway.test"]).write(&admin_dir);
    let routers = TestCa::new("routers ca");
    let routers_ca = d.join("routers-ca.pem");
    std::fs::write(&routers_ca, routers.cert_pem()).unwrap();
    let router_dir = d.join("router");
    std::fs::create_dir_all(&router_dir).unwrap();
    let (router_cert, router_key) = routers.issue(&["router"]).write(&router_dir);

    let (fleet, _stop_pods) = one_pod(4).await;
    let pod = fleet.pods[0].addr;
    let (front, gw_admin) = (free_addr(), free_addr());
    let gateway_file = d.join("gateway.yaml");
    std::fs::write(
        &gateway_file,
        format!(
            "listen: {front}\nadmin: {gw_admin}\nauth: none\nadminTls: {{ certFile: {}, keyFile: {}, clientCaFile: {} }}\nmodels:\n  - {{ name: llama, engine: vllm, endpoints: [{pod}] }}\n",
            path(&admin_cert),
            path(&admin_key),
            path(&routers_ca),
        ),
    )
    .unwrap();
    let mut gateway = Running::start(
        d,
        "gateway",
        &["gateway".into(), "--config".into(), path(&gateway_file)],
    );

    // A router presenting its certificate, and one presenting none.
    let router_file = |name: &str, client: Option<(&Path, &Path)>| {
        let client = client.map_or(String::new(), |(c, k)| {
            format!(", certFile: {}, keyFile: {}", path(c), path(k))
        });
        let (http, admin) = (free_addr(), free_addr());
        let file = d.join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "listen: {http}\nadmin: {admin}\nauth: none\nheartbeat: {{ intervalMs: 200, staleAfterMs: 1000, slowStartMs: 0 }}\nclusters:\n  - name: east\n    url: http://{front}\n    heartbeatUrl: https://{gw_admin}/heartbeat\n    region: r\n    cost: {{ inputPerMillion: 1 }}\n    tls: {{ caFile: {}, serverName: gateway.test{client} }}\n",
                path(&gateways_ca)
            ),
        )
        .unwrap();
        (file, http, admin)
    };
    let (with_file, with_http, with_admin) = router_file("with", Some((&router_cert, &router_key)));
    let (without_file, _, without_admin) = router_file("without", None);
    let router = |file: &Path| ["global".into(), "--config".into(), path(file)];
    let mut with = Running::start(d, "with", &router(&with_file));
    let mut without = Running::start(d, "without", &router(&without_file));

    // The router with a certificate reads the heartbeat and routes on it: a chat is answered
    // by the pod behind the gateway.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        gateway.assert_running();
        with.assert_running();
        let age = east(with_admin, "infergate_global_heartbeat_age_seconds").await;
        let weight = east(with_admin, "infergate_global_cluster_weight").await;
        if age.is_some_and(|a| a >= 0.0) && weight.is_some_and(|w| w > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat over mutual TLS within 30 s (age {age:?}, weight {weight:?}):\nrouter:\n{}\ngateway:\n{}",
            with.log(),
            gateway.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let chat = serde_json::json!({
        "model": "llama",
        "messages": [{ "role": "user", "content": "hi" }],
        "max_tokens": 4,
    });
    let r = infergate_testkit::post(
        with_http,
        "/v1/chat/completions",
        "application/json",
        chat.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{}", r.text());

    // The router without one: once the gateway has refused it (its handshakes counted on the
    // admin port, read over mutual TLS as the router reads the heartbeat) and its own admin
    // port answers, it has never had a heartbeat, and says why.
    let scraper = routers.issue(&["scraper"]);
    let refused = || async {
        let mut scrape = http::Request::new(bytes::Bytes::new());
        *scrape.uri_mut() = "/metrics".parse().unwrap();
        let page = infergate_testkit::tls::send_within(
            gw_admin,
            "gateway.test",
            gateways.client_config_presenting(&[b"http/1.1"], Some(&scraper)),
            scrape,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
        .text();
        infergate_testkit::metric(
            &page,
            "infergate_tls_handshake_failures_total",
            &[("port", "admin"), ("reason", "client_certificate")],
        )
        .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let age = loop {
        without.assert_running();
        let age = east(without_admin, "infergate_global_heartbeat_age_seconds").await;
        let logged = {
            let log = without.log();
            log.contains("heartbeat failed") && log.contains("east")
        };
        if age.is_some() && logged && refused().await >= 1.0 {
            break age;
        }
        assert!(
            Instant::now() < deadline,
            "the router without a certificate was not refused, or did not log it, within 30 s \
             (age {age:?}):\n{}",
            without.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(age, Some(-1.0), "{}", without.log());
}
