//! Simulated mode: the discrete-event fleet of `infergate-sim` on a virtual clock, routed by the
//! real `infergate_scheduler::Scheduler` of each policy.
//!
//! The scheduler sees what it would see in production and nothing more: a scrape of every pod
//! each `scrape.interval_ms` of virtual time, visible `scrape.lag_ms` later, each request's first
//! token when it is produced (as a streaming gateway sees it) and its usage when it completes. A
//! pick's endpoints are tried in order when a pod refuses a request (it cannot serve it: too long
//! for its context or KV cache, an adapter it does not serve); this costs no attempt, where the
//! gateway, which retries only connection failures and 5xx, would hand the pod's 4xx to the
//! client.
//!
//! A pod with an `error_rate` fault fails that fraction of the requests sent to it, at once and
//! at no cost to it (see [`infergate_sim::Fleet::submit`]). The runner then does what the
//! standalone gateway does with a 5xx: the failure is reported to the scheduler
//! (`observe_answer`, which the policy's `outlierDetection` counts) as the request moves to the
//! pick's next endpoint (`reassign`), up to `retries.maxAttempts` attempts; a request whose every
//! attempt failed is an error of the run; a completed request is reported as a success. The run
//! counts its [`crate::report::Attempts`] when the scenario has failing pods.
//!
//! The `infergate-precise` policy also sees each pod's KV-cache events (every block stored or
//! evicted, published at the end of the engine step and applied `kv_events.lag_ms` later, see
//! [`infergate_sim::KvView`]), and every pick carries each pod's cached prompt tokens by that view.
//!
//! A bench can be interrupted ([`run_until`]): a flag the caller sets (its Ctrl-C) is looked at
//! before each run and every [`STOP_EVERY`] arrivals or fleet events within one, so a run of a
//! 1,000-pod fleet stops within milliseconds; the run stopped part-way is dropped, and the
//! report keeps the runs that completed, naming the others, as a live bench's does.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use infergate_scheduler::outlier::{Answer, Ejection};
use infergate_scheduler::{
    CacheConfig, Decision, EndpointMeta, EngineType, LoraState, MetricsSnapshot, RequestContext,
    Scheduler, SchedulerConfig, ScrapeState, Ticket, Timestamp, Usage,
};
use std::collections::VecDeque;

use infergate_sim::fleet::Request;
use infergate_sim::{
    Completion, EngineKind, EngineView, FirstToken, Fleet, FleetSpec, Prompt, SimError,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::plan::{Plan, Ran};
use crate::policy::RoutePolicy;
use crate::progress::Progress;
use crate::report::{Attempts, FloorResult, PodInfo, Report, RequestRecord, RunResult};
use crate::scenario::{Scenario, StaleWindow};
use crate::stats::{Percentiles, quantile};
use crate::workload::{self, Arrival};

/// Points kept of each run's TTFT distribution, for the CDF plot.
const CDF_POINTS: usize = 200;

/// A run looks at the stop flag once in this many arrivals or fleet events: often enough to stop
/// within milliseconds, rarely enough to cost nothing next to a pick.
pub const STOP_EVERY: u32 = 256;

/// Per-pod load samples of one run: `running + waiting` every `every_s` seconds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LoadSeries {
    /// Seconds between samples.
    pub every_s: f64,
    /// One series per pod, in fleet order.
    pub pods: Vec<Vec<u32>>,
}

/// What a simulated run keeps beyond its figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Keep one [`RequestRecord`] per completed request in [`RunResult::records`]
    /// ([`Report::write`] writes them as CSV). Plain scenarios only: with a `flow:` or
    /// `replicas:` section [`run_with`] refuses it.
    pub requests: bool,
}

/// Runs every policy of `scenario` on every seed, simulated.
pub fn run(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
) -> Result<Report, BenchError> {
    run_with(scenario, origin, progress, RunOptions::default())
}

/// [`run`], keeping what `options` asks for.
pub fn run_with(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
    options: RunOptions,
) -> Result<Report, BenchError> {
    run_until(scenario, origin, progress, options, &AtomicBool::new(false))
}

