//! Flow control for a live pool: requests wait in bounded per-priority queues while every pod is
//! saturated, and go as soon as one has headroom.
//!
//! A [`FlowController`] wraps the pure [`FlowQueues`] of `infergate-scheduler` with the clock,
//! the wake-ups and the metrics. The request lifecycle ([`crate::lifecycle::admit`]) uses it
//! for both front doors:
//!
//! 1. A pick made with queueing asked for is [`Rejection::Shed`](infergate_scheduler::Rejection)
//!    at every priority when every candidate is saturated; the request is then queued
//!    ([`FlowController::enqueue`]) and the caller holds the [`Queued`] handle. A request is
//!    queued at once, without a pick, when its band or a higher one already has requests
//!    waiting, so it never overtakes them.
//! 2. Whenever something may have freed room — an in-flight request completed, failed or was
//!    cancelled, a metrics page arrived ([`FlowController::watch`]), a request was queued or left
//!    — the controller expires what is past its TTL and gives the head of the queues (the
//!    pure queues' order: band, fairness, ordering) its *turn*: that request's own task tries a
//!    pick. Routed: it leaves the queue and the next head gets a turn at once. Still saturated:
//!    it keeps its place and the next event gives it another turn. One turn at a time, so the
//!    order is the queues' order exactly.
//! 3. Each queued request sleeps until its own deadline, so a TTL fires on time with no
//!    background task; its wake expires every request that is due.
//! 4. Dropping a [`Queued`] (client disconnect, reset ext_proc stream) removes its entry at once
//!    and, when it held the turn, passes the turn on.
//! 5. With a headroom reservation (`flowControl.headroom`), every pick made under flow control
//!    carries the reserve its request must leave ([`FlowController::reserve_for`],
//!    [`Queued::reserve`]). A head whose pick found only reserved pods passes its turn to the
//!    first protected request behind it ([`FlowQueues::peek_protected`]), which may still fit.
//!
//! A queue rejection's `Retry-After` (full band, TTL expired, evicted) is the longer of the
//! latest saturated pick's drain estimate and the expected wait of the queue ahead of the
//! request's band at the measured send rate, that wait counted up to the TTL
//! ([`FlowQueues::retry_after`]).
//!
//! Metrics (registered once per process by [`FlowMetrics::register`], labelled by pool; the same
//! names at the gateway and at the picker):
//! `infergate_flow_queue_requests{pool,priority}` and
//! `infergate_flow_queue_bytes{pool,priority}` (gauges),
//! `infergate_flow_queue_wait_seconds{pool,priority}` (histogram of the time queued requests
//! waited, whatever their outcome) and
//! `infergate_flow_requests_total{pool,priority,tenant,outcome}` (outcomes of requests that
//! entered the queue path; tenant labels bounded by [`Tenancy::label`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::Changes;
use infergate_metrics::Clock;
use infergate_scheduler::flow::{
    FlowConfig, FlowQueues, FlowRequest, FlowTicket, Refusal, ServiceCharge,
};
use infergate_scheduler::{Priority, Usage};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, Sleep};

use crate::tenant::{Tenancy, TenancyConfig};

/// The flow-control part of a configuration file: `flowControl:` (the queues) and `tenancy:`
/// (who a request's tenant is, and its priority). The gateway file carries both sections at
/// its top level; the picker reads a file of exactly this shape (`--flow-control`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowSettings {
    /// The queues.
    pub flow_control: FlowConfig,
    /// Tenants and priorities.
    pub tenancy: TenancyConfig,
}

/// A `tenancy:` field of the gateway's file in the picker's `--flow-control` file, where it
/// would be read by nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`tenancy.{field}` is read by the standalone gateway only: the picker takes a request's \
     tenant from `x-llm-d-inference-fairness-id` and its priority from the objective named in \
     `x-llm-d-inference-objective` (`tenancy.objectives`); remove the field"
)]
pub struct GatewayOnlyField {
    /// `tenantHeader` or `priorityHeader`.
    pub field: &'static str,
}

impl FlowSettings {
    /// Checks a picker's `--flow-control` file: the gateway-only header fields of `tenancy:`
    /// are refused rather than ignored, since a user who sets them expects them to work.
    pub fn check_for_picker(&self) -> Result<(), GatewayOnlyField> {
        let t = &self.tenancy;
        if t.tenant_header.is_some() {
            return Err(GatewayOnlyField {
                field: "tenantHeader",
            });
        }
        if t.priority_header.is_some() {
            return Err(GatewayOnlyField {
                field: "priorityHeader",
            });
        }
        Ok(())
    }
}

