//! The `limits:` section: what one client, and all clients together, may make the gateway hold.
//!
//! Every limit has a default that is safe on a public port, and every value is either validated
//! (zero where zero means nothing could be served is refused, naming the field, as is a
//! `maxHeaderBytes` the gateway cannot honour) or clamped to what the runtime can represent
//! (durations, to a week), so no configuration value can make the gateway panic.
//!
//! ```yaml
//! limits:
//!   maxRequestBodyBytes: 4194304        # 413 above it
//!   maxConcurrentRequests: 256          # per model (default for models[].limits), 429 above it
//!   maxConnections: 10000               # per process; one more is accepted and closed at once
//!   maxRequestsInFlight: 4096           # whole gateway, taken before the body is read; 503
//!   maxBufferedRequestBytes: 268435456  # request bodies held at once, all connections; 503
//!   maxHeaderBytes: 65536               # request head (HTTP/1) / header list (HTTP/2); 431
//!   headerReadTimeoutMs: 10000          # until a request's head is complete; closed after
//!   bodyReadTimeoutMs: 30000            # until the whole body has arrived; 408
//!   http2: { maxConcurrentStreams: 100, keepAliveIntervalMs: 20000, keepAliveTimeoutMs: 10000,
//!            maxPendingAcceptResetStreams: 20, maxLocalErrorResetStreams: 256 }
//! ```

use std::time::Duration;

use serde::Deserialize;

/// Default cap on a request body: 4 MiB, enough for a long chat history.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Default `maxConnections`: open client connections per gateway process.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Default `maxRequestsInFlight`: requests the whole gateway holds at once.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: usize = 4_096;

/// Default `maxBufferedRequestBytes`: 256 MiB of request bodies held at once.
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: u64 = 256 << 20;

/// Default `maxHeaderBytes`: 64 KiB of request head.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;

/// The smallest `maxHeaderBytes` accepted: hyper's HTTP/1 parser reads a request head into a
/// buffer of at most `maxHeaderBytes`, and refuses (panics on) a buffer below 8 KiB, so a smaller
/// head limit could not be enforced. A file asking for less is refused.
pub const MIN_HEADER_BYTES: usize = 8 << 10;

/// The largest `maxHeaderBytes` accepted: 16 MiB, the `h2` crate's own ceiling when a peer sets
/// none. Every connection may hold a head this large while it arrives, so `maxConnections` heads of
/// more would be a memory bound in name only; no client needs one. A file asking for more is
/// refused.
pub const MAX_HEADER_BYTES: usize = 16 << 20;

/// Default `headerReadTimeoutMs`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `bodyReadTimeoutMs`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest duration any `...Ms` setting is taken to mean (longer values are clamped to it):
/// a week is "forever" for a request, and deadlines computed from it cannot overflow a clock.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Request limits.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    /// Larger request bodies are answered 413 (read on and discarded first when they end within
    /// twice the limit; never kept).
    pub max_request_body_bytes: usize,
    /// The default for every model's `models[].limits.maxConcurrentRequests` (each model counts
    /// its own requests, after the body is parsed, since the model is named in the body; with
    /// flow control a model at its limit queues rather than refuses); `None`, the default, sets
    /// no limit.
    pub max_concurrent_requests: Option<u32>,
    /// Open client connections per process, all workers together. A connection beyond it is
    /// accepted and closed at once (the client sees the connection end before any response),
    /// and counted in `infergate_gateway_connections_refused_total`.
    pub max_connections: usize,
    /// Requests the whole gateway serves at once, every model together, from the complete
    /// request head to the last response byte. Taken *before* the body is read, so no client can
    /// make the gateway read more bodies than this; one more is answered 503 `gateway_busy`
    /// with `Retry-After: 1`.
    pub max_requests_in_flight: usize,
    /// Bytes of request bodies held at once, every connection together. A request is charged its
    /// declared `content-length` before its body is read (a chunked body is charged as it
    /// arrives); one that does not fit is answered 503 `buffer_budget_exhausted` with
    /// `Retry-After: 1`, so many large uploads at once are refused, never an out-of-memory kill.
    pub max_buffered_request_bytes: u64,
    /// The largest request head: HTTP/1 request line and headers (answered 431 by the HTTP/1
    /// parser) and the HTTP/2 header list (`SETTINGS_MAX_HEADER_LIST_SIZE`, answered 431).
    /// A file's value outside [`MIN_HEADER_BYTES`]..=[`MAX_HEADER_BYTES`] is refused (see
    /// [`Limits::header_bytes`] for one set in code).
    pub max_header_bytes: usize,
    /// How long a request's head may take to arrive, in milliseconds. HTTP/1: from the moment
    /// the connection waits for a request (also between keep-alive requests) to the end of the
    /// head; the connection is closed after it. Both protocols: a new connection that has not
    /// completed one request head within it is closed.
    pub header_read_timeout_ms: u64,
    /// How long the whole request body may take to arrive, in milliseconds, from the end of the
    /// head; answered 408 `request_timeout` after it.
    pub body_read_timeout_ms: u64,
    /// HTTP/2 connection settings.
    pub http2: Http2Limits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_concurrent_requests: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            max_buffered_request_bytes: DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            header_read_timeout_ms: millis(DEFAULT_HEADER_READ_TIMEOUT),
            body_read_timeout_ms: millis(DEFAULT_BODY_READ_TIMEOUT),
            http2: Http2Limits::default(),
        }
    }
}

