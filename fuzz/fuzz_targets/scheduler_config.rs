//! The scheduler's configuration as users write it (YAML, every key optional from a preset):
//! reading never panics; `Scheduler::new` builds exactly the configurations that validate; a
//! valid one routes requests on a small pool without panicking and survives a round trip through
//! YAML unchanged.
#![no_main]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use infergate_scheduler::{
    EndpointMeta, EngineType, MetricsSnapshot, RequestContext, Scheduler, SchedulerConfig,
    Timestamp, Usage,
};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = serde_yaml::from_str::<SchedulerConfig>(text) else {
        return;
    };
    let valid = cfg.validate().is_ok();
    let built = Scheduler::new(cfg.clone());
    assert_eq!(
        built.is_ok(),
        valid,
        "Scheduler::new disagrees with validate"
    );
    let Ok(mut s) = built else {
        return;
    };
    let again: SchedulerConfig = serde_yaml::from_str(&serde_yaml::to_string(&cfg).unwrap())
        .expect("a written configuration reads back");
    assert_eq!(again, cfg, "the YAML round trip changed the configuration");

    let mut rng = SmallRng::seed_from_u64(7);
    let addrs: Vec<SocketAddr> = (1..=3)
        .map(|i| SocketAddr::from(([10, 0, 0, i], 8000)))
        .collect();
    for (i, a) in addrs.iter().enumerate() {
        s.upsert_endpoint(EndpointMeta {
            namespace: String::from("fuzz"),
            pod: format!("pod-{i}"),
            addr: *a,
            engine: EngineType::Vllm,
            gpu: None,
            labels: BTreeMap::new(),
        });
        let snapshot = MetricsSnapshot {
            sampled_at: Timestamp::ZERO,
            waiting: i as u32 * 20,
            running: 4,
            kv_cache_usage: Some(0.5 * i as f64),
            ..MetricsSnapshot::default()
        };
        s.apply_metrics(*a, snapshot).unwrap();
    }
    let prompt = [
        "system: be brief",
        "user: tell me about GPUs and inference gateways",
    ];
    for step in 0..4_u64 {
        let now = Timestamp::from_nanos(step * 1_000_000_000);
        let cx = RequestContext::new("m", 40).with_prompt(&prompt);
        match s.pick(&cx, now, &mut rng) {
            Ok(d) => {
                let n = d.endpoints.as_slice().len();
                assert!(n >= 1 && n <= usize::from(cfg.returned_endpoints));
                s.first_token(d.ticket, now);
                let usage = Usage {
                    prompt_tokens: 40,
                    cached_tokens: 0,
                    output_tokens: 100,
                };
                assert!(s.complete(
                    d.ticket,
                    Timestamp::from_nanos(step * 1_000_000_000 + 500_000_000),
                    usage
                ));
            }
            Err(r) => {
                if let Some(after) = r.retry_after() {
                    assert!(after >= Duration::from_secs(1), "Retry-After {after:?}");
                    assert!(
                        after <= cfg.retry_after_max + Duration::from_secs(1),
                        "Retry-After {after:?}"
                    );
                }
            }
        }
    }
    assert_eq!(s.inflight(), 0);
});
