//! Flow control: bounded per-priority queues with fair order between tenants.
//!
//! When every candidate endpoint is saturated, a shell parks the request here instead of sending
//! it to an overloaded pod or rejecting it at once, and takes it out again when a pod has
//! headroom. The queues are pure: time is passed in, nothing here reads a clock or wakes a task.
//!
//! # Model
//!
//! - A **band** per [`Priority`]. [`FlowQueues::peek`] always serves Critical before Standard
//!   before Sheddable. Each band is bounded by a request count and a byte total
//!   ([`BandLimits`], default 5,000 requests and 1 GB), and the queue as a whole by its own
//!   limits ([`FlowConfig::max_requests`], default [`DEFAULT_MAX_QUEUED_REQUESTS`], and
//!   [`FlowConfig::max_bytes`]).
//! - A **flow** is a tenant within a band. Between the flows of a band, the [`Fairness`] policy
//!   chooses whose request goes next: `global-strict` (the best head across all flows: FCFS over
//!   the whole band), `round-robin` (flows in turn), or `least-attained-service` (the flow that
//!   has been served the fewest weighted tokens, see [`ServiceWeights`]).
//! - Within a flow, the [`Ordering`] policy: FCFS, or EDF (earliest deadline first; a request's
//!   deadline is its enqueue time plus the TTL unless the caller gives one).
//! - A **TTL** ([`FlowConfig::request_ttl`], default 60 s, zero disables): [`FlowQueues::expire`]
//!   removes every request whose deadline has passed.
//! - **Eviction**: when the whole queue is full and a Critical or Standard request arrives,
//!   queued Sheddable requests are evicted (newest first) to make room.
//!   [`FlowQueues::enqueue`] hands each evicted entry to the caller's callback.
//! - **Removal by ticket** ([`FlowQueues::remove`]): a client that went away leaves at once.
//! - **Headroom reservation** ([`Headroom`], off by default): requests that are not protected
//!   (Sheddable ones, and those of a tenant served more than its fair share recently) must leave
//!   the last `reservedEndpoints` pods with no prefill ahead (clear) to the protected ones.
//!   [`FlowQueues::reserve_for`] says what a request must leave, the pick enforces it
//!   ([`RequestContext::with_reserved_endpoints`](crate::RequestContext::with_reserved_endpoints)),
//!   and [`FlowQueues::peek_protected`] names the request to try when the head is held back.
//!
//! Attained service (for `least-attained-service`) is charged at dispatch with the request's
//! estimated tokens and corrected by [`FlowQueues::settle`] once the response reports its usage.
//! A flow that becomes active again starts no lower than the least-served active flow of its
//! band, so an idle tenant does not bank credit that would starve the others later.
//!
//! # Cost
//!
//! Entries live in a slab addressed by [`FlowTicket`]s (index + generation); each flow keeps an
//! indexed binary heap of its entries and each band one of its deadlines, so enqueue, dispatch,
//! removal and expiry are O(log n) in the flow's or band's length, and choosing the next flow is
//! O(active flows in the band). Nothing is allocated per operation except when a slab, heap or
//! ring grows past its previous high-water mark, or when a tenant is seen for the first time.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use infergate_scheduler::flow::{FlowConfig, FlowQueues, FlowRequest, Fairness};
//! use infergate_scheduler::{Priority, Timestamp};
//!
//! let cfg = FlowConfig { fairness: Fairness::RoundRobin, ..FlowConfig::default() };
//! let mut q: FlowQueues<&str> = FlowQueues::new(cfg);
//! let t0 = Timestamp::ZERO;
//! let req = |tenant| FlowRequest::new(tenant, Priority::Standard, 100);
//! q.enqueue(req("a"), "a1", t0, |_| {}).unwrap();
//! q.enqueue(req("a"), "a2", t0, |_| {}).unwrap();
//! q.enqueue(req("b"), "b1", t0, |_| {}).unwrap();
//! // A Critical request is served before every Standard one.
//! let c = q.enqueue(FlowRequest::new("b", Priority::Critical, 10), "c1", t0, |_| {}).unwrap();
//! assert_eq!(q.peek(), Some(c));
//! let order: Vec<_> = std::iter::from_fn(|| q.pop(t0).map(|d| d.payload)).collect();
//! // Round-robin between tenants a and b within the Standard band.
//! assert_eq!(order, ["c1", "a1", "b1", "a2"]);
//!
//! // TTL: a request still queued 60 s after it arrived expires.
//! q.enqueue(req("a"), "late", t0, |_| {}).unwrap();
//! let mut expired = Vec::new();
//! q.expire(t0.saturating_add(Duration::from_secs(60)), |r| expired.push(r.payload));
//! assert_eq!(expired, ["late"]);
//! assert!(q.is_empty());
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::endpoint::Timestamp;
use crate::error::ConfigError;
use crate::request::Priority;

/// Idle flows (tenants with nothing queued) kept per band for their attained service; beyond
/// this, creating a new flow first forgets every idle one.
const MAX_IDLE_FLOWS: usize = 1024;

const NONE: u32 = u32::MAX;

/// Charges between two sweeps of the tenants' recent service.
const RECENT_SWEEP_EVERY: u32 = 256;

/// Half-life of the measured send rate behind [`FlowQueues::expected_wait`], in nanoseconds.
const RATE_HALF_LIFE_NS: f64 = 5e9;

/// The shortest history the send rate is measured over, in seconds ([`FlowQueues::send_rate`]).
const MIN_RATE_WINDOW_S: f64 = 1.0;

/// The `Retry-After` of a queue rejection when the queues have no TTL to bound it.
const MAX_QUEUE_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A tenant whose recent service has decayed below this fraction of the total is forgotten at
/// the next sweep (so at most about a thousand tenants are kept).
const RECENT_FORGET_BELOW: f64 = 1e-3;

