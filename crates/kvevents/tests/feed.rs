//! The subscriber against a publisher over real TCP: stores and evictions reach the index; a gap
//! resets the pod or is filled by a replay; a restarted engine resets it; a hostile peer is
//! survived.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use infergate_kvevents::event::{Batch, Encoding, Event, Removed, Stored, encode_batch};
use infergate_kvevents::index::MatchScratch;
use infergate_kvevents::publish::Publisher;
use infergate_kvevents::{KvEvents, SubscriberConfig};
use infergate_testkit::eventually;
use prometheus_client::registry::Registry;

const BS: u32 = 4;

fn prompt(n: u32) -> Vec<u32> {
    (1000..1000 + n).collect()
}

/// `blocks` blocks of `tokens` from block `first`, engine hashes `first + 1000 …`.
fn stored(tokens: &[u32], first: usize, blocks: usize) -> Event {
    let bs = BS as usize;
    Event::Stored(Stored {
        block_hashes: (first..first + blocks).map(|i| 1000 + i as u64).collect(),
        parent: (first > 0).then(|| 1000 + first as u64 - 1),
        token_ids: tokens[first * bs..(first + blocks) * bs].to_vec(),
        block_size: BS,
        ..Default::default()
    })
}

fn batch(events: Vec<Event>, enc: Encoding) -> Vec<u8> {
    encode_batch(
        &Batch {
            ts: 1.0,
            events,
            data_parallel_rank: None,
            unknown_events: 0,
        },
        enc,
    )
}

fn cached(kv: &KvEvents, pod: SocketAddr, tokens: &[u32]) -> Option<u32> {
    let mut out = Vec::new();
    kv.match_tokens(None, None, tokens, &mut MatchScratch::default(), &mut out);
    out.iter().find(|(a, _)| *a == pod).map(|(_, n)| *n)
}

fn cfg() -> SubscriberConfig {
    SubscriberConfig {
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(100),
        ..Default::default()
    }
}

fn metrics(kv: &KvEvents) -> String {
    let mut r = Registry::default();
    kv.register(&mut r);
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
    s
}

const POD: &str = "127.0.0.1:8000";

#[tokio::test]
async fn stores_and_evictions_reach_the_index_in_both_encodings() {
    for enc in [Encoding::Keyed, Encoding::Positional] {
        let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "kv", 16)
            .await
            .unwrap();
        let kv = KvEvents::new(cfg());
        let pod: SocketAddr = POD.parse().unwrap();
        kv.add_pod_at(pod, publisher.addr(), None);
        eventually("the feed", || kv.index().stats().synced_pods == 1).await;
        let p = prompt(22); // five full blocks of 4, two tokens over
        assert_eq!(cached(&kv, pod, &p), Some(0));
        publisher.publish(batch(vec![stored(&p, 0, 3)], enc));
        publisher.publish(batch(vec![stored(&p, 3, 2)], enc));
        eventually("the stores", || cached(&kv, pod, &p) == Some(20)).await;
        // Another prompt sharing two blocks matches two.
        let mut q = p[..8].to_vec();
        q.extend([1, 2, 3, 4, 5]);
        assert_eq!(cached(&kv, pod, &q), Some(8));
        // The engine evicts block 2: the match stops before it.
        publisher.publish(batch(
            vec![Event::Removed(Removed {
                block_hashes: vec![1002],
                ..Default::default()
            })],
            enc,
        ));
        eventually("the eviction", || cached(&kv, pod, &p) == Some(8)).await;
        publisher.publish(batch(vec![Event::AllCleared], enc));
        eventually("the reset", || cached(&kv, pod, &p) == Some(0)).await;
        assert_eq!(kv.index().pod_blocks(pod), 0);
        let m = metrics(&kv);
        assert!(m.contains("infergate_kv_events_batches_total 4"), "{m}");
        assert!(
            m.contains("infergate_kv_events_blocks_total{kind=\"stored\"} 5"),
            "{m}"
        );
        assert!(
            m.contains("infergate_kv_events_resets_total{reason=\"cleared\"} 1"),
            "{m}"
        );
    }
}

