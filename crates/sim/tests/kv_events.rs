//! The emulator publishes vLLM's KV-cache events: infergate's own subscriber (the one precise
//! prefix routing runs) receives them over ZeroMQ, in both encodings, and its index then holds
//! exactly the prompt blocks the pod computed, under the LoRA adapter and `cache_salt` they were
//! computed for — and drops them when the pod's cache is reset.

// Test helpers panic on purpose: a failed call is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use infergate_kvevents::event::{Encoding, Event, decode_batch};
use infergate_kvevents::index::MatchScratch;
use infergate_kvevents::msgpack::{Kind, Reader};
use infergate_kvevents::zmtp::{self, Limits, SocketType};
use infergate_kvevents::{KvEvents, SubscriberConfig};
use infergate_sim::tokens::token_ids;
use infergate_sim::{
    Catalog, EngineKind, FleetSpec, KvEventsOptions, PodSpec, Profile, ServeOptions, ServedFleet,
    serve_fleet_opts, serve_fleet_with,
};
use infergate_testkit::eventually;
use infergate_tokenizer::{ChatRequest, ModelTokenizer, Options as TokenizerOptions};
use serde_json::json;

/// The built-in `llama-3.1-8b/h100` profile.
fn h100() -> Profile {
    Catalog::builtin()
        .unwrap()
        .get("llama-3.1-8b/h100")
        .unwrap()
        .clone()
}

