//! A live inference pool: the scheduler, kept fresh by the metrics scraper.
//!
//! The ext_proc endpoint picker and the standalone gateway route the same way because they run
//! on the same [`LivePool`]: a [`Scheduler`] behind one short-held mutex, a metrics [`Scraper`]
//! whose snapshots flow straight into it, one clock, and one seeded random generator.
//!
//! Per request, a shell calls [`LivePool::pick`] and holds the returned [`Inflight`] guard for as
//! long as the request runs. The guard reports the outcome back to the scheduler — first token,
//! completion with usage (which teaches the rate learner), failure — and, if it is dropped without
//! an outcome (client reset, stream cancelled, task aborted), cancels the in-flight entry. So no
//! path through a shell can leak in-flight accounting.
//!
//! Layout:
//! - this file — [`PoolConfig`], [`LivePool`], [`Inflight`];
//! - [`lifecycle`] — one request's lifecycle for both front doors: context, pick, the rejection
//!   table, the response watch and how the in-flight entry ends;
//! - [`admin`] — the small HTTP server for `/metrics`, `/healthz` and `/readyz`, the one admin
//!   port of the gateway, the picker, the BBR and the operator;
//! - [`heartbeat`] — the heartbeat document (`/heartbeat` on the admin port): a small JSON status
//!   per pool that the global router polls;
//! - [`flow`] — flow control: requests wait in bounded per-priority queues while every pod is
//!   saturated ([`flow::FlowController`]), woken by the pool's [`changes::Changes`] signal;
//!   [`tenant`] — a request's tenant and priority;
//! - [`histogram`] — [`histogram::AtomicHistogram`], a lock-free histogram for per-request
//!   timings;
//! - [`hop`] — the hop-by-hop headers both front doors strip before forwarding, either way;
//! - [`pods`] — the per-pod gauges (`infergate_pod_*`), read from the scheduler at each scrape;
//! - [`quota`] — per-tenant request and token quotas, shared across replicas through Redis;
//! - [`readiness`] — what `/readyz` says when not ready: which pools cannot route, and why;
//! - [`redis`] — a small RESP2 Redis client (pipelines, timeouts, reconnect with backoff);
//! - [`tls`] — TLS for the server ports (certificate files reloaded on change, or
//!   self-signed) and HTTPS to model servers;
//! - [`watch`] — polling a file for changes and reloading it (configuration files, rewrites);
//! - [`error`] — [`PoolError`], and [`ErrorChain`] to log an error with its causes.
//!
//! [`Scraper`]: infergate_metrics::Scraper

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use infergate_metrics::{
    Clock, ScrapeMetrics, ScrapeState, Scraper, ScraperConfig, Target, Update,
};
use infergate_scheduler::{
    Decision, EndpointInfo, EndpointMeta, Explanation, Ranked, Rejection, RequestContext,
    Scheduler, SchedulerConfig, Ticket, Usage,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use infergate_scheduler::outlier::{Answer, Cause, Ejection};

pub mod address;
pub mod admin;
pub mod changes;
pub mod error;
pub mod flow;
pub mod heartbeat;
pub mod histogram;
pub mod hop;
pub mod lifecycle;
pub mod peers;
pub mod pods;
pub mod precise;
pub mod quota;
pub mod readiness;
pub mod redis;
pub mod tenant;
pub mod tls;
pub mod watch;

pub use changes::Changes;
pub use error::{ErrorChain, PoolError};

/// How a pool routes and how it watches its endpoints.
#[derive(Clone, Debug, Default)]
pub struct PoolConfig {
    /// Filters, scorers, weights and admission.
    pub scheduler: SchedulerConfig,
    /// Scrape interval, staleness, timeouts and limits.
    pub scrape: ScraperConfig,
    /// Seed of the tie-breaking random generator (fixed seeds make runs reproducible).
    pub seed: u64,
}

/// The scheduler and its random generator, locked together for one pick.
struct State {
    scheduler: Scheduler,
    rng: SmallRng,
    /// Endpoints whose scrapes failed because nothing listened (connection refused): whatever
    /// answers there next is a new process, whose speed must be learned afresh.
    unreachable: HashSet<SocketAddr>,
}

/// The pool's own metrics.
#[derive(Clone)]
struct Telemetry {
    pick_seconds: histogram::AtomicHistogram,
    endpoints: Gauge,
    /// 1 while the pool dispatches fail-open (no pod with fresh metrics; `staleMetrics`).
    fail_open: Gauge,
    /// Requests dispatched fail-open.
    fail_open_requests: Counter,
    /// Connections to an endpoint refused on the request path ([`LivePool::connection_refused`]).
    refused: Counter,
    /// Picks whose random sample of a large pool could not take the request (`candidateSample`).
    sample_fallbacks: Counter,
    /// Endpoints ejected by outlier detection.
    ejections: Counter,
    /// Ejections due but held back by `maxEjectionPercent`.
    ejections_held_back: Counter,
}

impl Telemetry {
    fn new(registry: Option<&mut Registry>) -> Self {
        // Pick latency buckets from 1 µs to ~4 ms: a pick is microseconds; anything in the
        // milliseconds is lock contention worth seeing.
        let t = Telemetry {
            // Recorded on every pick: atomic adds, no lock of its own.
            pick_seconds: histogram::AtomicHistogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(1e-6, 2.0, 13),
            ),
            endpoints: Gauge::default(),
            fail_open: Gauge::default(),
            fail_open_requests: Counter::default(),
            refused: Counter::default(),
            sample_fallbacks: Counter::default(),
            ejections: Counter::default(),
            ejections_held_back: Counter::default(),
        };
        if let Some(r) = registry {
            r.register(
                "infergate_pool_pick_duration_seconds",
                "Time to choose endpoints for one request, lock wait included",
                t.pick_seconds.clone(),
            );
            r.register(
                "infergate_pool_endpoints",
                "Endpoints in the pool",
                t.endpoints.clone(),
            );
            r.register(
                "infergate_pool_fail_open",
                "1 while requests are dispatched fail-open on in-flight accounting: no pod has fresh metrics, or every fresh pod would shed (staleMetrics)",
                t.fail_open.clone(),
            );
            r.register(
                "infergate_pool_fail_open_requests",
                "Requests dispatched fail-open (no pod with fresh metrics)",
                t.fail_open_requests.clone(),
            );
            r.register(
                "infergate_pool_pick_sample_fallbacks",
                "Picks over a large pool whose random sample of endpoints (candidateSample) could not take the request (none left after the filters, all saturated, it would shed, or the headroom reserve held endpoints back) and that were made again over every endpoint",
                t.sample_fallbacks.clone(),
            );
            r.register(
                "infergate_pool_endpoint_ejections",
                "Endpoints outlier detection took out of the candidates: their requests failed (500, 502, 503, 504 or no response headers) outlierDetection.consecutive5xx times in a row",
                t.ejections.clone(),
            );
            r.register(
                "infergate_pool_endpoint_ejections_held_back",
                "Ejections due but held back: one more would be over outlierDetection.maxEjectionPercent of the pool's endpoints",
                t.ejections_held_back.clone(),
            );
            r.register(
                "infergate_pool_endpoint_refusals",
                "Connections to an endpoint refused on the request path; each fails the endpoint at once, as a refused scrape does",
                t.refused.clone(),
            );
        }
        t
    }
}

