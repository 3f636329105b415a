//! Test fixtures: endpoints, metrics snapshots, configurations and ready-made schedulers, shared by
//! the unit tests, the property tests (`tests/properties.rs`), the allocation test
//! (`tests/alloc.rs`) and the criterion bench (`benches/pick.rs`).
//!
//! Compiled for the crate's own unit tests and behind the non-default `fixtures` feature, which the
//! crate's dev-dependency on itself turns on for its integration tests and benches. Never part of a
//! normal build.

#![allow(
    clippy::unwrap_used,
    reason = "fixtures build known-good state; a failed setup is a failed test"
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::{SchedulerConfig, Weights};
use crate::endpoint::{
    CacheConfig, EndpointMeta, EngineType, LoraState, MetricsSnapshot, Timestamp,
};
use crate::scheduler::Scheduler;

/// The time the fixture endpoints are scraped at.
pub const T0: Timestamp = Timestamp::from_millis(10_000);

/// First port of the fixture addresses: endpoint `i` listens on `127.0.0.1:(BASE_PORT + i)`.
pub const BASE_PORT: u16 = 8000;

/// The address of fixture endpoint `i` (`i` below 57,536).
pub fn addr(i: u32) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], BASE_PORT + i as u16))
}

/// The fixture index of an address made by [`addr`].
pub fn index_of(a: SocketAddr) -> usize {
    usize::from(a.port() - BASE_PORT)
}

/// Identity of fixture endpoint `i`: pod `ns/pod-<i>` at [`addr`]`(i)`, a vLLM server.
pub fn meta(i: u32) -> EndpointMeta {
    EndpointMeta {
        namespace: "ns".into(),
        pod: format!("pod-{i}"),
        addr: addr(i),
        engine: EngineType::Vllm,
        gpu: None,
        labels: BTreeMap::new(),
    }
}

/// A snapshot sampled at `t` with `waiting` queued requests and KV-cache use `kv`.
pub fn snapshot(t: Timestamp, waiting: u32, kv: f64) -> MetricsSnapshot {
    MetricsSnapshot {
        sampled_at: t,
        waiting,
        running: 0,
        kv_cache_usage: Some(kv),
        ..MetricsSnapshot::default()
    }
}

/// LoRA state with `max` slots and the named running and waiting adapters.
pub fn lora_state(max: u32, running: &[&str], waiting: &[&str]) -> LoraState {
    LoraState {
        max_lora: max,
        running: running.iter().map(|s| s.to_string()).collect(),
        waiting: waiting.iter().map(|s| s.to_string()).collect(),
    }
}

/// [`snapshot`] at [`T0`] (KV use 0.1) carrying [`lora_state`].
pub fn with_lora(waiting: u32, max: u32, running: &[&str], queued: &[&str]) -> MetricsSnapshot {
    let mut m = snapshot(T0, waiting, 0.1);
    m.lora = Some(lora_state(max, running, queued));
    m
}

/// Adds fixture endpoint `i` to `s` with the snapshot `m`.
pub fn add_endpoint(s: &mut Scheduler, i: u32, m: MetricsSnapshot) {
    s.upsert_endpoint(meta(i));
    s.apply_metrics(addr(i), m).unwrap();
}

/// A scheduler with `n` idle endpoints (`0..n`), all scraped at [`T0`] with KV use 0.1.
pub fn scheduler(cfg: SchedulerConfig, n: u32) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    for i in 0..n {
        add_endpoint(&mut s, i, snapshot(T0, 0, 0.1));
    }
    s
}

/// A seeded generator.
pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// The default configuration with only these weights.
pub fn weights_only(w: Weights) -> SchedulerConfig {
    SchedulerConfig {
        weights: w,
        ..SchedulerConfig::default()
    }
}

/// Every scorer on, the infergate preset otherwise (freshness, LoRA and saturation filters).
pub fn all_scorers() -> SchedulerConfig {
    weights_only(Weights {
        queue: 1.0,
        kv_cache: 1.0,
        prefix: 1.0,
        lora_affinity: 2.0,
        running_requests: 1.0,
        inflight_tokens: 1.0,
        estimated_wait: 6.0,
    })
}