/// How the next flow is chosen within a band.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fairness {
    /// No fairness between tenants: the best head across the band (FCFS, or EDF, over all of it).
    #[default]
    GlobalStrict,
    /// Flows in turn, one request each.
    RoundRobin,
    /// The flow with the least attained service (weighted tokens), ties to the best head.
    LeastAttainedService,
}

impl Fairness {
    /// The name used in configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Fairness::GlobalStrict => "global-strict",
            Fairness::RoundRobin => "round-robin",
            Fairness::LeastAttainedService => "least-attained-service",
        }
    }
}

/// The order of requests within one flow.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Earliest deadline first (deadline = enqueue + TTL, or the request's own); requests without
    /// a deadline (TTL disabled) come last, FCFS among themselves.
    Edf,
}

impl Ordering {
    /// The name used in configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Ordering::Fcfs => "fcfs",
            Ordering::Edf => "edf",
        }
    }
}

/// Weights of input (prompt) and output tokens in a flow's attained service.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceWeights {
    /// Weight of one prompt token.
    pub input: f64,
    /// Weight of one generated token.
    pub output: f64,
}

impl Default for ServiceWeights {
    fn default() -> Self {
        ServiceWeights {
            input: 1.0,
            output: 1.0,
        }
    }
}

impl ServiceWeights {
    /// The service of `input` prompt and `output` generated tokens.
    pub fn service(&self, input: u32, output: u32) -> f64 {
        self.input * f64::from(input) + self.output * f64::from(output)
    }
}

/// Requests queued across all bands at most, by default: three quarters of the standalone
/// gateway's default `limits.maxRequestsInFlight` (4,096), which queued requests count in too, so
/// that with both defaults the queue fills — and evicts Sheddable requests for Critical ones —
/// before the gateway refuses requests at its door, while a quarter is left for running ones.
pub const DEFAULT_MAX_QUEUED_REQUESTS: u32 = 3_072;

/// Bounds of one priority band.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BandLimits {
    /// Requests queued in the band at most.
    pub max_requests: u32,
    /// Request bytes queued in the band at most.
    pub max_bytes: u64,
}

impl Default for BandLimits {
    fn default() -> Self {
        BandLimits {
            max_requests: 5_000,
            max_bytes: 1_000_000_000,
        }
    }
}

/// Per-band limits, by priority name.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Bands {
    /// The Critical band.
    pub critical: BandLimits,
    /// The Standard band.
    pub standard: BandLimits,
    /// The Sheddable band.
    pub sheddable: BandLimits,
}

impl Bands {
    /// The limits of `priority`'s band.
    pub const fn get(&self, priority: Priority) -> BandLimits {
        match priority {
            Priority::Critical => self.critical,
            Priority::Standard => self.standard,
            Priority::Sheddable => self.sheddable,
        }
    }
}

/// Headroom reservation (`flowControl.headroom`): pods kept clear of prefill work for the
/// requests flow control protects.
///
/// A pod working through a prefill makes every request sent to it wait for that engine step (up
/// to a whole prefill chunk); a *clear* pod — headroom, nothing waiting in its engine, none of
/// this gateway's requests without a first token — answers a new request in about its own
/// prefill time. With `reservedEndpoints: R`, a request that is *not protected* may not take a
/// clear pod when that would leave fewer than `R` clear ones (it may still go to a pod already
/// prefilling that has headroom), and may take no pod at all while fewer than `R` are clear, so
/// that the reserve comes back once a protected request has used it. Held back, it waits in its
/// queue.
///
/// A request is protected when it is not Sheddable and its tenant has been served at most its
/// fair share recently: its recent service (the weighted tokens of its non-Sheddable requests
/// sent, decayed with `shareHalfLifeMs`) at most the mean of the tenants served recently. So a
/// bursting tenant, one tenant's flood of Standard traffic, or any Sheddable request leaves the
/// last `R` clear pods to a quiet tenant's or a small Critical tenant's requests; a tenant alone
/// is always within its share.
///
/// The reserve is never more than the candidates minus one (a pool of one pod reserves
/// nothing). The price is throughput at overload: the reserved pods take only protected
/// prefills while the others are busy, and the others take no more prefills while the reserve
/// is being rebuilt.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Headroom {
    /// Candidates with no prefill ahead that requests not protected must leave; 0 disables the
    /// reservation.
    pub reserved_endpoints: u16,
    /// Half-life of the recent service a tenant's fair share is judged on, in milliseconds
    /// (at least 1).
    #[serde(rename = "shareHalfLifeMs", with = "millis")]
    pub share_half_life: Duration,
}

impl Default for Headroom {
    fn default() -> Self {
        Headroom {
            reserved_endpoints: 0,
            share_half_life: Duration::from_secs(10),
        }
    }
}

/// The longest `requestTtlMs` a configuration may set: one day (the CRD's bound as well).
pub const MAX_REQUEST_TTL: Duration = Duration::from_secs(86_400);

/// Flow-control configuration (`flowControl:` in the gateway and picker configuration).
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowConfig {
    /// Whether requests wait in the queues when the pool is saturated. Off: a saturated pool
    /// routes or sheds at once, as without flow control.
    pub enabled: bool,
    /// How long a request may wait, in milliseconds; 0 disables the TTL.
    #[serde(rename = "requestTtlMs", with = "millis")]
    pub request_ttl: Duration,
    /// Requests queued across all bands at most (full: Sheddable requests are evicted for
    /// Critical and Standard ones).
    pub max_requests: u32,
    /// Request bytes queued across all bands at most.
    pub max_bytes: u64,
    /// Limits of each band.
    pub bands: Bands,
    /// Order between the tenants of a band.
    pub fairness: Fairness,
    /// Order within one tenant's flow.
    pub ordering: Ordering,
    /// Token weights of attained service (`least-attained-service`) and of the recent service
    /// of [`Headroom`].
    pub service_weights: ServiceWeights,
    /// Endpoints kept clear of prefill work for protected requests.
    pub headroom: Headroom,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            enabled: false,
            request_ttl: Duration::from_secs(60),
            max_requests: DEFAULT_MAX_QUEUED_REQUESTS,
            max_bytes: 1_000_000_000,
            bands: Bands::default(),
            fairness: Fairness::GlobalStrict,
            ordering: Ordering::Fcfs,
            service_weights: ServiceWeights::default(),
            headroom: Headroom::default(),
        }
    }
}