/// As [`run_with`], until `stop` is set (the caller's Ctrl-C): then no further run starts, the
/// run in progress stops within [`STOP_EVERY`] arrivals or fleet events and is dropped (figures
/// over part of its arrivals would read as a whole run's), and the report of the runs that
/// completed is returned, with [`Report::interrupted`] naming the runs that did not (the one
/// stopped part-way first, said so).
pub fn run_until(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
    options: RunOptions,
    stop: &AtomicBool,
) -> Result<Report, BenchError> {
    if options.requests && !scenario.keeps_request_records() {
        return Err(BenchError::Unsupported {
            origin: origin.to_owned(),
            what: "per-request records (a scenario with a `flow:` or `replicas:` section keeps \
                   its own figures only)",
        });
    }
    if scenario.flow.is_some() {
        return flow::run(scenario, origin, progress, stop);
    }
    if scenario.replicas.is_some() {
        return replicas::run(scenario, origin, progress, stop);
    }
    let catalog = infergate_sim::Catalog::builtin()?;
    let spec = scenario.fleet_spec(&catalog, origin)?;
    let adapters: Vec<Arc<str>> = scenario
        .workload
        .lora
        .as_ref()
        .map(|l| l.adapters.iter().map(|a| a.as_str().into()).collect())
        .unwrap_or_default();
    let mut runs = Vec::new();
    let mut floors = Vec::new();
    let names = scenario.policies.iter().map(|p| p.as_str().to_owned());
    let mut until = Until::new(scenario, names.collect(), stop);
    'seeds: for (si, &seed) in scenario.seeds.iter().enumerate() {
        let arrivals = workload::generate(&scenario.workload, seed);
        floors.push(floor(&spec, &arrivals, seed));
        for (pi, policy) in scenario.policies.iter().enumerate() {
            let keep = Keep {
                load: si == 0,
                requests: options.requests,
            };
            let ran = until.run(si, pi, arrivals.len(), progress, |progress, stop| {
                run_one(
                    scenario, &spec, &adapters, policy, &arrivals, seed, keep, progress, stop,
                )
            })?;
            let Some(r) = ran else {
                break 'seeds;
            };
            runs.push(r);
        }
    }
    Ok(until.report(&spec, runs, floors))
}

/// The stop flag as a run's loops see it: looked at on the first call of [`Stop::now`] and
/// once in [`STOP_EVERY`] calls after that (a counter, not a load of a shared cache line, per
/// arrival or event).
pub(crate) struct Stop<'a> {
    flag: &'a AtomicBool,
    calls: u32,
}

impl Stop<'_> {
    /// Whether the run is to stop now.
    pub(crate) fn now(&mut self) -> bool {
        let look = self.calls == 0;
        self.calls = (self.calls + 1) % STOP_EVERY;
        look && self.flag.load(Ordering::Relaxed)
    }
}

/// The runs of a simulated bench, made in their plan's order until the stop flag is set.
struct Until<'a> {
    scenario: &'a Scenario,
    plan: Plan<'a>,
    flag: &'a AtomicBool,
}

impl<'a> Until<'a> {
    /// The runs named `runs`, in order, on every seed of `scenario`, until `flag` is set.
    fn new(scenario: &'a Scenario, runs: Vec<String>, flag: &'a AtomicBool) -> Self {
        Until {
            scenario,
            plan: Plan::new(&scenario.seeds, runs),
            flag,
        }
    }