struct Shared {
    /// Raised when room may have freed up: an in-flight entry released, a metrics page
    /// applied (flow control's wake-up; every watcher sees it, none is lost).
    changes: Arc<Changes>,
    state: Arc<Mutex<State>>,
    scraper: Scraper<SocketAddr>,
    clock: Clock,
    stale_after: Duration,
    telemetry: Telemetry,
    /// Whether the last decisive pick was fail-open (for the gauge and the enter/leave logs).
    fail_open: AtomicBool,
    /// Whether the scheduler dispatches fail-open when no pod is fresh (`staleMetrics`).
    fail_open_enabled: bool,
    /// Wakes the peer exchange's reporter when this replica's load changed (a pick, a first
    /// token, a release), once an exchange runs ([`peers`]): the change is pushed at once
    /// unless a report went out less than an interval ago.
    peer_wake: tokio::sync::Notify,
    /// Whether an exchange runs (no wake-ups are stored otherwise).
    peer_wake_on: AtomicBool,
    /// Precise prefix routing, once enabled ([`LivePool::enable_precise`]).
    precise: std::sync::OnceLock<precise::Precise>,
}

/// A pool of model-server endpoints with live metrics and a scheduler. Cheap to clone.
#[derive(Clone)]
pub struct LivePool {
    shared: Arc<Shared>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves the scheduler consistent enough to keep routing:
    // every mutation it makes is a single counter or table update.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LivePool {
    /// Starts a pool with no endpoints. Must be called inside a tokio runtime (the scraper spawns
    /// tasks). Metrics are registered into `registry` when one is given.
    pub fn start(config: PoolConfig, registry: Option<&mut Registry>) -> Result<Self, PoolError> {
        Self::start_with_clock(config, Clock::starting_now(), registry)
    }