impl FlowConfig {
    /// Checks the limits and weights; the error names the YAML field (under `flowControl.`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.request_ttl > MAX_REQUEST_TTL {
            return Err(ConfigError::new(
                "flowControl.requestTtlMs",
                "must be between 0 (no TTL) and 86400000 ms (one day): a request does not wait longer",
            ));
        }
        if self.max_requests == 0 {
            return Err(ConfigError::new(
                "flowControl.maxRequests",
                "must be at least 1",
            ));
        }
        if self.max_bytes == 0 {
            return Err(ConfigError::new(
                "flowControl.maxBytes",
                "must be at least 1",
            ));
        }
        // Each limit named down to its field, as the CRD's validation names it.
        let b = &self.bands;
        let band_limits = [
            (
                "flowControl.bands.critical.maxRequests",
                u64::from(b.critical.max_requests),
            ),
            ("flowControl.bands.critical.maxBytes", b.critical.max_bytes),
            (
                "flowControl.bands.standard.maxRequests",
                u64::from(b.standard.max_requests),
            ),
            ("flowControl.bands.standard.maxBytes", b.standard.max_bytes),
            (
                "flowControl.bands.sheddable.maxRequests",
                u64::from(b.sheddable.max_requests),
            ),
            (
                "flowControl.bands.sheddable.maxBytes",
                b.sheddable.max_bytes,
            ),
        ];
        if let Some((field, _)) = band_limits.into_iter().find(|&(_, limit)| limit == 0) {
            return Err(ConfigError::new(field, "must be at least 1"));
        }
        let w = self.service_weights;
        for (field, v) in [
            ("flowControl.serviceWeights.input", w.input),
            ("flowControl.serviceWeights.output", w.output),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::new(
                    field,
                    format!("must be a finite number >= 0, got {v}"),
                ));
            }
        }
        if self.headroom.share_half_life.is_zero() {
            return Err(ConfigError::new(
                "flowControl.headroom.shareHalfLifeMs",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The TTL, `None` when disabled.
    pub fn ttl(&self) -> Option<Duration> {
        (!self.request_ttl.is_zero()).then_some(self.request_ttl)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// One request offered to the queues.
#[derive(Copy, Clone, Debug)]
#[non_exhaustive]
pub struct FlowRequest<'a> {
    /// The tenant (fairness id).
    pub tenant: &'a str,
    /// The band.
    pub priority: Priority,
    /// The request's size in bytes (counted against the byte limits).
    pub bytes: u64,
    /// Estimated prompt tokens (attained service charged at dispatch).
    pub input_tokens: u32,
    /// Expected output tokens (attained service charged at dispatch).
    pub output_tokens: u32,
    /// The request's own deadline, instead of enqueue + TTL.
    pub deadline: Option<Timestamp>,
}

impl<'a> FlowRequest<'a> {
    /// A request of `bytes` bytes from `tenant` in `priority`'s band, with no token estimate and
    /// the configured TTL.
    pub const fn new(tenant: &'a str, priority: Priority, bytes: u64) -> Self {
        FlowRequest {
            tenant,
            priority,
            bytes,
            input_tokens: 0,
            output_tokens: 0,
            deadline: None,
        }
    }

    /// Sets the token estimate charged to the flow at dispatch.
    pub const fn with_tokens(mut self, input: u32, output: u32) -> Self {
        self.input_tokens = input;
        self.output_tokens = output;
        self
    }

    /// Sets the request's own deadline.
    pub const fn with_deadline(mut self, deadline: Option<Timestamp>) -> Self {
        self.deadline = deadline;
        self
    }
}

/// A queued request's handle. Stale tickets (the entry left) are ignored.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowTicket {
    index: u32,
    generation: u32,
}

/// Why a request was not queued.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its band is at its request or byte limit.
    BandFull,
    /// The whole queue is at its limit and no Sheddable request can be evicted for it.
    QueueFull,
}

/// A request the queues did not take, with its payload back.
#[derive(Debug)]
pub struct Refused<T> {
    /// Why.
    pub reason: Refusal,
    /// The payload given to [`FlowQueues::enqueue`].
    pub payload: T,
}

/// Why a queued request left without being dispatched.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Its deadline passed.
    Expired,
    /// A higher band needed its room.
    Evicted,
}

/// A request that left the queues without being dispatched.
#[derive(Debug)]
pub struct Removed<T> {
    /// Its ticket (now stale).
    pub ticket: FlowTicket,
    /// The payload.
    pub payload: T,
    /// Its band.
    pub priority: Priority,
    /// Why it left.
    pub reason: Removal,
    /// How long it waited.
    pub waited: Duration,
}

/// What to settle a dispatched request's attained service against, once its usage is known.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ServiceCharge {
    flow: u32,
    generation: u32,
    charged: f64,
}

/// A request taken out of the queues to be sent.
#[derive(Debug)]
pub struct Dispatched<T> {
    /// Its ticket (now stale).
    pub ticket: FlowTicket,
    /// The payload.
    pub payload: T,
    /// Its band.
    pub priority: Priority,
    /// How long it waited.
    pub waited: Duration,
    /// The estimate charged to its flow; pass it to [`FlowQueues::settle`] with the usage.
    pub charge: ServiceCharge,
}