/// Outcome labels of `infergate_flow_requests_total`; the values of the rejections are also their
/// reason headers.
pub mod outcome {
    /// Sent after waiting in the queue.
    pub const DISPATCHED: &str = "dispatched";
    /// Waited longer than the TTL.
    pub const TTL_EXPIRED: &str = "rejected-ttl-expired";
    /// Its band or the queue was full.
    pub const SATURATED: &str = "rejected-saturated";
    /// Evicted for a higher band.
    pub const EVICTED: &str = "evicted-priority";
    /// The pool had no endpoint while it waited.
    pub const NO_ENDPOINTS: &str = "rejected-no-endpoints";
    /// Its client went away while it waited.
    pub const CANCELLED: &str = "rejected-context-cancelled";
}

/// Labels of the per-band gauges and the wait histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BandLabels {
    pool: String,
    priority: &'static str,
}

/// Labels of `infergate_flow_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    pool: String,
    priority: &'static str,
    tenant: String,
    outcome: &'static str,
}

type HistogramFamily = Family<BandLabels, Histogram, fn() -> Histogram>;

/// The flow-control metric families, shared by every pool's controller.
#[derive(Clone)]
pub struct FlowMetrics {
    requests: Family<BandLabels, Gauge>,
    bytes: Family<BandLabels, Gauge>,
    wait: HistogramFamily,
    outcomes: Family<OutcomeLabels, Counter>,
}

impl Default for FlowMetrics {
    fn default() -> Self {
        fn wait_histogram() -> Histogram {
            // 1 ms to ~37 h, doubling: a wait is bounded by the TTL, 60 s by default and at
            // most one day (`MAX_REQUEST_TTL`), so a long TTL's waits land in a bucket of their
            // own, not all in `+Inf`.
            Histogram::new(exponential_buckets(0.001, 2.0, 28))
        }
        FlowMetrics {
            requests: Family::default(),
            bytes: Family::default(),
            wait: Family::new_with_constructor(wait_histogram),
            outcomes: Family::default(),
        }
    }
}

impl FlowMetrics {
    /// The families, registered into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = FlowMetrics::default();
        registry.register(
            "infergate_flow_queue_requests",
            "Requests waiting in a flow-control priority band",
            m.requests.clone(),
        );
        registry.register(
            "infergate_flow_queue_bytes",
            "Request bytes waiting in a flow-control priority band",
            m.bytes.clone(),
        );
        registry.register(
            "infergate_flow_queue_wait_seconds",
            "Time requests waited in a flow-control queue, whatever their outcome",
            m.wait.clone(),
        );
        registry.register(
            "infergate_flow_requests",
            "Requests that entered flow control's queue path, by outcome",
            m.outcomes.clone(),
        );
        m
    }
}

/// One pool's cached metric handles (no label allocation on the request path, except the
/// tenant-labelled outcome counters).
struct PoolMetrics {
    pool: String,
    requests: [Gauge; 3],
    bytes: [Gauge; 3],
    wait: [Histogram; 3],
    outcomes: Family<OutcomeLabels, Counter>,
}

const PRIORITIES: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

const fn band(p: Priority) -> usize {
    match p {
        Priority::Critical => 0,
        Priority::Standard => 1,
        Priority::Sheddable => 2,
    }
}

impl PoolMetrics {
    fn new(m: &FlowMetrics, pool: &str) -> Self {
        let labels = |p: Priority| BandLabels {
            pool: pool.to_owned(),
            priority: p.as_str(),
        };
        PoolMetrics {
            pool: pool.to_owned(),
            requests: PRIORITIES.map(|p| m.requests.get_or_create(&labels(p)).clone()),
            bytes: PRIORITIES.map(|p| m.bytes.get_or_create(&labels(p)).clone()),
            wait: PRIORITIES.map(|p| m.wait.get_or_create(&labels(p)).clone()),
            outcomes: m.outcomes.clone(),
        }
    }

    /// Counts an outcome, and explains it at debug level (one line per request leaving the
    /// queue path, `RUST_LOG=infergate_pool=debug`).
    fn outcome(&self, priority: Priority, tenant: &str, outcome: &'static str, waited: Duration) {
        tracing::debug!(
            pool = %self.pool,
            priority = priority.as_str(),
            tenant,
            outcome,
            waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            "flow control",
        );
        self.outcomes
            .get_or_create(&OutcomeLabels {
                pool: self.pool.clone(),
                priority: priority.as_str(),
                tenant: tenant.to_owned(),
                outcome,
            })
            .inc();
    }
}

