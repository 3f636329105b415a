//! Precise prefix routing in a live pool: each pod's KV-event feed over real TCP, the request
//! tokenized with a real Hugging Face tokenizer, and the picks following what the engines say
//! they hold — evictions included.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a failed test

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use infergate_kvevents::event::{Batch, Encoding, Event, ExtraKey, Removed, Stored, encode_batch};
use infergate_kvevents::publish::Publisher;
use infergate_metrics::ScraperConfig;
use infergate_openai::{ApiKind, parse_request};
use infergate_pool::lifecycle::{Segments, context};
use infergate_pool::precise::{EVENTS_PORT_LABEL, Precise, PreciseConfig, refine};
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, EngineType, SchedulerConfig};
use infergate_testkit::eventually;
use infergate_testkit::pages::{page_server, vllm_page};
use infergate_tokenizer::{ChatRequest, ModelTokenizer, Options};
use prometheus_client::registry::Registry;

const BS: usize = 16;

fn tokenizer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny")
}

fn body(text: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "and then?"}],
    }))
    .unwrap()
}

/// The engine's announcement of the request's full blocks (hashes `base + i`).
fn stored(ids: &[u32], base: u64) -> Vec<u8> {
    let blocks = ids.len() / BS;
    let ev = Event::Stored(Stored {
        block_hashes: (0..blocks as u64).map(|i| base + i).collect(),
        parent: None,
        token_ids: ids[..blocks * BS].to_vec(),
        block_size: BS as u32,
        ..Default::default()
    });
    batch(ev)
}

fn batch(ev: Event) -> Vec<u8> {
    encode_batch(
        &Batch {
            ts: 0.0,
            events: vec![ev],
            ..Default::default()
        },
        Encoding::Keyed,
    )
}

