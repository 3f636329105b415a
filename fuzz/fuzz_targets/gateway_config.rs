//! The gateway's configuration loader (`GatewayConfig::from_yaml`): it never panics, on any text,
//! and its error prints. A configuration it accepts is usable as it stands: every model's
//! scheduler builds and routes a request over the model's endpoints, the model table resolves
//! every model and adapter, and the scrape settings make a valid scraper configuration.
#![no_main]

use std::collections::BTreeMap;

use infergate_openai::ModelRouter;
use infergate_proxy::config::GatewayConfig;
use infergate_scheduler::{EndpointMeta, MetricsSnapshot, RequestContext, Scheduler, Timestamp};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match GatewayConfig::from_yaml(text) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    config
        .scrape
        .to_scraper_config()
        .validate()
        .expect("an accepted scrape section is a valid scraper configuration");
    assert!(config.limits.max_request_body_bytes > 0);
    assert!(config.retries.max_attempts >= 1);
    let mut router = ModelRouter::new();
    for m in &config.models {
        router
            .add_model(&m.name, &m.lora_adapters, ())
            .expect("an accepted model table builds");
        assert_ne!(config.max_concurrent_requests(m), Some(0));
    }
    let mut rng = SmallRng::seed_from_u64(config.seed);
    for m in &config.models {
        assert_eq!(
            router.resolve(&m.name).ok().map(|r| r.base_model),
            Some(m.name.as_str())
        );
        for a in &m.lora_adapters {
            assert_eq!(
                router.resolve(a).ok().map(|r| r.base_model),
                Some(m.name.as_str())
            );
        }
        let mut s = Scheduler::new(m.scheduler.clone()).expect("an accepted scheduler builds");
        for ep in m.endpoints.iter().take(16) {
            s.upsert_endpoint(EndpointMeta {
                namespace: String::from("gateway"),
                pod: ep.name.clone().unwrap_or_else(|| ep.address.to_string()),
                addr: ep.address,
                engine: ep.engine.unwrap_or(m.engine),
                gpu: ep.gpu.clone(),
                labels: BTreeMap::new(),
            });
            let snapshot = MetricsSnapshot {
                sampled_at: Timestamp::ZERO,
                ..MetricsSnapshot::default()
            };
            s.apply_metrics(ep.address, snapshot)
                .expect("a listed endpoint takes metrics");
        }
        let prompt = [
            "You are a helpful assistant.",
            "Hello there, how are you today?",
        ];
        let cx = RequestContext::new(&m.name, 20).with_prompt(&prompt);
        if let Ok(d) = s.pick(&cx, Timestamp::ZERO, &mut rng) {
            assert!(!d.endpoints.as_slice().is_empty());
            assert!(s.cancel(d.ticket, Timestamp::ZERO));
        }
    }
});