/// What a queued request's task is told.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Signal {
    Wait,
    Turn,
    Expired,
    Evicted,
}

/// The meeting point of a queued request's task and the controller.
struct Waiter {
    state: Mutex<(Signal, Option<Waker>)>,
}

impl Waiter {
    fn signal(&self, s: Signal) {
        let waker = {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            st.0 = s;
            st.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A queued request's payload in the pure queues.
struct Entry {
    waiter: Arc<Waiter>,
    label: Arc<str>,
}

struct Inner {
    queues: FlowQueues<Entry>,
    /// The request whose task is trying a pick.
    turn: Option<FlowTicket>,
    /// Something freed room while a turn was out: give the head another turn when it ends.
    missed: bool,
    /// The pool's latest estimated drain time (the `Retry-After` of a queue rejection).
    retry_after: Duration,
    /// What this controller has added to each band's gauges (requests, bytes).
    shown: [(i64, i64); 3],
}

struct Ctl {
    cfg: FlowConfig,
    clock: Clock,
    tenancy: Tenancy,
    inner: Mutex<Inner>,
    metrics: PoolMetrics,
}

/// One pool's flow control. Cheap to clone.
#[derive(Clone)]
pub struct FlowController {
    ctl: Arc<Ctl>,
}

impl std::fmt::Debug for FlowController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowController")
            .field("pool", &self.ctl.metrics.pool)
            .field("queued", &self.queued())
            .finish()
    }
}

/// A flow controller that does not keep it alive ([`FlowController::downgrade`]): for whoever
/// must still reach the requests queued in a controller a reload replaced, for as long as one of
/// them holds it, without holding it themselves.
#[derive(Clone)]
pub struct WeakFlowController {
    ctl: Weak<Ctl>,
}

impl WeakFlowController {
    /// The controller, while anything else still holds it.
    pub fn upgrade(&self) -> Option<FlowController> {
        self.ctl.upgrade().map(|ctl| FlowController { ctl })
    }
}

impl std::fmt::Debug for WeakFlowController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakFlowController")
            .field("alive", &(self.ctl.strong_count() > 0))
            .finish()
    }
}

/// Why a request was not queued.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueueRefused(pub Refusal);

/// What a queued request's turn says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Try a pick now.
    Try,
    /// The request waited this long, past its TTL; it has left the queue.
    Expired(Duration),
    /// The request was evicted for a higher band after waiting this long; it has left the queue.
    Evicted(Duration),
}

/// A settled-later charge of attained service, kept by the in-flight guard and settled with the
/// usage the response reports.
#[derive(Clone, Debug)]
pub struct FlowCharge {
    ctl: Weak<Ctl>,
    charge: ServiceCharge,
}

impl std::fmt::Debug for Ctl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.metrics.pool)
    }
}

impl FlowCharge {
    /// Corrects the tenant's attained service with the usage the response reported.
    pub fn settle(self, usage: &Usage) {
        if let Some(ctl) = self.ctl.upgrade() {
            ctl.lock()
                .queues
                .settle(self.charge, usage.prompt_tokens, usage.output_tokens);
        }
    }
}

impl Ctl {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Expires what is due and, when no turn is out, gives the head its turn. `freed`: room
    /// may have freed up (a release, a page), so a turn out now must be followed by another.
    fn kick_locked(&self, inner: &mut Inner, freed: bool) {
        let now = self.clock.now();
        let metrics = &self.metrics;
        inner.queues.expire(now, |r| {
            metrics.wait[band(r.priority)].observe(r.waited.as_secs_f64());
            metrics.outcome(r.priority, &r.payload.label, outcome::TTL_EXPIRED, r.waited);
            r.payload.waiter.signal(Signal::Expired);
        });
        if let Some(t) = inner.turn
            && inner.queues.get(t).is_none()
        {
            inner.turn = None;
        }
        if inner.turn.is_some() {
            inner.missed |= freed;
        } else if let Some(head) = inner.queues.peek() {
            inner.turn = Some(head);
            inner.missed = false;
            if let Some(e) = inner.queues.get(head) {
                e.waiter.signal(Signal::Turn);
            }
        }
        self.gauges(inner);
    }