#[tokio::test]
async fn a_gap_resets_the_pod_without_replay_and_is_filled_with_it() {
    for replay in [false, true] {
        let publisher = Publisher::bind(
            "127.0.0.1:0".parse().unwrap(),
            replay.then(|| "127.0.0.1:0".parse().unwrap()),
            "",
            64,
        )
        .await
        .unwrap();
        let kv = KvEvents::new(cfg());
        let pod: SocketAddr = POD.parse().unwrap();
        kv.add_pod_at(pod, publisher.addr(), publisher.replay_addr());
        eventually("the feed", || kv.index().stats().synced_pods == 1).await;
        let a = prompt(8);
        let b: Vec<u32> = (5000..5008).collect();
        let c: Vec<u32> = (7000..7008).collect();
        publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
        eventually("a", || cached(&kv, pod, &a) == Some(8)).await;
        // b's batch never reaches the subscriber (in the replay buffer only with replay).
        let lost = Event::Stored(Stored {
            block_hashes: vec![50, 51],
            token_ids: b.clone(),
            block_size: BS,
            ..Default::default()
        });
        publisher.lose(vec![batch(vec![lost], Encoding::Keyed)], true);
        let cs = Event::Stored(Stored {
            block_hashes: vec![70, 71],
            token_ids: c.clone(),
            block_size: BS,
            ..Default::default()
        });
        publisher.publish(batch(vec![cs], Encoding::Keyed));
        eventually("c", || cached(&kv, pod, &c) == Some(8)).await;
        let m = metrics(&kv);
        assert!(m.contains("infergate_kv_events_gaps_total 1"), "{m}");
        if replay {
            assert_eq!(cached(&kv, pod, &a), Some(8), "a kept");
            assert_eq!(cached(&kv, pod, &b), Some(8), "b replayed");
            assert!(
                m.contains("infergate_kv_events_replays_total{outcome=\"ok\"} 2"),
                "{m}"
            );
        } else {
            assert_eq!(cached(&kv, pod, &a), Some(0), "a dropped with the reset");
            assert_eq!(cached(&kv, pod, &b), Some(0));
            assert!(
                m.contains("infergate_kv_events_resets_total{reason=\"gap\"} 1"),
                "{m}"
            );
        }
    }
}

