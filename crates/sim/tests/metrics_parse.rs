//! The pages the emulator serves parse with infergate's own metrics parser, for all three engines,
//! and say what the engine state says.

// Test helpers panic on purpose: a failed call is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use infergate_metrics::parse_page;
use infergate_scheduler::{EngineType, Timestamp};
use infergate_sim::{Catalog, EngineKind, Faults, FleetSpec, PodSpec, serve_fleet};
use serde_json::json;

async fn get(addr: SocketAddr, path: &str) -> Vec<u8> {
    infergate_testkit::get(addr, path).await.body.to_vec()
}

/// Starts a completion whose answer does not matter (its steps never end).
async fn post(addr: SocketAddr, body: serde_json::Value) {
    let _ = infergate_testkit::try_post(
        addr,
        "/v1/completions",
        "application/json",
        body.to_string(),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn served_pages_parse_with_the_metrics_crate_for_every_engine() {
    let p = Catalog::builtin()
        .unwrap()
        .get("llama-3.1-8b/h100")
        .unwrap()
        .clone();
    let model = p.model.clone();
    let mut pods = Vec::new();
    for (name, kind) in [
        ("v", EngineKind::Vllm),
        ("s", EngineKind::Sglang),
        ("t", EngineKind::Tgi),
    ] {
        let mut pod = PodSpec::new(name, &p, kind);
        pod.lora_adapters = vec!["a".into(), "b".into()];
        pod.max_loras = 1;
        // Steps that never end: the state stays put while the test reads it.
        pod.faults = Faults {
            slowdown: 1e9,
            ..Faults::default()
        };
        pods.push(pod);
    }
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    for pod in &fleet.pods {
        for (i, m) in ["a", "b", model.as_str(), "a"].into_iter().enumerate() {
            let addr = pod.addr;
            let body = json!({"model": m, "prompt": format!("{i} shared prompt text ").repeat(40), "max_tokens": 4});
            tokio::spawn(async move { post(addr, body).await });
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(10)).await;

    for (pod, engine) in
        fleet
            .pods
            .iter()
            .zip([EngineType::Vllm, EngineType::Sglang, EngineType::Tgi])
    {
        let view = pod.handle.view();
        assert_eq!(view.running + view.waiting, 4, "{}", pod.name);
        let page = get(pod.addr, "/metrics").await;
        let parsed = parse_page(engine, &page, None, Timestamp::ZERO)
            .unwrap_or_else(|e| panic!("{} page does not parse: {e}", pod.name));
        let s = parsed.snapshot;
        assert_eq!(
            (s.waiting, s.running),
            (view.waiting, view.running),
            "{}",
            pod.name
        );
        match engine {
            EngineType::Vllm => {
                assert!((s.kv_cache_usage.unwrap() - view.kv_usage).abs() < 1e-12);
                let cache = s.cache.unwrap();
                assert_eq!((cache.block_size, cache.num_blocks), (16, p.num_blocks()));
                let lora = s.lora.unwrap();
                assert_eq!(lora.max_lora, 1);
                let running: Vec<String> =
                    view.running_loras.iter().map(|a| a.to_string()).collect();
                assert_eq!(lora.running, running);
                assert!(!lora.waiting.is_empty());
                assert!(parsed.counters.is_some());
            }
            EngineType::Sglang => {
                assert!((s.kv_cache_usage.unwrap() - view.kv_usage).abs() < 1e-12);
            }
            EngineType::Tgi => assert_eq!(s.kv_cache_usage, None),
        }
    }
    let _ = tx.send(());
    fleet.wait().await;
}
