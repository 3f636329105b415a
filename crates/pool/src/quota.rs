//! Per-tenant quotas for both front doors: local windows on the request path, shared through
//! Redis in the background.
//!
//! A request is admitted or refused from this replica's memory alone ([`Quotas::admit`]: one
//! map lookup and one short per-tenant lock, no IO), charged one request and its token
//! estimate; when its answer completes, [`QuotaTicket::settle`] corrects the estimate to the
//! input and output tokens the model server reported. The windows and their accuracy are
//! `infergate_scheduler::quota`'s.
//!
//! With `redis` configured, a background task syncs every `sync_interval`: one pipeline per
//! round writes this replica's own total for each bucket it used since the last round (one
//! script, `EVAL`: each replica's own total per bucket in a hash, the bucket's sum moved by the
//! difference, so a round whose answer was lost and that is sent again counts once), reads the
//! live buckets' sums back (`MGET`), and records its round time in a sorted set of the
//! replicas' last rounds (`ZADD`), from which it reads how many replicas are alive (`ZCARD`) and
//! the oldest last round among them (`ZRANGE … WITHSCORES`). Between rounds each replica assumes
//! the others do as much as it does (its unsynced use counts `replicas` times, and so does its
//! use in its own rounds taken after the oldest replica's last round: the others' use of that
//! stretch may not be in Redis yet; two rounds at most), so the fleet holds the shared limit
//! even while a replica's rounds run up to one round late.
//!
//! The presence set is complete only once every replica has had a period to add itself: after
//! Redis restarts empty (or this replica's link comes back), the first replica to sync would
//! find itself alone and, counting with `replicas = 1`, admit the whole remaining quota while the
//! others admit their shares too. So for one period after a round first succeeds the replica
//! count may rise but not fall; a replica that really left is dropped after that.
//!
//! When Redis cannot be reached (timeout, refused, broken reply) no request waits for it or
//! fails because of it: the round's use is kept for the next one, the metric
//! `infergate_quota_redis_up` drops to 0 and one warning is logged; each replica then counts
//! locally and enforces its share of the quota (the limit divided by the replicas last seen),
//! carrying the totals it last read until they leave the window. When Redis answers again,
//! this replica's own total of every live bucket is written again (Redis may have restarted
//! empty), the gauge returns to 1, one line is logged, and counting is shared again.
//!
//! Keys: `{keyPrefix}q:{tenant}:{requests|tokens}:{bucket}` (the sum, a counter) and the same
//! with `:by-replica` (a hash of the replicas' own totals), `{keyPrefix}rounds`, and the
//! per-period presence sets of earlier releases, `{keyPrefix}replicas:{period}` (still written
//! and read, so that replicas of both count each other during a rolling upgrade). Every replica
//! sharing a prefix must use the same window and bucket count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use infergate_openai::{ApiError, Usage};
use infergate_scheduler::quota::{
    Charge, DEFAULT_BUCKETS, DEFAULT_WINDOW, Limits, QuotaError, QuotaKind, TenantQuota, Window,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::redis::{Pipeline, Redis, RedisConfig, Value};

pub mod spec;

pub use spec::QuotasSpec;

/// The metrics label of tenants not configured by name.
pub const OTHER_TENANT: &str = "other";

/// The longest tenant name given its own window; longer names share the overflow window.
pub const MAX_TENANT_NAME: usize = 256;

/// Unlisted tenants given their own window (with the default limits) unless configured; more
/// share one.
pub const DEFAULT_MAX_TENANTS: usize = 10_000;

/// How the quotas count.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaConfig {
    /// Tenants with their own limits.
    pub tenants: Vec<(Arc<str>, Limits)>,
    /// Limits for every tenant not listed, each counted on its own (`None`: no limit).
    pub default: Option<Limits>,
    /// The window the limits are counted over (limits are per window).
    pub window: Duration,
    /// Buckets in the window.
    pub buckets: u32,
    /// Unlisted tenants given a window of their own; beyond, they share one.
    pub max_tenants: usize,
    /// Shared counting, when set.
    pub redis: Option<SharedConfig>,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            tenants: Vec::new(),
            default: None,
            window: DEFAULT_WINDOW,
            buckets: DEFAULT_BUCKETS,
            max_tenants: DEFAULT_MAX_TENANTS,
            redis: None,
        }
    }
}

/// Shared counters in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConfig {
    /// Address, timeouts, password.
    pub redis: RedisConfig,
    /// Prepended to every key, so several fleets can share one Redis.
    pub key_prefix: String,
    /// How often own totals are written and totals read.
    pub sync_interval: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    tenant: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Clone, Default)]
struct QuotaMetrics {
    requests: Family<OutcomeLabels, Counter>,
    tokens: Family<TenantLabels, Counter>,
    redis_up: Gauge,
    sync_errors: Counter,
    replicas: Gauge,
    layout_conflict: Gauge,
}