/// Serves `pods` (each on a port of its own on 127.0.0.1) publishing their KV events in
/// `encoding`; the sender stops the fleet.
async fn serve_publishing(
    pods: Vec<PodSpec>,
    encoding: Encoding,
) -> (ServedFleet, tokio::sync::oneshot::Sender<()>) {
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let opts = KvEventsOptions {
        encoding,
        ..KvEventsOptions::default()
    };
    let fleet = serve_fleet_with(
        &spec,
        |_| SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(&opts),
        async move {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    (fleet, tx)
}

/// A subscriber to every pod of `fleet`, once it has synced with each pod's feed.
async fn subscribe(fleet: &ServedFleet) -> KvEvents {
    let kv = KvEvents::new(SubscriberConfig::default());
    for pod in &fleet.pods {
        let (events, replay) = pod.kv_events.expect("the pod publishes");
        kv.add_pod_at(pod.addr, events, replay);
    }
    let pods = fleet.pods.len();
    eventually("every pod's feed", || {
        kv.index().stats().synced_pods == pods
    })
    .await;
    kv
}

fn cached(kv: &KvEvents, pod: SocketAddr, ids: &[u32]) -> u32 {
    cached_under(kv, pod, None, ids)
}

fn cached_under(kv: &KvEvents, pod: SocketAddr, lora: Option<&str>, ids: &[u32]) -> u32 {
    cached_salted(kv, pod, lora, None, ids)
}

fn cached_salted(
    kv: &KvEvents,
    pod: SocketAddr,
    lora: Option<&str>,
    salt: Option<&str>,
    ids: &[u32],
) -> u32 {
    let mut out = Vec::new();
    kv.match_tokens(lora, salt, ids, &mut MatchScratch::default(), &mut out);
    out.iter().find(|(a, _)| *a == pod).map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulated_pods_publish_stores_in_both_encodings_to_the_subscriber() {
    let p = h100();
    let bs = p.block_size;
    for encoding in [Encoding::Keyed, Encoding::Positional] {
        let pods = vec![
            PodSpec::new("a", &p, EngineKind::Vllm),
            PodSpec::new("b", &p, EngineKind::Vllm),
        ];
        let (fleet, tx) = serve_publishing(pods, encoding).await;
        let kv = subscribe(&fleet).await;
        let (a, b) = (fleet.pods[0].addr, fleet.pods[1].addr);
        let prompt = "a system prompt every request of this tenant shares, then more ".repeat(30);
        let mut ids = Vec::new();
        token_ids(&prompt, &mut ids);
        let full = (ids.len() as u32 / bs) * bs;
        let r = infergate_testkit::try_post(
            a,
            "/v1/completions",
            "application/json",
            json!({"model": p.model.as_str(), "prompt": prompt, "max_tokens": 2}).to_string(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{encoding:?}");
        eventually("pod a's stores", || cached(&kv, a, &ids) == full).await;
        assert_eq!(cached(&kv, b, &ids), 0, "{encoding:?}: b computed nothing");
        // vLLM's /reset_prefix_cache: AllBlocksCleared, and the index forgets pod a's blocks.
        let r = infergate_testkit::try_post(
            a,
            "/reset_prefix_cache",
            "application/json",
            String::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{encoding:?}");
        eventually("the clear", || cached(&kv, a, &ids) == 0).await;
        let _ = tx.send(());
    }
}

/// A LoRA request's blocks are keyed by its adapter in the engine, as in vLLM, and its
/// `BlockStored` names the adapter: the subscriber matches them for that adapter only, never for
/// another adapter or the base model, and the base model's own copy of the prompt for it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_blocks_reach_the_subscriber_under_their_adapter_only() {
    let p = h100();
    let bs = p.block_size;
    let mut pod = PodSpec::new("a", &p, EngineKind::Vllm);
    pod.lora_adapters = vec!["sql".into(), "chat".into()];
    pod.max_loras = 2;
    let (fleet, tx) = serve_publishing(vec![pod], Encoding::Keyed).await;
    let kv = subscribe(&fleet).await;
    let a = fleet.pods[0].addr;
    let prompt = "the same instructions, whichever adapter reads them, and then some ".repeat(30);
    let mut ids = Vec::new();
    token_ids(&prompt, &mut ids);
    let full = (ids.len() as u32 / bs) * bs;
    let post = |model: &str| {
        infergate_testkit::try_post(
            a,
            "/v1/completions",
            "application/json",
            json!({"model": model, "prompt": prompt, "max_tokens": 2}).to_string(),
        )
    };
    assert_eq!(post("sql").await.unwrap().status, 200);
    eventually("sql's stores", || {
        cached_under(&kv, a, Some("sql"), &ids) == full
    })
    .await;
    assert_eq!(cached_under(&kv, a, Some("chat"), &ids), 0);
    assert_eq!(cached_under(&kv, a, None, &ids), 0);
    // The base model computes (and stores) the prompt again, under no adapter.
    assert_eq!(post(p.model.as_str()).await.unwrap().status, 200);
    eventually("the base model's stores", || cached(&kv, a, &ids) == full).await;
    assert_eq!(cached_under(&kv, a, Some("sql"), &ids), full);
    assert_eq!(cached_under(&kv, a, Some("chat"), &ids), 0);
    let _ = tx.send(());
}

/// A salted request's blocks are keyed by its `cache_salt` in the engine, as in vLLM, and their
/// `BlockStored` lists the salt in the first block's `extra_keys` (after the adapter's name under
/// an adapter): the subscriber matches them for that salt (and adapter) only, and the unsalted
/// copy of the prompt for unsalted requests only. Positional encoding, to cover both (the stores
/// test above runs keyed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salted_blocks_reach_the_subscriber_under_their_salt_only() {
    let p = h100();
    let bs = p.block_size;
    let mut pod = PodSpec::new("a", &p, EngineKind::Vllm);
    pod.lora_adapters = vec!["sql".into()];
    pod.max_loras = 1;
    let (fleet, tx) = serve_publishing(vec![pod], Encoding::Positional).await;
    let kv = subscribe(&fleet).await;
    let a = fleet.pods[0].addr;
    let prompt = "one tenant's private instructions, which no other tenant may reuse ".repeat(30);
    let mut ids = Vec::new();
    token_ids(&prompt, &mut ids);
    let full = (ids.len() as u32 / bs) * bs;
    let post = |model: &str, salt: Option<&str>| {
        let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 2});
        if let Some(s) = salt {
            body["cache_salt"] = s.into();
        }
        infergate_testkit::try_post(a, "/v1/completions", "application/json", body.to_string())
    };
    let base = p.model.as_str();
    assert_eq!(post(base, Some("tenant-a")).await.unwrap().status, 200);
    eventually("tenant-a's stores", || {
        cached_salted(&kv, a, None, Some("tenant-a"), &ids) == full
    })
    .await;
    assert_eq!(cached_salted(&kv, a, None, Some("tenant-b"), &ids), 0);
    assert_eq!(cached(&kv, a, &ids), 0, "an unsalted request");
    assert_eq!(
        cached_salted(&kv, a, Some("sql"), Some("tenant-a"), &ids),
        0
    );
    // The same salt under an adapter: its own blocks, listed as (adapter, salt).
    assert_eq!(post("sql", Some("tenant-a")).await.unwrap().status, 200);
    eventually("sql + tenant-a's stores", || {
        cached_salted(&kv, a, Some("sql"), Some("tenant-a"), &ids) == full
    })
    .await;
    assert_eq!(cached_under(&kv, a, Some("sql"), &ids), 0);
    // Unsalted, the prompt is computed once more and matched for unsalted requests alone.
    assert_eq!(post(base, None).await.unwrap().status, 200);
    eventually("the unsalted stores", || cached(&kv, a, &ids) == full).await;
    assert_eq!(cached_salted(&kv, a, None, Some("tenant-b"), &ids), 0);
    assert_eq!(cached_salted(&kv, a, None, Some("tenant-a"), &ids), full);
    let _ = tx.send(());
}

/// A MessagePack value, as the wire comparison below reads it.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Bool,
    Int(u64),
    Float,
    Str(String),
    Bin(usize),
    Array(Vec<Value>),
    Map(Vec<(String, Value)>),
    Ext,
}

fn read_value(r: &mut Reader<'_>) -> Value {
    match r.peek().unwrap() {
        Kind::Nil => {
            r.nil().unwrap();
            Value::Nil
        }
        Kind::Bool => {
            r.skip().unwrap();
            Value::Bool
        }
        Kind::Int => Value::Int(r.int().unwrap()),
        Kind::Float => {
            r.float().unwrap();
            Value::Float
        }
        Kind::Str => Value::Str(r.str().unwrap().to_owned()),
        Kind::Bin => Value::Bin(r.bin().unwrap().len()),
        Kind::Array => Value::Array((0..r.array().unwrap()).map(|_| read_value(r)).collect()),
        Kind::Map => Value::Map(
            (0..r.map().unwrap())
                .map(|_| (r.str().unwrap().to_owned(), read_value(r)))
                .collect(),
        ),
        Kind::Ext => {
            r.skip().unwrap();
            Value::Ext
        }
    }
}

/// A whole payload as a value (nothing may follow it).
fn parse(payload: &[u8]) -> Value {
    let mut r = Reader::new(payload);
    let v = read_value(&mut r);
    assert_eq!(r.remaining(), 0, "bytes after the batch");
    v
}

/// `v` with what differs between two engines' stores of the same prompt shape blanked: the
/// integers of block hashes and token ids (the emulator's tokenizer and hash are its own). Their
/// kinds and counts stay, as does every other value.
fn blank_ids(key: &str, v: &Value) -> Value {
    match (key, v) {
        ("block_hashes" | "token_ids" | "parent_block_hash", Value::Array(items)) => Value::Array(
            items
                .iter()
                .map(|i| match i {
                    Value::Int(_) => Value::Int(0),
                    other => other.clone(),
                })
                .collect(),
        ),
        ("parent_block_hash", Value::Int(_)) => Value::Int(0),
        _ => v.clone(),
    }
}

/// Asserts that the emulator's event has the real one's fields, in its order, each of the same
/// MessagePack shape and (but for ids and hashes) value.
fn assert_event_like(case: &str, emulated: &Value, real: &Value) {
    let (Value::Map(e), Value::Map(r)) = (emulated, real) else {
        panic!("{case}: events are maps in vLLM 0.32: emulated {emulated:?}, real {real:?}");
    };
    let keys = |m: &[(String, Value)]| m.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(e), keys(r), "{case}: the event's fields, in order");
    for ((key, ev), (_, rv)) in e.iter().zip(r) {
        assert_eq!(
            blank_ids(key, ev),
            blank_ids(key, rv),
            "{case}: field {key}"
        );
    }
}