    /// Makes run `run` of the seed at index `seed` (of `requests` arrivals) with `go`, on the
    /// progress bar, unless the bench has been stopped; `None` once it has (before the run, or
    /// part-way through it), when no further run is to be made.
    fn run(
        &mut self,
        seed: usize,
        run: usize,
        requests: usize,
        progress: &mut dyn Progress,
        go: impl FnOnce(&mut dyn Progress, &mut Stop<'_>) -> Result<Ran, BenchError>,
    ) -> Result<Option<RunResult>, BenchError> {
        if self.flag.load(Ordering::Relaxed) {
            self.plan.stop(seed, run, false);
            return Ok(None);
        }
        let s = self.scenario;
        let label = format!(
            "{} seed {} ({}/{}) {}",
            s.name,
            s.seeds.get(seed).copied().unwrap_or_default(),
            seed + 1,
            s.seeds.len(),
            self.plan.name(run)
        );
        progress.start(&label, requests as u64);
        let mut stop = Stop {
            flag: self.flag,
            calls: 0,
        };
        match go(progress, &mut stop) {
            Ok(Ran::Done(r)) => {
                progress.finish();
                Ok(Some(*r))
            }
            Ok(ran @ (Ran::Interrupted | Ran::Unsent)) => {
                progress.abort();
                self.plan.stop(seed, run, matches!(ran, Ran::Interrupted));
                Ok(None)
            }
            Err(e) => {
                progress.abort();
                Err(e)
            }
        }
    }

    /// The report of `runs` on a fleet of `spec`, marked partial if the bench was stopped.
    fn report(self, spec: &FleetSpec, runs: Vec<RunResult>, floors: Vec<FloorResult>) -> Report {
        let pods = PodInfo::list(spec);
        let mut report = Report::new(self.scenario.clone(), "simulated", pods, runs, floors);
        self.plan.mark(&mut report);
        report
    }
}

/// The address standing for pod `i` in the scheduler (never bound: the fleet is virtual).
pub fn pod_addr(i: usize) -> SocketAddr {
    let [a, b] = u16::try_from(i).unwrap_or(u16::MAX).to_be_bytes();
    SocketAddr::from((Ipv4Addr::new(10, 0, a, b.wrapping_add(1)), 8000))
}

/// The fleet index `i < n` whose [`pod_addr`] is `addr`, computed rather than searched (a pick
/// names its pod by address; a scan of 1,000 pods per request showed in the scale run).
pub fn pod_index(addr: &SocketAddr, n: usize) -> Option<usize> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let [ten, zero, a, b] = v4.ip().octets();
    if ten != 10 || zero != 0 || v4.port() != 8000 {
        return None;
    }
    let i = usize::from(u16::from_be_bytes([a, b.wrapping_sub(1)]));
    (i < n && pod_addr(i) == *addr).then_some(i)
}

fn engine_type(k: EngineKind) -> EngineType {
    match k {
        EngineKind::Vllm => EngineType::Vllm,
        EngineKind::Sglang => EngineType::Sglang,
        EngineKind::Tgi => EngineType::Tgi,
    }
}

fn ts(t: f64) -> Timestamp {
    Timestamp::from_nanos((t.max(0.0) * 1e9) as u64)
}

/// Per-pod counters the simulated scraper keeps between scrapes.
#[derive(Debug, Clone, Copy, Default)]
struct PrefixCounters {
    queries: u64,
    hits: u64,
    rate: Option<f64>,
}

fn snapshot(
    kind: EngineKind,
    v: &EngineView,
    sampled_at: f64,
    prev: &mut PrefixCounters,
) -> MetricsSnapshot {
    let dq = v.prefix_queries.saturating_sub(prev.queries);
    if dq > 0 {
        prev.rate = Some(v.prefix_hits.saturating_sub(prev.hits) as f64 / dq as f64);
    }
    prev.queries = v.prefix_queries;
    prev.hits = v.prefix_hits;
    let vllm = kind == EngineKind::Vllm;
    MetricsSnapshot {
        sampled_at: ts(sampled_at),
        waiting: v.waiting,
        running: v.running,
        kv_cache_usage: (kind != EngineKind::Tgi).then_some(v.kv_usage),
        lora: vllm.then(|| LoraState {
            max_lora: v.max_loras,
            running: v.running_loras.iter().map(|a| a.to_string()).collect(),
            waiting: v.waiting_loras.iter().map(|a| a.to_string()).collect(),
        }),
        cache: vllm.then_some(CacheConfig {
            block_size: v.block_size,
            num_blocks: v.num_blocks,
        }),
        prefix_cache_hit_rate: if kind == EngineKind::Tgi {
            None
        } else {
            prev.rate
        },
    }
}