/// A vLLM-like KV cache of `num_blocks` blocks of 16 tokens.
pub fn cache(num_blocks: u64) -> CacheConfig {
    CacheConfig {
        block_size: 16,
        num_blocks,
    }
}

/// Endpoint `i`'s snapshot in a deterministic mixed pool (allocation test): queue `i % 5`, batch
/// `i % 7`, KV use up to 0.45, adapter `adapter-<i % 3>` running in one of two slots.
pub fn mixed_snapshot(i: u32, now: Timestamp) -> MetricsSnapshot {
    MetricsSnapshot {
        sampled_at: now,
        waiting: i % 5,
        running: i % 7,
        kv_cache_usage: Some(f64::from(i % 10) / 20.0),
        lora: Some(LoraState {
            max_lora: 2,
            running: vec![format!("adapter-{}", i % 3)],
            waiting: vec![],
        }),
        cache: Some(cache(10_000)),
        prefix_cache_hit_rate: None,
    }
}

/// Endpoint `i`'s snapshot in a randomly loaded pool (bench): queue 0–7, batch 0–31, KV use below
/// 0.9, adapter `adapter-<i % 8>` running in one of four slots.
pub fn random_snapshot(i: u32, now: Timestamp, rng: &mut impl Rng) -> MetricsSnapshot {
    MetricsSnapshot {
        sampled_at: now,
        waiting: rng.random_range(0..8),
        running: rng.random_range(0..32),
        kv_cache_usage: Some(rng.random_range(0.0..0.9)),
        lora: Some(LoraState {
            max_lora: 4,
            running: vec![format!("adapter-{}", i % 8)],
            waiting: vec![],
        }),
        cache: Some(cache(20_000)),
        prefix_cache_hit_rate: None,
    }
}

/// A scheduler with `n` endpoints, endpoint `i` carrying `snapshot(i)`.
pub fn scheduler_with(
    cfg: SchedulerConfig,
    n: u32,
    mut snapshot: impl FnMut(u32) -> MetricsSnapshot,
) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    for i in 0..n {
        add_endpoint(&mut s, i, snapshot(i));
    }
    s
}

/// `n` endpoints with [`random_snapshot`]s from a generator seeded with 3 (the bench's pool).
pub fn loaded_scheduler(cfg: SchedulerConfig, n: u32, now: Timestamp) -> Scheduler {
    let mut rng = rng(3);
    scheduler_with(cfg, n, |i| random_snapshot(i, now, &mut rng))
}

/// ~2 KiB prompts (32 blocks) sharing a system prompt, 64 conversations.
pub fn shared_prefix_prompts() -> Vec<String> {
    let system = "You are a helpful assistant that answers briefly and precisely. ".repeat(8);
    (0..64)
        .map(|i| format!("{system}conversation {i}: {}", "question text ".repeat(100)))
        .collect()
}

/// A prompt of 200 repetitions of `"<tag>: "` (many prefix blocks, distinct per tag).
pub fn prompt_text(tag: &str) -> String {
    format!("{tag}: ").repeat(200)
}

/// Teaches endpoint `i` a prefill rate by reporting `n` requests that took `ttft` for `tokens`.
pub fn teach(s: &mut Scheduler, i: u32, tokens: u32, ttft: std::time::Duration, n: usize) {
    let subset = [addr(i)];
    for k in 0..n {
        let req = crate::request::RequestContext::new("m", tokens).with_subset(Some(&subset));
        let d = s.pick(&req, T0, &mut rng(k as u64)).unwrap();
        s.first_token(d.ticket, T0.saturating_add(ttft));
        s.complete(
            d.ticket,
            T0.saturating_add(ttft * 2),
            crate::decision::Usage {
                prompt_tokens: tokens,
                cached_tokens: 0,
                output_tokens: 10,
            },
        );
    }
}

/// Three endpoints (default configuration), endpoint `i` at the saturation queue depth + `i` with
/// KV use 0.5: every candidate saturated, none overloaded.
pub fn saturated_scheduler() -> Scheduler {
    let mut s = scheduler(SchedulerConfig::default(), 3);
    let sat = s.config().saturation.queue_depth;
    for i in 0..3 {
        s.apply_metrics(addr(i), snapshot(T0, sat + i, 0.5))
            .unwrap();
    }
    s
}
