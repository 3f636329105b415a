//! The scraper: polls a changing set of targets and reports snapshots and stale transitions.
//!
//! Each target gets its own task, so scrapes of one pod never overlap and a slow pod only ever
//! delays itself. By default the tasks run on a thread of the scraper's own (a single-threaded
//! tokio runtime, see [`ScraperConfig::own_thread`]): a scrape then never wakes a task on another
//! thread, and parsing pages never competes with request handling on the caller's workers. The task keeps one keep-alive connection to its pod, scrapes every
//! [`ScraperConfig::interval`] (phase-shifted so that a thousand pods do not fire at once), bounds
//! each scrape by [`ScraperConfig::timeout`] and [`ScraperConfig::max_body_bytes`], and takes a
//! permit from a shared semaphore so that at most [`ScraperConfig::max_concurrency`] scrapes are in
//! flight. Page buffers come from a pool the size of that bound, not one per pod.
//!
//! Freshness is judged by the task itself, on a timer that runs while a scrape hangs. A target is
//! in one of three states ([`ScrapeState`]):
//! - **ok**: its last good page is at most [`ScraperConfig::stale_after`] old;
//! - **late**: no good page for longer than that, but the server answered its last scrape and
//!   the one in flight has not failed — the server is alive and slow to answer (a loaded vLLM
//!   answers `/metrics` on the event loop that streams tokens, so a page can take seconds). It is
//!   reported [`Update::Late`] once. The scrape in flight has [`ScraperConfig::timeout`] to
//!   connect and, once connected, until [`ScraperConfig::max_late`] after its start to answer;
//! - **failed**: a scrape failed (connect refused or timed out, reset, an HTTP or parse error, a
//!   late scrape past `max_late`), or a target that never answered passed the staleness
//!   threshold. Reported [`Update::Stale`] at once — a refused connection means the server is
//!   gone now, not after `stale_after`.
//!
//! The next good page makes the target ok again ([`Update::Snapshot`]). Every transition is
//! logged once.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use http::Uri;
pub use infergate_scheduler::ScrapeState;
use infergate_scheduler::{EngineType, MetricsSnapshot, Timestamp};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::{Error, ScrapeError};
use crate::parse::{PrefixCounters, parse_page};
use crate::telemetry::ScrapeMetrics;

mod conn;

#[cfg(fuzzing)]
#[doc(hidden)]
pub use conn::fuzzing;

/// Scraper settings. Defaults: 50 ms interval, stale after 250 ms, 250 ms timeout, late for at
/// most 20 s, 4 MiB cap, 128 scrapes in flight, on a thread of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScraperConfig {
    /// Time between the starts of two scrapes of one target.
    pub interval: Duration,
    /// A target whose last good page is older than this is reported stale.
    pub stale_after: Duration,
    /// Limit on one scrape that has no connection to the server yet (connecting, or waiting for
    /// a permit), and on a connected one before it counts as slow.
    pub timeout: Duration,
    /// Limit on one scrape once connected to a server that answered its last scrape: until then
    /// a slow page makes the target late (still routed on its last page), not failed.
    pub max_late: Duration,
    /// Cap on the bytes read from one page (a real vLLM page is 60–80 KB).
    pub max_body_bytes: usize,
    /// Scrapes in flight at once, across all targets.
    pub max_concurrency: usize,
    /// Run the scrapes on a thread of the scraper's own, with a single-threaded tokio runtime,
    /// instead of on the runtime that calls [`Scraper::upsert`]. Cheaper per scrape (no wake-ups
    /// across worker threads; see `docs/benchmarks.md`), bounded to one core by construction, and
    /// kept apart from request handling. Set it to `false` to scrape on the caller's runtime, for
    /// example in a test on tokio's paused clock.
    pub own_thread: bool,
    /// Scrape over HTTPS with this client configuration; `None` (the default) is plain HTTP.
    pub tls: Option<crate::tls::ClientTls>,
}