struct Sim<'a> {
    fleet: Fleet,
    sched: Scheduler,
    kinds: Vec<EngineKind>,
    counters: Vec<PrefixCounters>,
    interval: f64,
    lag: f64,
    /// Scrapes taken and not yet visible: (visible at, sampled at, one view per pod).
    scrapes: VecDeque<(f64, f64, Vec<EngineView>)>,
    next_scrape: f64,
    tickets: Vec<Option<Ticket>>,
    arrivals: &'a [Arrival],
    firsts: Vec<FirstToken>,
    done: Vec<Completion>,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    per_pod: Vec<u64>,
    output_tokens: u64,
    last_done: f64,
    load: Option<LoadSeries>,
    next_sample: f64,
    /// Windows in which scrapes return no page.
    stale: Vec<StaleWindow>,
    /// This gateway's requests in flight per pod.
    inflight: Vec<u32>,
    /// Requests sent to each pod since its visible snapshot was sampled.
    since_scrape: Vec<u32>,
    /// The visible snapshot of each pod: (sampled at, waiting, KV-cache use).
    seen: Vec<Option<(f64, u32, f64)>>,
    /// Per request: (TTFT from its arrival, served tokens: prompt + output), once completed.
    served: Vec<Option<(f64, u64)>>,
    /// Requests completed since the caller last cleared it.
    just_completed: Vec<(u64, u32, u32)>,
    /// Prompt tokens of completed requests, and those of them served from the prefix cache.
    prompt_tokens: u64,
    cached_tokens: u64,
    /// One record per completed request, when the run keeps them.
    records: Option<Vec<RequestRecord>>,
    /// Attempts per request at most (the scenario's `retries.maxAttempts`).
    max_attempts: usize,
    /// What the attempts met, when the scenario has failing pods.
    attempts: Option<Attempts>,
}

/// What a plain run keeps besides its figures.
#[derive(Debug, Clone, Copy)]
struct Keep {
    /// The per-pod load series (the first seed's runs).
    load: bool,
    /// One [`RequestRecord`] per completed request.
    requests: bool,
}

/// How long the scraper keeps a pod whose scrape is connected but unanswered routed on its last
/// page (`ScraperConfig::max_late`'s default) before it fails it.
const MAX_LATE_S: f64 = 20.0;

