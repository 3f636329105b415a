use super::*;
use crate::config::GatewayConfig;

fn parse(limits: &str) -> Result<GatewayConfig, String> {
    GatewayConfig::from_yaml(&format!(
        "auth: none\nlimits: {limits}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:1]\n"
    ))
    .map_err(|e| e.to_string())
}

#[test]
fn defaults_are_the_documented_ones() {
    let l = parse("{}").unwrap().limits;
    assert_eq!(l.max_request_body_bytes, 4 << 20);
    assert_eq!(l.max_concurrent_requests, None);
    assert_eq!(l.max_connections, 10_000);
    assert_eq!(l.max_requests_in_flight, 4_096);
    assert_eq!(l.max_buffered_request_bytes, 256 << 20);
    assert_eq!(l.header_bytes(), 64 << 10);
    assert_eq!(l.header_read_timeout(), Duration::from_secs(10));
    assert_eq!(l.body_read_timeout(), Duration::from_secs(30));
    assert_eq!(l.http2.max_concurrent_streams, 100);
    assert_eq!(l.http2.keep_alive_interval(), Some(Duration::from_secs(20)));
    assert_eq!(l.http2.keep_alive_timeout(), Duration::from_secs(10));
    assert_eq!(l.http2.max_pending_accept_reset_streams, 20);
    assert_eq!(l.http2.max_local_error_reset_streams, 256);
}

#[test]
fn every_field_is_read() {
    let l = parse(
        "{ maxConnections: 5, maxRequestsInFlight: 6, maxBufferedRequestBytes: 7, \
         maxHeaderBytes: 10000, headerReadTimeoutMs: 1500, bodyReadTimeoutMs: 2500, \
         http2: { maxConcurrentStreams: 3, keepAliveIntervalMs: 0, keepAliveTimeoutMs: 400, \
         maxPendingAcceptResetStreams: 1, maxLocalErrorResetStreams: 2 } }",
    )
    .unwrap()
    .limits;
    assert_eq!(
        (
            l.max_connections,
            l.max_requests_in_flight,
            l.max_buffered_request_bytes
        ),
        (5, 6, 7)
    );
    assert_eq!(l.header_bytes(), 10_000);
    assert_eq!(l.header_read_timeout(), Duration::from_millis(1500));
    assert_eq!(l.body_read_timeout(), Duration::from_millis(2500));
    assert_eq!(l.http2.max_concurrent_streams, 3);
    assert_eq!(l.http2.keep_alive_interval(), None);
    assert_eq!(l.http2.keep_alive_timeout(), Duration::from_millis(400));
}

#[test]
fn a_zero_that_would_serve_nothing_is_refused_by_name() {
    for field in [
        "maxConnections",
        "maxRequestsInFlight",
        "maxBufferedRequestBytes",
        "headerReadTimeoutMs",
        "bodyReadTimeoutMs",
        "maxRequestBodyBytes",
    ] {
        let e = parse(&format!("{{ {field}: 0 }}")).unwrap_err();
        assert!(
            e.contains(&format!("`limits.{field}` must be above zero")),
            "{e}"
        );
    }
    let e = parse("{ http2: { maxConcurrentStreams: 0 } }").unwrap_err();
    assert!(e.contains("`limits.http2.maxConcurrentStreams`"), "{e}");
    let e = parse("{ maxConections: 3 }").unwrap_err();
    assert!(e.contains("maxConections"), "{e}");
}

#[test]
fn absurd_values_are_clamped_not_a_panic() {
    let max = u64::MAX;
    let c = parse(&format!(
        "{{ maxConnections: {max}, maxRequestsInFlight: {max}, maxBufferedRequestBytes: {max}, \
         headerReadTimeoutMs: {max}, bodyReadTimeoutMs: {max}, \
         http2: {{ keepAliveIntervalMs: {max}, keepAliveTimeoutMs: {max} }} }}"
    ))
    .unwrap();
    let l = &c.limits;
    assert_eq!(l.header_read_timeout(), MAX_DURATION);
    assert_eq!(l.body_read_timeout(), MAX_DURATION);
    assert_eq!(l.http2.keep_alive_interval(), Some(MAX_DURATION));
    assert_eq!(l.http2.keep_alive_timeout(), MAX_DURATION);
    // Deadlines computed from the clamped values do not overflow the clock.
    let now = tokio::time::Instant::now();
    let _ = now + l.body_read_timeout();
    let t = GatewayConfig::from_yaml(&format!(
        "auth: none\ntimeouts: {{ connectMs: {max}, firstByteMs: {max}, idleMs: {max}, \
         poolIdleMs: {max} }}\nmodels:\n  - name: m\n"
    ))
    .unwrap()
    .timeouts;
    assert_eq!(t.idle, MAX_DURATION);
    let _ = now + t.idle + t.first_byte + t.connect;
}

/// A `maxHeaderBytes` the gateway cannot honour is refused, naming the field, the value and the
/// bound with its reason, where it used to be raised or lowered without a word; the bounds
/// themselves are accepted.
#[test]
fn a_header_limit_outside_what_can_be_enforced_is_refused_naming_the_bound() {
    for (value, bound, why) in [
        (0_u64, "8192 (8 KiB)", "HTTP/1 parser"),
        (1, "8192 (8 KiB)", "HTTP/1 parser"),
        (8191, "8192 (8 KiB)", "HTTP/1 parser"),
        ((16 << 20) + 1, "16777216 (16 MiB)", "every open connection"),
        (u64::MAX, "16777216 (16 MiB)", "every open connection"),
    ] {
        let e = parse(&format!("{{ maxHeaderBytes: {value} }}")).unwrap_err();
        assert!(
            e.contains(&format!("`limits.maxHeaderBytes` is {value}")),
            "{value}: {e}"
        );
        assert!(e.contains(bound) && e.contains(why), "{value}: {e}");
    }
    for ok in [MIN_HEADER_BYTES, MAX_HEADER_BYTES] {
        let l = parse(&format!("{{ maxHeaderBytes: {ok} }}"))
            .unwrap()
            .limits;
        assert_eq!(l.header_bytes(), ok);
    }
}