    /// Moves the band gauges by what this controller's queues changed since it last did: a
    /// gateway reload that changes `flowControl:` starts a new controller for the pool while
    /// the old one's requests still wait, and the series shows both queues, not whichever
    /// moved last.
    fn gauges(&self, inner: &mut Inner) {
        for p in PRIORITIES {
            let b = band(p);
            let n = i64::try_from(inner.queues.band_len(p)).unwrap_or(i64::MAX);
            let bytes = i64::try_from(inner.queues.band_bytes(p)).unwrap_or(i64::MAX);
            let (shown_n, shown_bytes) = inner.shown[b];
            if n != shown_n {
                self.metrics.requests[b].inc_by(n.saturating_sub(shown_n));
            }
            if bytes != shown_bytes {
                self.metrics.bytes[b].inc_by(bytes.saturating_sub(shown_bytes));
            }
            inner.shown[b] = (n, bytes);
        }
    }
}

impl FlowController {
    /// A controller for the pool `pool` (the metric label), with its queues' configuration
    /// (assumed valid: [`FlowConfig::validate`]) and tenancy, on `clock` (the pool's).
    pub fn new(
        pool: &str,
        cfg: FlowConfig,
        tenancy: Tenancy,
        clock: Clock,
        metrics: &FlowMetrics,
    ) -> Self {
        FlowController {
            ctl: Arc::new(Ctl {
                cfg,
                clock,
                tenancy,
                inner: Mutex::new(Inner {
                    queues: FlowQueues::new(cfg),
                    turn: None,
                    missed: false,
                    retry_after: Duration::from_secs(1),
                    shown: [(0, 0); 3],
                }),
                metrics: PoolMetrics::new(metrics, pool),
            }),
        }
    }