impl Sim<'_> {
    /// Feeds the scheduler the newest scrape visible at the current time.
    fn refresh_metrics(&mut self) {
        let now = self.fleet.now();
        let mut newest = None;
        while self.scrapes.front().is_some_and(|(at, _, _)| *at <= now) {
            newest = self.scrapes.pop_front();
        }
        if let Some((_, sampled_at, views)) = newest {
            for (i, view) in views.iter().enumerate() {
                let snap = snapshot(self.kinds[i], view, sampled_at, &mut self.counters[i]);
                // Snapshots come from the simulator's own numbers, which are always finite; a
                // refused snapshot would only leave the previous one in place.
                let _ = self.sched.apply_metrics(pod_addr(i), snap);
                self.seen[i] = Some((sampled_at, view.waiting, view.kv_usage));
                self.since_scrape[i] = 0;
            }
        }
        if self.stale.is_empty() {
            return;
        }
        // A scrape overdue by more than an interval is hanging (connected, no page): the
        // scraper reports the pod late (routed on its last page), then, after `MAX_LATE_S`,
        // failed but reachable (its scrape had connected). What the scheduler does with a
        // failed pod that still answers is its `staleMetrics` setting.
        let overdue = 2.0 * self.interval + self.lag;
        for i in 0..self.seen.len() {
            let age = self.seen[i].map_or(f64::INFINITY, |(at, _, _)| now - at);
            let state = if age <= overdue {
                continue;
            } else if age <= MAX_LATE_S {
                ScrapeState::Late
            } else {
                ScrapeState::Failed
            };
            if state == ScrapeState::Failed {
                let _ = self.sched.set_reachable(pod_addr(i), true);
            }
            let _ = self.sched.set_scrape_state(pod_addr(i), state);
        }
    }

    /// Applies a scrape of the idle fleet taken at time 0, so the first arrivals meet a pool
    /// with metrics (a gateway that has been running), not one that has none yet.
    fn prime(&mut self) {
        let mut v = EngineView::default();
        for i in 0..self.kinds.len() {
            let _ = self.fleet.view_into(i, &mut v);
            let snap = snapshot(self.kinds[i], &v, 0.0, &mut self.counters[i]);
            let _ = self.sched.apply_metrics(pod_addr(i), snap);
            self.seen[i] = Some((0.0, v.waiting, v.kv_usage));
        }
    }

    /// Age of the newest visible snapshot of pod `i` (infinite before the first).
    fn metrics_age(&self, i: usize) -> f64 {
        self.seen[i].map_or(f64::INFINITY, |(at, _, _)| self.fleet.now() - at)
    }

    /// Sends `a` to the endpoints of `decision` in order, as the gateway's retry loop does: a
    /// pod that refuses it (it can never serve it) is passed over; a pod that fails it (its
    /// `error_rate`) costs one of the scenario's `retries.maxAttempts`, and its failure is
    /// reported to the scheduler (`observe_answer`) before the request moves to the next
    /// endpoint (`reassign`), or, after the last attempt, before the ticket is failed. The
    /// endpoint that took it, or `None` when none did.
    fn place(
        &mut self,
        a: &Arrival,
        decision: &Decision,
        text: &Arc<str>,
        lora: Option<&Arc<str>>,
    ) -> Result<Option<SocketAddr>, BenchError> {
        let n = self.kinds.len();
        let now = self.fleet.now();
        let mut sent = 0;
        // The endpoint whose failure is still to be reported: the gateway judges an answer
        // when the request leaves its endpoint (`Inflight::reassign`, `fail`).
        let mut failed: Option<SocketAddr> = None;
        for (j, addr) in decision.endpoints.iter().enumerate() {
            let Some(pod) = pod_index(addr, n) else {
                continue;
            };
            if let Some(prev) = failed.take() {
                self.observe(prev, Answer::Failure, now);
            }
            if j > 0 && !self.sched.reassign(decision.ticket, *addr) {
                continue;
            }
            let req = Request {
                id: a.id,
                arrival: now.max(a.at),
                prompt: Prompt::Text(text.clone()),
                max_tokens: a.output_tokens,
                lora: lora.cloned(),
            };
            let failing = self.attempts.is_some()
                && self.fleet.faults(pod).is_some_and(|f| f.error_rate > 0.0);
            let result = self.fleet.submit(pod, req);
            if !matches!(result, Err(SimError::Rejected(_))) {
                sent += 1;
                if let Some(at) = &mut self.attempts {
                    at.sent += 1;
                    if sent == 1 {
                        at.requests += 1;
                        at.first_to_failing += u64::from(failing);
                        if let Some(c) = at.first_per_pod.get_mut(pod) {
                            *c += 1;
                        }
                    }
                }
            }
            match result {
                Ok(()) => {
                    if let Some(t) = self.tickets.get_mut(a.id as usize) {
                        *t = Some(decision.ticket);
                    }
                    self.inflight[pod] += 1;
                    self.since_scrape[pod] += 1;
                    return Ok(Some(*addr));
                }
                Err(SimError::Rejected(_)) => continue,
                Err(SimError::Failed(_)) => {
                    if let Some(at) = &mut self.attempts {
                        at.failed += 1;
                    }
                    failed = Some(*addr);
                    if sent >= self.max_attempts {
                        break;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(prev) = failed {
            self.observe(prev, Answer::Failure, now);
            if let Some(at) = &mut self.attempts {
                at.exhausted += 1;
            }
        }
        self.sched.fail(decision.ticket, ts(now));
        Ok(None)
    }

    /// Reports what `addr` answered to the scheduler's outlier detection (a no-op without it),
    /// counting its ejections.
    fn observe(&mut self, addr: SocketAddr, answer: Answer, t: f64) {
        let ejection = self.sched.observe_answer(addr, answer, ts(t));
        if let (Some(e), Some(at)) = (ejection, &mut self.attempts) {
            match e {
                Ejection::Ejected { .. } => at.ejections += 1,
                Ejection::HeldBack => at.held_back += 1,
            }
        }
    }

    /// Records a completed request's figures (TTFT, ITL, E2E, served tokens, per-pod counts)
    /// once the scheduler has been told of it.
    fn record_completion(&mut self, c: &Completion) {
        // From the request's own arrival: with flow control it may have waited in the
        // gateway's queue before it was sent.
        let arrived = self.arrivals.get(c.id as usize).map_or(c.arrival, |a| a.at);
        let ttft = c.first_token - arrived;
        if let Some(records) = &mut self.records {
            records.push(RequestRecord {
                id: c.id,
                arrival_s: arrived,
                pod: c.pod,
                adapter: self.arrivals.get(c.id as usize).and_then(|a| a.lora),
                prompt_tokens: c.prompt_tokens,
                cached_tokens: c.cached_tokens,
                output_tokens: c.output_tokens,
                gateway_s: c.arrival - arrived,
                queue_s: c.scheduled - c.arrival,
                prefill_s: c.first_token - c.scheduled,
                ttft_s: ttft,
                e2e_s: c.last_token - arrived,
                preemptions: c.preemptions,
            });
        }
        self.ttft.push(ttft);
        self.itl.push(c.mean_itl());
        self.e2e.push(c.last_token - arrived);
        if let Some(slot) = self.served.get_mut(c.id as usize) {
            *slot = Some((
                ttft,
                u64::from(c.prompt_tokens) + u64::from(c.output_tokens),
            ));
        }
        if let Some(n) = self.inflight.get_mut(c.pod as usize) {
            *n = n.saturating_sub(1);
        }
        self.just_completed
            .push((c.id, c.prompt_tokens, c.output_tokens));
        self.prompt_tokens += u64::from(c.prompt_tokens);
        self.cached_tokens += u64::from(c.cached_tokens);
        if let Some(n) = self.per_pod.get_mut(c.pod as usize) {
            *n += 1;
        }
        self.output_tokens += u64::from(c.output_tokens);
        self.last_done = self.last_done.max(c.last_token);
    }

    /// Tells the scheduler about first tokens and completions, in time order, and records them.
    fn absorb(&mut self) {
        let mut firsts = std::mem::take(&mut self.firsts);
        let mut done = std::mem::take(&mut self.done);
        self.fleet.drain_first_tokens(&mut firsts);
        self.fleet.drain_completions(&mut done);
        firsts.sort_by(|a, b| a.t.total_cmp(&b.t));
        done.sort_by(|a, b| a.last_token.total_cmp(&b.last_token));
        let mut f = firsts.iter().peekable();
        for c in &done {
            while let Some(first) = f.next_if(|first| first.t <= c.last_token) {
                if let Some(Some(ticket)) = self.tickets.get(first.id as usize) {
                    self.sched.first_token(*ticket, ts(first.t));
                }
            }
            let Some(ticket) = self.tickets.get_mut(c.id as usize).and_then(Option::take) else {
                continue;
            };
            // Normally reported already, when it happened; a no-op then.
            self.sched.first_token(ticket, ts(c.first_token));
            // The gateway judges a 200 when the request completes (`Inflight::complete`).
            self.observe(pod_addr(c.pod as usize), Answer::Success, c.last_token);
            self.sched.complete(
                ticket,
                ts(c.last_token),
                Usage {
                    prompt_tokens: c.prompt_tokens,
                    cached_tokens: c.cached_tokens,
                    output_tokens: c.output_tokens,
                },
            );
            self.record_completion(c);
        }
        for first in f {
            if let Some(Some(ticket)) = self.tickets.get(first.id as usize) {
                self.sched.first_token(*ticket, ts(first.t));
            }
        }
        firsts.clear();
        done.clear();
        self.firsts = firsts;
        self.done = done;
    }

    /// Advances the fleet to `t`, taking scrapes and per-pod load samples on the way.
    fn advance(&mut self, t: f64) {
        loop {
            let sample = self
                .load
                .as_ref()
                .map_or(f64::INFINITY, |_| self.next_sample);
            let next = sample.min(self.next_scrape);
            if next > t {
                break;
            }
            self.fleet.advance_to(next);
            if next == self.next_scrape {
                let views = (0..self.kinds.len())
                    .map(|i| {
                        let mut v = EngineView::default();
                        // `i` is below the fleet's pod count: the view is always written.
                        let _ = self.fleet.view_into(i, &mut v);
                        v
                    })
                    .collect();
                // In a stale window the scrape hangs: no page reaches the gateway.
                if !self.stale.iter().any(|w| w.contains(next)) {
                    self.scrapes.push_back((next + self.lag, next, views));
                }
                self.next_scrape += self.interval;
            }
            if next == sample
                && let Some(load) = &mut self.load
            {
                let mut v = EngineView::default();
                for (i, series) in load.pods.iter_mut().enumerate() {
                    let _ = self.fleet.view_into(i, &mut v);
                    series.push(v.running + v.waiting);
                }
                self.next_sample += load.every_s;
            }
        }
        self.fleet.advance_to(t);
    }

    /// Runs the fleet until it is idle, sampling load on the way; false when `stop` came first.
    fn drain(&mut self, stop: &mut Stop<'_>) -> bool {
        while let Some(t) = self.fleet.next_event_time() {
            if stop.now() {
                return false;
            }
            self.advance(t);
        }
        true
    }
}

/// A fresh fleet and scheduler for one run.
fn setup<'a>(
    scenario: &Scenario,
    spec: &FleetSpec,
    cfg: SchedulerConfig,
    arrivals: &'a [Arrival],
    seed: u64,
    record_load: bool,
    stale: &[StaleWindow],
) -> Result<Sim<'a>, BenchError> {
    let policy = cfg.preset.as_str().to_owned();
    let mut cfg = cfg;
    crate::live::GatewayScrape::for_scenario(&scenario.scrape).raise_max_metrics_age(&mut cfg);
    let mut sched = Scheduler::new(cfg).map_err(|source| BenchError::Scheduler {
        policy: policy.clone(),
        source,
    })?;
    for (i, p) in spec.pods.iter().enumerate() {
        sched.upsert_endpoint(EndpointMeta {
            namespace: "sim".to_owned(),
            pod: p.name.clone(),
            addr: pod_addr(i),
            engine: engine_type(p.engine),
            gpu: Some(p.profile.gpu_label()),
            labels: Default::default(),
        });
    }
    let mut fleet = Fleet::new(spec)?;
    fleet.record_first_tokens(true);
    fleet.seed_faults(seed);
    let interval = scenario.scrape.interval_ms / 1e3;
    let lag = scenario.scrape.lag_ms / 1e3;
    let n = spec.pods.len();
    let every_s = (scenario.workload.duration_s / 300.0).max(0.25);
    Ok(Sim {
        fleet,
        sched,
        kinds: spec.pods.iter().map(|p| p.engine).collect(),
        counters: vec![PrefixCounters::default(); n],
        interval,
        lag,
        scrapes: VecDeque::new(),
        next_scrape: 0.0,
        tickets: vec![None; arrivals.len()],
        arrivals,
        firsts: Vec::new(),
        done: Vec::new(),
        ttft: Vec::with_capacity(arrivals.len()),
        itl: Vec::with_capacity(arrivals.len()),
        e2e: Vec::with_capacity(arrivals.len()),
        per_pod: vec![0; n],
        output_tokens: 0,
        last_done: 0.0,
        load: record_load.then(|| LoadSeries {
            every_s,
            pods: vec![Vec::new(); n],
        }),
        next_sample: 0.0,
        stale: stale.to_vec(),
        inflight: vec![0; n],
        since_scrape: vec![0; n],
        seen: vec![None; n],
        served: vec![None; arrivals.len()],
        just_completed: Vec::new(),
        prompt_tokens: 0,
        cached_tokens: 0,
        records: None,
        max_attempts: usize::from(scenario.retries.max_attempts),
        attempts: scenario.has_failing_pods().then(|| Attempts::new(n)),
    })
}

/// The model name every request asks for (the pool's).
fn model_of(spec: &FleetSpec) -> Arc<str> {
    spec.pods
        .first()
        .map(|p| p.model.clone())
        .unwrap_or_default()
}

/// The run's figures, once the fleet is idle.
fn finish(mut sim: Sim<'_>, policy: String, seed: u64, rejected: u64, errors: u64) -> RunResult {
    let arrivals = sim.arrivals;
    let completed = sim.ttft.len() as u64;
    let first_arrival = arrivals.first().map_or(0.0, |a| a.at);
    let span = (sim.last_done - first_arrival).max(1e-9);
    let mut ttft = std::mem::take(&mut sim.ttft);
    let ttft_p = Percentiles::of(&mut ttft);
    let cdf = (1..=CDF_POINTS)
        .map(|i| quantile(&ttft, i as f64 / CDF_POINTS as f64))
        .collect();
    RunResult {
        policy,
        seed,
        requests: arrivals.len() as u64,
        completed,
        rejected,
        errors,
        ttft: ttft_p,
        itl: Percentiles::of(&mut sim.itl),
        e2e: Percentiles::of(&mut sim.e2e),
        requests_per_s: completed as f64 / span,
        output_tokens_per_s: sim.output_tokens as f64 / span,
        per_pod_requests: sim.per_pod,
        ttft_cdf: cdf,
        load: sim.load,
        flow: None,
        prefix_hit_rate: (sim.prompt_tokens > 0)
            .then(|| sim.cached_tokens as f64 / sim.prompt_tokens as f64),
        records: sim.records.take(),
        failures: match &sim.attempts {
            Some(at) if at.exhausted > 0 => std::collections::BTreeMap::from([(
                "every attempt failed by its pod (HTTP 500)".to_owned(),
                at.exhausted,
            )]),
            _ => std::collections::BTreeMap::new(),
        },
        attempts: sim.attempts.take(),
        prompt_tokens: None,
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "one private call site; a struct would only rename them"
)]
fn run_one(
    scenario: &Scenario,
    spec: &FleetSpec,
    adapters: &[Arc<str>],
    policy: &RoutePolicy,
    arrivals: &[Arrival],
    seed: u64,
    keep: Keep,
    progress: &mut dyn Progress,
    stop: &mut Stop<'_>,
) -> Result<Ran, BenchError> {
    let cfg = policy.scheduler_config();
    let mut sim = setup(
        scenario,
        spec,
        cfg,
        arrivals,
        seed,
        keep.load,
        &scenario.stale,
    )?;
    if keep.requests {
        sim.records = Some(Vec::with_capacity(arrivals.len()));
    }
    let mut precise = policy.precise.then(|| {
        Precise::new(
            &mut sim.fleet,
            scenario.kv_events.lag_ms / 1e3,
            scenario.kv_events.provisional,
        )
    });
    let policy = policy.as_str().to_owned();
    let model = model_of(spec);
    // Every policy draws its random choices from the same seed.
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7363_6865_645f_726e);
    let (mut rejected, mut errors) = (0u64, 0u64);
    for (done, a) in sim.arrivals.iter().enumerate() {
        if stop.now() {
            return Ok(Ran::Interrupted);
        }
        sim.advance(a.at);
        sim.absorb();
        if let Some(p) = precise.as_mut() {
            for (id, _, _) in sim.just_completed.drain(..) {
                p.completed(id);
            }
        }
        sim.refresh_metrics();
        let text = workload::prompt_text(a);
        let segments = [&*text];
        let lora = a.lora.and_then(|i| adapters.get(usize::from(i)));
        let cached = precise
            .as_mut()
            .map(|p| p.cached(&mut sim.fleet, &text, lora.map(|l| &**l)));
        let cx = RequestContext::new(&model, a.prompt_tokens)
            .with_prompt(&segments)
            .with_lora(lora.map(|l| &**l))
            .with_priority(a.priority)
            .with_output_tokens(a.output_tokens)
            .with_cached(cached);
        match sim.sched.pick(&cx, ts(a.at), &mut rng) {
            Err(_) => rejected += 1,
            Ok(decision) => match sim.place(a, &decision, &text, lora)? {
                None => errors += 1,
                Some(addr) => {
                    if let Some(p) = precise.as_mut() {
                        p.placed(addr, a.id, &text, lora.map(|l| &**l));
                    }
                }
            },
        }
        progress.advance(done as u64 + 1);
    }
    // Drain: keep sampling load until the fleet is idle.
    if !sim.drain(stop) {
        return Ok(Ran::Interrupted);
    }
    sim.absorb();
    Ok(Ran::Done(Box::new(finish(
        sim, policy, seed, rejected, errors,
    ))))
}