impl QuotaMetrics {
    /// Registers the service's metrics; the Redis ones (`redis_up`, sync errors, replicas) only
    /// when counts are `shared`, so a replica counting alone by design exports no "Redis down".
    fn register(registry: &mut Registry, shared: bool) -> Self {
        let m = QuotaMetrics::default();
        registry.register(
            "infergate_quota_requests",
            "Requests checked against a quota, by tenant (configured ones, others as `other`) and outcome (admitted, rejected_requests, rejected_tokens)",
            m.requests.clone(),
        );
        registry.register(
            "infergate_quota_tokens",
            "Tokens counted against quotas (input plus output as the responses reported), by tenant",
            m.tokens.clone(),
        );
        if !shared {
            return m;
        }
        registry.register(
            "infergate_quota_redis_up",
            "1 while quota counters are shared through Redis, 0 while this replica counts locally",
            m.redis_up.clone(),
        );
        registry.register(
            "infergate_quota_redis_sync_errors",
            "Sync rounds with Redis that failed",
            m.sync_errors.clone(),
        );
        registry.register(
            "infergate_quota_replicas",
            "Replicas sharing the quota counters, as last seen in Redis",
            m.replicas.clone(),
        );
        registry.register(
            "infergate_quota_window_conflict",
            "1 while another replica sharing the key prefix in Redis counts in another window or \
             bucket count (their counts do not add up), else 0",
            m.layout_conflict.clone(),
        );
        m
    }
}

/// One tenant's windows and its counters.
struct Entry {
    /// The name in Redis keys.
    key: Arc<str>,
    quota: Mutex<TenantQuota>,
    admitted: Counter,
    rejected_requests: Counter,
    rejected_tokens: Counter,
    tokens: Counter,
}