#[tokio::test]
async fn a_restarted_engine_resets_the_pod() {
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "", 0)
        .await
        .unwrap();
    let addr = publisher.addr();
    let kv = KvEvents::new(cfg());
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, addr, None);
    eventually("the feed", || kv.index().stats().synced_pods == 1).await;
    let a = prompt(8);
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("a", || cached(&kv, pod, &a) == Some(8)).await;
    drop(publisher);
    // While the feed is down the pod is not listed: the approximate index stands in.
    eventually("the feed down", || cached(&kv, pod, &a).is_none()).await;
    let again = loop {
        match Publisher::bind(addr, None, "", 0).await {
            Ok(p) => break p,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    eventually("the feed back", || kv.index().stats().synced_pods == 1).await;
    // Reconnected without replay: what was known may be stale, so it was dropped.
    assert_eq!(cached(&kv, pod, &a), Some(0));
    let b: Vec<u32> = (5000..5008).collect();
    let bs = Event::Stored(Stored {
        block_hashes: vec![1, 2],
        token_ids: b.clone(),
        block_size: BS,
        ..Default::default()
    });
    again.publish(batch(vec![bs], Encoding::Positional));
    eventually("b", || cached(&kv, pod, &b) == Some(8)).await;
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_resets_total{reason=\"reconnect\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_hostile_peer_is_survived_and_bad_payloads_reset_the_pod() {
    use tokio::io::AsyncWriteExt;
    // A "publisher" answering garbage, then a frame size far over the limit.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        for i in 0.. {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            if i % 2 == 0 {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            } else {
                let mut g = [0u8; 64];
                g[0] = 0xff;
                g[9] = 0x7f;
                g[10] = 3;
                g[12..16].copy_from_slice(b"NULL");
                let _ = s.write_all(&g).await;
                let _ = s
                    .write_all(&[0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
                    .await;
            }
        }
    });
    let kv = KvEvents::new(cfg());
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, addr, None);
    eventually("failures", || {
        metrics(&kv).contains("infergate_kv_events_connect_failures_total 4")
    })
    .await;
    assert_eq!(kv.index().stats().synced_pods, 0);
    kv.remove_pod(pod);

    // A real publisher whose batch does not decode: the pod is reset, the feed goes on.
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "", 0)
        .await
        .unwrap();
    kv.add_pod_at(pod, publisher.addr(), None);
    eventually("the feed", || kv.index().stats().synced_pods == 1).await;
    let a = prompt(8);
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("a", || cached(&kv, pod, &a) == Some(8)).await;
    publisher.publish(vec![0x92, 0xc1, 0x90]);
    eventually("the reset", || cached(&kv, pod, &a) == Some(0)).await;
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("a again", || cached(&kv, pod, &a) == Some(8)).await;
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_decode_errors_total 1"),
        "{m}"
    );
    assert!(
        m.contains("infergate_kv_events_resets_total{reason=\"decode-error\"} 1"),
        "{m}"
    );
}

/// A replay socket answering exactly as vLLM's `ZmqEventPublisher._service_replay` does: per
/// buffered batch `[delimiter, seq, payload]` (no topic frame), then `[delimiter, -1, empty]`.
async fn vllm_replay_socket(buffer: Vec<(u64, Vec<u8>)>) -> SocketAddr {
    use infergate_kvevents::zmtp::{Connection, Limits, SocketType};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let buffer = buffer.clone();
            tokio::spawn(async move {
                let mut conn = Connection::handshake(s, SocketType::Router, Limits::default())
                    .await
                    .unwrap();
                let mut req = Vec::new();
                conn.recv(&mut req).await.unwrap();
                assert_eq!(req.len(), 2, "a DEALER's request: [delimiter, start seq]");
                let start = u64::from_be_bytes(req[1][..].try_into().unwrap());
                for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
                    conn.send(&[b"", &seq.to_be_bytes(), payload])
                        .await
                        .unwrap();
                }
                conn.send(&[b"", &(-1i64).to_be_bytes(), b""])
                    .await
                    .unwrap();
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_replay_in_vllms_own_frames_fills_the_index_on_a_first_connect() {
    let a = prompt(8);
    let b: Vec<u32> = (5000..5008).collect();
    let bs = Event::Stored(Stored {
        block_hashes: vec![50, 51],
        token_ids: b.clone(),
        block_size: BS,
        ..Default::default()
    });
    let replay = vllm_replay_socket(vec![
        (0, batch(vec![stored(&a, 0, 2)], Encoding::Keyed)),
        (1, batch(vec![bs], Encoding::Keyed)),
    ])
    .await;
    let publisher = Publisher::bind("127.0.0.1:0".parse().unwrap(), None, "", 0)
        .await
        .unwrap();
    let kv = KvEvents::new(SubscriberConfig {
        // Longer than the wait below: only an understood end marker ends this replay.
        replay_timeout: Duration::from_secs(60),
        ..cfg()
    });
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, publisher.addr(), Some(replay));
    eventually("the replayed blocks", || {
        cached(&kv, pod, &a) == Some(8) && cached(&kv, pod, &b) == Some(8)
    })
    .await;
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_replays_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("infergate_kv_events_decode_errors_total 0"),
        "{m}"
    );
    assert!(m.contains("infergate_kv_events_batches_total 2"), "{m}");
}