/// One queued request.
struct Entry<T> {
    payload: T,
    flow: u32,
    band: u8,
    bytes: u64,
    input_tokens: u32,
    output_tokens: u32,
    enqueued: Timestamp,
    /// Deadline in nanoseconds, `u64::MAX` for none.
    deadline: u64,
    seq: u64,
    /// Position in the flow's heap.
    flow_pos: u32,
    /// Position in the band's deadline heap (`NONE` without a deadline).
    exp_pos: u32,
    /// Neighbours in the band's arrival list.
    prev: u32,
    next: u32,
}

struct Slot<T> {
    generation: u32,
    entry: Option<Entry<T>>,
}

/// One tenant in one band.
struct Flow {
    generation: u32,
    tenant: Option<Arc<str>>,
    band: u8,
    /// Indices of the flow's entries, a binary heap on the ordering key.
    heap: Vec<u32>,
    /// Weighted tokens served.
    attained: f64,
}

/// One priority band.
#[derive(Default)]
struct Band {
    flows: HashMap<Arc<str>, u32>,
    /// Flows with queued requests, in round-robin turn.
    active: VecDeque<u32>,
    /// Entries with a deadline, a binary heap on (deadline, seq).
    expiry: Vec<u32>,
    /// Arrival list (oldest at `head`), for evicting the newest.
    head: u32,
    tail: u32,
    len: u32,
    bytes: u64,
}

/// A quantity decaying with a half-life, as of `at` (nanoseconds).
#[derive(Copy, Clone, Debug, Default)]
struct Decayed {
    value: f64,
    at: u64,
}

impl Decayed {
    /// The value at `now` (not decayed for a `now` before the last update).
    fn get(&self, now: u64, half_life_ns: f64) -> f64 {
        if now <= self.at {
            return self.value;
        }
        self.value * (-((now - self.at) as f64) / half_life_ns * std::f64::consts::LN_2).exp()
    }

    fn add(&mut self, v: f64, now: u64, half_life_ns: f64) {
        self.value = self.get(now, half_life_ns) + v;
        self.at = self.at.max(now);
    }
}

/// The tenants' recent service across every band (weighted tokens sent, decayed): whose is
/// within its fair share, for [`Headroom`].
#[derive(Default)]
struct Recent {
    tenants: HashMap<Arc<str>, Decayed>,
    total: Decayed,
    charges: u32,
}

impl Recent {
    fn charge(&mut self, tenant: &str, service: f64, now: u64, half_life_ns: f64) {
        match self.tenants.get_mut(tenant) {
            Some(d) => d.add(service, now, half_life_ns),
            None => {
                let mut d = Decayed::default();
                d.add(service, now, half_life_ns);
                self.tenants.insert(Arc::from(tenant), d);
            }
        }
        self.total.add(service, now, half_life_ns);
        self.charges = self.charges.wrapping_add(1);
        if self.charges.is_multiple_of(RECENT_SWEEP_EVERY) {
            let floor = self.total.get(now, half_life_ns) * RECENT_FORGET_BELOW;
            self.tenants
                .retain(|_, d| d.get(now, half_life_ns) >= floor && d.value > 0.0);
        }
    }

    /// Whether `tenant`'s recent service is at most the mean of the tenants served recently
    /// (a tenant not served recently is).
    fn within_share(&self, tenant: &str, now: u64, half_life_ns: f64) -> bool {
        let Some(d) = self.tenants.get(tenant) else {
            return true;
        };
        let mean = self.total.get(now, half_life_ns) / self.tenants.len() as f64;
        // A relative margin for rounding: a tenant alone is exactly at the mean.
        d.get(now, half_life_ns) <= mean * (1.0 + 1e-9)
    }
}

/// The flow-control queues. `T` is the caller's payload per request (a waker, a request id).
pub struct FlowQueues<T> {
    cfg: FlowConfig,
    recent: Recent,
    /// Requests sent (dispatched or charged), decayed with [`RATE_HALF_LIFE_NS`].
    sent: Decayed,
    /// When the first request was sent (ns).
    first_sent: Option<u64>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    flows: Vec<Flow>,
    free_flows: Vec<u32>,
    bands: [Band; 3],
    len: u32,
    bytes: u64,
    seq: u64,
}

/// The half-life of recent service, in nanoseconds (at least 1).
fn half_life_ns(cfg: &FlowConfig) -> f64 {
    (cfg.headroom.share_half_life.as_nanos() as f64).max(1.0)
}

const fn band_index(p: Priority) -> usize {
    match p {
        Priority::Critical => 0,
        Priority::Standard => 1,
        Priority::Sheddable => 2,
    }
}

const BAND_PRIORITY: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

/// Which heap an operation works on.
#[derive(Copy, Clone)]
enum Which {
    Flow,
    Expiry,
}

impl<T> FlowQueues<T> {
    /// Empty queues with this configuration (assumed valid, see [`FlowConfig::validate`]).
    pub fn new(cfg: FlowConfig) -> Self {
        let band = || Band {
            head: NONE,
            tail: NONE,
            ..Band::default()
        };
        FlowQueues {
            cfg,
            recent: Recent::default(),
            sent: Decayed::default(),
            first_sent: None,
            slots: Vec::new(),
            free: Vec::new(),
            flows: Vec::new(),
            free_flows: Vec::new(),
            bands: [band(), band(), band()],
            len: 0,
            bytes: 0,
            seq: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.cfg
    }

    /// Requests queued.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Request bytes queued.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Requests queued in `priority`'s band.
    pub fn band_len(&self, priority: Priority) -> usize {
        self.bands[band_index(priority)].len as usize
    }

    /// Request bytes queued in `priority`'s band.
    pub fn band_bytes(&self, priority: Priority) -> u64 {
        self.bands[band_index(priority)].bytes
    }

    /// The payload of a queued request.
    pub fn get(&self, ticket: FlowTicket) -> Option<&T> {
        self.entry(ticket).map(|e| &e.payload)
    }

    /// The band of a queued request.
    pub fn priority(&self, ticket: FlowTicket) -> Option<Priority> {
        self.entry(ticket)
            .map(|e| BAND_PRIORITY[usize::from(e.band)])
    }

    /// The earliest deadline of any queued request (when to call [`FlowQueues::expire`] next).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.bands
            .iter()
            .filter_map(|b| b.expiry.first())
            .filter_map(|&i| self.slots[i as usize].entry.as_ref())
            .map(|e| Timestamp(e.deadline))
            .min()
    }