impl Default for ScraperConfig {
    fn default() -> Self {
        ScraperConfig {
            interval: Duration::from_millis(50),
            stale_after: Duration::from_millis(250),
            timeout: Duration::from_millis(250),
            max_late: Duration::from_secs(20),
            max_body_bytes: 4 << 20,
            max_concurrency: 128,
            own_thread: true,
            tls: None,
        }
    }
}

impl ScraperConfig {
    /// Checks that every setting is usable.
    pub fn validate(&self) -> Result<(), Error> {
        if self.interval.is_zero() {
            return Err(Error::InvalidConfig("interval must be above zero"));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidConfig("timeout must be above zero"));
        }
        if self.max_late < self.timeout {
            return Err(Error::InvalidConfig(
                "max_late must be at least the timeout",
            ));
        }
        if self.stale_after < self.interval {
            return Err(Error::InvalidConfig(
                "stale_after must be at least one interval",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(Error::InvalidConfig("max_body_bytes must be above zero"));
        }
        if self.max_concurrency == 0 || self.max_concurrency > Semaphore::MAX_PERMITS {
            return Err(Error::InvalidConfig(
                "max_concurrency must be between 1 and the semaphore limit",
            ));
        }
        Ok(())
    }
}

/// Converts tokio instants into the scheduler's [`Timestamp`]s, relative to an origin.
///
/// Built on `tokio::time::Instant`, so a test running on tokio's paused clock gets exact,
/// reproducible timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose [`Timestamp::ZERO`] is `origin`.
    pub const fn new(origin: Instant) -> Self {
        Clock { origin }
    }

    /// A clock whose origin is now.
    pub fn starting_now() -> Self {
        Clock::new(Instant::now())
    }

    /// The origin.
    pub const fn origin(&self) -> Instant {
        self.origin
    }

    /// `instant` as a timestamp (zero if it is before the origin).
    pub fn at(&self, instant: Instant) -> Timestamp {
        Timestamp::from_duration(instant.saturating_duration_since(self.origin))
    }

    /// The current time as a timestamp.
    pub fn now(&self) -> Timestamp {
        self.at(Instant::now())
    }
}

/// One pod to scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target<K> {
    /// The caller's name for it; every [`Update`] carries it.
    pub id: K,
    /// Where the model server listens.
    pub addr: SocketAddr,
    /// Which engine's metric names to read.
    pub engine: EngineType,
    /// The metrics path (`/metrics` for all three engines by default).
    pub path: String,
}

impl<K> Target<K> {
    /// A target at `addr` with the usual `/metrics` path.
    pub fn new(id: K, addr: SocketAddr, engine: EngineType) -> Self {
        Target {
            id,
            addr,
            engine,
            path: "/metrics".to_owned(),
        }
    }
}

/// What the scraper reports about a target.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A good page was read: the target is fresh ([`ScrapeState::Ok`]), with this state.
    Snapshot(MetricsSnapshot),
    /// The target went [`ScrapeState::Late`]: no page within the staleness threshold, but the
    /// server answered its last scrape and the one in flight has not failed. Its last page is old but the server is alive; the next
    /// [`Update::Snapshot`] or [`Update::Stale`] ends it. Sent once per transition.
    Late {
        /// When the target was judged late.
        at: Timestamp,
        /// When its last good page was read.
        last_sampled: Option<Timestamp>,
        /// When the scrape in flight started.
        scrape_started: Timestamp,
    },
    /// The target went [`ScrapeState::Failed`]: its last state must not be routed on. Sent once
    /// per transition (and once more, with `unreachable`, when a failure first seen as a reset
    /// turns into refused connections); the next [`Update::Snapshot`] makes it fresh again.
    Stale {
        /// When the target was judged failed.
        at: Timestamp,
        /// When its last good page was read, if ever.
        last_sampled: Option<Timestamp>,
        /// The failure was a refused or failed connection: nothing listens there (the process is
        /// gone), so whatever answers next is a new process.
        unreachable: bool,
        /// The failing scrape had connected to the server and the connection held (it timed
        /// out reading, or the server answered with an error or an unusable page): the process
        /// is alive though its metrics are not. A connection reset or closed unanswered is not
        /// reachable (a killed process resets its connections before its port refuses). A
        /// stale-metrics fail-open may keep routing to a reachable pod; never to one that is
        /// not. Reported again, once, when this changes while the target stays failed.
        reachable: bool,
    },
}