/// Asserts that an emulated batch is shaped as a batch vLLM 0.32 published: the envelope
/// `[ts, events, data_parallel_rank]`, and each event as the real batch's event of its type.
/// Returns the event types the emulated batch had.
fn assert_batch_like(case: &str, emulated: &[u8], real: &[u8]) -> Vec<String> {
    let (Value::Array(e), Value::Array(r)) = (parse(emulated), parse(real)) else {
        panic!("{case}: a batch is an array");
    };
    assert_eq!(e.len(), r.len(), "{case}: the batch's fields");
    assert_eq!(
        (&e[0], &e[2]),
        (&r[0], &r[2]),
        "{case}: ts, data_parallel_rank"
    );
    let (Value::Array(events), Value::Array(real_events)) = (&e[1], &r[1]) else {
        panic!("{case}: events are an array");
    };
    let type_of = |ev: &Value| match ev {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| k == "type")
            .and_then(|(_, t)| match t {
                Value::Str(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default(),
        _ => String::new(),
    };
    let mut types = Vec::new();
    for ev in events {
        let t = type_of(ev);
        let like = real_events
            .iter()
            .find(|r| type_of(r) == t)
            .unwrap_or_else(|| panic!("{case}: the real batch has no {t:?} to compare with"));
        assert_event_like(&format!("{case}, {t}"), ev, like);
        types.push(t);
    }
    types
}

/// Every batch a pod's replay socket holds, asked for as vLLM's subscribers ask: a `DEALER`
/// sending `[delimiter, start seq]`, answered `[delimiter, seq, payload]` per batch, then seq −1.
async fn replayed(replay: SocketAddr) -> Vec<Vec<u8>> {
    let mut conn = zmtp::connect(&replay.to_string(), SocketType::Dealer, Limits::default())
        .await
        .unwrap();
    conn.send(&[b"", &0u64.to_be_bytes()]).await.unwrap();
    let mut out = Vec::new();
    let mut frames = Vec::new();
    loop {
        conn.recv(&mut frames).await.unwrap();
        let [_, seq, payload] = &frames[..] else {
            panic!("a replayed batch is [delimiter, seq, payload]: {frames:?}");
        };
        if seq[..] == (-1i64).to_be_bytes() {
            return out;
        }
        out.push(payload.to_vec());
    }
}

/// The emulator's keyed KV events are vLLM 0.32's on the wire, field for field: held against
/// batches a running vLLM 0.32 published (tests/fixtures/capture_kv_fixtures.py), for a salted
/// prompt, the same salt under a LoRA adapter and no salt — the same block size, block count,
/// salt and adapter, so everything but the hashes and token ids compares as it is. vLLM sends
/// `extra_keys` with an entry per block even when no block has keys (a `nil` each), names the
/// cache group (`group_idx` 0, `kv_cache_spec_kind` `full_attention`) and removes a block per
/// `BlockRemoved`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_batches_are_shaped_as_vllm_0_32_publishes_them() {
    // The real engine's cache: 128-token blocks; eight of them here, so that each prompt
    // evicts blocks of the one before (the real batches remove five blocks before the store).
    let mut p = h100();
    p.block_size = 128;
    p.kv_capacity_tokens = 8 * 128;
    let mut pod = PodSpec::new("a", &p, EngineKind::Vllm);
    pod.lora_adapters = vec!["lora-a".into()];
    pod.max_loras = 1;
    let (fleet, tx) = serve_publishing(vec![pod], Encoding::Keyed).await;
    let a = fleet.pods[0].addr;
    let replay = fleet.pods[0].kv_events.and_then(|(_, r)| r).unwrap();
    // 650 tokens of the emulator's tokenizer: five full blocks, as the real prompts had.
    let prompt = "alpha bravo charlie delta echo foxtrot golf hotel india juliet ".repeat(50)
        [..650 * 4]
        .to_owned();
    let salt = "tenant-230494553";
    let base = p.model.as_str();
    let cases = [
        (
            "salted",
            base,
            Some(salt),
            &include_bytes!("fixtures/vllm-0.32-salted.msgpack")[..],
        ),
        (
            "salted-lora",
            "lora-a",
            Some(salt),
            &include_bytes!("fixtures/vllm-0.32-salted-lora.msgpack")[..],
        ),
        (
            "unsalted",
            base,
            None,
            &include_bytes!("fixtures/vllm-0.32-unsalted.msgpack")[..],
        ),
    ];
    let mut seen = Vec::new();
    let mut published = 0;
    for (case, model, salt, real) in cases {
        let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 2});
        if let Some(s) = salt {
            body["cache_salt"] = s.into();
        }
        let r =
            infergate_testkit::try_post(a, "/v1/completions", "application/json", body.to_string())
                .await
                .unwrap();
        assert_eq!(r.status, 200, "{case}: {:?}", r.body);
        // The batch with this prompt's store (published at its prefill step).
        let mut batch = None;
        for _ in 0..100 {
            let batches = replayed(replay).await;
            let new = &batches[published.min(batches.len())..];
            if let Some(b) = new.iter().rev().find(|b| {
                decode_batch(b)
                    .unwrap()
                    .events
                    .iter()
                    .any(|e| matches!(e, Event::Stored(_)))
            }) {
                batch = Some(b.clone());
                published = batches.len();
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let batch = batch.unwrap_or_else(|| panic!("{case}: no BlockStored published"));
        seen.extend(assert_batch_like(case, &batch, real));
        // And infergate's decoder reads the same store from both.
        let store = |payload: &[u8]| {
            decode_batch(payload)
                .unwrap()
                .events
                .into_iter()
                .find_map(|e| match e {
                    Event::Stored(s) => Some(s),
                    _ => None,
                })
                .unwrap()
        };
        let (emulated, vllm) = (store(&batch), store(real));
        assert_eq!(
            (
                &emulated.extra_keys,
                emulated.group_idx,
                &emulated.kv_cache_spec_kind,
                (&emulated.lora_id, &emulated.lora_name),
            ),
            (
                &vllm.extra_keys,
                vllm.group_idx,
                &vllm.kv_cache_spec_kind,
                (&vllm.lora_id, &vllm.lora_name),
            ),
            "{case}"
        );
    }
    // Both kinds of event were compared.
    assert!(seen.iter().any(|t| t == "BlockStored"), "{seen:?}");
    assert!(seen.iter().any(|t| t == "BlockRemoved"), "{seen:?}");
    let _ = tx.send(());
}

#[tokio::test]
async fn kv_event_ports_past_the_range_on_an_http_port_or_taken_are_refused_naming_the_pod() {
    let p = h100();
    let mut b = PodSpec::new("b", &p, EngineKind::Vllm);
    b.port = 31000;
    let pods = vec![PodSpec::new("a", &p, EngineKind::Vllm), b];
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let opts = |base| KvEventsOptions {
        base_port: Some(base),
        ..KvEventsOptions::default()
    };
    // Pod 1 would publish on 65534 + 2: past the range, not wrapped or saturated.
    let e = opts(65534).check(&spec).unwrap_err().to_string();
    assert!(
        e.starts_with("pod b: KV-event port 65536: past 65535"),
        "{e}"
    );
    let e = serve_fleet_with(
        &spec,
        |_| SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(&opts(65534)),
        std::future::pending(),
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(e.starts_with("pod b: KV-event port 65536"), "{e}");
    // Pod 0's replay socket would take pod b's HTTP port.
    let e = opts(30999).check(&spec).unwrap_err().to_string();
    assert_eq!(e, "pod a: KV-event port 31000: pod b serves HTTP on it");
    assert!(opts(31002).check(&spec).is_ok());
    // A port already taken names the pod and both sockets.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = serve_fleet_with(
        &spec,
        |_| SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(&opts(port)),
        std::future::pending(),
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        e,
        format!(
            "pod a: cannot publish KV events on port {port} and replay them on port {}",
            port + 1
        )
    );
}

#[tokio::test]
async fn only_vllm_pods_publish_and_each_keeps_its_index_ports() {
    let p = h100();
    let pods = vec![
        PodSpec::new("tgi", &p, EngineKind::Tgi),
        PodSpec::new("vllm", &p, EngineKind::Vllm),
    ];
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let fleet = serve_fleet_with(
        &spec,
        |_| SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(&KvEventsOptions::default()),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(fleet.pods[0].kv_events, None, "TGI publishes no KV events");
    assert!(fleet.pods[1].kv_events.is_some());
    // Pod 1 keeps the ports of its place in the fleet.
    let opts = KvEventsOptions {
        base_port: Some(6000),
        ..KvEventsOptions::default()
    };
    assert_eq!(opts.ports(1, "vllm").unwrap(), (6002, 6003));
}

/// The tiny real tokenizer of the tokenizer crate's tests (tokenizer.json, config, template).
fn tiny_tokenizer_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny")
}

/// Two vLLM pods serving with the tiny tokenizer, publishing their KV events.
async fn tokenized_fleet(
    tokenizer: std::sync::Arc<ModelTokenizer>,
) -> (ServedFleet, tokio::sync::oneshot::Sender<()>) {
    let p = h100();
    let pods = vec![
        PodSpec::new("a", &p, EngineKind::Vllm),
        PodSpec::new("b", &p, EngineKind::Vllm),
    ];
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let options = ServeOptions {
        kv_events: Some(KvEventsOptions::default()),
        tokenizer: Some(tokenizer),
    };
    let fleet = serve_fleet_opts(
        &spec,
        |_| SocketAddr::from(([127, 0, 0, 1], 0)),
        &options,
        async move {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    (fleet, tx)
}

/// With the model's tokenizer, a pod counts, caches and publishes the ids the gateway's precise
/// prefix routing computes for the same request (chat template and all): the subscriber's exact
/// match names the pod that served the prompt, with the prompt's full blocks, and no other pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_with_the_model_tokenizer_publish_the_ids_a_precise_router_computes() {
    let tok = std::sync::Arc::new(
        ModelTokenizer::from_dir(tiny_tokenizer_dir(), TokenizerOptions::default()).unwrap(),
    );
    let bs = h100().block_size;
    let (fleet, tx) = tokenized_fleet(tok.clone()).await;
    let kv = subscribe(&fleet).await;
    let (a, b) = (fleet.pods[0].addr, fleet.pods[1].addr);
    let system = "You answer questions about the quarterly report, citing its tables. ".repeat(12);
    let body = json!({
        "model": h100().model.as_str(),
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What was the revenue in the third quarter?"},
        ],
        "max_tokens": 2,
    })
    .to_string();
    // What the gateway's precise path computes (crates/pool `Precise::lookup`).
    let mut ids = Vec::new();
    tok.encode_chat(&ChatRequest::from_json(body.as_bytes()).unwrap(), &mut ids)
        .unwrap();
    let full = (ids.len() as u32 / bs) * bs;
    assert!(full >= 2 * bs, "{} ids: the prompt spans blocks", ids.len());
    let r =
        infergate_testkit::try_post(a, "/v1/chat/completions", "application/json", body.clone())
            .await
            .unwrap();
    assert_eq!(r.status, 200);
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["usage"]["prompt_tokens"], ids.len(), "{answer}");
    eventually("pod a's stores", || cached(&kv, a, &ids) == full).await;
    assert_eq!(cached(&kv, b, &ids), 0, "b computed nothing");
    // The pod's own prefix cache keys the same blocks: the same prompt again hits them all.
    let r = infergate_testkit::try_post(a, "/v1/chat/completions", "application/json", body)
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], full,
        "{answer}"
    );
    // `/tokenize` answers the same ids, and `/detokenize` gives the rendered chat back.
    let r = infergate_testkit::try_post(
        b,
        "/tokenize",
        "application/json",
        json!({"messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What was the revenue in the third quarter?"},
        ]})
        .to_string(),
    )
    .await
    .unwrap();
    let tokenized: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(tokenized["tokens"], json!(ids), "{tokenized}");
    let r = infergate_testkit::try_post(
        b,
        "/detokenize",
        "application/json",
        json!({"tokens": ids}).to_string(),
    )
    .await
    .unwrap();
    let text: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let rendered = tok
        .render_chat(&ChatRequest::from_json(r#"{"messages": []}"#.as_bytes()).unwrap())
        .unwrap();
    assert!(
        text["prompt"]
            .as_str()
            .is_some_and(|t| t.contains("third quarter") && t.ends_with(&rendered)),
        "{text}"
    );
    // A Responses request is the chat request of its messages.
    let r = infergate_testkit::try_post(
        b,
        "/v1/responses",
        "application/json",
        json!({"instructions": system, "input": "What was the revenue in the third quarter?",
               "max_output_tokens": 2})
        .to_string(),
    )
    .await
    .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["usage"]["input_tokens"], ids.len(), "{answer}");
    // A completions prompt is encoded with the tokenizer's special tokens (vLLM's default).
    let mut prompt_ids = Vec::new();
    tok.encode_completion(&system, true, &mut prompt_ids)
        .unwrap();
    let r = infergate_testkit::try_post(
        b,
        "/v1/completions",
        "application/json",
        json!({"model": h100().model.as_str(), "prompt": system, "max_tokens": 2}).to_string(),
    )
    .await
    .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        answer["usage"]["prompt_tokens"],
        prompt_ids.len(),
        "{answer}"
    );
    let full = (prompt_ids.len() as u32 / bs) * bs;
    eventually("pod b's stores", || cached(&kv, b, &prompt_ids) == full).await;
    let _ = tx.send(());
}