    /// Queues a request, or refuses it with its payload back.
    ///
    /// When the whole queue is full, a Critical or Standard request evicts queued Sheddable
    /// requests (newest first) until it fits; each is handed to `evicted`. A request that cannot
    /// fit even then is refused and nothing is evicted.
    pub fn enqueue(
        &mut self,
        req: FlowRequest<'_>,
        payload: T,
        now: Timestamp,
        mut evicted: impl FnMut(Removed<T>),
    ) -> Result<FlowTicket, Refused<T>> {
        let b = band_index(req.priority);
        let limits = self.cfg.bands.get(req.priority);
        let band = &self.bands[b];
        if band.len >= limits.max_requests
            || band.bytes.saturating_add(req.bytes) > limits.max_bytes
        {
            return Err(Refused {
                reason: Refusal::BandFull,
                payload,
            });
        }
        let (max_requests, max_bytes) = (self.cfg.max_requests, self.cfg.max_bytes);
        let fits = |len: u32, bytes: u64| {
            len < max_requests && bytes.saturating_add(req.bytes) <= max_bytes
        };
        if !fits(self.len, self.bytes) {
            let shed = &self.bands[band_index(Priority::Sheddable)];
            let can_evict = req.priority != Priority::Sheddable
                && fits(self.len - shed.len, self.bytes - shed.bytes);
            if !can_evict {
                return Err(Refused {
                    reason: Refusal::QueueFull,
                    payload,
                });
            }
            while !fits(self.len, self.bytes) {
                let Some(r) = self.evict_newest_sheddable(now) else {
                    break;
                };
                evicted(r);
            }
        }
        let flow = self.flow_for(b, req.tenant);
        let deadline = req
            .deadline
            .or_else(|| self.cfg.ttl().map(|ttl| now.saturating_add(ttl)))
            .map_or(u64::MAX, |t| t.0);
        self.seq += 1;
        let entry = Entry {
            payload,
            flow,
            band: b as u8,
            bytes: req.bytes,
            input_tokens: req.input_tokens,
            output_tokens: req.output_tokens,
            enqueued: now,
            deadline,
            seq: self.seq,
            flow_pos: NONE,
            exp_pos: NONE,
            prev: self.bands[b].tail,
            next: NONE,
        };
        let index = if let Some(i) = self.free.pop() {
            self.slots[i as usize].entry = Some(entry);
            i
        } else {
            let i = u32::try_from(self.slots.len()).unwrap_or(NONE);
            self.slots.push(Slot {
                generation: 0,
                entry: Some(entry),
            });
            i
        };
        let ticket = FlowTicket {
            index,
            generation: self.slots[index as usize].generation,
        };
        // Arrival list.
        let band = &mut self.bands[b];
        let old_tail = band.tail;
        band.tail = index;
        if old_tail == NONE {
            band.head = index;
        }
        band.len += 1;
        band.bytes += req.bytes;
        if let Some(e) = self.slot_entry_mut(old_tail) {
            e.next = index;
        }
        self.len += 1;
        self.bytes += req.bytes;
        // Heaps.
        let was_empty = self.flows[flow as usize].heap.is_empty();
        if was_empty {
            self.activate(b, flow);
        }
        self.heap_push(Which::Flow, flow as usize, index);
        if deadline != u64::MAX {
            self.heap_push(Which::Expiry, b, index);
        }
        Ok(ticket)
    }

    /// Takes out the newest queued Sheddable request (the one eviction takes first), if any:
    /// for a Critical or Standard request that needs the room it holds elsewhere than in the
    /// queue (the gateway's in-flight slots).
    pub fn evict_newest_sheddable(&mut self, now: Timestamp) -> Option<Removed<T>> {
        let tail = self.bands[band_index(Priority::Sheddable)].tail;
        let (ticket, entry) = self.take(tail)?;
        Some(Removed {
            ticket,
            payload: entry.payload,
            priority: Priority::Sheddable,
            reason: Removal::Evicted,
            waited: now.saturating_since(entry.enqueued),
        })
    }

    /// The request that would be dispatched next: the Critical band first, then Standard, then
    /// Sheddable; within a band the fairness policy's flow, and that flow's head.
    pub fn peek(&self) -> Option<FlowTicket> {
        let b = self.bands.iter().position(|b| b.len > 0)?;
        let flow = self.next_flow(b)?;
        let &index = self.flows[flow as usize].heap.first()?;
        Some(FlowTicket {
            index,
            generation: self.slots[index as usize].generation,
        })
    }

    /// Takes a queued request out to be sent (usually the one [`FlowQueues::peek`] named),
    /// charging its estimated tokens to its flow and advancing the round-robin turn.
    pub fn dispatch(&mut self, ticket: FlowTicket, now: Timestamp) -> Option<Dispatched<T>> {
        self.entry(ticket)?;
        let (ticket, e) = self.take(ticket.index)?;
        let b = usize::from(e.band);
        let flow = &mut self.flows[e.flow as usize];
        let charged = self
            .cfg
            .service_weights
            .service(e.input_tokens, e.output_tokens);
        flow.attained += charged;
        let charge = ServiceCharge {
            flow: e.flow,
            generation: flow.generation,
            charged,
        };
        let still_active = !flow.heap.is_empty();
        if self.cfg.headroom.reserved_endpoints > 0
            && b != band_index(Priority::Sheddable)
            && let Some(tenant) = &flow.tenant
        {
            let hl = half_life_ns(&self.cfg);
            self.recent.charge(tenant, charged, now.0, hl);
        }
        self.count_sent(now);
        // Round-robin: the flow served moves to the back of the turn.
        let active = &mut self.bands[b].active;
        if still_active && active.front() == Some(&e.flow) {
            active.rotate_left(1);
        }
        Some(Dispatched {
            ticket,
            payload: e.payload,
            priority: BAND_PRIORITY[b],
            waited: now.saturating_since(e.enqueued),
            charge,
        })
    }