#[tokio::test]
async fn an_engine_restarted_behind_its_replay_socket_resets_the_pod() {
    let publisher = Publisher::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
        "",
        64,
    )
    .await
    .unwrap();
    let (addr, replay) = (publisher.addr(), publisher.replay_addr().unwrap());
    let kv = KvEvents::new(cfg());
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, addr, Some(replay));
    eventually("the feed", || kv.index().stats().synced_pods == 1).await;
    let a = prompt(8);
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("a", || cached(&kv, pod, &a) == Some(8)).await;
    drop(publisher);
    eventually("the feed down", || cached(&kv, pod, &a).is_none()).await;
    // The engine comes back with an empty cache and a replay buffer that starts over; it stays
    // idle, so no live batch reveals the restart.
    let again = loop {
        match Publisher::bind(addr, Some(replay), "", 64).await {
            Ok(p) => break p,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    eventually("the feed back", || kv.index().stats().synced_pods == 1).await;
    assert_eq!(
        cached(&kv, pod, &a),
        Some(0),
        "nothing of the old cache is left"
    );
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_resets_total{reason=\"restart\"} 1"),
        "{m}"
    );
    // What the restarted engine then stores is followed.
    again.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("a again", || cached(&kv, pod, &a) == Some(8)).await;
}

#[tokio::test]
async fn live_batches_measure_the_lag_from_the_engines_timestamp_and_replayed_ones_do_not() {
    let publisher = Publisher::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
        "",
        64,
    )
    .await
    .unwrap();
    let a = prompt(8);
    // Buffered before the subscriber connects, stamped long ago: replayed, not a lag.
    publisher.publish(batch(vec![stored(&a, 0, 1)], Encoding::Keyed));
    let kv = KvEvents::new(cfg());
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, publisher.addr(), publisher.replay_addr());
    eventually("the replay", || cached(&kv, pod, &a) == Some(4)).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let late = Batch {
        ts: now - 5.0,
        events: vec![stored(&a, 1, 1)],
        data_parallel_rank: None,
        unknown_events: 0,
    };
    publisher.publish(encode_batch(&late, Encoding::Keyed));
    eventually("the live batch", || cached(&kv, pod, &a) == Some(8)).await;
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_lag_seconds_count 1\n"),
        "{m}"
    );
    let sum: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("infergate_kv_events_lag_seconds_sum "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((5.0..15.0).contains(&sum), "{sum}");
}

#[tokio::test]
async fn a_publisher_on_another_topic_is_not_used_though_its_replay_was() {
    let publisher = Publisher::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
        "kv@other",
        64,
    )
    .await
    .unwrap();
    let a = prompt(8);
    // Buffered before the subscriber connects: the replay (which has no topic) brings it.
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    let kv = KvEvents::new(SubscriberConfig {
        topic: "kv@llama".into(),
        ..cfg()
    });
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, publisher.addr(), publisher.replay_addr());
    eventually("the replay", || cached(&kv, pod, &a) == Some(8)).await;
    // The first live batch shows the topic: the feed is not used, what it brought is dropped.
    publisher.publish(batch(vec![Event::AllCleared], Encoding::Keyed));
    eventually("the feed set aside", || cached(&kv, pod, &a).is_none()).await;
    assert_eq!(kv.index().pod_blocks(pod), 0);
    publisher.publish(batch(vec![stored(&a, 0, 2)], Encoding::Keyed));
    eventually("counted", || {
        metrics(&kv).contains("infergate_kv_events_other_topic_total 2")
    })
    .await;
    assert_eq!(cached(&kv, pod, &a), None, "still not used");
    let m = metrics(&kv);
    assert!(
        m.contains("infergate_kv_events_resets_total{reason=\"topic\"} 1"),
        "{m}"
    );
    assert!(m.contains("infergate_kv_events_connected_pods 0"), "{m}");
}
