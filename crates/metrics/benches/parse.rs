//! Cost of reading one metrics page: infergate's streaming parser against `prometheus-parse`.
//!
//! Run: `cargo bench -p infergate-metrics --bench parse`. Both sides produce the same vLLM
//! snapshot fields from the same real vLLM 0.32 page (635 lines); the `prometheus-parse` side
//! parses the whole page into its sample list first, then picks the families out, which is how
//! the design card's choice would be used.
//!
//! `prometheus-parse` 0.2 matches metric names with `\w+`, so it silently drops every line whose
//! name has a colon — every `vllm:*` and `sglang:*` sample. To time it on equal work, its side
//! reads the same page with `vllm:` written `vllm_` (same length, same lines); the check below
//! shows that on the page as served it finds no vLLM sample at all. It also splits label text on
//! every comma, which cuts vLLM's adapter lists to their first entry.
#![allow(missing_docs, reason = "criterion entry points")]
#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed benchmark")]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use infergate_metrics::parse_page;
use infergate_scheduler::{CacheConfig, EngineType, LoraState, MetricsSnapshot, Timestamp};

const VLLM: &str = include_str!("../tests/fixtures/vllm-after-load.txt");
const SGLANG: &str = include_str!("../tests/fixtures/sglang-busy.txt");
const TGI: &str = include_str!("../tests/fixtures/tgi-busy.txt");

/// The same vLLM mapping, on top of `prometheus-parse`.
fn vllm_with_prometheus_parse(page: &str) -> MetricsSnapshot {
    let scrape = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |v: &prometheus_parse::Value| match v {
        prometheus_parse::Value::Counter(x)
        | prometheus_parse::Value::Gauge(x)
        | prometheus_parse::Value::Untyped(x) => Some(*x),
        _ => None,
    };
    let mut snap = MetricsSnapshot::default();
    let mut lora_best: Option<(f64, &prometheus_parse::Labels)> = None;
    let (mut queries, mut hits) = (None, None);
    for s in &scrape.samples {
        let Some(v) = value(&s.value) else { continue };
        match s.metric.as_str() {
            "vllm_num_requests_waiting" => snap.waiting += v as u32,
            "vllm_num_requests_running" => snap.running += v as u32,
            "vllm_kv_cache_usage_perc" => {
                snap.kv_cache_usage = Some(snap.kv_cache_usage.map_or(v, |k: f64| k.max(v)));
            }
            "vllm_lora_requests_info" if lora_best.is_none_or(|(b, _)| v >= b) => {
                lora_best = Some((v, &s.labels));
            }
            "vllm_cache_config_info" => {
                let block = s.labels.get("block_size").and_then(|b| b.parse().ok());
                let blocks = s.labels.get("num_gpu_blocks").and_then(|b| b.parse().ok());
                if let (Some(block_size), Some(num_blocks)) = (block, blocks) {
                    snap.cache = Some(CacheConfig {
                        block_size,
                        num_blocks,
                    });
                }
            }
            "vllm_prefix_cache_queries_total" | "vllm_prefix_cache_queries" => queries = Some(v),
            "vllm_prefix_cache_hits_total" | "vllm_prefix_cache_hits" => hits = Some(v),
            _ => {}
        }
    }
    if let Some((_, labels)) = lora_best {
        let list = |k: &str| -> Vec<String> {
            labels
                .get(k)
                .unwrap_or("")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let running = list("running_lora_adapters");
        let mut waiting = list("waiting_lora_adapters");
        waiting.retain(|a| !running.contains(a));
        snap.lora = Some(LoraState {
            max_lora: labels
                .get("max_lora")
                .and_then(|m| m.parse().ok())
                .unwrap_or(0),
            running,
            waiting,
        });
    }
    if let (Some(q), Some(h)) = (queries, hits) {
        snap.prefix_cache_hit_rate = (q > 0.0).then(|| h / q);
    }
    snap
}

fn parse(c: &mut Criterion) {
    // Both readers agree on the page before anything is timed.
    let ours = parse_page(EngineType::Vllm, VLLM.as_bytes(), None, Timestamp::ZERO)
        .unwrap()
        .snapshot;
    let underscored = VLLM.replace("vllm:", "vllm_");
    assert_eq!(underscored.len(), VLLM.len());
    let theirs = vllm_with_prometheus_parse(&underscored);
    assert_eq!(
        (ours.waiting, ours.running, ours.kv_cache_usage, ours.cache),
        (
            theirs.waiting,
            theirs.running,
            theirs.kv_cache_usage,
            theirs.cache
        )
    );
    // It also splits label text on every comma, so an adapter list keeps only its first entry.
    assert_eq!(ours.lora.as_ref().unwrap().running, ["lora-a", "lora-b"]);
    assert_eq!(theirs.lora.as_ref().unwrap().running, ["lora-a"]);
    assert_eq!(ours.prefix_cache_hit_rate, theirs.prefix_cache_hit_rate);
    let as_served =
        prometheus_parse::Scrape::parse(VLLM.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert!(
        !as_served
            .samples
            .iter()
            .any(|s| s.metric.starts_with("vllm")),
        "prometheus-parse now reads names with colons: compare on the real page"
    );

    let mut g = c.benchmark_group("parse_vllm_page");
    g.throughput(Throughput::Bytes(VLLM.len() as u64));
    g.bench_function("streaming", |b| {
        b.iter(|| {
            parse_page(
                EngineType::Vllm,
                black_box(VLLM.as_bytes()),
                None,
                Timestamp::ZERO,
            )
        })
    });
    g.bench_function("prometheus-parse", |b| {
        b.iter(|| vllm_with_prometheus_parse(black_box(&underscored)))
    });
    g.finish();

    let mut g = c.benchmark_group("parse_other_engines");
    for (name, engine, page) in [
        ("sglang", EngineType::Sglang, SGLANG),
        ("tgi", EngineType::Tgi, TGI),
    ] {
        g.throughput(Throughput::Bytes(page.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| parse_page(engine, black_box(page.as_bytes()), None, Timestamp::ZERO))
        });
    }
    g.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
