//! The gateway in front of emulated vLLM and SGLang pods (`infergate-sim`), with the `infergate`
//! preset scoring on their scraped metrics pages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::time::Duration;

use infergate_proxy::{GatewayConfig, WorkerListeners, serve_workers};
use infergate_sim::{FleetSpec, serve_fleet};
use upstream::{get, post};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulated_pods_serve_chat_and_completions_through_the_gateway() {
    let spec = FleetSpec::from_yaml(
        "seed: 7\npods:\n  - { name: a, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama }\n  - { name: b, profile: llama-3.1-8b/h100, engine: sglang, served_model_name: llama }\n",
    )
    .unwrap();
    let (fleet_stop, fleet_rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = fleet_rx.await;
    })
    .await
    .unwrap();
    let addrs = fleet.addrs();
    let config = GatewayConfig::from_yaml(&format!(
        "models:\n  - name: llama\n    scheduler: {{ preset: infergate }}\n    endpoints:\n      - {{ address: {}, name: a, engine: vllm }}\n      - {{ address: {}, name: b, engine: sglang }}\n",
        addrs[0].1, addrs[1].1
    ))
    .unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, Some(local), 2).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let admin = gw.admin_addr().unwrap();

    // Both engines' pages are scraped: the gateway becomes ready.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(admin, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let served: Vec<String> = addrs.iter().map(|(_, a)| a.to_string()).collect();
    let chat =
        r#"{"model":"llama","max_tokens":4,"messages":[{"role":"user","content":"Hello there"}]}"#;
    let (status, headers, body) = post(gw.http_addr(), "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let from = headers["x-infergate-endpoint"].to_str().unwrap().to_owned();
    assert!(served.contains(&from), "{from}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");

    let stream = r#"{"model":"llama","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello again"}]}"#;
    let (status, _, body) = post(gw.http_addr(), "/v1/chat/completions", stream).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("data: [DONE]"), "{text}");

    let completion = r#"{"model":"llama","max_tokens":4,"prompt":"Once upon a time"}"#;
    let (status, _, _) = post(gw.http_addr(), "/v1/completions", completion).await;
    assert_eq!(status, 200);

    let (_, m) = get(admin, "/metrics").await;
    assert!(
        m.contains(r#"infergate_gateway_requests_total{model="llama",code="2xx"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_gateway_ttft_seconds_count{model="llama"} 1"#),
        "{m}"
    );
    assert_eq!(gw.handle().inflight("llama"), Some(0));

    stop.send(()).unwrap();
    gw.wait().await;
    fleet_stop.send(()).unwrap();
    fleet.wait().await;
}