/// HTTP/2 settings of client connections.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Http2Limits {
    /// Streams a client may have open on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`);
    /// a stream beyond it is reset with `REFUSED_STREAM`. Default 100.
    pub max_concurrent_streams: u32,
    /// How often an idle connection is pinged, in milliseconds; 0 sends no pings. Default 20 s.
    pub keep_alive_interval_ms: u64,
    /// How long a ping may go unanswered before the connection is closed. Default 10 s.
    pub keep_alive_timeout_ms: u64,
    /// Streams the client opened and reset before the gateway accepted them, kept at once
    /// before the connection is closed with `ENHANCE_YOUR_CALM` (the "rapid reset" attack,
    /// CVE-2023-44487). Default 20.
    pub max_pending_accept_reset_streams: usize,
    /// Streams the gateway itself reset because of the client's protocol errors before the
    /// connection is closed (CVE-2024-27316-style floods). Default 256.
    pub max_local_error_reset_streams: usize,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Http2Limits {
            max_concurrent_streams: 100,
            keep_alive_interval_ms: 20_000,
            keep_alive_timeout_ms: 10_000,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 256,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `ms` as a duration, clamped to [`MAX_DURATION`].
pub fn clamped_millis(ms: u64) -> Duration {
    Duration::from_millis(ms).min(MAX_DURATION)
}

impl Limits {
    /// `headerReadTimeoutMs` as a duration (clamped).
    pub fn header_read_timeout(&self) -> Duration {
        clamped_millis(self.header_read_timeout_ms)
    }

    /// `bodyReadTimeoutMs` as a duration (clamped).
    pub fn body_read_timeout(&self) -> Duration {
        clamped_millis(self.body_read_timeout_ms)
    }

    /// `maxHeaderBytes`. A file's value is within [`MIN_HEADER_BYTES`]..=[`MAX_HEADER_BYTES`]
    /// (refused otherwise); one set in code without validation is clamped to it, since hyper
    /// panics below the minimum.
    pub fn header_bytes(&self) -> usize {
        self.max_header_bytes
            .clamp(MIN_HEADER_BYTES, MAX_HEADER_BYTES)
    }

    /// Refuses the values under which nothing could be served, naming the field.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let zero = [
            ("maxRequestBodyBytes", self.max_request_body_bytes == 0),
            ("maxConnections", self.max_connections == 0),
            ("maxRequestsInFlight", self.max_requests_in_flight == 0),
            (
                "maxBufferedRequestBytes",
                self.max_buffered_request_bytes == 0,
            ),
            ("headerReadTimeoutMs", self.header_read_timeout_ms == 0),
            ("bodyReadTimeoutMs", self.body_read_timeout_ms == 0),
            (
                "http2.maxConcurrentStreams",
                self.http2.max_concurrent_streams == 0,
            ),
            (
                "http2.keepAliveTimeoutMs",
                self.http2.keep_alive_timeout_ms == 0,
            ),
        ];
        if let Some((field, _)) = zero.iter().find(|(_, z)| *z) {
            return Err(format!("`limits.{field}` must be above zero"));
        }
        if let Some(problem) = header_bytes_problem(self.max_header_bytes) {
            return Err(format!("`limits.maxHeaderBytes` {problem}"));
        }
        if self.max_concurrent_requests == Some(0) {
            return Err(
                "`limits.maxConcurrentRequests` must be at least 1 (leave it out for no limit)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Why a `maxHeaderBytes` of `bytes` cannot be honoured, if it cannot (outside
/// [`MIN_HEADER_BYTES`]..=[`MAX_HEADER_BYTES`]), each bound with its reason: the words after the
/// field's name, for the gateway's and the global router's file checks alike.
pub fn header_bytes_problem(bytes: usize) -> Option<String> {
    if bytes < MIN_HEADER_BYTES {
        Some(format!(
            "is {bytes}, below the least that can be enforced, {MIN_HEADER_BYTES} (8 KiB): the \
             HTTP/1 parser (hyper) reads a request head into a buffer that cannot be smaller"
        ))
    } else if bytes > MAX_HEADER_BYTES {
        Some(format!(
            "is {bytes}, above the most accepted, {MAX_HEADER_BYTES} (16 MiB): every open \
             connection may hold a request head this large while it arrives"
        ))
    } else {
        None
    }
}

impl Http2Limits {
    /// `keepAliveIntervalMs` as a duration; `None` when pings are off.
    pub fn keep_alive_interval(&self) -> Option<Duration> {
        (self.keep_alive_interval_ms > 0).then(|| clamped_millis(self.keep_alive_interval_ms))
    }

    /// `keepAliveTimeoutMs` as a duration (clamped).
    pub fn keep_alive_timeout(&self) -> Duration {
        clamped_millis(self.keep_alive_timeout_ms)
    }
}

#[cfg(test)]
mod tests;
