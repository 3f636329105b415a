//! The gateway with TLS for the TLS tests: a private CA and a `localhost` certificate on disk,
//! a configuration serving it, and a single-loop gateway started with an admin port.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig, Listeners, serve};
use infergate_testkit::tls::{Leaf, TestCa};

/// A CA, a certificate for `localhost`/`127.0.0.1` written into a temporary directory, and the
/// CA file.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: TestCa,
    pub ca_file: PathBuf,
    pub leaf: Leaf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gateway test ca");
    let ca_file = ca.write_ca(dir.path());
    let leaf = ca.issue(&["localhost", "127.0.0.1"]);
    let (cert, key) = leaf.write(dir.path());
    Pki {
        dir,
        ca,
        ca_file,
        leaf,
        cert,
        key,
    }
}

pub fn tls_config(pki: &Pki, endpoints: &[SocketAddr]) -> GatewayConfig {
    let eps: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    GatewayConfig::from_yaml(&format!(
        "auth: none\ntls: {{ certFile: {}, keyFile: {} }}\nmodels:\n  - name: m\n    loraAdapters: [m-lora]\n    scheduler: {{ preset: round-robin }}\n    endpoints: [{}]\n",
        pki.cert.display(),
        pki.key.display(),
        eps.join(", ")
    ))
    .unwrap()
}

/// A single-loop gateway with an admin port.
pub async fn start(config: GatewayConfig) -> (Gateway, tokio::sync::oneshot::Sender<()>) {
    let listeners = Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    wait_ready(&gw).await;
    (gw, tx)
}

/// Waits (10 s at most) until the gateway reports ready.
pub async fn wait_ready(gw: &Gateway) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gw.handle().is_ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway never became ready"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