/// The clairvoyant floor: each request's uncached prefill on the pod that does it fastest, with
/// no queueing. A prefix counts as cached once an earlier request of its group has arrived
/// (whole blocks only, as the engines cache).
pub fn floor(spec: &FleetSpec, arrivals: &[Arrival], seed: u64) -> FloorResult {
    // The fastest pod for a request depends on its profile only: a fleet of 1,000 pods has a
    // handful of distinct profiles, and the floor is taken over those.
    let mut profiles: Vec<&infergate_sim::Profile> = Vec::new();
    for p in &spec.pods {
        if !profiles.iter().any(|q| **q == *p.profile) {
            profiles.push(&p.profile);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut v: Vec<f64> = arrivals
        .iter()
        .map(|a| {
            let cached = match a.prefix_group {
                Some(g) if !seen.insert(g) => a.prefix_tokens,
                _ => 0,
            };
            profiles
                .iter()
                .map(|p| {
                    let bs = p.block_size.max(1);
                    let cached = cached / bs * bs;
                    let uncached = a.prompt_tokens.saturating_sub(cached).max(1);
                    p.nominal_ttft(u64::from(uncached))
                })
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    FloorResult {
        seed,
        ttft: Percentiles::of(&mut v),
    }
}

mod flow;
mod precise;
mod replicas;

pub use precise::Precise;

#[cfg(test)]
mod tests;