    /// Takes out the next request ([`FlowQueues::peek`] then [`FlowQueues::dispatch`]).
    pub fn pop(&mut self, now: Timestamp) -> Option<Dispatched<T>> {
        let t = self.peek()?;
        self.dispatch(t, now)
    }

    /// Removes a queued request without dispatching it (its client went away). `None` for a
    /// stale ticket.
    pub fn remove(&mut self, ticket: FlowTicket) -> Option<T> {
        self.entry(ticket)?;
        self.take(ticket.index).map(|(_, e)| e.payload)
    }

    /// Removes every request whose deadline is at or before `now`, handing each to `expired`.
    pub fn expire(&mut self, now: Timestamp, mut expired: impl FnMut(Removed<T>)) {
        for (b, priority) in BAND_PRIORITY.into_iter().enumerate() {
            while let Some(&i) = self.bands[b].expiry.first() {
                let due = self.slots[i as usize]
                    .entry
                    .as_ref()
                    .is_some_and(|e| e.deadline <= now.0);
                if !due {
                    break;
                }
                let Some((ticket, e)) = self.take(i) else {
                    break;
                };
                expired(Removed {
                    ticket,
                    payload: e.payload,
                    priority,
                    reason: Removal::Expired,
                    waited: now.saturating_since(e.enqueued),
                });
            }
        }
    }

    /// Corrects a dispatched request's attained service with the usage its response reported
    /// (`input` prompt tokens, `output` generated tokens). A charge whose flow was forgotten is
    /// ignored.
    pub fn settle(&mut self, charge: ServiceCharge, input: u32, output: u32) {
        let Some(flow) = self.flows.get_mut(charge.flow as usize) else {
            return;
        };
        if flow.generation != charge.generation || flow.tenant.is_none() {
            return;
        }
        let actual = self.cfg.service_weights.service(input, output);
        flow.attained = (flow.attained + actual - charge.charged).max(0.0);
    }

    /// Charges the estimate of a request sent without waiting (the pool had headroom) at `now`
    /// to its flow, so attained service (and the recent service of [`Headroom`]) counts every
    /// request a tenant sent, queued or not. Settle it like a dispatched one.
    pub fn charge(&mut self, req: &FlowRequest<'_>, now: Timestamp) -> ServiceCharge {
        let b = band_index(req.priority);
        let f = self.flow_for(b, req.tenant);
        let charged = self
            .cfg
            .service_weights
            .service(req.input_tokens, req.output_tokens);
        self.count_sent(now);
        if self.cfg.headroom.reserved_endpoints > 0 && req.priority != Priority::Sheddable {
            let hl = half_life_ns(&self.cfg);
            self.recent.charge(req.tenant, charged, now.0, hl);
        }
        let flow = &mut self.flows[f as usize];
        flow.attained += charged;
        ServiceCharge {
            flow: f,
            generation: flow.generation,
            charged,
        }
    }

    /// Whether a request of `priority` would wait behind others: something is queued in its
    /// band or a higher one.
    pub fn has_queued_at_or_above(&self, priority: Priority) -> bool {
        self.bands[..=band_index(priority)]
            .iter()
            .any(|b| b.len > 0)
    }

    /// The reserve a request of `tenant` in `priority`'s band must leave ([`Headroom`]): 0 for
    /// a protected request (not Sheddable, its tenant within its fair share of the recent
    /// service), else `headroom.reservedEndpoints`. Pass it to the pick
    /// ([`RequestContext::with_reserved_endpoints`](crate::RequestContext::with_reserved_endpoints)).
    pub fn reserve_for(&self, tenant: &str, priority: Priority, now: Timestamp) -> u16 {
        let r = self.cfg.headroom.reserved_endpoints;
        if r == 0 || self.protected(tenant, priority, now) {
            0
        } else {
            r
        }
    }

    /// [`FlowQueues::reserve_for`] of a queued request; 0 for a stale ticket.
    pub fn reserve_of(&self, ticket: FlowTicket, now: Timestamp) -> u16 {
        let Some(e) = self.entry(ticket) else {
            return 0;
        };
        match &self.flows[e.flow as usize].tenant {
            Some(t) => self.reserve_for(t, BAND_PRIORITY[usize::from(e.band)], now),
            None => 0,
        }
    }

    /// The first queued request, in the queues' order, that is protected ([`Headroom`]): the one
    /// to try when the head was held back by the reserve. `None` without a reservation or when
    /// no queued request is protected.
    pub fn peek_protected(&self, now: Timestamp) -> Option<FlowTicket> {
        if self.cfg.headroom.reserved_endpoints == 0 {
            return None;
        }
        for (b, &priority) in BAND_PRIORITY.iter().enumerate() {
            if self.bands[b].len == 0 || priority == Priority::Sheddable {
                continue;
            }
            let flow = self.next_flow_where(b, |f| {
                self.flows[f as usize]
                    .tenant
                    .as_deref()
                    .is_some_and(|t| self.protected(t, priority, now))
            });
            if let Some(flow) = flow
                && let Some(&index) = self.flows[flow as usize].heap.first()
            {
                return Some(FlowTicket {
                    index,
                    generation: self.slots[index as usize].generation,
                });
            }
        }
        None
    }