fn pick(pool: &LivePool, body: &[u8]) -> (SocketAddr, String) {
    let parsed = parse_request(ApiKind::ChatCompletions, body).unwrap();
    let segments = Segments::new(parsed.segments());
    let cx = context(&parsed, "m", None, &segments, None);
    let mut cached = Vec::new();
    let cx = refine(cx, pool.precise(), &parsed, body, &mut cached);
    let (picked, ex) = pool.pick_explained(&cx);
    let addr = picked.unwrap().endpoint(); // dropped: cancelled, nothing stays in flight
    (addr, ex.summary(4))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_follow_the_engines_kv_events_through_an_eviction() {
    let pods = [
        page_server(Arc::new(|| vllm_page(0))).await,
        page_server(Arc::new(|| vllm_page(0))).await,
    ];
    let publishers = [
        Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "", 0)
            .await
            .unwrap(),
        Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "", 0)
            .await
            .unwrap(),
    ];
    let mut registry = Registry::default();
    let pool = LivePool::start(
        PoolConfig {
            scheduler: SchedulerConfig::default(),
            scrape: ScraperConfig {
                interval: Duration::from_millis(50),
                ..ScraperConfig::default()
            },
            seed: 3,
        },
        None,
    )
    .unwrap();
    let precise = Precise::new(&PreciseConfig::new(tokenizer_dir()), Some(&mut registry)).unwrap();
    pool.enable_precise(precise).unwrap();
    // Both engines on one host: each endpoint's label names its publisher's port.
    pool.set_endpoints(
        pods.iter()
            .zip(&publishers)
            .enumerate()
            .map(|(i, (a, p))| EndpointMeta {
                namespace: "default".into(),
                pod: format!("pod-{i}"),
                addr: *a,
                engine: EngineType::Vllm,
                gpu: None,
                labels: BTreeMap::from([(EVENTS_PORT_LABEL.into(), p.addr().port().to_string())]),
            }),
    )
    .unwrap();
    let p = pool.precise().unwrap();
    eventually("both feeds", || p.events().index().stats().synced_pods == 2).await;
    eventually("both pages", || {
        pool.endpoints_info().iter().all(|e| e.metrics.is_some())
    })
    .await;

    // What the engine computes for this request: the chat template rendered, then tokenized.
    let text =
        "the quick brown fox jumps over the lazy dog while a model server answers ".repeat(12);
    let req = body(&text);
    let tok = ModelTokenizer::from_dir(tokenizer_dir(), Options::default()).unwrap();
    let mut ids = Vec::new();
    tok.encode_chat(&ChatRequest::from_json(&req).unwrap(), &mut ids)
        .unwrap();
    assert!(ids.len() >= 8 * BS, "{} tokens", ids.len());

    // Pod 1 holds the prompt: every pick goes there, with its exact match.
    publishers[1].publish(stored(&ids, 100));
    eventually("pod 1's blocks", || {
        p.events().index().pod_blocks(pods[1]) > 0
    })
    .await;
    for _ in 0..10 {
        let (addr, ex) = pick(&pool, &req);
        assert_eq!(addr, pods[1], "{ex}");
        assert!(ex.contains("exact_prefix=2"), "{ex}");
    }
    // Pod 1 evicts it, pod 0 computes and stores it: the picks follow.
    let blocks = (ids.len() / BS) as u64;
    publishers[1].publish(batch(Event::Removed(Removed {
        block_hashes: (100..100 + blocks).collect(),
        ..Default::default()
    })));
    publishers[0].publish(stored(&ids, 500));
    eventually("the eviction and the store", || {
        let ix = p.events().index();
        ix.pod_blocks(pods[1]) == 0 && ix.pod_blocks(pods[0]) > 0
    })
    .await;
    for _ in 0..10 {
        let (addr, ex) = pick(&pool, &req);
        assert_eq!(addr, pods[0], "{ex}");
    }
    // Pod 1 computes it again for a request salted `tenant-a`: vLLM publishes the salt in the
    // first block's extra keys. Only requests with that salt match pod 1; an unsalted request
    // still goes to pod 0, and another salt's matches nothing (vLLM reuses neither).
    let salted = |salt: &str| {
        let mut v: serde_json::Value = serde_json::from_slice(&req).unwrap();
        v["cache_salt"] = salt.into();
        serde_json::to_vec(&v).unwrap()
    };
    publishers[1].publish(batch(Event::Stored(Stored {
        block_hashes: (900..900 + blocks).collect(),
        token_ids: ids[..blocks as usize * BS].to_vec(),
        block_size: BS as u32,
        extra_keys: (0..blocks)
            .map(|i| (i == 0).then(|| vec![ExtraKey::Str("tenant-a".into())]))
            .collect(),
        ..Default::default()
    })));
    eventually("pod 1's salted blocks", || {
        p.events().index().pod_blocks(pods[1]) > 0
    })
    .await;
    for _ in 0..5 {
        let (addr, ex) = pick(&pool, &salted("tenant-a"));
        assert_eq!(addr, pods[1], "{ex}");
        let (addr, ex) = pick(&pool, &req);
        assert_eq!(addr, pods[0], "{ex}");
    }
    let other = salted("tenant-b");
    let parsed = parse_request(ApiKind::ChatCompletions, &other).unwrap();
    let mut cached = Vec::new();
    let lookup = pool
        .precise()
        .unwrap()
        .lookup(&parsed, &other, None, &mut cached);
    assert!(lookup.is_some());
    cached.sort();
    let mut want = vec![(pods[0], 0), (pods[1], 0)];
    want.sort();
    assert_eq!(cached, want, "another salt holds nothing");
    // A salt that is not a string salts nothing (vLLM refuses the request, another engine
    // ignores the field): it is matched as the unsalted request it is to any other engine.
    let bad = {
        let mut v: serde_json::Value = serde_json::from_slice(&req).unwrap();
        v["cache_salt"] = 7.into();
        serde_json::to_vec(&v).unwrap()
    };
    let (addr, ex) = pick(&pool, &bad);
    assert_eq!(addr, pods[0], "{ex}");
    // A request the tokenizer cannot take keeps the approximate match (no exact_prefix).
    let completions = br#"{"model": "m", "prompt": [1, 2, 3]}"#;
    let parsed = parse_request(ApiKind::Completions, completions).unwrap();
    let segments = Segments::new(parsed.segments());
    let cx = context(&parsed, "m", None, &segments, None);
    let mut cached = Vec::new();
    let cx = refine(cx, pool.precise(), &parsed, completions, &mut cached);
    assert!(cx.cached.is_none());
    // A body over the limit (64 KiB by default) is not tokenized: the picker's core is spared.
    let long = body(&"many words of a very long prompt ".repeat(2200));
    assert!(long.len() > 64 << 10);
    let parsed = parse_request(ApiKind::ChatCompletions, &long).unwrap();
    let segments = Segments::new(parsed.segments());
    let cx = context(&parsed, "m", None, &segments, None);
    let mut cached = Vec::new();
    let cx = refine(cx, pool.precise(), &parsed, &long, &mut cached);
    assert!(cx.cached.is_none());
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    assert!(
        out.contains("infergate_precise_prefix_requests_total{outcome=\"too-long\"} 1"),
        "{out}"
    );
    assert!(
        out.contains("infergate_precise_prefix_requests_total{outcome=\"exact\"} 32"),
        "{out}"
    );
    assert!(
        out.contains("infergate_precise_prefix_requests_total{outcome=\"unsupported\"} 1"),
        "{out}"
    );
    assert!(
        out.contains("infergate_kv_events_connected_pods 2"),
        "{out}"
    );
}

#[tokio::test]
async fn with_no_feed_in_sequence_a_request_is_not_tokenized() {
    let mut registry = Registry::default();
    let precise = Precise::new(&PreciseConfig::new(tokenizer_dir()), Some(&mut registry)).unwrap();
    let body = body(&"a long shared system prompt ".repeat(50));
    let parsed = parse_request(ApiKind::ChatCompletions, &body).unwrap();
    let mut cached = Vec::new();
    assert_eq!(precise.lookup(&parsed, &body, None, &mut cached), None);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("infergate_precise_prefix_requests_total{outcome=\"no-feed\"} 1"),
        "{text}"
    );
    // The tokenizer's 1–2 ms a long request are not spent when no pod's events can be matched.
    assert!(
        text.contains("infergate_precise_prefix_duration_seconds_count 0"),
        "{text}"
    );
}
