//! Criterion benchmarks: one pick with every scorer enabled over 10 / 100 / 1,000 / 10,000
//! endpoints, and the prefix index's insert and match.
//!
//! Run with `cargo bench -p infergate-scheduler --bench pick`.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup; a failure aborts the run"
)]
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented function"
)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infergate_scheduler::prefix::{hash_blocks, model_seed};
use infergate_scheduler::{
    CacheConfig, EndpointMeta, EngineType, LoraState, MetricsSnapshot, PrefixConfig, PrefixIndex,
    RequestContext, Scheduler, SchedulerConfig, Timestamp, Weights,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn addr(i: u32) -> SocketAddr {
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 8000))
}

/// Every scorer on, the infergate preset otherwise (freshness, LoRA and saturation filters).
fn all_scorers() -> SchedulerConfig {
    SchedulerConfig {
        weights: Weights {
            queue: 1.0,
            kv_cache: 1.0,
            prefix: 1.0,
            lora_affinity: 2.0,
            running_requests: 1.0,
            inflight_tokens: 1.0,
            estimated_wait: 6.0,
        },
        ..SchedulerConfig::default()
    }
}

fn pool(n: u32, now: Timestamp) -> Scheduler {
    let mut s = Scheduler::new(all_scorers()).unwrap();
    let mut rng = SmallRng::seed_from_u64(3);
    for i in 0..n {
        s.upsert_endpoint(EndpointMeta {
            namespace: "bench".into(),
            pod: format!("pod-{i}"),
            addr: addr(i),
            engine: EngineType::Vllm,
            gpu: None,
            labels: BTreeMap::new(),
        });
        s.apply_metrics(
            addr(i),
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
                cache: Some(CacheConfig {
                    block_size: 16,
                    num_blocks: 20_000,
                }),
                prefix_cache_hit_rate: None,
            },
        )
        .unwrap();
    }
    s
}

fn prompts() -> Vec<String> {
    // ~2 KiB prompts (32 blocks) sharing a system prompt, 64 conversations.
    let system = "You are a helpful assistant that answers briefly and precisely. ".repeat(8);
    (0..64)
        .map(|i| format!("{system}conversation {i}: {}", "question text ".repeat(100)))
        .collect()
}

fn bench_pick(c: &mut Criterion) {
    let now = Timestamp::from_millis(1_000);
    let prompts = prompts();
    let mut g = c.benchmark_group("pick_all_scorers");
    for n in [10u32, 100, 1_000, 10_000] {
        let mut s = pool(n, now);
        let mut rng = SmallRng::seed_from_u64(7);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % prompts.len();
                let segs = ["system", prompts[i].as_str()];
                let req = RequestContext::new("llama-3-8b", 512)
                    .with_prompt(&segs)
                    .with_lora(Some("adapter-3"));
                let d = s.pick(black_box(&req), now, &mut rng).unwrap();
                // Release at once so the pool's load stays put across iterations.
                s.cancel(d.ticket, now);
                black_box(d.endpoints)
            });
        });
    }
    g.finish();
}

fn bench_prefix(c: &mut Criterion) {
    let prompts = prompts();
    let seed = model_seed("llama-3-8b", None);
    let hashes: Vec<Vec<u64>> = prompts
        .iter()
        .map(|p| {
            let mut v = Vec::new();
            hash_blocks(seed, &[p.as_str()], 64, 256, &mut v);
            v
        })
        .collect();
    let mut index = PrefixIndex::new(PrefixConfig::default());
    for slot in 0..100 {
        index.set_endpoint(slot, Some(320_000));
    }
    for (i, h) in hashes.iter().enumerate() {
        index.insert((i % 100) as u32, h);
    }
    let mut g = c.benchmark_group("prefix_index");
    g.bench_function("hash_32_blocks", |b| {
        let mut out = Vec::with_capacity(256);
        b.iter(|| {
            out.clear();
            hash_blocks(seed, &[black_box(prompts[5].as_str())], 64, 256, &mut out)
        });
    });
    g.bench_function("insert_32_blocks", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i += 1;
            index.insert((i % 100) as u32, black_box(&hashes[i % hashes.len()]));
        });
    });
    g.bench_function("match_32_blocks", |b| {
        let mut matched = vec![0u32; 100];
        let mut touched = Vec::with_capacity(16);
        let mut i = 0usize;
        b.iter(|| {
            i += 1;
            index.match_prefix(
                black_box(&hashes[i % hashes.len()]),
                &mut matched,
                &mut touched,
            );
            for t in touched.drain(..) {
                matched[t as usize] = 0;
            }
        });
    });
    g.finish();
}

criterion_group!(benches, bench_pick, bench_prefix);
criterion_main!(benches);
