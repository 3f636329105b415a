//! What the subscriber logs about a pod's feed, read back through a captured log. Alone in its
//! binary: tracing caches each log line's interest from whichever thread reaches it first, so a
//! test running beside others on their own threads (with no subscriber) would miss lines.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use infergate_kvevents::publish::Publisher;
use infergate_kvevents::{KvEvents, SubscriberConfig};
use infergate_testkit::eventually;
use prometheus_client::registry::Registry;

const POD: &str = "127.0.0.1:8000";

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

#[tokio::test]
async fn a_feed_that_is_unreachable_lost_or_not_replayed_is_logged_once_at_warn() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    // Nothing listens yet: several failed connects, one warning.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let no_replay = dead.local_addr().unwrap();
    drop(dead);
    let kv = KvEvents::new(cfg());
    let pod: SocketAddr = POD.parse().unwrap();
    kv.add_pod_at(pod, addr, Some(no_replay));
    eventually("failures", || {
        metrics(&kv).contains("infergate_kv_events_connect_failures_total 3")
    })
    .await;
    let text = out.text();
    assert_eq!(text.matches(" WARN ").count(), 1, "{text}");
    assert!(text.contains("kv-events: feed down"), "{text}");
    assert!(text.contains(&format!("events={addr}")), "{text}");
    // The engine comes up without its replay socket: the replay's failure is a warning, the
    // feed in sequence an info line.
    let publisher = loop {
        match Publisher::bind(addr, None, "", 0).await {
            Ok(p) => break p,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    eventually("the feed", || kv.index().stats().synced_pods == 1).await;
    let text = out.text();
    assert!(text.contains("kv-events: replay failed"), "{text}");
    assert!(
        text.contains("kv-events: feed connected and in sequence"),
        "{text}"
    );
    // Lost once it was in sequence: a warning again.
    let before = out.text().matches(" WARN ").count();
    drop(publisher);
    eventually("the feed down", || kv.index().stats().synced_pods == 0).await;
    eventually("the warning", || {
        out.text().matches(" WARN ").count() == before + 1
    })
    .await;
}