    /// The measured send rate (requests dispatched from the queues or charged, per second),
    /// over about the last 7 s (an exponential average with a 5 s half-life); `None` before two
    /// moments have passed. A history shorter than a second counts as a second long.
    pub fn send_rate(&self, now: Timestamp) -> Option<f64> {
        let first = self.first_sent?;
        let elapsed = now.0.checked_sub(first).filter(|&e| e > 0)? as f64;
        let tau = RATE_HALF_LIFE_NS / std::f64::consts::LN_2;
        // A steady rate r leaves r·τ·(1 − e^(−t/τ)) decayed sends after t: divide by that
        // window, so the rate is not underestimated while the history is short — but not by
        // less than a second: the sends of a burst's first milliseconds (one per idle pod)
        // over those milliseconds read as hundreds a second, and told every client the full
        // queue turned away to come back in a second.
        let window_s = (tau * (1.0 - (-elapsed / tau).exp()) / 1e9).max(MIN_RATE_WINDOW_S);
        Some(self.sent.get(now.0, RATE_HALF_LIFE_NS) / window_s)
    }

    /// How long a request of `priority` joining now would wait: the requests queued in its band
    /// and the bands above, at the measured send rate (zero with nothing ahead). `None` when
    /// requests are ahead but no send rate is measured (nothing sent, or nothing for hours).
    pub fn expected_wait(&self, priority: Priority, now: Timestamp) -> Option<Duration> {
        let ahead: u32 = self.bands[..=band_index(priority)]
            .iter()
            .map(|b| b.len)
            .sum();
        if ahead == 0 {
            return Some(Duration::ZERO);
        }
        let rate = self.send_rate(now).filter(|r| *r > 0.0)?;
        Some(Duration::try_from_secs_f64(f64::from(ahead) / rate).unwrap_or(Duration::MAX))
    }

    /// The `Retry-After` of a request of `priority` the queues turned away (full band or queue,
    /// TTL expired, evicted): the longer of the pool's drain estimate `drain` (from the
    /// saturated pick, already clamped by the scheduler) and [`FlowQueues::expected_wait`] —
    /// a client told to come back before the queue ahead of it has drained would only be
    /// turned away again — rounded up to whole seconds, at least 1 s. The expected wait counts
    /// at most the TTL (60 s without one), as long as a queued request can wait; with requests
    /// ahead and no rate measured, it counts as that much.
    pub fn retry_after(&self, priority: Priority, drain: Duration, now: Timestamp) -> Duration {
        let max = self.cfg.ttl().unwrap_or(MAX_QUEUE_RETRY_AFTER);
        let wait = self.expected_wait(priority, now).unwrap_or(max).min(max);
        let longer = drain.max(wait);
        Duration::try_from_secs_f64(longer.as_secs_f64().ceil())
            .unwrap_or(longer)
            .max(Duration::from_secs(1))
    }

    fn count_sent(&mut self, now: Timestamp) {
        self.sent.add(1.0, now.0, RATE_HALF_LIFE_NS);
        self.first_sent.get_or_insert(now.0);
    }

    fn protected(&self, tenant: &str, priority: Priority, now: Timestamp) -> bool {
        priority != Priority::Sheddable
            && self
                .recent
                .within_share(tenant, now.0, half_life_ns(&self.cfg))
    }

    /// The attained service of `tenant` in `priority`'s band (weighted tokens), if it is known.
    pub fn attained(&self, tenant: &str, priority: Priority) -> Option<f64> {
        let &f = self.bands[band_index(priority)].flows.get(tenant)?;
        Some(self.flows[f as usize].attained)
    }

    fn entry(&self, t: FlowTicket) -> Option<&Entry<T>> {
        let s = self.slots.get(t.index as usize)?;
        if s.generation != t.generation {
            return None;
        }
        s.entry.as_ref()
    }

    fn slot_entry_mut(&mut self, i: u32) -> Option<&mut Entry<T>> {
        self.slots.get_mut(i as usize)?.entry.as_mut()
    }

    /// The flow of `tenant` in band `b`, created if new.
    fn flow_for(&mut self, b: usize, tenant: &str) -> u32 {
        if let Some(&f) = self.bands[b].flows.get(tenant) {
            return f;
        }
        if self.bands[b].flows.len() >= MAX_IDLE_FLOWS + self.bands[b].active.len() {
            self.forget_idle(b);
        }
        let name: Arc<str> = Arc::from(tenant);
        let f = if let Some(f) = self.free_flows.pop() {
            let flow = &mut self.flows[f as usize];
            flow.tenant = Some(name.clone());
            flow.band = b as u8;
            flow.attained = 0.0;
            f
        } else {
            let f = u32::try_from(self.flows.len()).unwrap_or(NONE);
            self.flows.push(Flow {
                generation: 0,
                tenant: Some(name.clone()),
                band: b as u8,
                heap: Vec::new(),
                attained: 0.0,
            });
            f
        };
        self.bands[b].flows.insert(name, f);
        f
    }

    /// Forgets band `b`'s idle flows (their attained service with them).
    fn forget_idle(&mut self, b: usize) {
        let flows = &mut self.flows;
        let free = &mut self.free_flows;
        self.bands[b].flows.retain(|_, &mut f| {
            let flow = &mut flows[f as usize];
            if flow.heap.is_empty() {
                flow.tenant = None;
                flow.generation = flow.generation.wrapping_add(1);
                free.push(f);
                false
            } else {
                true
            }
        });
    }

    /// A flow of band `b` gets its first queued request.
    fn activate(&mut self, b: usize, flow: u32) {
        let floor = self.bands[b]
            .active
            .iter()
            .map(|&f| self.flows[f as usize].attained)
            .fold(f64::INFINITY, f64::min);
        let fl = &mut self.flows[flow as usize];
        if floor.is_finite() && fl.attained < floor {
            fl.attained = floor;
        }
        self.bands[b].active.push_back(flow);
    }

    /// The flow of band `b` whose head goes next.
    fn next_flow(&self, b: usize) -> Option<u32> {
        self.next_flow_where(b, |_| true)
    }