    /// As [`LivePool::start`], with the clock given (tests pass one on tokio's paused time).
    ///
    /// The scraper judges each pod ok, late or failed at its staleness threshold, and the
    /// scheduler follows those reports: a failed pod leaves the candidates at once, a late one
    /// stays on its last page. The scheduler's own age bound (`maxMetricsAge`) is then only the
    /// safety net for an ok pod the scraper has said nothing about — a scraper thread starved
    /// on busy cores reports late, so the bound is never below the scraper's threshold plus one
    /// interval (with the two equal, a pick on another thread dropped a healthy pod in the gap
    /// before the scraper's timer ran, and with every other pod failed answered 503). A scheduler
    /// configured to keep stale pods (`maxMetricsAge` unset, as the baseline presets do) keeps
    /// them.
    pub fn start_with_clock(
        mut config: PoolConfig,
        clock: Clock,
        mut registry: Option<&mut Registry>,
    ) -> Result<Self, PoolError> {
        if let Some(age) = config.scheduler.max_metrics_age {
            let floor = config.scrape.stale_after + config.scrape.interval;
            config.scheduler.max_metrics_age = Some(age.max(floor));
        }
        // What an ok pod's page may be aged before it is not routed on: the scheduler's bound.
        let stale_after = config
            .scheduler
            .max_metrics_age
            .unwrap_or(config.scrape.stale_after);
        let fail_open_enabled = config.scheduler.max_metrics_age.is_some()
            && config.scheduler.stale_metrics.fail_open_cap().is_some();
        let scheduler = Scheduler::new(config.scheduler)?;
        let state = Arc::new(Mutex::new(State {
            scheduler,
            rng: SmallRng::seed_from_u64(config.seed),
            unreachable: HashSet::new(),
        }));
        let scrape_metrics = match registry.as_deref_mut() {
            Some(r) => ScrapeMetrics::register(r),
            None => ScrapeMetrics::default(),
        };
        if let Some(r) = registry.as_deref_mut() {
            r.register_collector(Box::new(pods::PodCollector {
                state: Arc::clone(&state),
                clock,
                stale_after,
            }));
        }
        let telemetry = Telemetry::new(registry);
        let sink_state = Arc::clone(&state);
        let changes = Arc::new(Changes::new());
        let sink_changes = Arc::clone(&changes);
        // The scraper has already logged every transition; the scheduler follows it: a late pod
        // stays a candidate on its last page, a failed one leaves the candidates at once.
        let sink = move |addr: &SocketAddr, update: Update| {
            let mut st = lock(&sink_state);
            let applied = match update {
                Update::Snapshot(snapshot) => {
                    let applied = st.scheduler.apply_metrics(*addr, snapshot);
                    if applied.is_ok() && st.unreachable.remove(addr) {
                        st.scheduler.forget_learned_rates(*addr);
                        tracing::info!(endpoint = %addr, "endpoint answers again after being unreachable: its learned rates start afresh");
                    }
                    applied
                }
                Update::Late { .. } => st.scheduler.set_scrape_state(*addr, ScrapeState::Late),
                Update::Stale {
                    unreachable,
                    reachable,
                    ..
                } => {
                    if unreachable {
                        st.unreachable.insert(*addr);
                    }
                    st.scheduler
                        .set_reachable(*addr, reachable)
                        .and_then(|()| st.scheduler.set_scrape_state(*addr, ScrapeState::Failed))
                }
            };
            drop(st);
            if let Err(e) = applied {
                // The endpoint left the pool while its scrape was in flight.
                tracing::debug!(endpoint = %addr, error = %e, "update for a removed endpoint dropped");
            }
            sink_changes.signal();
        };
        let scraper = Scraper::spawn(config.scrape, clock, scrape_metrics, sink)?;
        Ok(LivePool {
            shared: Arc::new(Shared {
                changes,
                state,
                scraper,
                clock,
                stale_after,
                telemetry,
                fail_open: AtomicBool::new(false),
                fail_open_enabled,
                peer_wake: tokio::sync::Notify::new(),
                peer_wake_on: AtomicBool::new(false),
                precise: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Replaces the pool's membership: endpoints not listed leave (their in-flight entries are
    /// dropped with them), listed ones are added or updated, and the scraper follows.
    pub fn set_endpoints(
        &self,
        endpoints: impl IntoIterator<Item = EndpointMeta>,
    ) -> Result<(), PoolError> {
        let endpoints: Vec<EndpointMeta> = endpoints.into_iter().collect();
        for (i, e) in endpoints.iter().enumerate() {
            if endpoints[..i].iter().any(|o| o.addr == e.addr) {
                return Err(PoolError::DuplicateEndpoint { addr: e.addr });
            }
        }
        {
            let mut st = lock(&self.shared.state);
            let leaving: Vec<SocketAddr> = st
                .scheduler
                .endpoints()
                .map(|m| m.addr)
                .filter(|a| !endpoints.iter().any(|e| e.addr == *a))
                .collect();
            for addr in leaving {
                st.scheduler.remove_endpoint(addr);
            }
            for e in &endpoints {
                st.scheduler.upsert_endpoint(e.clone());
            }
        }
        if let Some(p) = self.shared.precise.get() {
            p.set_endpoints(endpoints.iter());
        }
        // Scheduler first, scraper second: a first snapshot always finds its endpoint.
        self.shared.scraper.set_targets(
            endpoints
                .iter()
                .map(|e| Target::new(e.addr, e.addr, e.engine)),
        )?;
        self.shared
            .telemetry
            .endpoints
            .set(i64::try_from(endpoints.len()).unwrap_or(i64::MAX));
        Ok(())
    }

    /// Turns on precise prefix routing: from now on the pool subscribes to every endpoint's
    /// KV-event feed. Must be called inside a tokio runtime; a second call is refused (the
    /// precise state is returned back).
    pub fn enable_precise(&self, precise: precise::Precise) -> Result<(), precise::Precise> {
        self.shared.precise.set(precise)?;
        if let Some(p) = self.shared.precise.get() {
            let metas: Vec<EndpointMeta> = lock(&self.shared.state)
                .scheduler
                .endpoints()
                .cloned()
                .collect();
            p.set_endpoints(metas.iter());
        }
        Ok(())
    }

    /// Precise prefix routing, when enabled.
    pub fn precise(&self) -> Option<&precise::Precise> {
        self.shared.precise.get()
    }

    /// Chooses endpoints for a request. The returned guard holds the in-flight entry.
    ///
    /// With debug logging on for this crate (`RUST_LOG=debug`), every pick is made with
    /// [`LivePool::pick_explained`] and logged as one line: candidates, which filter removed
    /// which pod, every scorer's value. With it off, nothing is built (one cached check).
    pub fn pick(&self, req: &RequestContext<'_>) -> Result<Inflight, Rejection> {
        if tracing::enabled!(tracing::Level::DEBUG) {
            return self.pick_explained(req).0;
        }
        let started = std::time::Instant::now();
        let now = self.shared.clock.now();
        let decision = {
            let mut st = lock(&self.shared.state);
            let State { scheduler, rng, .. } = &mut *st;
            scheduler.pick(req, now, rng)
        };
        self.shared
            .telemetry
            .pick_seconds
            .observe(started.elapsed().as_secs_f64());
        self.note_mode(&decision);
        decision.map(|d| Inflight::new(self.clone(), d))
    }

    /// Follows fail-open from the picks' outcomes: a fail-open pick enters it (or counts in
    /// it), a pick on fresh metrics or a pool with no pod answering leaves it. Each transition
    /// is logged once and shown in `infergate_pool_fail_open`.
    fn note_mode(&self, decision: &Result<Decision, Rejection>) {
        if matches!(decision, Ok(d) if d.sample_fallback) {
            self.shared.telemetry.sample_fallbacks.inc();
        }
        let now_open = match decision {
            Ok(d) => d.fail_open,
            Err(Rejection::Unavailable { .. } | Rejection::NoEndpoints) => false,
            // Shed: saturated, or every answering pod at its fail-open cap; the mode stands.
            Err(_) => return,
        };
        let t = &self.shared.telemetry;
        if now_open {
            t.fail_open_requests.inc();
        }
        if self.shared.fail_open.swap(now_open, Ordering::Relaxed) != now_open {
            t.fail_open.set(i64::from(now_open));
            if now_open {
                tracing::warn!(
                    "no pod with fresh metrics can take requests (none fresh, or every fresh one would shed): dispatching fail-open on in-flight accounting to the pods whose scrapes fail but which still answer (staleMetrics)"
                );
            } else {
                tracing::info!(
                    "fail-open ended: routing on fresh metrics again (or no pod answers)"
                );
            }
        }
    }

    /// As [`LivePool::pick`], with the decision record (candidates, filters, every score). Logs
    /// the decision at debug level.
    pub fn pick_explained(
        &self,
        req: &RequestContext<'_>,
    ) -> (Result<Inflight, Rejection>, Explanation) {
        let started = std::time::Instant::now();
        let now = self.shared.clock.now();
        let (decision, explanation) = {
            let mut st = lock(&self.shared.state);
            let State { scheduler, rng, .. } = &mut *st;
            scheduler.pick_explained(req, now, rng)
        };
        self.shared
            .telemetry
            .pick_seconds
            .observe(started.elapsed().as_secs_f64());
        self.note_mode(&decision);
        tracing::debug!(
            model = req.model,
            lora = req.lora_adapter,
            priority = req.priority.as_str(),
            considered = explanation.considered,
            filtered = explanation.filtered.len(),
            scored = explanation.candidates.len(),
            rejection = explanation.rejection,
            explanation = %explanation.summary(usize::MAX),
            "routing decision"
        );
        (
            decision.map(|d| Inflight::new(self.clone(), d)),
            explanation,
        )
    }

    /// Whether at least one endpoint can be routed on: metrics fresher than the staleness
    /// threshold, or a late scrape (alive, slow) with metrics from before; never a failed one
    /// — unless the pool dispatches fail-open (`staleMetrics`) and the failed one's scrapes
    /// still reach the server.
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Why the pool is not ready ([`LivePool::is_ready`]), or `None` when it is: no endpoint,
    /// none scraped yet, or none with fresh metrics, with how many endpoints are in which state
    /// (what `/readyz` says, [`readiness`]).
    pub fn not_ready(&self) -> Option<readiness::Reason> {
        let now = self.shared.clock.now();
        let st = lock(&self.shared.state);
        let addrs: Vec<SocketAddr> = st.scheduler.endpoints().map(|m| m.addr).collect();
        let (mut failing, mut old, mut not_scraped) = (0, 0, 0);
        for info in addrs.iter().filter_map(|a| st.scheduler.endpoint(*a)) {
            if routable(&info, now, self.shared.stale_after) == Some(true)
                || (self.shared.fail_open_enabled
                    && info.scrape == ScrapeState::Failed
                    && info.reachable)
            {
                return None;
            }
            if info.scrape == ScrapeState::Failed {
                failing += 1;
            } else if info.metrics.is_none() {
                not_scraped += 1;
            } else {
                old += 1;
            }
        }
        let endpoints = failing + old + not_scraped;
        Some(if endpoints == 0 {
            readiness::Reason::NoEndpoints
        } else if not_scraped == endpoints {
            readiness::Reason::NotScraped { endpoints }
        } else {
            readiness::Reason::Stale {
                endpoints,
                failing,
                old,
                not_scraped,
                stale_after: self.shared.stale_after,
            }
        })
    }

    /// A view of every endpoint (identity, latest metrics, in-flight, learned rates).
    pub fn endpoints_info(&self) -> Vec<EndpointInfo> {
        let st = lock(&self.shared.state);
        let addrs: Vec<SocketAddr> = st.scheduler.endpoints().map(|m| m.addr).collect();
        addrs
            .into_iter()
            .filter_map(|a| st.scheduler.endpoint(a))
            .collect()
    }

    /// What the per-pod gauges (`infergate_pod_*`) show now, one sample per endpoint.
    pub fn pod_samples(&self) -> Vec<pods::PodSample> {
        pods::sample(
            &self.shared.state,
            self.shared.clock,
            self.shared.stale_after,
        )
    }

    /// Requests in flight across the pool, as the scheduler counts them.
    pub fn inflight(&self) -> usize {
        lock(&self.shared.state).scheduler.inflight()
    }

    /// The smoothed mean of the estimated prompt tokens of the requests routed
    /// ([`Scheduler::mean_prompt_tokens`]).
    pub fn mean_prompt_tokens(&self) -> f64 {
        lock(&self.shared.state).scheduler.mean_prompt_tokens()
    }

    /// Raised whenever room may have freed up (an in-flight entry released, a metrics page
    /// applied); flow control waits on it.
    pub fn changes(&self) -> Arc<Changes> {
        Arc::clone(&self.shared.changes)
    }

    /// Whether `other` is this same pool (a clone of it), not another with the same settings.
    pub fn same_pool(&self, other: &LivePool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The pool's clock.
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// The scheduler configuration in force.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        lock(&self.shared.state).scheduler.config().clone()
    }

    /// Stops scraping. Picks keep working on the last snapshots until they age out.
    pub fn shutdown(&self) {
        self.shared.scraper.shutdown();
        if let Some(p) = self.shared.precise.get() {
            p.set_endpoints(std::iter::empty());
        }
    }

    /// A connection to `addr` made on the request path was refused: nothing listens there. The
    /// endpoint is failed and unreachable at once, as a refused scrape makes it, without waiting
    /// for its next scrape: no pick (fail-open included) is sent there until its metrics answer
    /// again, and its learned rates start afresh then (whatever answers is a new process).
    /// Unknown endpoints (left the pool meanwhile) are ignored.
    pub fn connection_refused(&self, addr: SocketAddr) {
        self.shared.telemetry.refused.inc();
        let mut st = lock(&self.shared.state);
        let marked = st
            .scheduler
            .set_reachable(addr, false)
            .and_then(|()| st.scheduler.set_scrape_state(addr, ScrapeState::Failed));
        let first = marked.is_ok() && st.unreachable.insert(addr);
        drop(st);
        if first {
            tracing::warn!(
                endpoint = %addr,
                "connection to the endpoint refused: not routed on until its metrics answer again"
            );
        }
    }

    fn with_scheduler<T>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        f(&mut lock(&self.shared.state).scheduler)
    }

    /// This replica's own load changed: wakes the peer exchange's reporter, if one runs (an
    /// atomic load otherwise).
    fn load_changed(&self) {
        if self.shared.peer_wake_on.load(Ordering::Relaxed) {
            self.shared.peer_wake.notify_one();
        }
    }
}

/// Whether `info` can be routed on at `now` with `stale_after` as the age bound of an `ok`
/// endpoint's metrics: `None` before its first page.
pub fn routable(
    info: &EndpointInfo,
    now: infergate_scheduler::Timestamp,
    stale_after: Duration,
) -> Option<bool> {
    let m = info.metrics.as_ref()?;
    Some(match info.scrape {
        ScrapeState::Failed => false,
        ScrapeState::Late => true,
        ScrapeState::Ok => now.saturating_since(m.sampled_at) <= stale_after,
    })
}

/// The in-flight entry of one routed request. Report its outcome through it; dropping it without
/// [`Inflight::complete`] or [`Inflight::fail`] cancels the entry.
pub struct Inflight {
    pool: LivePool,
    decision: Decision,
    current: SocketAddr,
    first_token: bool,
    finished: bool,
    /// What the current endpoint answered, for outlier detection: told without a lock
    /// ([`Inflight::answered`]), counted under the lock the entry's next report takes anyway.
    answer: Option<Answer>,
}

impl std::fmt::Debug for Inflight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflight")
            .field("endpoints", &self.decision.endpoints)
            .field("current", &self.current)
            .field("first_token", &self.first_token)
            .finish()
    }
}

impl Inflight {
    fn new(pool: LivePool, decision: Decision) -> Self {
        let current = decision.endpoints.first();
        pool.load_changed();
        Inflight {
            pool,
            decision,
            current,
            first_token: false,
            finished: false,
            answer: None,
        }
    }

    /// The current endpoint answered with `status` (its response headers): counted for outlier
    /// detection (the scheduler's `outlierDetection`) when the entry is next reported — moved
    /// to a fallback, completed, failed or dropped.
    pub fn answered(&mut self, status: u16) {
        self.answer = Some(Answer::of_status(status));
    }

    /// The current endpoint gave no response headers (a connection broken after it was made, a
    /// first-byte timeout): a failure for outlier detection, as [`Inflight::answered`]. A
    /// refused connection is [`Inflight::refused`] instead.
    pub fn no_answer(&mut self) {
        self.answer = Some(Answer::Failure);
    }
}

/// Counts what `addr` answered (if it was told) with the scheduler already locked; logs and
/// counts an ejection.
fn judge(
    s: &mut Scheduler,
    answer: Option<Answer>,
    addr: SocketAddr,
    now: infergate_scheduler::Timestamp,
    telemetry: &Telemetry,
) {
    let Some(answer) = answer else {
        return;
    };
    match s.observe_answer(addr, answer, now) {
        None => {}
        Some(Ejection::Ejected {
            length,
            in_a_row,
            cause,
        }) => {
            telemetry.ejections.inc();
            let ejection_ms = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
            match cause {
                Cause::Consecutive5xx => tracing::warn!(
                    endpoint = %addr,
                    ejection_ms,
                    in_a_row,
                    "endpoint ejected: its requests failed (500, 502, 503, 504 or no response headers) outlierDetection.consecutive5xx times in a row"
                ),
                Cause::FailurePercentage { failed, answers } => tracing::warn!(
                    endpoint = %addr,
                    ejection_ms,
                    in_a_row,
                    failed,
                    answers,
                    "endpoint ejected: over an interval of outlierDetection.failurePercentage, at least its threshold of the answers failed (500, 502, 503, 504 or no response headers)"
                ),
            }
        }
        Some(Ejection::HeldBack) => {
            telemetry.ejections_held_back.inc();
            tracing::debug!(
                endpoint = %addr,
                "ejection held back: outlierDetection.maxEjectionPercent of the pool is ejected"
            );
        }
    }
}

impl Inflight {
    /// The ranked endpoints: first choice, then fallbacks.
    pub fn endpoints(&self) -> &Ranked {
        &self.decision.endpoints
    }

    /// The endpoint the entry is currently charged to.
    pub fn endpoint(&self) -> SocketAddr {
        self.current
    }

    /// The scheduler's ticket.
    pub fn ticket(&self) -> Ticket {
        self.decision.ticket
    }

    /// Moves the entry to `addr` after falling back to it.
    pub fn reassign(&mut self, addr: SocketAddr) {
        if addr != self.current {
            let (ticket, now) = (self.decision.ticket, self.pool.clock().now());
            let (answer, current) = (self.answer.take(), self.current);
            let telemetry = &self.pool.shared.telemetry;
            self.pool.with_scheduler(|s| {
                judge(s, answer, current, now, telemetry);
                s.reassign(ticket, addr)
            });
            self.current = addr;
            self.pool.load_changed();
        }
    }

    /// The connection to `addr` (the first choice or a fallback) was refused: see
    /// [`LivePool::connection_refused`].
    pub fn refused(&self, addr: SocketAddr) {
        self.pool.connection_refused(addr);
    }

    /// For a request whose ranked endpoints all failed: the pool's next endpoint from position
    /// `*from` of its endpoints on that is not among [`Inflight::endpoints`] and was not found
    /// unreachable (a refused or failed connection, by a scrape or a request, since its last
    /// good scrape); `*from` moves past it. The pick's filters (metrics age, saturation, LoRA,
    /// outlier ejection) and `returnedEndpoints` may have left it out: it is a last resort
    /// before a failure answer. Takes the pool's lock, so it belongs on the failure path only.
    pub fn next_untried(&self, from: &mut usize) -> Option<SocketAddr> {
        let ranked = self.decision.endpoints.as_slice();
        let st = lock(&self.pool.shared.state);
        let (i, addr) = st
            .scheduler
            .endpoints()
            .map(|m| m.addr)
            .enumerate()
            .skip(*from)
            .find(|(_, a)| !ranked.contains(a) && !st.unreachable.contains(a))?;
        *from = i + 1;
        Some(addr)
    }

    /// Records the first generated token (the time to first token). Later calls do nothing.
    pub fn first_token(&mut self) {
        if !self.first_token {
            self.first_token = true;
            let (ticket, now) = (self.decision.ticket, self.pool.clock().now());
            self.pool.with_scheduler(|s| s.first_token(ticket, now));
            self.pool.load_changed();
        }
    }

    /// Whether the first token has been recorded.
    pub fn saw_first_token(&self) -> bool {
        self.first_token
    }

    /// The request completed; `usage` teaches the rate learner.
    pub fn complete(mut self, usage: Usage) {
        self.finished = true;
        let (ticket, now) = (self.decision.ticket, self.pool.clock().now());
        let (answer, current) = (self.answer.take(), self.current);
        let telemetry = &self.pool.shared.telemetry;
        self.pool.with_scheduler(|s| {
            judge(s, answer, current, now, telemetry);
            s.complete(ticket, now, usage)
        });
        self.pool.shared.changes.signal();
        self.pool.load_changed();
    }

    /// The request failed (upstream error or timeout).
    pub fn fail(mut self) {
        self.finished = true;
        let (ticket, now) = (self.decision.ticket, self.pool.clock().now());
        let (answer, current) = (self.answer.take(), self.current);
        let telemetry = &self.pool.shared.telemetry;
        self.pool.with_scheduler(|s| {
            judge(s, answer, current, now, telemetry);
            s.fail(ticket, now)
        });
        self.pool.shared.changes.signal();
        self.pool.load_changed();
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if !self.finished {
            let (ticket, now) = (self.decision.ticket, self.pool.clock().now());
            let (answer, current) = (self.answer.take(), self.current);
            let telemetry = &self.pool.shared.telemetry;
            self.pool.with_scheduler(|s| {
                judge(s, answer, current, now, telemetry);
                s.cancel(ticket, now)
            });
            self.pool.shared.changes.signal();
            self.pool.load_changed();
        }
    }
}