    /// The queues' configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.ctl.cfg
    }

    /// How tenants and priorities are found.
    pub fn tenancy(&self) -> &Tenancy {
        &self.ctl.tenancy
    }

    /// A handle that does not keep this controller alive.
    pub fn downgrade(&self) -> WeakFlowController {
        WeakFlowController {
            ctl: Arc::downgrade(&self.ctl),
        }
    }

    /// Whether `other` is this controller (a clone of it), not merely one configured alike.
    pub fn is(&self, other: &FlowController) -> bool {
        Arc::ptr_eq(&self.ctl, &other.ctl)
    }

    /// Requests queued now.
    pub fn queued(&self) -> usize {
        self.ctl.lock().queues.len()
    }

    /// The attained service of `tenant` in `priority`'s band, for tests.
    #[cfg(test)]
    pub(crate) fn attained(&self, tenant: &str, priority: Priority) -> Option<f64> {
        self.ctl.lock().queues.attained(tenant, priority)
    }

    /// Requests queued in `priority`'s band now.
    pub fn queued_in(&self, priority: Priority) -> usize {
        self.ctl.lock().queues.band_len(priority)
    }

    /// Something may have freed room (a request ended, a metrics page arrived): expire what is
    /// due and give the head of the queues a turn.
    pub fn kick(&self) {
        let mut inner = self.ctl.lock();
        self.ctl.kick_locked(&mut inner, true);
    }

    /// Kicks on every notification of `changes` (the pool's: releases and metrics pages), from
    /// a task that ends at the first notification after the controller is gone.
    pub fn watch(&self, changes: Arc<Changes>) {
        let weak = Arc::downgrade(&self.ctl);
        // Taken now: a signal raised before the task first runs is not missed.
        let mut seen = changes.version();
        tokio::spawn(async move {
            loop {
                changes.changed(&mut seen).await;
                let Some(ctl) = weak.upgrade() else {
                    return;
                };
                let mut inner = ctl.lock();
                if !inner.queues.is_empty() {
                    ctl.kick_locked(&mut inner, true);
                }
            }
        });
    }

    /// Evicts the newest queued Sheddable request (answered as evicted, like an eviction for
    /// room in the queue), for a request of a higher band that needs an in-flight slot the
    /// queued ones hold. Whether there was one.
    pub fn evict_newest_sheddable(&self) -> bool {
        let mut inner = self.ctl.lock();
        let now = self.ctl.clock.now();
        let Some(r) = inner.queues.evict_newest_sheddable(now) else {
            return false;
        };
        self.ctl.gauges(&mut inner);
        drop(inner);
        let metrics = &self.ctl.metrics;
        metrics.wait[band(r.priority)].observe(r.waited.as_secs_f64());
        metrics.outcome(r.priority, &r.payload.label, outcome::EVICTED, r.waited);
        r.payload.waiter.signal(Signal::Evicted);
        true
    }

    /// Whether a request of `priority` must queue behind requests already waiting.
    pub fn must_wait(&self, priority: Priority) -> bool {
        self.ctl.lock().queues.has_queued_at_or_above(priority)
    }

    /// Charges a request routed without waiting to its tenant's attained service.
    pub fn charge(&self, req: &FlowRequest<'_>) -> FlowCharge {
        FlowCharge {
            ctl: Arc::downgrade(&self.ctl),
            charge: self.ctl.lock().queues.charge(req, self.ctl.clock.now()),
        }
    }

    /// The pool's latest estimated drain time, as the last saturated pick said.
    pub fn retry_after(&self) -> Duration {
        self.ctl.lock().retry_after
    }

    /// The `Retry-After` of a request of `priority` the queues turned away: the longer of the
    /// drain estimate and the expected wait of the queue ahead of its band
    /// ([`FlowQueues::retry_after`]).
    pub fn queue_retry_after(&self, priority: Priority) -> Duration {
        let inner = self.ctl.lock();
        inner
            .queues
            .retry_after(priority, inner.retry_after, self.ctl.clock.now())
    }

    /// The clear pods a pick for `req` must leave to protected requests (the headroom
    /// reservation, [`FlowQueues::reserve_for`]): pass it to
    /// [`RequestContext::with_reserved_endpoints`](infergate_scheduler::RequestContext::with_reserved_endpoints).
    pub fn reserve_for(&self, req: &FlowRequest<'_>) -> u16 {
        self.ctl
            .lock()
            .queues
            .reserve_for(req.tenant, req.priority, self.ctl.clock.now())
    }

    /// Queues a request; the handle waits for its turn and removes the entry when dropped.
    /// `retry_after` is the pool's estimated drain time (from the saturated pick), told to the
    /// client if the request leaves without being routed; `None` keeps the latest known.
    pub fn enqueue(
        &self,
        req: FlowRequest<'_>,
        retry_after: Option<Duration>,
    ) -> Result<Queued, QueueRefused> {
        let waiter = Arc::new(Waiter {
            state: Mutex::new((Signal::Wait, None)),
        });
        let label: Arc<str> = Arc::from(self.ctl.tenancy.label(req.tenant));
        let now = Instant::now();
        let entry = Entry {
            waiter: Arc::clone(&waiter),
            label: Arc::clone(&label),
        };
        let ctl = &self.ctl;
        let mut inner = ctl.lock();
        if let Some(r) = retry_after {
            inner.retry_after = r;
        }
        let metrics = &ctl.metrics;
        let queued = inner.queues.enqueue(req, entry, ctl.clock.at(now), |r| {
            metrics.wait[band(r.priority)].observe(r.waited.as_secs_f64());
            metrics.outcome(r.priority, &r.payload.label, outcome::EVICTED, r.waited);
            r.payload.waiter.signal(Signal::Evicted);
        });
        let ticket = match queued {
            Ok(t) => t,
            Err(refused) => {
                metrics.outcome(req.priority, &label, outcome::SATURATED, Duration::ZERO);
                return Err(QueueRefused(refused.reason));
            }
        };
        tracing::debug!(
            pool = %ctl.metrics.pool,
            priority = req.priority.as_str(),
            tenant = &*label,
            band_queued = inner.queues.band_len(req.priority),
            "flow control: queued, every pod saturated or requests of its band waiting",
        );
        ctl.kick_locked(&mut inner, false);
        drop(inner);
        let deadline = ctl
            .cfg
            .ttl()
            .map(|ttl| Box::pin(tokio::time::sleep_until(now + ttl)));
        Ok(Queued {
            ctl: Arc::clone(ctl),
            ticket,
            waiter,
            priority: req.priority,
            label,
            enqueued: now,
            deadline,
            done: false,
        })
    }
}

/// A request waiting in the queues. Poll [`Queued::poll_turn`] (or await [`Queued::turn`]);
/// on [`Turn::Try`] pick, then report [`Queued::dispatched`] or [`Queued::still_saturated`].
/// Dropping it removes the request from the queues.
pub struct Queued {
    ctl: Arc<Ctl>,
    ticket: FlowTicket,
    waiter: Arc<Waiter>,
    priority: Priority,
    label: Arc<str>,
    enqueued: Instant,
    deadline: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued")
            .field("ticket", &self.ticket)
            .field("priority", &self.priority)
            .finish()
    }
}