/// A request the model's tokenizer cannot take gets vLLM's 400, never a panic: a chat request
/// to a model without a chat template (completions still served), a template that fails, ids
/// outside the vocabulary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_tokenizer_cannot_take_get_vllm_s_400() {
    let dir = std::env::temp_dir().join(format!("infergate-sim-notemplate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        tiny_tokenizer_dir().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let bare = ModelTokenizer::from_dir(&dir, TokenizerOptions::default()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (fleet, tx) = tokenized_fleet(std::sync::Arc::new(bare)).await;
    let a = fleet.pods[0].addr;
    let model = h100().model;
    let post = |path: &'static str, body: serde_json::Value| {
        infergate_testkit::try_post(a, path, "application/json", body.to_string())
    };
    let messages = json!([{"role": "user", "content": "hi"}]);
    let r = post(
        "/v1/chat/completions",
        json!({"model": model.as_str(), "messages": messages}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);
    let e: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("must provide a chat template")),
        "{e}"
    );
    let r = post("/tokenize", json!({"messages": messages}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let r = post(
        "/v1/completions",
        json!({"model": model.as_str(), "prompt": "hi", "max_tokens": 1}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let r = post("/detokenize", json!({"tokens": [4_000_000_000u32]}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let _ = tx.send(());

    // A template that does not render (an image part: not reproduced) is a 400 too.
    let tok = ModelTokenizer::from_dir(tiny_tokenizer_dir(), TokenizerOptions::default()).unwrap();
    let (fleet, tx) = tokenized_fleet(std::sync::Arc::new(tok)).await;
    let r = infergate_testkit::try_post(
        fleet.pods[0].addr,
        "/v1/chat/completions",
        "application/json",
        json!({"model": model.as_str(), "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]})
        .to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{:?}", r.body);
    // A request-level field the tokenizer does not reproduce is named as `param`.
    let r = infergate_testkit::try_post(
        fleet.pods[0].addr,
        "/v1/chat/completions",
        "application/json",
        json!({"model": model.as_str(), "messages": messages,
            "tools": [{"type": "function", "function": {"name": "f"}}]})
        .to_string(),
    )
    .await
    .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (r.status.as_u16(), &e["error"]["param"]),
        (400, &json!("tools")),
        "{e}"
    );
    let _ = tx.send(());
}