/// Receives the scraper's reports. Called from the targets' tasks: it must be quick and must not
/// block (store the snapshot, swap a pointer, send on a channel).
pub trait Sink<K>: Send + Sync + 'static {
    /// `id`'s state changed.
    fn update(&self, id: &K, update: Update);
}

impl<K, F> Sink<K> for F
where
    F: Fn(&K, Update) + Send + Sync + 'static,
{
    fn update(&self, id: &K, update: Update) {
        self(id, update);
    }
}

/// What every target task shares.
struct Shared<K> {
    config: ScraperConfig,
    clock: Clock,
    sink: Box<dyn Sink<K>>,
    metrics: ScrapeMetrics,
    permits: Semaphore,
    buffers: Mutex<Vec<Vec<u8>>>,
}

impl<K> Shared<K> {
    /// The thread watch's tick due at `due` has just run: records how late. A delay past the
    /// staleness threshold means every freshness judgement in that stretch came that much late,
    /// for want of CPU rather than because of any pod: counted and logged.
    fn woke(&self, due: Instant) {
        let delay = Instant::now().saturating_duration_since(due);
        self.metrics.observe_wakeup_delay(delay);
        if delay >= self.config.stale_after {
            self.metrics.count_stall();
            tracing::warn!(
                delay_ms = delay.as_millis() as u64,
                stale_after_ms = self.config.stale_after.as_millis() as u64,
                "metrics scraper stalled: its thread ran later than the staleness threshold; the gateway is short of CPU (a busy host or a CPU limit), and pods' freshness was judged that much late"
            );
        }
    }
}

/// Ticks every interval beside the targets' tasks and measures how late each tick runs: the
/// scheduling delay of the thread the scrapes run on. A task of its own, always idle between ticks,
/// so that a stall is seen whatever the targets' tasks were doing (a task waiting on a scrape
/// cannot tell a stalled thread from a slow pod).
async fn watch_thread<K>(shared: Arc<Shared<K>>) {
    let mut ticker = tokio::time::interval(shared.config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let due = ticker.tick().await;
        shared.woke(due);
    }
}

struct Running<K> {
    target: Target<K>,
    task: JoinHandle<()>,
}

struct Inner<K> {
    shared: Arc<Shared<K>>,
    tasks: Mutex<HashMap<K, Running<K>>>,
    spawned: AtomicU64,
    /// The scraper's own runtime, when it has one.
    own: Option<OwnRuntime>,
    /// The thread watch ([`watch_thread`]), started with the first target.
    watch: OnceLock<JoinHandle<()>>,
}

/// A single-threaded runtime on a thread of its own, which runs until its handle is dropped.
struct OwnRuntime {
    handle: Handle,
    /// Dropping it ends the thread, and with it every task still on the runtime.
    _stop: oneshot::Sender<()>,
}

impl OwnRuntime {
    fn start() -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("infergate-scraper".to_owned())
            .spawn(move || {
                // Either a stop or a dropped sender ends the wait.
                let _ = runtime.block_on(stopped);
            })
            .map_err(Error::Runtime)?;
        Ok(OwnRuntime {
            handle,
            _stop: stop,
        })
    }
}

impl<K> Drop for Inner<K> {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (_, running) in tasks.drain() {
            running.task.abort();
        }
        if let Some(watch) = self.watch.get() {
            watch.abort();
        }
    }
}

