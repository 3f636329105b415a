//! What keeps hostile or merely careless clients from exhausting the gateway: the runtime side
//! of the `limits:` section (its fields and defaults are in `config::Limits`).
//!
//! - **Connections** ([`Counters::open_connection`]): one counter for the whole process, shared
//!   by every worker. A connection beyond `maxConnections` is accepted and closed at once rather
//!   than left in the kernel's backlog: the client learns immediately, the backlog keeps room for
//!   the connections that will be served, and the refusal is counted.
//! - **Head timeout** ([`no_request_within`]): hyper bounds an HTTP/1 head with
//!   `header_read_timeout`; HTTP/2 has no such bound per stream, so every new connection, of
//!   either protocol, must complete one request head within `headerReadTimeoutMs` or is closed.
//!   After that, HTTP/2 keep-alive pings (and `maxConcurrentStreams`) bound what an established
//!   connection may hold.
//! - **Requests in flight** ([`Counters::start_request`]): taken before the body is read, so the
//!   number of bodies being read at once is bounded whatever the per-model limits (which need the
//!   body's `model` and are taken after parsing).
//! - **Buffered bytes** ([`read_body`]): every request body the gateway holds is charged to one
//!   process-wide budget before it is read (its declared `content-length`, or as it arrives when
//!   chunked); the whole body must arrive within `bodyReadTimeoutMs`.
//!
//! The counters are the exported gauges themselves (`infergate_gateway_connections_open`,
//! `..._requests_in_flight`, `..._buffered_request_bytes`): one atomic add per event, no lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use infergate_openai::ApiError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::Limits;

/// How long a client refused by `maxRequestsInFlight` or `maxBufferedRequestBytes` is told to
/// wait (`Retry-After`, whole seconds): these drain as fast as requests finish.
pub(crate) const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The process-wide counters behind the limits. Cloning shares them.
#[derive(Clone, Default)]
pub(crate) struct Counters {
    /// Open client connections.
    pub(crate) connections: Gauge,
    /// Connections closed at once because `maxConnections` were open.
    pub(crate) connections_refused: Counter,
    /// Connections closed because no request head arrived within `headerReadTimeoutMs`.
    pub(crate) header_timeouts: Counter,
    /// Requests between their complete head and their last response byte.
    pub(crate) in_flight: Gauge,
    /// Request body bytes charged to the budget.
    pub(crate) buffered: Gauge,
    /// Slots taken over the limit by requests above Sheddable from queued Sheddable ones.
    pub(crate) slots_taken_over: Counter,
}

/// One open connection; dropping it frees the slot.
pub(crate) struct ConnectionSlot(Gauge);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One request in flight; dropping it (when the response ends, fails or is abandoned) frees it.
pub(crate) struct RequestSlot(Gauge);

