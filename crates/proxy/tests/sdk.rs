//! The official `openai` Python SDK talks to the gateway (`tests/python/test_sdk.py`).
//!
//! CI installs the SDK (`.ci/run`); there a missing SDK fails the test. Elsewhere it is reported
//! as skipped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::path::Path;

use infergate_proxy::{GatewayConfig, WorkerListeners, serve_workers};
use upstream::{Behaviour, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_works_against_the_gateway() {
    let a = Upstream::start(Behaviour::Ok).await;
    let b = Upstream::start(Behaviour::Ok).await;
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: m\n    loraAdapters: [m-lora]\n    scheduler: {{ preset: round-robin }}\n    endpoints: [{}, {}]\n",
        a.addr, b.addr
    ))
    .unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, None, 2).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_sdk.py");
    let base = format!("http://{}", gw.http_addr());
    // The gateway keeps serving on the runtime's workers while the script blocks this thread.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(&script)
            .arg(&base)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 must be installed to run the SDK test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Exit 77: the script found no `openai` package.
    if !infergate_testkit::required_tool(
        out.status.code() != Some(77),
        "the openai Python SDK",
        &format!("pip install openai==3.57.0: {stderr}"),
    ) {
        return;
    }
    assert!(out.status.success(), "SDK test failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    // Chat, streamed chat and completion reached model servers; the model list and the unknown
    // model were answered by the gateway itself.
    assert_eq!(a.requests() + b.requests(), 3);
    tx.send(()).unwrap();
    gw.wait().await;
}