    /// The flow of band `b` whose head goes next among the active flows `keep` accepts.
    fn next_flow_where(&self, b: usize, keep: impl Fn(u32) -> bool) -> Option<u32> {
        let mut active = self.bands[b].active.iter().copied().filter(|&f| keep(f));
        match self.cfg.fairness {
            Fairness::RoundRobin => active.next(),
            Fairness::GlobalStrict => active.min_by_key(|&f| self.head_key(f)),
            Fairness::LeastAttainedService => active.min_by(|&x, &y| {
                let (fx, fy) = (&self.flows[x as usize], &self.flows[y as usize]);
                fx.attained
                    .total_cmp(&fy.attained)
                    .then_with(|| self.head_key(x).cmp(&self.head_key(y)))
            }),
        }
    }

    fn head_key(&self, flow: u32) -> (u64, u64) {
        self.flows[flow as usize]
            .heap
            .first()
            .and_then(|&i| self.slots[i as usize].entry.as_ref())
            .map_or((u64::MAX, u64::MAX), |e| self.key(Which::Flow, e))
    }

    fn key(&self, which: Which, e: &Entry<T>) -> (u64, u64) {
        match (which, self.cfg.ordering) {
            (Which::Flow, Ordering::Fcfs) => (0, e.seq),
            (Which::Flow, Ordering::Edf) | (Which::Expiry, _) => (e.deadline, e.seq),
        }
    }

    /// Unlinks entry `i` from every structure and frees its slot.
    fn take(&mut self, i: u32) -> Option<(FlowTicket, Entry<T>)> {
        let (flow, b, flow_pos, exp_pos, prev, next, bytes) = {
            let e = self.slot_entry_mut(i)?;
            (
                e.flow,
                usize::from(e.band),
                e.flow_pos,
                e.exp_pos,
                e.prev,
                e.next,
                e.bytes,
            )
        };
        self.heap_remove(Which::Flow, flow as usize, flow_pos);
        if exp_pos != NONE {
            self.heap_remove(Which::Expiry, b, exp_pos);
        }
        // Arrival list.
        if let Some(p) = self.slot_entry_mut(prev) {
            p.next = next;
        } else {
            self.bands[b].head = next;
        }
        if let Some(n) = self.slot_entry_mut(next) {
            n.prev = prev;
        } else {
            self.bands[b].tail = prev;
        }
        let band = &mut self.bands[b];
        band.len -= 1;
        band.bytes -= bytes;
        self.len -= 1;
        self.bytes -= bytes;
        if self.flows[flow as usize].heap.is_empty()
            && let Some(p) = band.active.iter().position(|&f| f == flow)
        {
            band.active.remove(p);
        }
        let slot = &mut self.slots[i as usize];
        let ticket = FlowTicket {
            index: i,
            generation: slot.generation,
        };
        slot.generation = slot.generation.wrapping_add(1);
        let e = slot.entry.take()?;
        self.free.push(i);
        Some((ticket, e))
    }

    fn heap(&mut self, which: Which, owner: usize) -> &mut Vec<u32> {
        match which {
            Which::Flow => &mut self.flows[owner].heap,
            Which::Expiry => &mut self.bands[owner].expiry,
        }
    }

    fn set_pos(&mut self, which: Which, i: u32, pos: u32) {
        if let Some(e) = self.slot_entry_mut(i) {
            match which {
                Which::Flow => e.flow_pos = pos,
                Which::Expiry => e.exp_pos = pos,
            }
        }
    }

    fn key_of(&self, which: Which, i: u32) -> (u64, u64) {
        self.slots[i as usize]
            .entry
            .as_ref()
            .map_or((u64::MAX, u64::MAX), |e| self.key(which, e))
    }

    fn heap_push(&mut self, which: Which, owner: usize, i: u32) {
        let h = self.heap(which, owner);
        let pos = h.len();
        h.push(i);
        self.set_pos(which, i, pos as u32);
        self.sift_up(which, owner, pos);
    }

    fn heap_remove(&mut self, which: Which, owner: usize, pos: u32) {
        let pos = pos as usize;
        let h = self.heap(which, owner);
        if pos >= h.len() {
            return;
        }
        let removed = h.swap_remove(pos);
        let moved = h.get(pos).copied();
        self.set_pos(which, removed, NONE);
        if let Some(m) = moved {
            self.set_pos(which, m, pos as u32);
            let pos = self.sift_up(which, owner, pos);
            self.sift_down(which, owner, pos);
        }
    }

    fn swap(&mut self, which: Which, owner: usize, a: usize, b: usize) {
        let h = self.heap(which, owner);
        h.swap(a, b);
        let (ia, ib) = (h[a], h[b]);
        self.set_pos(which, ia, a as u32);
        self.set_pos(which, ib, b as u32);
    }

    fn at(&mut self, which: Which, owner: usize, pos: usize) -> u32 {
        self.heap(which, owner)[pos]
    }

    fn sift_up(&mut self, which: Which, owner: usize, mut pos: usize) -> usize {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            let (c, p) = (self.at(which, owner, pos), self.at(which, owner, parent));
            if self.key_of(which, c) >= self.key_of(which, p) {
                break;
            }
            self.swap(which, owner, pos, parent);
            pos = parent;
        }
        pos
    }

    fn sift_down(&mut self, which: Which, owner: usize, mut pos: usize) {
        loop {
            let len = self.heap(which, owner).len();
            let (l, r) = (2 * pos + 1, 2 * pos + 2);
            let mut best = pos;
            for child in [l, r] {
                if child < len {
                    let (c, b) = (self.at(which, owner, child), self.at(which, owner, best));
                    if self.key_of(which, c) < self.key_of(which, b) {
                        best = child;
                    }
                }
            }
            if best == pos {
                return;
            }
            self.swap(which, owner, pos, best);
            pos = best;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
