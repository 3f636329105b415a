use super::*;

#[test]
fn connections_beyond_the_limit_are_refused_and_counted() {
    let c = Counters::default();
    let a = c.open_connection(2).unwrap();
    let _b = c.open_connection(2).unwrap();
    assert!(c.open_connection(2).is_none());
    assert_eq!(c.connections.get(), 2);
    assert_eq!(c.connections_refused.get(), 1);
    drop(a);
    assert_eq!(c.connections.get(), 1);
    assert!(c.open_connection(2).is_some());
    // An absurd limit is "no limit", not an overflow.
    assert!(c.open_connection(usize::MAX).is_some());
}

#[test]
fn requests_beyond_the_limit_are_busy_with_retry_after() {
    let c = Counters::default();
    let s = c.start_request(1).unwrap();
    let e = c.start_request(1).err().unwrap();
    assert_eq!(e.status(), 503);
    assert_eq!(e.metric_label(), "gateway_busy");
    assert_eq!(e.retry_after_secs(), Some(1));
    drop(s);
    assert_eq!(c.in_flight.get(), 0);
}

#[test]
fn a_charge_grows_within_the_budget_and_is_given_back_when_dropped() {
    let c = Counters::default();
    assert!(charge(&c.buffered, 60, 100));
    let mut held = BufferCharge {
        gauge: c.buffered.clone(),
        bytes: 60,
    };
    assert!(held.grow_to(100, 100));
    assert!(!held.grow_to(101, 100));
    assert_eq!(c.buffered.get(), 100);
    assert!(!charge(&c.buffered, 1, 100));
    assert_eq!(c.buffered.get(), 100);
    drop(held);
    assert_eq!(c.buffered.get(), 0);
    // Values beyond i64 saturate instead of wrapping.
    assert!(!charge(&c.buffered, i64::MAX, 10));
    assert_eq!(to_i64(u64::MAX), i64::MAX);
    assert_eq!(c.buffered.get(), 0);
}

#[test]
fn absurd_limits_build_a_connection_builder_without_panicking() {
    let limits = Limits {
        max_header_bytes: 0,
        header_read_timeout_ms: u64::MAX,
        body_read_timeout_ms: u64::MAX,
        http2: crate::config::Http2Limits {
            max_concurrent_streams: u32::MAX,
            keep_alive_interval_ms: u64::MAX,
            keep_alive_timeout_ms: u64::MAX,
            max_pending_accept_reset_streams: usize::MAX,
            max_local_error_reset_streams: usize::MAX,
        },
        ..Limits::default()
    };
    assert_eq!(limits.header_bytes(), crate::config::MIN_HEADER_BYTES);
    assert_eq!(limits.body_read_timeout(), crate::config::MAX_DURATION);
    let _ = http_builder(&limits);
    let limits = Limits {
        max_header_bytes: usize::MAX,
        ..Limits::default()
    };
    assert_eq!(limits.header_bytes(), crate::config::MAX_HEADER_BYTES);
    let _ = http_builder(&limits);
}