impl Queued {
    /// The request's band.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The `Retry-After` of a queue rejection of this request: the longer of the pool's latest
    /// drain estimate and the expected wait of the queue ahead of its band.
    pub fn retry_after(&self) -> Duration {
        let inner = self.ctl.lock();
        inner
            .queues
            .retry_after(self.priority, inner.retry_after, self.ctl.clock.now())
    }

    /// The clear pods this request's pick must leave to protected requests (0 when it is
    /// protected, or has left the queue).
    pub fn reserve(&self) -> u16 {
        self.ctl
            .lock()
            .queues
            .reserve_of(self.ticket, self.ctl.clock.now())
    }

    /// Ready when the request has its turn, or has left the queue (TTL, eviction).
    pub fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<Turn> {
        if let Some(sleep) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            self.deadline = None;
            let mut inner = self.ctl.lock();
            self.ctl.kick_locked(&mut inner, true);
        }
        let mut st = self
            .waiter
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match st.0 {
            Signal::Wait => {
                st.1 = Some(cx.waker().clone());
                Poll::Pending
            }
            Signal::Turn => {
                st.0 = Signal::Wait;
                Poll::Ready(Turn::Try)
            }
            Signal::Expired => {
                self.done = true;
                Poll::Ready(Turn::Expired(self.waited()))
            }
            Signal::Evicted => {
                self.done = true;
                Poll::Ready(Turn::Evicted(self.waited()))
            }
        }
    }

    /// Waits for the request's turn (see [`Queued::poll_turn`]).
    pub async fn turn(&mut self) -> Turn {
        std::future::poll_fn(|cx| self.poll_turn(cx)).await
    }

    fn waited(&self) -> Duration {
        self.enqueued.elapsed()
    }

    /// The pick made on this turn routed the request: it leaves the queue, its estimate is
    /// charged to its tenant, and the next request gets its turn.
    pub fn dispatched(mut self) -> Option<FlowCharge> {
        self.done = true;
        let ctl = Arc::clone(&self.ctl);
        let mut inner = ctl.lock();
        let d = inner.queues.dispatch(self.ticket, ctl.clock.now());
        if inner.turn == Some(self.ticket) {
            inner.turn = None;
        }
        ctl.kick_locked(&mut inner, true);
        drop(inner);
        let d = d?;
        ctl.metrics.wait[band(d.priority)].observe(d.waited.as_secs_f64());
        ctl.metrics
            .outcome(d.priority, &self.label, outcome::DISPATCHED, d.waited);
        Some(FlowCharge {
            ctl: Arc::downgrade(&ctl),
            charge: d.charge,
        })
    }

    /// The pick made on this turn found the pool still saturated: the request keeps its place;
    /// the next release or metrics page gives the head another turn. When the request had a
    /// reserve to leave, the first protected request behind it gets a turn first.
    pub fn still_saturated(&mut self, retry_after: Duration) {
        let mut inner = self.ctl.lock();
        inner.retry_after = retry_after;
        if inner.turn == Some(self.ticket) {
            inner.turn = None;
            let now = self.ctl.clock.now();
            let protected = if inner.queues.reserve_of(self.ticket, now) > 0 {
                inner
                    .queues
                    .peek_protected(now)
                    .filter(|&p| p != self.ticket)
            } else {
                None
            };
            if let Some(p) = protected {
                inner.turn = Some(p);
                if let Some(e) = inner.queues.get(p) {
                    e.waiter.signal(Signal::Turn);
                }
            } else if std::mem::take(&mut inner.missed) {
                self.ctl.kick_locked(&mut inner, true);
            }
        }
    }

    /// Leaves the queue because the pool has no endpoint for it; returns how long it waited.
    pub fn no_endpoints(mut self) -> Duration {
        self.leave(outcome::NO_ENDPOINTS);
        self.waited()
    }

    fn leave(&mut self, why: &'static str) {
        if self.done {
            return;
        }
        self.done = true;
        let mut inner = self.ctl.lock();
        if inner.queues.remove(self.ticket).is_some() {
            let waited = self.enqueued.elapsed();
            self.ctl.metrics.wait[band(self.priority)].observe(waited.as_secs_f64());
            self.ctl
                .metrics
                .outcome(self.priority, &self.label, why, waited);
        }
        if inner.turn == Some(self.ticket) {
            inner.turn = None;
        }
        self.ctl.kick_locked(&mut inner, true);
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.leave(outcome::CANCELLED);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