impl Entry {
    fn new(key: Arc<str>, label: &str, quota: TenantQuota, metrics: &QuotaMetrics) -> Arc<Entry> {
        let outcome = |outcome| {
            metrics
                .requests
                .get_or_create(&OutcomeLabels {
                    tenant: label.to_owned(),
                    outcome,
                })
                .clone()
        };
        Arc::new(Entry {
            key,
            quota: Mutex::new(quota),
            admitted: outcome("admitted"),
            rejected_requests: outcome("rejected_requests"),
            rejected_tokens: outcome("rejected_tokens"),
            tokens: metrics
                .tokens
                .get_or_create(&TenantLabels {
                    tenant: label.to_owned(),
                })
                .clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TenantQuota> {
        // Every mutation is a counter update: a panic elsewhere leaves the windows usable.
        self.quota.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Milliseconds since the Unix epoch, advanced by tokio's clock (so paused-clock tests move it
/// and replicas on different hosts name the same buckets).
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    base_ms: u64,
    base: tokio::time::Instant,
}

impl WallClock {
    /// The system's time now.
    pub fn system() -> Self {
        let base_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        WallClock::starting_at(base_ms)
    }

    /// A clock reading `base_ms` now.
    pub fn starting_at(base_ms: u64) -> Self {
        WallClock {
            base_ms,
            base: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the epoch.
    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }
}

struct Inner {
    configured: HashMap<Arc<str>, Arc<Entry>>,
    dynamic: RwLock<HashMap<Arc<str>, Arc<Entry>>>,
    /// Unlisted tenants beyond `max_tenants` (or with over-long names) share this one.
    overflow: Option<Arc<Entry>>,
    config: QuotaConfig,
    replicas: AtomicU32,
    /// [`UNKNOWN`], [`UP`] or [`DOWN`]: what the last sync round found.
    redis: AtomicU8,
    /// When the current run of successful rounds began (ms, the quota clock): until a presence
    /// period has passed since, the sets read may miss replicas.
    up_since_ms: AtomicU64,
    /// This replica's id in the presence set: random per service.
    id: String,
    /// This replica's window layout as written to Redis ([`layout`]).
    layout: String,
    /// Whether the last round found another window layout in Redis under the same prefix.
    layout_conflict: AtomicBool,
    clock: WallClock,
    metrics: QuotaMetrics,
    /// The metrics' own registry, when started with [`Quotas::start_with_registry`].
    registry: Option<Registry>,
    /// With Redis: how [`Quotas::leave`] asks the sync task to leave now, and learns it has.
    departure: Option<Departure>,
}

/// The sync task's side of [`Quotas::leave`]: `stop` is set to ask it to leave the presence
/// sets and end; it sets `left` once it has tried (or drops it, ending).
struct Departure {
    stop: tokio::sync::watch::Sender<bool>,
    left: tokio::sync::watch::Receiver<bool>,
}

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// The quota service. Cheap to clone; the Redis sync task runs while a clone is alive.
#[derive(Clone)]
pub struct Quotas {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// An admitted request's charge. Until [`QuotaTicket::commit`] (the request reached a model
/// server and is being answered), dropping it gives the charge back: a request refused further
/// on, or never answered, does not count. Once committed, [`QuotaTicket::settle`] corrects the
/// estimate to the reported usage; dropped without it (the answer failed, broke off or
/// reported no usage), the estimate stays counted.
#[derive(Debug)]
pub struct QuotaTicket {
    entry: Arc<Entry>,
    charge: Charge,
    clock: WallClock,
    committed: bool,
}

impl Drop for QuotaTicket {
    fn drop(&mut self) {
        if !self.committed {
            let now = self.clock.now_ms();
            self.entry.lock().refund(now, self.charge);
        }
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("key", &self.key).finish()
    }
}

impl QuotaTicket {
    /// The request is being answered: from now on it counts, whatever happens to the answer.
    pub fn commit(mut self) -> Self {
        self.committed = true;
        self
    }

    /// Corrects the estimate to `usage`: input plus output tokens, as the response reported.
    pub fn settle(mut self, usage: &Usage) {
        self.committed = true;
        let actual = usage.prompt_tokens.saturating_add(usage.completion_tokens);
        self.entry.tokens.inc_by(actual);
        let now = self.clock.now_ms();
        self.entry.lock().settle(now, self.charge, actual);
    }

    /// What was charged at admission.
    pub fn charge(&self) -> Charge {
        self.charge
    }
}

impl Quotas {
    /// Starts the service; with `redis` configured, spawns the sync task (so it must be called
    /// inside a tokio runtime). Metrics go to `registry` when one is given.
    pub fn start(config: QuotaConfig, registry: Option<&mut Registry>) -> Result<Self, QuotaError> {
        Self::start_with_clock(config, WallClock::system(), registry)
    }

    /// As [`Quotas::start`], with the metrics in a registry of the service's own
    /// ([`Quotas::registry`]), for a process that encodes one registry per configuration in
    /// force (the gateway, whose reloads may start a new service).
    pub fn start_with_registry(config: QuotaConfig) -> Result<Self, QuotaError> {
        let mut registry = Registry::default();
        let metrics = QuotaMetrics::register(&mut registry, config.redis.is_some());
        Self::build(config, WallClock::system(), metrics, Some(registry))
    }

    /// As [`Quotas::start`], with the clock given.
    pub fn start_with_clock(
        config: QuotaConfig,
        clock: WallClock,
        registry: Option<&mut Registry>,
    ) -> Result<Self, QuotaError> {
        let metrics = match registry {
            Some(r) => QuotaMetrics::register(r, config.redis.is_some()),
            None => QuotaMetrics::default(),
        };
        Self::build(config, clock, metrics, None)
    }

    /// The service's own registry (see [`Quotas::start_with_registry`]).
    pub fn registry(&self) -> Option<&Registry> {
        self.inner.registry.as_ref()
    }

    fn build(
        config: QuotaConfig,
        clock: WallClock,
        metrics: QuotaMetrics,
        registry: Option<Registry>,
    ) -> Result<Self, QuotaError> {
        // Fails here, not per tenant later.
        Window::new(config.window, config.buckets)?;
        let mut configured = HashMap::new();
        for (name, limits) in &config.tenants {
            let quota = TenantQuota::new(*limits, config.window, config.buckets)?;
            let entry = Entry::new(Arc::clone(name), name, quota, &metrics);
            configured.insert(Arc::clone(name), entry);
        }
        let overflow = match config.default {
            Some(limits) => Some(Entry::new(
                Arc::from("~other"),
                OTHER_TENANT,
                TenantQuota::new(limits, config.window, config.buckets)?,
                &metrics,
            )),
            None => None,
        };
        metrics.replicas.set(1);
        metrics.redis_up.set(0);
        let channels = config.redis.is_some().then(|| {
            let (stop, stop_rx) = tokio::sync::watch::channel(false);
            let (left_tx, left) = tokio::sync::watch::channel(false);
            (Departure { stop, left }, (stop_rx, left_tx))
        });
        let (departure, task_side) = channels.unzip();
        let inner = Arc::new(Inner {
            configured,
            dynamic: RwLock::new(HashMap::new()),
            overflow,
            replicas: AtomicU32::new(1),
            redis: AtomicU8::new(UNKNOWN),
            up_since_ms: AtomicU64::new(0),
            id: replica_id(),
            layout: layout(&config),
            layout_conflict: AtomicBool::new(false),
            clock,
            metrics,
            config,
            registry,
            departure,
        });
        if let (Some(shared), Some((stop, left))) = (inner.config.redis.clone(), task_side) {
            tokio::spawn(sync_loop(Arc::downgrade(&inner), shared, stop, left));
        }
        Ok(Quotas { inner })
    }

    /// Whether the last sync round found another replica under the same key prefix counting in
    /// another window layout (`infergate_quota_window_conflict`).
    pub fn window_conflict(&self) -> bool {
        self.inner.layout_conflict.load(Ordering::Relaxed)
    }

    /// The configuration in force.
    pub fn config(&self) -> &QuotaConfig {
        &self.inner.config
    }

    /// Whether the last sync with Redis succeeded (always `false` without Redis).
    pub fn redis_up(&self) -> bool {
        self.inner.redis.load(Ordering::Relaxed) == UP
    }

    /// The replicas the counters are shared with (1 until Redis has said otherwise).
    pub fn replicas(&self) -> u32 {
        self.inner.replicas.load(Ordering::Relaxed)
    }

    /// The clock the windows count on.
    pub fn clock(&self) -> WallClock {
        self.inner.clock
    }

    /// Admits a request from `tenant` estimated at `estimated_tokens` (input and output), or
    /// answers the 429. `Ok(None)`: the tenant has no quota.
    pub fn admit(
        &self,
        tenant: &str,
        estimated_tokens: u64,
    ) -> Result<Option<QuotaTicket>, ApiError> {
        let Some(entry) = self.entry(tenant) else {
            return Ok(None);
        };
        let now = self.inner.clock.now_ms();
        let replicas = self.inner.replicas.load(Ordering::Relaxed);
        let admitted = entry.lock().admit(now, replicas, estimated_tokens);
        match admitted {
            Ok(charge) => {
                entry.admitted.inc();
                Ok(Some(QuotaTicket {
                    entry,
                    charge,
                    clock: self.inner.clock,
                    committed: false,
                }))
            }
            Err(e) => {
                match e.kind {
                    QuotaKind::Requests => entry.rejected_requests.inc(),
                    QuotaKind::Tokens => entry.rejected_tokens.inc(),
                };
                // Charged at most the limit, such a request waits for an empty window: the
                // message says so instead of blaming the tenant's earlier use.
                let alone = e.kind == QuotaKind::Tokens && estimated_tokens > e.limit;
                Err(ApiError::QuotaExceeded {
                    tenant: tenant.to_owned(),
                    kind: e.kind.as_str(),
                    limit: e.limit,
                    window: self.inner.config.window,
                    request_tokens: alone.then_some(estimated_tokens),
                    retry_after: e.retry_after,
                })
            }
        }
    }

    /// The tenant's entry: configured, else its own with the default limits (created on first
    /// use), else the shared overflow one; `None` without a default.
    fn entry(&self, tenant: &str) -> Option<Arc<Entry>> {
        if let Some(e) = self.inner.configured.get(tenant) {
            return Some(Arc::clone(e));
        }
        let limits = self.inner.config.default?;
        {
            let dynamic = self
                .inner
                .dynamic
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = dynamic.get(tenant) {
                return Some(Arc::clone(e));
            }
        }
        if tenant.len() > MAX_TENANT_NAME {
            return self.inner.overflow.clone();
        }
        let mut dynamic = self
            .inner
            .dynamic
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = dynamic.get(tenant) {
            return Some(Arc::clone(e));
        }
        if dynamic.len() >= self.inner.config.max_tenants {
            return self.inner.overflow.clone();
        }
        let quota =
            TenantQuota::new(limits, self.inner.config.window, self.inner.config.buckets).ok()?;
        let key: Arc<str> = Arc::from(tenant);
        let entry = Entry::new(Arc::clone(&key), OTHER_TENANT, quota, &self.inner.metrics);
        dynamic.insert(key, Arc::clone(&entry));
        Some(entry)
    }

    /// Leaves the replicas sharing the quotas through Redis now, for a process that is about to
    /// exit: the sync task takes this replica out of the presence sets (one attempt, at most
    /// [`LEAVE_TIMEOUT`]) and ends, so the other replicas count it out at their next round
    /// instead of two presence periods later. Dropping the last clone does the same at the sync
    /// task's next tick, which a process whose runtime ends with `main` never reaches.
    ///
    /// Returns once the attempt is over; at once without Redis or when the task has already
    /// ended. Afterwards the service keeps admitting, counting alone on its last-known share.
    pub async fn leave(&self) {
        let Some(departure) = &self.inner.departure else {
            return;
        };
        let _ = departure.stop.send(true);
        let mut left = departure.left.clone();
        // The task may be in a round (bounded by the link's timeout) before it reads the stop.
        let round = self
            .inner
            .config
            .redis
            .as_ref()
            .map_or(Duration::ZERO, |r| {
                r.redis.connect_timeout + r.redis.command_timeout
            });
        let _ = tokio::time::timeout(LEAVE_TIMEOUT + round, left.wait_for(|done| *done)).await;
    }

    /// One sync round with Redis now (the background task calls it every interval; tests call
    /// it to step). Returns whether Redis answered.
    pub async fn sync_now(&self, redis: &mut Redis, shared: &SharedConfig) -> bool {
        sync_once(&self.inner, redis, shared).await
    }
}

/// What one entry's part of a pipeline reads back.
struct Reading {
    entry: Arc<Entry>,
    kind: QuotaKind,
    epochs: std::ops::RangeInclusive<u64>,
}

async fn sync_loop(
    inner: Weak<Inner>,
    shared: SharedConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
    left: tokio::sync::watch::Sender<bool>,
) {
    let mut redis = Redis::new(shared.redis.clone());
    let mut tick = tokio::time::interval(shared.sync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (id, clock) = match inner.upgrade() {
        Some(i) => (i.id.clone(), i.clock),
        None => return,
    };
    loop {
        let asked = tokio::select! {
            _ = tick.tick() => false,
            // An error: every `Quotas` is gone, which the next upgrade sees.
            _ = stop.wait_for(|s| *s) => true,
        };
        let Some(inner) = inner.upgrade().filter(|_| !asked) else {
            leave(&mut redis, &shared, &id, clock.now_ms()).await;
            let _ = left.send(true);
            return;
        };
        sync_once(&inner, &mut redis, &shared).await;
    }
}

/// The longest a dropped service's replica spends leaving the presence sets: a connect (when
/// its link is closed) and one round trip, each also bounded by its configured timeout
/// (200 ms by default). A Redis that does not answer within it leaves the replica to age out.
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Takes a dropped service's replica out of the presence sets (one attempt, at most
/// [`LEAVE_TIMEOUT`]), so the others stop counting it — and assuming its share of the use — at
/// their next round rather than two presence periods later. Its use stays in the totals until
/// it leaves the window.
///
/// A link closed by a failed round (a timeout, a reset) waits out its backoff before it connects
/// again, which would skip the attempt and leave the others admitting only their shares for
/// those two periods: the replica connects afresh instead, once, whatever the backoff.
async fn leave(redis: &mut Redis, shared: &SharedConfig, id: &str, now: u64) {
    let prefix = &shared.key_prefix;
    let period_ms = presence_period_ms(shared);
    let mut p = Pipeline::new();
    p.cmd(&["ZREM", format!("{prefix}rounds").as_str(), id]);
    for period in [now / period_ms, (now / period_ms).saturating_sub(1)] {
        p.cmd(&["SREM", format!("{prefix}replicas:{period}").as_str(), id]);
    }
    let mut fresh;
    let link = if redis.is_connected() {
        redis
    } else {
        fresh = Redis::new(shared.redis.clone());
        &mut fresh
    };
    let why = match tokio::time::timeout(LEAVE_TIMEOUT, link.pipeline(&p)).await {
        Ok(Ok(replies)) => match replies.into_iter().find(|v| matches!(v, Value::Error(_))) {
            Some(Value::Error(message)) => format!("Redis refused it: {message}"),
            _ => return,
        },
        Ok(Err(e)) => crate::ErrorChain(&e).to_string(),
        Err(_) => format!("no answer within {} ms", LEAVE_TIMEOUT.as_millis()),
    };
    tracing::debug!(
        address = %shared.redis.address,
        error = why.as_str(),
        "quota replica could not leave the presence sets; the others count it until it ages out"
    );
}

/// A presence period: ten sync intervals, at least a second.
fn presence_period_ms(shared: &SharedConfig) -> u64 {
    u64::try_from((shared.sync_interval * 10).as_millis())
        .unwrap_or(u64::MAX)
        .max(1000)
}

/// Every entry to sync: the configured ones, and unlisted ones (idle ones with nothing left in
/// their windows are dropped from the map here, off the request path).
fn entries(inner: &Inner, now: u64) -> Vec<Arc<Entry>> {
    let mut all: Vec<Arc<Entry>> = inner.configured.values().cloned().collect();
    all.extend(inner.overflow.iter().cloned());
    let mut dynamic = inner
        .dynamic
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    dynamic.retain(|_, e| {
        // Held only by the map, and nothing counted: safe to forget.
        let idle = Arc::strong_count(e) == 1 && {
            let q = e.lock();
            q.requests().count(now, 1) == 0 && q.tokens().count(now, 1) == 0
        };
        !idle
    });
    all.extend(dynamic.values().cloned());
    all
}

/// Appended to a bucket's key for the hash of each replica's own total for it.
const OWN_SUFFIX: &str = ":by-replica";

/// Writes replicas' own totals, idempotently: for each bucket, `KEYS` holds the hash of the
/// replicas' own totals and the bucket's sum; `ARGV` is the replica id, the keys' time to live
/// (ms), then one own total per bucket. The sum moves by the difference from the total last
/// recorded for this replica, so a round written twice (its answer lost, then sent again) counts
/// once. The sum stays a plain counter that `INCRBY` from replicas of earlier releases adds to.
/// (The difference is written out as an integer and the total passed on as received, rather
/// than left to the conversion of Lua numbers to arguments, which need not keep a large integer
/// in integer form across Redis versions.)
const WRITE_OWN_TOTALS: &str = "\
local id, ttl = ARGV[1], ARGV[2]
for i = 1, #KEYS / 2 do
  local own, sum = KEYS[2 * i - 1], KEYS[2 * i]
  local new = tonumber(ARGV[2 + i])
  local old = tonumber(redis.call('HGET', own, id) or 0)
  if new ~= old then
    redis.call('INCRBY', sum, string.format('%d', new - old))
    redis.call('HSET', own, id, ARGV[2 + i])
  end
  redis.call('PEXPIRE', own, ttl)
  redis.call('PEXPIRE', sum, ttl)
end
return #KEYS / 2";

fn key(prefix: &str, tenant: &str, kind: QuotaKind, epoch: u64) -> String {
    format!("{prefix}q:{tenant}:{}:{epoch}", kind.as_str())
}

async fn sync_once(inner: &Inner, redis: &mut Redis, shared: &SharedConfig) -> bool {
    let now = inner.clock.now_ms();
    let all = entries(inner, now);
    let window_ms = u64::try_from(inner.config.window.as_millis()).unwrap_or(u64::MAX);
    let ttl = window_ms.saturating_mul(2).to_string();
    let prefix = &shared.key_prefix;
    // The order matters: this replica's own totals, then its round time (a replica that reads it
    // knows every delta taken by then is in), then the replicas' round times, then the totals
    // (a total read after a round time holds that round's deltas).
    let mut p = Pipeline::new();
    let mut readings = Vec::new();
    let mut owns = Vec::new();
    // The script's keys (per bucket: the replicas' own totals, the sum) and own totals.
    let mut keys = Vec::new();
    let mut totals = Vec::new();
    for entry in &all {
        let mut q = entry.lock();
        let limits = q.limits();
        let (requests, tokens) = q.windows_mut();
        for (kind, window, limited) in [
            (QuotaKind::Requests, requests, limits.requests.is_some()),
            (QuotaKind::Tokens, tokens, limits.tokens.is_some()),
        ] {
            if !limited {
                continue;
            }
            owns.clear();
            window.take_unsynced(now, &mut owns);
            for (epoch, own) in &owns {
                let total = key(prefix, &entry.key, kind, *epoch);
                keys.push(format!("{total}{OWN_SUFFIX}"));
                keys.push(total);
                totals.push(own.to_string());
            }
            readings.push(Reading {
                entry: Arc::clone(entry),
                kind,
                epochs: window.live_epochs(now),
            });
        }
    }
    if !totals.is_empty() {
        let mut words = Vec::with_capacity(5 + keys.len() + totals.len());
        words.extend([
            String::from("EVAL"),
            String::from(WRITE_OWN_TOTALS),
            keys.len().to_string(),
        ]);
        words.append(&mut keys);
        words.extend([inner.id.clone(), ttl]);
        words.append(&mut totals);
        p.cmd(&words);
    }
    let writes = p.len();
    // Presence: each replica's last round time in one sorted set; a replica counts as alive
    // for two periods of ten sync intervals (at least a second each) after its last round.
    let period_ms = presence_period_ms(shared);
    let rounds = format!("{prefix}rounds");
    let now_s = now.to_string();
    let gone = format!("({}", now.saturating_sub(period_ms * 2));
    p.cmd(&["ZADD", rounds.as_str(), now_s.as_str(), inner.id.as_str()]);
    p.cmd(&["ZREMRANGEBYSCORE", rounds.as_str(), "-inf", gone.as_str()]);
    p.cmd(&[
        "PEXPIRE",
        rounds.as_str(),
        (period_ms * 3).to_string().as_str(),
    ]);
    p.cmd(&["ZCARD", rounds.as_str()]);
    p.cmd(&["ZRANGE", rounds.as_str(), "0", "0", "WITHSCORES"]);
    // The presence sets of earlier releases, kept so that a fleet in a rolling upgrade counts
    // every replica: one per period, read for this period and the last.
    let current = format!("{prefix}replicas:{}", now / period_ms);
    let previous = format!("{prefix}replicas:{}", (now / period_ms).saturating_sub(1));
    p.cmd(&["SADD", current.as_str(), inner.id.as_str()]);
    p.cmd(&[
        "PEXPIRE",
        current.as_str(),
        (period_ms * 3).to_string().as_str(),
    ]);
    p.cmd(&["SCARD", current.as_str()]);
    p.cmd(&["SCARD", previous.as_str()]);
    // The window layout every replica under this prefix must share: written by the first, kept
    // alive only by the replicas that count in it, read back by each.
    let layout_key = format!("{prefix}layout");
    p.cmd(&[
        "EVAL",
        CLAIM_LAYOUT,
        "1",
        layout_key.as_str(),
        inner.layout.as_str(),
        (period_ms * 3).to_string().as_str(),
    ]);
    for r in &readings {
        let mut words = vec![String::from("MGET")];
        words.extend(
            r.epochs
                .clone()
                .map(|e| key(prefix, &r.entry.key, r.kind, e)),
        );
        p.cmd(&words);
    }

    match redis.pipeline(&p).await {
        Ok(values) => match apply(
            inner,
            now,
            &readings,
            writes,
            &values,
            presence_settled(inner, now, period_ms),
        ) {
            Ok(()) => {
                check_layout(inner, &values[writes + PRESENCE], shared);
                if inner.redis.swap(UP, Ordering::Relaxed) != UP {
                    tracing::info!(address = %shared.redis.address, replicas = inner.replicas.load(Ordering::Relaxed), "quota counters are shared through Redis");
                }
                inner.metrics.redis_up.set(1);
                true
            }
            Err(reason) => {
                failed(inner, &readings, shared, &reason);
                false
            }
        },
        Err(e) => {
            failed(inner, &readings, shared, &crate::ErrorChain(&e).to_string());
            false
        }
    }
}

/// What to change when Redis refused this replica for its password, appended to the warning:
/// `NOAUTH` alone does not say which setting gives a password. Redis's error codes lead its
/// error lines (`NOAUTH ...`, `WRONGPASS ...`), whichever reply of the round carried them.
fn password_hint(reason: &str, has_password: bool) -> &'static str {
    if reason.contains("NOAUTH") && !has_password {
        "; this Redis requires a password: name a variable holding it in `redis.passwordEnv` of \
         the quotas (`spec.quotas.redis.passwordSecretRef` in Kubernetes)"
    } else if reason.contains("without any password configured") {
        "; this Redis has no password: leave `redis.passwordEnv` out of the quotas (or give the \
         Redis one, `requirepass`)"
    } else if reason.contains("WRONGPASS") || reason.contains("invalid password") {
        "; the password from `redis.passwordEnv` of the quotas was refused: check the variable's \
         value (the Secret of `spec.quotas.redis.passwordSecretRef` in Kubernetes)"
    } else {
        ""
    }
}

/// Replies to the presence commands of a round: `ZADD`, `ZREMRANGEBYSCORE`, `PEXPIRE`, `ZCARD`,
/// `ZRANGE` on the round times, then `SADD`, `PEXPIRE`, `SCARD`, `SCARD` on the per-period sets.
const PRESENCE: usize = 9;

/// Replies to the window-layout claim of a round ([`CLAIM_LAYOUT`]).
const LAYOUT: usize = 1;

/// Sets the layout key to this replica's layout when it has none, refreshes its expiry when it
/// holds this replica's, and returns what it holds: a layout no live replica counts in expires.
const CLAIM_LAYOUT: &str = "\
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return cur";

/// A quota configuration's window layout as the replicas compare it: the window and its bucket
/// count decide which time each bucket key covers.
fn layout(config: &QuotaConfig) -> String {
    format!(
        "windowMs={} buckets={}",
        config.window.as_millis(),
        config.buckets
    )
}

/// Compares the layout Redis holds with this replica's: another means their bucket keys cover
/// different times and the counts do not add up. Said once when it starts and once when it
/// ends; a reply of another shape (an older Redis refusing the script) is left unjudged.
fn check_layout(inner: &Inner, reply: &Value, shared: &SharedConfig) {
    let Value::Bulk(theirs) = reply else {
        return;
    };
    let theirs = String::from_utf8_lossy(theirs);
    let conflict = theirs != inner.layout;
    inner.metrics.layout_conflict.set(i64::from(conflict));
    if inner.layout_conflict.swap(conflict, Ordering::Relaxed) == conflict {
        return;
    }
    if conflict {
        tracing::warn!(
            key_prefix = shared.key_prefix.as_str(),
            ours = inner.layout.as_str(),
            theirs = %theirs,
            "quotas: another replica sharing this keyPrefix in Redis counts in another window \
             (quotas.windowSeconds or quotas.buckets differ), so their counts do not add up and \
             the limits are not held; give every replica the same window, or each fleet its own \
             keyPrefix"
        );
    } else {
        tracing::info!(
            key_prefix = shared.key_prefix.as_str(),
            "quotas: every replica sharing this keyPrefix counts in the same window again"
        );
    }
}

/// Whether the presence set read at `now` can be trusted to name every live replica: a whole
/// period has passed since this run of successful rounds began. Called for a round that Redis
/// answered; the first such round after an outage (or at start) begins a run.
fn presence_settled(inner: &Inner, now: u64, period_ms: u64) -> bool {
    if inner.redis.load(Ordering::Relaxed) != UP {
        inner.up_since_ms.store(now, Ordering::Relaxed);
    }
    now.saturating_sub(inner.up_since_ms.load(Ordering::Relaxed)) >= period_ms
}

/// Applies the replies of one round (`writes` counter updates, the [`PRESENCE`] replies, then
/// one `MGET` per reading); on a reply of the wrong shape, nothing more is applied. Unless the
/// presence set is `settled`, the replica count only rises.
fn apply(
    inner: &Inner,
    now: u64,
    readings: &[Reading],
    writes: usize,
    values: &[Value],
    settled: bool,
) -> Result<(), std::borrow::Cow<'static, str>> {
    if values.len() != writes + PRESENCE + LAYOUT + readings.len() {
        return Err("Redis answered a different number of commands than were sent".into());
    }
    // Redis's own words: a server that does not allow scripts (`EVAL`) says so here.
    if let Some(Value::Error(message)) = values[..writes]
        .iter()
        .find(|v| matches!(v, Value::Error(_)))
    {
        return Err(format!("Redis refused the counter update: {message}").into());
    }
    let presence = &values[writes..writes + PRESENCE];
    if let Some(Value::Error(message)) = presence.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(format!("Redis refused a presence update: {message}").into());
    }
    let seen = presence[3]
        .as_i64()
        .ok_or("Redis answered ZCARD with no integer")?;
    // Replicas of earlier releases show only in the per-period sets.
    let seen_any = presence[7..9]
        .iter()
        .filter_map(Value::as_i64)
        .fold(seen, i64::max);
    // The oldest last-round time among the replicas alive: [member, score].
    let oldest = match &presence[4] {
        Value::Array(pair) => pair
            .get(1)
            .and_then(|v| match v {
                Value::Bulk(b) => std::str::from_utf8(b).ok()?.parse::<f64>().ok(),
                _ => None,
            })
            .map(|ms| ms as u64),
        _ => return Err("Redis answered ZRANGE with something other than an array".into()),
    };
    let mut replicas = u32::try_from(seen_any.max(1)).unwrap_or(u32::MAX);
    if !settled {
        replicas = replicas.max(inner.replicas.load(Ordering::Relaxed));
    }
    // A replica counted but absent from the set (Redis restarted empty, or one of an earlier
    // release): its last round is unknown, so every recent round is covered.
    let peers_synced = if i64::from(replicas) <= seen {
        oldest
    } else {
        None
    };
    for (r, v) in readings.iter().zip(&values[writes + PRESENCE + LAYOUT..]) {
        let Value::Array(totals) = v else {
            return Err("Redis answered MGET with something other than an array".into());
        };
        let mut q = r.entry.lock();
        let (requests, tokens) = q.windows_mut();
        let window = match r.kind {
            QuotaKind::Requests => requests,
            QuotaKind::Tokens => tokens,
        };
        window.set_peers_synced(peers_synced);
        for (epoch, v) in r.epochs.clone().zip(totals) {
            let total = v.as_i64().unwrap_or(0).max(0);
            window.apply_shared(now, epoch, u64::try_from(total).unwrap_or(0));
        }
    }
    inner.replicas.store(replicas, Ordering::Relaxed);
    inner.metrics.replicas.set(i64::from(replicas));
    Ok(())
}

/// A failed round: the use is written again next time, and the first failure is said.
fn failed(inner: &Inner, readings: &[Reading], shared: &SharedConfig, reason: &str) {
    for r in readings {
        let mut q = r.entry.lock();
        let (requests, tokens) = q.windows_mut();
        match r.kind {
            QuotaKind::Requests => requests.sync_failed(),
            QuotaKind::Tokens => tokens.sync_failed(),
        }
    }
    inner.metrics.sync_errors.inc();
    inner.metrics.redis_up.set(0);
    if inner.redis.swap(DOWN, Ordering::Relaxed) != DOWN {
        let error = format!(
            "{reason}{}",
            password_hint(reason, shared.redis.password.is_some())
        );
        tracing::warn!(address = %shared.redis.address, error = error.as_str(), replicas = inner.replicas.load(Ordering::Relaxed), "Redis unreachable: quotas are counted locally, each replica enforcing its share, until it answers again");
    } else {
        tracing::debug!(address = %shared.redis.address, error = reason, "quota sync with Redis failed");
    }
}

/// An id for this service in the presence set, distinct per process and per service in it.
fn replica_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}-{:x}-{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
