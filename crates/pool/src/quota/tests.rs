//! The service on tokio's paused clock, without Redis (shared counting is tested against a real
//! `redis-server` in `tests/quota.rs`).

use std::time::Duration;

use prometheus_client::encoding::text::encode;

use super::*;

fn limits(requests: Option<u64>, tokens: Option<u64>) -> Limits {
    Limits { requests, tokens }
}

fn service(registry: Option<&mut Registry>) -> Quotas {
    let config = QuotaConfig {
        tenants: vec![
            (Arc::from("team-a"), limits(Some(2), None)),
            (Arc::from("team-b"), limits(None, Some(1000))),
        ],
        default: Some(limits(Some(1), None)),
        max_tenants: 2,
        ..QuotaConfig::default()
    };
    // 10:00:00.250 on some day: buckets start on whole seconds.
    Quotas::start_with_clock(config, WallClock::starting_at(1_800_000_000_250), registry).unwrap()
}

fn retry_after(e: &ApiError) -> Duration {
    match e {
        ApiError::QuotaExceeded { retry_after, .. } => *retry_after,
        other => panic!("not a quota refusal: {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_quota_refuses_with_the_exact_wait() {
    let q = service(None);
    assert!(
        q.admit("team-a", 10)
            .unwrap()
            .map(QuotaTicket::commit)
            .is_some()
    );
    tokio::time::advance(Duration::from_millis(20_000)).await;
    assert!(
        q.admit("team-a", 10)
            .unwrap()
            .map(QuotaTicket::commit)
            .is_some()
    );
    tokio::time::advance(Duration::from_millis(5_000)).await;
    let e = q.admit("team-a", 10).unwrap_err();
    assert_eq!(e.status(), 429);
    // The first use, at 0.25 s into its bucket, leaves with that bucket at 60 s after the
    // bucket's start: 60 - 25.25 = 34.75 s from now.
    assert_eq!(retry_after(&e), Duration::from_millis(34_750));
    assert_eq!(e.retry_after_secs(), Some(35));
    assert_eq!(e.reason(), Some("rejected-quota-requests"));
    tokio::time::advance(Duration::from_millis(34_749)).await;
    assert!(q.admit("team-a", 10).is_err());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(
        q.admit("team-a", 10)
            .unwrap()
            .map(QuotaTicket::commit)
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn tokens_count_what_the_response_reported() {
    let q = service(None);
    let t = q.admit("team-b", 900).unwrap().unwrap();
    assert_eq!(t.charge().tokens, 900);
    // Before the answer, the estimate holds the window.
    let e = q.admit("team-b", 200).unwrap_err();
    assert_eq!(e.reason(), Some("rejected-quota-tokens"));
    t.settle(&Usage {
        prompt_tokens: 120,
        completion_tokens: 30,
        ..Usage::default()
    });
    // 150 counted: 850 left.
    let t = q.admit("team-b", 850).unwrap().unwrap();
    let e = q.admit("team-b", 1).unwrap_err();
    assert_eq!(retry_after(&e), Duration::from_millis(59_750));
    // An answer that reported nothing leaves the estimate counted.
    drop(t.commit());
    assert!(q.admit("team-b", 1).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_whole_token_quota_waits_for_an_empty_window() {
    let q = service(None);
    q.admit("team-b", 100).unwrap().map(QuotaTicket::commit);
    tokio::time::advance(Duration::from_millis(10_000)).await;
    // 5,000 tokens against a quota of 1,000: charged the limit, it fits only once the 100
    // tokens counted 10 s ago have left the window, and the refusal says that, not that the
    // tenant used its quota (it used a tenth of it).
    let e = q.admit("team-b", 5_000).unwrap_err();
    assert_eq!(e.status(), 429);
    assert_eq!(e.reason(), Some("rejected-quota-tokens"));
    assert_eq!(retry_after(&e), Duration::from_millis(49_750));
    assert_eq!(
        e.to_string(),
        "the request alone needs an estimated 5000 tokens (prompt and output), more than tenant \
         `team-b`'s whole quota of 1000 tokens per 60 s: it can run only once the window holds \
         none of the tenant's tokens: retry after 50 s, or send a shorter prompt or a lower \
         max_tokens"
    );
    // A request within the limit refused by the same use keeps the usual message.
    let e = q.admit("team-b", 950).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("tenant `team-b` has used its quota of 1000 tokens"),
        "{e}"
    );
    tokio::time::advance(Duration::from_millis(49_750)).await;
    let t = q.admit("team-b", 5_000).unwrap().unwrap();
    assert_eq!(t.charge().tokens, 1_000);
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_further_on_is_not_counted() {
    let q = service(None);
    let t = q.admit("team-a", 1).unwrap().unwrap();
    drop(t);
    assert!(q.admit("team-a", 1).unwrap().is_some_and(|t| {
        drop(t.commit());
        true
    }));
    let t = q.admit("team-a", 1).unwrap().unwrap().commit();
    drop(t);
    assert!(q.admit("team-a", 1).is_err());
}

#[tokio::test(start_paused = true)]
async fn unlisted_tenants_get_the_default_each_and_share_beyond_the_cap() {
    let mut registry = Registry::default();
    let q = service(Some(&mut registry));
    // Each unlisted tenant has its own default window (1 request) ...
    assert!(q.admit("x", 1).unwrap().map(QuotaTicket::commit).is_some());
    assert!(q.admit("y", 1).unwrap().map(QuotaTicket::commit).is_some());
    assert!(q.admit("x", 1).is_err());
    // ... up to `max_tenants` (2); the third shares the overflow window.
    assert!(q.admit("z", 1).unwrap().map(QuotaTicket::commit).is_some());
    assert!(q.admit("w", 1).is_err());
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"infergate_quota_requests_total{tenant="other",outcome="admitted"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"infergate_quota_requests_total{tenant="other",outcome="rejected_requests"} 2"#
        ),
        "{text}"
    );
    // Counting alone by configuration: no Redis series to read as "Redis down".
    assert!(!text.contains("infergate_quota_redis"), "{text}");
    assert!(!text.contains("infergate_quota_replicas"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn no_default_means_unlisted_tenants_are_not_limited() {
    let q = Quotas::start(
        QuotaConfig {
            tenants: vec![(Arc::from("a"), limits(Some(1), None))],
            ..QuotaConfig::default()
        },
        None,
    )
    .unwrap();
    for _ in 0..10 {
        assert!(q.admit("b", 1).unwrap().is_none());
    }
    assert!(q.admit("a", 1).unwrap().map(QuotaTicket::commit).is_some());
    assert!(q.admit("a", 1).is_err());
}

#[test]
fn a_window_that_cannot_be_bucketed_is_refused_at_start() {
    let e = Quotas::start(
        QuotaConfig {
            window: Duration::from_millis(1001),
            ..QuotaConfig::default()
        },
        None,
    )
    .unwrap_err();
    assert!(matches!(e, QuotaError::BadWindow { .. }), "{e}");
}

/// The replies of one sync round for `team-a`'s request window: no counter updates, the presence
/// replies (`zcard` replicas in the round-time set, the oldest round `oldest`), one `MGET`.
fn round_replies(zcard: Value, oldest: Value, mget: Value) -> Vec<Value> {
    vec![
        Value::Int(1),
        Value::Int(0),
        Value::Int(1),
        zcard,
        oldest,
        Value::Int(1),
        Value::Int(1),
        Value::Int(1),
        Value::Int(0),
        // The window layout Redis holds.
        Value::Bulk(b"windowMs=60000 buckets=60".to_vec()),
        mget,
    ]
}

#[tokio::test(start_paused = true)]
async fn a_sync_round_with_a_malformed_reply_applies_nothing() {
    let q = service(None);
    let now = q.clock().now_ms();
    let entry = Arc::clone(&q.inner.configured["team-a"]);
    let epochs = entry.lock().windows_mut().0.live_epochs(now);
    let readings = [Reading {
        entry: Arc::clone(&entry),
        kind: QuotaKind::Requests,
        epochs: epochs.clone(),
    }];
    let totals = |v: i64| Value::Array(epochs.clone().map(|_| Value::Int(v)).collect());
    let oldest = Value::Array(vec![
        Value::Bulk(b"replica-b".to_vec()),
        Value::Bulk(now.to_string().into_bytes()),
    ]);
    let bad: [(&str, Vec<Value>, usize); 6] = [
        (
            "one reply short",
            round_replies(Value::Int(2), oldest.clone(), totals(1))[..10].to_vec(),
            0,
        ),
        (
            "a counter update refused",
            [
                vec![Value::Error("OOM".into())],
                round_replies(Value::Int(2), oldest.clone(), totals(1)),
            ]
            .concat(),
            1,
        ),
        (
            "a presence command refused",
            round_replies(Value::Error("WRONGTYPE".into()), oldest.clone(), totals(1)),
            0,
        ),
        (
            "ZCARD not an integer",
            round_replies(Value::Bulk(b"two".to_vec()), oldest.clone(), totals(1)),
            0,
        ),
        (
            "ZRANGE not an array",
            round_replies(Value::Int(2), Value::Int(7), totals(1)),
            0,
        ),
        (
            "MGET not an array",
            round_replies(Value::Int(2), oldest.clone(), Value::Int(1)),
            0,
        ),
    ];
    for (what, values, writes) in bad {
        let err = apply(&q.inner, now, &readings, writes, &values, true).unwrap_err();
        if writes > 0 {
            // Redis's own words reach the log (a server without scripting says so there).
            assert!(err.contains("OOM"), "{what}: {err}");
        }
        assert_eq!(q.replicas(), 1, "{what}: the replica count moved");
        assert_eq!(
            entry.lock().requests().count(now, 1),
            0,
            "{what}: totals applied"
        );
    }
    // A well-formed round applies; a round time that is not a number only means every recent
    // round stays covered.
    for oldest in [
        oldest,
        Value::Array(vec![
            Value::Bulk(b"b".to_vec()),
            Value::Bulk(b"soon".to_vec()),
        ]),
    ] {
        let values = round_replies(Value::Int(2), oldest, totals(1));
        apply(&q.inner, now, &readings, 0, &values, true).unwrap();
        assert_eq!(q.replicas(), 2);
        assert_eq!(
            entry.lock().requests().count(now, 2),
            epochs.clone().count() as u64
        );
    }
}

/// Leaving at shutdown is bounded: a Redis that accepts the connection and never answers holds
/// the leave [`LEAVE_TIMEOUT`], however long the configured timeouts.
#[tokio::test(start_paused = true)]
async fn leaving_a_redis_that_never_answers_takes_at_most_the_leave_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let mut redis = RedisConfig::new(addr.to_string());
    redis.connect_timeout = Duration::from_secs(30);
    redis.command_timeout = Duration::from_secs(30);
    let shared = SharedConfig {
        redis,
        key_prefix: String::from("t:"),
        sync_interval: Duration::from_millis(50),
    };
    // A link never connected, as one closed by a failed round: the leave connects afresh.
    let mut link = Redis::new(shared.redis.clone());
    let start = tokio::time::Instant::now();
    leave(&mut link, &shared, "replica-1", 1_800_000_000_250).await;
    assert_eq!(start.elapsed(), LEAVE_TIMEOUT);
    silent.abort();
}