impl Drop for RequestSlot {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Bytes of one request body charged to the buffered-bytes budget; dropping it gives them back.
pub struct BufferCharge {
    gauge: Gauge,
    bytes: i64,
}

impl BufferCharge {
    /// Raises the charge to `total` bytes if the budget `max` allows it.
    fn grow_to(&mut self, total: i64, max: i64) -> bool {
        let delta = total - self.bytes;
        if delta <= 0 {
            return true;
        }
        if !charge(&self.gauge, delta, max) {
            return false;
        }
        self.bytes = total;
        true
    }
}

impl Drop for BufferCharge {
    fn drop(&mut self) {
        self.gauge.dec_by(self.bytes);
    }
}

/// Adds `n` to `gauge` unless that takes it over `max`.
fn charge(gauge: &Gauge, n: i64, max: i64) -> bool {
    let before = gauge.inc_by(n);
    if before.saturating_add(n) > max {
        gauge.dec_by(n);
        return false;
    }
    true
}

fn to_i64<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl Counters {
    /// Opens one more connection, or `None` (counted) when `max` are open.
    pub(crate) fn open_connection(&self, max: usize) -> Option<ConnectionSlot> {
        if charge(&self.connections, 1, to_i64(max)) {
            Some(ConnectionSlot(self.connections.clone()))
        } else {
            self.connections_refused.inc();
            None
        }
    }

    /// Starts one more request whatever the limit: for one that takes over the slot of a queued
    /// request just evicted, which frees it as it answers.
    pub(crate) fn start_request_over_limit(&self) -> RequestSlot {
        self.in_flight.inc();
        self.slots_taken_over.inc();
        RequestSlot(self.in_flight.clone())
    }

    /// Starts one more request, or answers `gateway_busy` when `max` are in flight.
    pub(crate) fn start_request(&self, max: usize) -> Result<RequestSlot, ApiError> {
        if charge(&self.in_flight, 1, to_i64(max)) {
            Ok(RequestSlot(self.in_flight.clone()))
        } else {
            Err(ApiError::GatewayBusy {
                limit: max,
                retry_after: BUSY_RETRY_AFTER,
            })
        }
    }
}

/// The HTTP/1 and HTTP/2 settings of client connections, from `limits`.
pub(crate) fn http_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let header_bytes = limits.header_bytes();
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Some(limits.header_read_timeout()))
        .max_buf_size(header_bytes);
    let h2 = &limits.http2;
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(h2.max_concurrent_streams)
        .keep_alive_interval(h2.keep_alive_interval())
        .keep_alive_timeout(h2.keep_alive_timeout())
        .max_header_list_size(u32::try_from(header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(h2.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(h2.max_local_error_reset_streams);
    builder
}

/// Marks that a connection has produced a complete request head (set by its service).
#[derive(Clone, Default)]
pub(crate) struct FirstRequest(Arc<AtomicBool>);

impl FirstRequest {
    /// Called for every request head; cheap after the first.
    pub(crate) fn seen(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Completes when no request head arrived within `timeout` of the call (counting it), and
/// never once one has: the connection is then closed by dropping it.
pub(crate) async fn no_request_within(seen: &FirstRequest, timeout: Duration, counters: &Counters) {
    tokio::time::sleep(timeout).await;
    if seen.0.load(Ordering::Relaxed) {
        std::future::pending::<()>().await;
    }
    counters.header_timeouts.inc();
}

/// What [`read_body`] read: the body and its charge, or the error to answer.
pub enum BodyRead {
    /// The whole body, and its bytes' charge (held until the request no longer needs them).
    Read(Bytes, BufferCharge),
    /// Answered with this error without reading further.
    Refused(ApiError),
}

/// Reads a request body within `limits`: at most `maxRequestBodyBytes` (413), charged to
/// `maxBufferedRequestBytes` before it is read (503), complete within `bodyReadTimeoutMs` (408).
/// Errors only when the client's body breaks off.
///
/// A body refused as too large is read on and discarded, when it ends within as many bytes
/// again, before the 413 goes out: a client still sending when the answer arrives
/// sees its stream reset (HTTP/2 `RST_STREAM`) or its connection closed (HTTP/1.1), and some
/// report that instead of the 413 (curl before 8, over HTTP/2).
///
/// `buffered` is the process-wide count of body bytes held (the gateway's
/// `infergate_gateway_buffered_request_bytes`); the global router passes its own.
pub async fn read_body(
    buffered: &Gauge,
    limits: &Limits,
    declared: Option<u64>,
    mut body: Incoming,
) -> Result<BodyRead, hyper::Error> {
    let limit = limits.max_request_body_bytes;
    let too_large = || BodyRead::Refused(ApiError::BodyTooLarge { limit });
    let limit = to_i64(limit);
    if declared.is_some_and(|n| to_i64(n) > limit) {
        let twice = limit.saturating_mul(2);
        if declared.is_some_and(|n| to_i64(n) <= twice) {
            drain(&mut body, twice, limits.body_read_timeout()).await;
        }
        return Ok(too_large());
    }
    let budget = to_i64(limits.max_buffered_request_bytes);
    let busy = || {
        BodyRead::Refused(ApiError::BufferBudget {
            retry_after: BUSY_RETRY_AFTER,
        })
    };
    let declared = declared.map_or(0, to_i64);
    if !charge(buffered, declared, budget) {
        return Ok(busy());
    }
    let mut held = BufferCharge {
        gauge: buffered.clone(),
        bytes: declared,
    };
    let timeout = limits.body_read_timeout();
    // The bytes received when the body went over the limit.
    let mut over: Option<i64> = None;
    let read = async {
        // Most bodies arrive in one frame: keep it without copying; join only when there are
        // more.
        let mut first: Option<Bytes> = None;
        let mut joined = BytesMut::new();
        let mut received: i64 = 0;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue; // trailers
            };
            received = received.saturating_add(to_i64(data.len()));
            if received > limit {
                over = Some(received);
                return Ok(too_large());
            }
            if !held.grow_to(received, budget) {
                return Ok(busy());
            }
            match first.take() {
                None if joined.is_empty() => first = Some(data),
                None => joined.extend_from_slice(&data),
                Some(f) => {
                    let cap = usize::try_from(received.max(declared)).unwrap_or(0);
                    joined.reserve(cap);
                    joined.extend_from_slice(&f);
                    joined.extend_from_slice(&data);
                }
            }
        }
        let bytes = first.unwrap_or_else(|| joined.freeze());
        Ok(BodyRead::Read(
            bytes,
            BufferCharge {
                gauge: held.gauge.clone(),
                bytes: std::mem::take(&mut held.bytes),
            },
        ))
    };
    let started = tokio::time::Instant::now();
    let read = match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_elapsed) => Ok(BodyRead::Refused(ApiError::RequestTimeout { timeout })),
    };
    if let Some(received) = over {
        // What is left of the read's time, for the rest of a body at most twice the limit.
        let left = timeout.saturating_sub(started.elapsed());
        drain(
            &mut body,
            limit.saturating_mul(2).saturating_sub(received),
            left,
        )
        .await;
    }
    read
}

/// Reads and discards the rest of `body`, up to its end, `allowance` bytes or `timeout`,
/// whichever comes first. Nothing is kept, so a drained body costs no memory, only its bytes'
/// reading.
async fn drain(body: &mut Incoming, allowance: i64, timeout: std::time::Duration) {
    let rest = async {
        let mut left = allowance;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                left = left.saturating_sub(to_i64(data.len()));
                if left < 0 {
                    return;
                }
            }
        }
    };
    let _ended = tokio::time::timeout(timeout, rest).await.is_ok();
}

#[cfg(test)]
mod tests;