/// Handle to a running scraper. Clones share it; dropping the last one stops every target.
pub struct Scraper<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Scraper<K> {
    fn clone(&self) -> Self {
        Scraper {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> Scraper<K>
where
    K: Clone + Eq + Hash + Debug + Send + Sync + 'static,
{
    /// Starts a scraper with no targets. With [`ScraperConfig::own_thread`] (the default) this
    /// starts the scraper's thread; otherwise targets run on the runtime that adds them, and
    /// [`Scraper::upsert`] must be called within one.
    ///
    /// `clock` stamps snapshots, `metrics` records the scraper's own metrics (use
    /// [`ScrapeMetrics::register`], or `ScrapeMetrics::default()` to keep them unexported), and
    /// `sink` receives every [`Update`].
    pub fn spawn(
        config: ScraperConfig,
        clock: Clock,
        metrics: ScrapeMetrics,
        sink: impl Sink<K>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let permits = Semaphore::new(config.max_concurrency);
        let own = if config.own_thread {
            Some(OwnRuntime::start()?)
        } else {
            None
        };
        Ok(Scraper {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    config,
                    clock,
                    sink: Box::new(sink),
                    metrics,
                    permits,
                    buffers: Mutex::new(Vec::new()),
                }),
                tasks: Mutex::new(HashMap::new()),
                spawned: AtomicU64::new(0),
                own,
                watch: OnceLock::new(),
            }),
        })
    }

    /// Runs `task` on the scraper's own thread, or else on the caller's runtime.
    fn spawn_task(&self, task: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        match &self.inner.own {
            Some(own) => own.handle.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Adds a target, or replaces the one with the same id if its address, engine or path changed
    /// (an unchanged target keeps its connection and freshness). Its first scrape starts at once.
    pub fn upsert(&self, target: Target<K>) -> Result<(), Error> {
        let endpoint = endpoint(&target, self.inner.shared.config.tls.as_ref())?;
        let mut tasks = self.lock();
        if let Some(running) = tasks.get(&target.id)
            && running.target == target
        {
            return Ok(());
        }
        let n = self.inner.spawned.fetch_add(1, Ordering::Relaxed);
        let run = run_target(
            Arc::clone(&self.inner.shared),
            target.id.clone(),
            target.engine,
            endpoint,
            phase(n, self.inner.shared.config.interval),
        );
        self.inner
            .watch
            .get_or_init(|| self.spawn_task(watch_thread(Arc::clone(&self.inner.shared))));
        let task = self.spawn_task(run);
        match tasks.entry(target.id.clone()) {
            Entry::Occupied(mut slot) => slot.insert(Running { target, task }).task.abort(),
            Entry::Vacant(slot) => {
                slot.insert(Running { target, task });
            }
        }
        Ok(())
    }

    /// Stops scraping `id`. Returns whether it was a target. No further updates arrive for it.
    pub fn remove(&self, id: &K) -> bool {
        let removed = self.lock().remove(id);
        removed.map(|r| r.task.abort()).is_some()
    }

    /// Makes the target set exactly `targets`: adds new ones, replaces changed ones, removes the
    /// rest. Validates every target before changing anything.
    pub fn set_targets(&self, targets: impl IntoIterator<Item = Target<K>>) -> Result<(), Error> {
        let targets: Vec<Target<K>> = targets.into_iter().collect();
        for t in &targets {
            endpoint(t, None)?;
        }
        let keep: std::collections::HashSet<&K> = targets.iter().map(|t| &t.id).collect();
        let gone: Vec<K> = self
            .lock()
            .keys()
            .filter(|id| !keep.contains(id))
            .cloned()
            .collect();
        for id in &gone {
            self.remove(id);
        }
        for t in targets {
            self.upsert(t)?;
        }
        Ok(())
    }

    /// The ids of the current targets.
    pub fn target_ids(&self) -> Vec<K> {
        self.lock().keys().cloned().collect()
    }

    /// Stops every target. The scraper stays usable: targets can be added again.
    pub fn shutdown(&self) {
        let drained: Vec<Running<K>> = self.lock().drain().map(|(_, r)| r).collect();
        for running in drained {
            running.task.abort();
        }
    }

    /// Waits for `signal`, then stops every target.
    pub async fn run_until(&self, signal: impl Future<Output = ()>) {
        signal.await;
        self.shutdown();
    }

    /// The clock that stamps snapshots.
    pub fn clock(&self) -> Clock {
        self.inner.shared.clock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Running<K>>> {
        // A panic elsewhere cannot leave the map half-updated: every change is one call.
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn endpoint<K>(
    target: &Target<K>,
    tls: Option<&crate::tls::ClientTls>,
) -> Result<conn::Endpoint, Error> {
    let uri: Uri = target.path.parse().map_err(|source| Error::InvalidPath {
        path: target.path.clone(),
        source,
    })?;
    Ok(conn::Endpoint::new(target.addr, &uri, tls.cloned()))
}

/// Spreads targets over the interval: the n-th target's ticks are offset by the fractional part of
/// n × the golden ratio, which keeps any number of targets evenly spread without knowing the count.
fn phase(n: u64, interval: Duration) -> Duration {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    let frac = n.wrapping_mul(GOLDEN);
    // (frac / 2^64) of the interval, in nanoseconds; fits u64 for any interval under 584 years.
    let nanos = (u128::from(frac) * interval.as_nanos()) >> 64;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

/// Keeps the gauges right however the task ends (removal aborts it mid-await).
struct Gauges<'a> {
    metrics: &'a ScrapeMetrics,
    state: ScrapeState,
}

impl<'a> Gauges<'a> {
    fn new(metrics: &'a ScrapeMetrics) -> Self {
        metrics.targets_delta(1);
        Gauges {
            metrics,
            state: ScrapeState::Ok,
        }
    }

    fn set(&mut self, state: ScrapeState) {
        if state != self.state {
            self.metrics.state_delta(self.state, -1);
            self.metrics.state_delta(state, 1);
            self.state = state;
        }
    }
}

impl Drop for Gauges<'_> {
    fn drop(&mut self) {
        self.set(ScrapeState::Ok);
        self.metrics.targets_delta(-1);
    }
}

/// One target's freshness, judged by its own task.
struct Freshness<'a, K> {
    shared: &'a Shared<K>,
    id: &'a K,
    engine: EngineType,
    gauges: Gauges<'a>,
    added: Instant,
    last_good: Option<Instant>,
    /// When the target went late or failed (for the log line that ends it).
    since: Instant,
    last_error: Option<ScrapeError>,
    /// Whether the current failure was reported unreachable.
    unreachable: bool,
    /// Whether the current failure was reported reachable (its scrape had connected and the
    /// connection held).
    reachable: bool,
}

impl<K: Debug + 'static> Freshness<'_, K> {
    fn state(&self) -> ScrapeState {
        self.gauges.state
    }

    fn deadline(&self) -> Instant {
        self.last_good.unwrap_or(self.added) + self.shared.config.stale_after
    }

    /// The staleness threshold passed with the scrape that started at `started` in flight (or
    /// none: this task itself ran late). Late needs a live server: its last scrape was good and
    /// nothing has failed since. The scrape in flight then decides: it has `timeout` to connect
    /// and, once connected, `max_late` to answer; any failure fails the target at once.
    fn overdue(&mut self, started: Instant) {
        if self.last_good.is_some() && self.last_error.is_none() {
            self.mark_late(started);
        } else {
            self.mark_failed(self.deadline(), false, false);
        }
    }

    fn mark_late(&mut self, started: Instant) {
        self.gauges.set(ScrapeState::Late);
        self.since = Instant::now();
        let clock = self.shared.clock;
        let (id, engine) = (self.id, self.engine);
        tracing::warn!(
            target_id = ?id, %engine,
            scrape_ms = started.elapsed().as_millis() as u64,
            "metrics target is late: answered its last scrape, no page within the threshold; routed on its last page"
        );
        self.shared.sink.update(
            self.id,
            Update::Late {
                at: clock.at(self.deadline()),
                last_sampled: self.last_good.map(|t| clock.at(t)),
                scrape_started: clock.at(started),
            },
        );
    }

    fn mark_failed(&mut self, at: Instant, unreachable: bool, reachable: bool) {
        self.gauges.set(ScrapeState::Failed);
        self.unreachable = unreachable;
        self.reachable = reachable;
        self.since = Instant::now();
        let clock = self.shared.clock;
        let last_sampled = self.last_good.map(|t| clock.at(t));
        let (id, engine) = (self.id, self.engine);
        match &self.last_error {
            Some(e) => tracing::warn!(
                target_id = ?id, %engine, error = %crate::ErrorChain(e),
                unreachable, reachable,
                "metrics target failed: its metrics are not routed on until it answers again"
            ),
            None => tracing::warn!(
                target_id = ?id, %engine,
                "metrics target failed: no connection within the threshold"
            ),
        }
        self.shared.sink.update(
            self.id,
            Update::Stale {
                at: clock.at(at),
                last_sampled,
                unreachable,
                reachable,
            },
        );
    }

    fn good(&mut self, snapshot: MetricsSnapshot) {
        self.last_good = Some(Instant::now());
        self.last_error = None;
        self.unreachable = false;
        self.reachable = false;
        let was = self.state();
        if was != ScrapeState::Ok {
            self.gauges.set(ScrapeState::Ok);
            tracing::info!(
                target_id = ?self.id, engine = %self.engine, was = was.as_str(),
                for_ms = self.since.elapsed().as_millis() as u64,
                "metrics target is fresh again"
            );
        }
        tracing::trace!(
            target_id = ?self.id, engine = %self.engine, waiting = snapshot.waiting,
            running = snapshot.running, kv = ?snapshot.kv_cache_usage, "page read"
        );
        self.shared.sink.update(self.id, Update::Snapshot(snapshot));
    }

    /// A scrape failed with `e`; `connected`: it had reached the server.
    fn bad(&mut self, e: ScrapeError, connected: bool) {
        self.shared.metrics.count_error(e.metric_label());
        tracing::debug!(target_id = ?self.id, engine = %self.engine, error = %e, "scrape failed");
        let unreachable = matches!(e, ScrapeError::Connect(_));
        // Alive means it answered (an error status, an unusable page) or keeps an open
        // connection waiting. A connection that broke unanswered is a process going away: a
        // killed server resets its connections before its port refuses.
        let broke = matches!(e, ScrapeError::Io(_) | ScrapeError::Closed);
        let reachable = connected && !unreachable && !broke;
        self.last_error = Some(e);
        // A failed scrape fails the target at once: a refused connection is a server gone now.
        // A failure that turns out to be unreachable (reset first, refused next) is reported
        // again, once, saying so.
        // So is one whose scrapes stop (or start) reaching the server.
        if self.state() != ScrapeState::Failed
            || (unreachable && !self.unreachable)
            || reachable != self.reachable
        {
            self.mark_failed(Instant::now(), unreachable, reachable);
        }
    }
}

/// One target's loop: scrape, report, repeat, watching the staleness deadline throughout.
async fn run_target<K: Debug + 'static>(
    shared: Arc<Shared<K>>,
    id: K,
    engine: EngineType,
    endpoint: conn::Endpoint,
    phase: Duration,
) {
    let config = &shared.config;
    let added = Instant::now();
    let mut state = Freshness {
        shared: &shared,
        id: &id,
        engine,
        gauges: Gauges::new(&shared.metrics),
        added,
        last_good: None,
        since: added,
        last_error: None,
        unreachable: false,
        reachable: false,
    };
    let mut conn = None;
    let mut counters: Option<PrefixCounters> = None;
    // First scrape at once (a new pod should become routable quickly), then on the phased grid.
    let mut ticker = tokio::time::interval_at(added + phase, config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut first = true;
    // One staleness timer for the task's life, moved only when a good page moves the deadline:
    // cheaper than a new timer for every wait.
    let stale_timer = tokio::time::sleep_until(state.deadline());
    tokio::pin!(stale_timer);

    loop {
        if !first {
            tokio::select! {
                // A due scrape goes first: it judges the target better than the timer can.
                biased;
                _ = ticker.tick() => {}
                () = &mut stale_timer, if state.state() == ScrapeState::Ok => {
                    // No scrape in flight: this task ran late (a starved thread), not the server.
                    state.overdue(Instant::now());
                    continue;
                }
            }
        }
        first = false;

        let started = Instant::now();
        endpoint.connected.store(false, Ordering::Relaxed);
        // Only a server that answered its last scrape may be late; any other waits `timeout`.
        let may_be_late = state.last_good.is_some() && state.last_error.is_none();
        let scrape = scrape_once(&shared, engine, &endpoint, &mut conn, counters, may_be_late);
        tokio::pin!(scrape);
        let result = loop {
            tokio::select! {
                // The scrape first: after a starved stretch its page may already be there.
                biased;
                r = &mut scrape => break r,
                () = &mut stale_timer, if state.state() == ScrapeState::Ok => {
                    state.overdue(started);
                }
            }
        };
        match result {
            Ok((snapshot, new_counters)) => {
                counters = new_counters;
                state.good(snapshot);
                stale_timer.as_mut().reset(state.deadline());
            }
            Err(e) => state.bad(e, endpoint.connected.load(Ordering::Relaxed)),
        }
    }
}

/// Takes a permit and a buffer, fetches and parses one page: within [`ScraperConfig::timeout`],
/// or, when `may_be_late` and connected by then, within [`ScraperConfig::max_late`].
async fn scrape_once<K>(
    shared: &Shared<K>,
    engine: EngineType,
    endpoint: &conn::Endpoint,
    conn: &mut Option<conn::Conn>,
    counters: Option<PrefixCounters>,
    may_be_late: bool,
) -> Result<(MetricsSnapshot, Option<PrefixCounters>), ScrapeError> {
    let config = &shared.config;
    // The semaphore is never closed, so acquiring only fails if it were; treat that as no limit.
    let _permit = shared.permits.acquire().await.ok();
    let started = Instant::now();
    let mut buf = shared
        .buffers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop()
        .unwrap_or_default();
    let fetched = {
        let fetch = conn::fetch(conn, endpoint, &mut buf, config.max_body_bytes);
        tokio::pin!(fetch);
        match tokio::time::timeout_at(started + config.timeout, &mut fetch).await {
            Ok(r) => Ok(r),
            // Connected to a live server: a slow page is late, and worth waiting for.
            Err(_) if may_be_late && endpoint.connected.load(Ordering::Relaxed) => {
                tokio::time::timeout_at(started + config.max_late, &mut fetch)
                    .await
                    .map_err(|_| config.max_late)
            }
            Err(_) => Err(config.timeout),
        }
    };
    let result = match fetched {
        Err(limit) => {
            // The exchange was abandoned mid-way: the connection cannot be reused.
            *conn = None;
            Err(ScrapeError::Timeout(limit))
        }
        Ok(Err(e)) => Err(e),
        Ok(Ok(page)) => parse_page(engine, &buf[page], counters.as_ref(), shared.clock.now())
            .map(|p| (p.snapshot, p.counters))
            .map_err(ScrapeError::from),
    };
    shared.metrics.observe_duration(started.elapsed());
    buf.clear();
    if buf.capacity() > config.max_body_bytes.min(1 << 20) {
        // One oversized page should not pin its memory in the pool for good.
        buf = Vec::new();
    }
    shared
        .buffers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(buf);
    result
}

#[cfg(test)]
mod tests;
