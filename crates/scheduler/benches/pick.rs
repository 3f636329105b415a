//! Criterion benchmarks: one pick with every scorer enabled over 10 / 100 / 1,000 / 10,000
//! endpoints, and the prefix index's insert and match.
//!
//! Run with `cargo bench -p infergate-scheduler --bench pick`. The pool, its load and the prompts
//! are the crate's shared fixtures (`infergate_scheduler::fixtures`, feature `fixtures`).

#![allow(
    clippy::unwrap_used,
    reason = "benchmark setup; a failure aborts the run"
)]
#![allow(
    missing_docs,
    reason = "criterion_group! generates an undocumented function"
)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infergate_scheduler::fixtures::{all_scorers, loaded_scheduler, shared_prefix_prompts};
use infergate_scheduler::prefix::{hash_blocks, model_seed};
use infergate_scheduler::{PrefixConfig, PrefixIndex, RequestContext, Timestamp};
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn bench_pick(c: &mut Criterion) {
    let now = Timestamp::from_millis(1_000);
    let prompts = shared_prefix_prompts();
    let mut g = c.benchmark_group("pick_all_scorers");
    for n in [10u32, 100, 1_000, 10_000] {
        let mut s = loaded_scheduler(all_scorers(), n, now);
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
    let prompts = shared_prefix_prompts();
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
