//! One emulated vLLM pod serving `llama` (an A10G's profile), for the tests that start a
//! gateway, a picker or a router in front of a real HTTP server.

use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec, ServedFleet, serve_fleet};

/// Serves the pod `pod-0` on 127.0.0.1 with `seed`, until the returned sender is dropped or
/// sent to.
pub async fn one_pod(seed: u64) -> (ServedFleet, tokio::sync::oneshot::Sender<()>) {
    let catalog = Catalog::builtin().expect("the built-in catalog");
    let profile = catalog
        .get("llama-3.1-8b/a10g")
        .expect("the A10G profile")
        .clone();
    let spec = FleetSpec {
        seed,
        pods: vec![PodSpec {
            model: "llama".into(),
            ..PodSpec::new("pod-0", &profile, EngineKind::Vllm)
        }],
    }
    .finish()
    .expect("a valid fleet");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = stopped.await;
    })
    .await
    .expect("the fleet serves");
    (fleet, stop)
}
