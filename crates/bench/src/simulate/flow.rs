//! Flow control in simulated mode: the gateway's queues between the arrivals and the scheduler.
//!
//! Each run puts one flow policy in front of the same router preset and the same arrivals:
//!
//! - `none` — every request is picked the moment it arrives (routed, or shed by the scheduler's
//!   admission), as the gateway does today;
//! - `reference` — the reference picker's defaults as modelled here: the FLOW lane's
//!   [`FlowQueues`] with global-strict fairness and FCFS, dispatching while a saturation detector
//!   on scraped metrics alone (no in-flight accounting) finds a pod under its queue-depth and
//!   KV-cache thresholds; a pod whose metrics are older than its staleness threshold counts as
//!   saturated, so stale metrics stop dispatch (fail-closed);
//! - `infergate` — [`FlowQueues`] with the scenario's `flow.config` (fairness between tenants,
//!   priority bands, TTL, bounds), driven as `infergate_pool::flow` drives them: a request goes
//!   straight to a pick asked to queue when saturated unless its band or a higher one has
//!   requests waiting; a pick that finds every candidate saturated (the scheduler's thresholds,
//!   with this gateway's requests since the last scrape counted) parks it; at every event the
//!   head of the queues gets a turn (one pick) until a pick finds no headroom. With
//!   `flow.config.headroom`, each pick carries the reserve its request must leave
//!   ([`FlowQueues::reserve_for`]), and a head held back by it lets the first protected request
//!   behind it try once ([`FlowQueues::peek_protected`]). Stale metrics are the scheduler's
//!   business (its scrape states and `staleMetrics` setting).
//!
//! The queues are the scheduler crate's own ([`infergate_scheduler::flow`]); this file only
//! decides when to call them, on the virtual clock. TTFT counts from a request's arrival, so its
//! time in the queue is part of it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use infergate_scheduler::flow::{
    Fairness, FlowConfig, FlowQueues, FlowRequest, Headroom, Ordering, Refusal, Removal, Removed,
    ServiceCharge,
};
use infergate_scheduler::{Preset, Priority, Rejection, RequestContext, SchedulerConfig};
use infergate_sim::FleetSpec;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::{Sim, Stop, Until, finish, model_of, setup, ts};
use crate::BenchError;
use crate::plan::Ran;
use crate::progress::Progress;
use crate::report::{
    BaselineRun, FlowReport, FlowRun, GroupStats, RejectStats, Report, StaleStats,
};
use crate::scenario::{FlowBench, FlowPolicy, Scenario, StaleWindow};
use crate::stats::Percentiles;
use crate::workload::{self, Arrival};

/// Bytes of request body besides the prompt (JSON framing, model name, parameters).
const BODY_OVERHEAD: u64 = 200;

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// Not yet arrived, or queued.
    Pending,
    /// Sent to a pod.
    Sent,
    /// Answered without being served: (reason index, time).
    Rejected(usize, f64),
}

/// One rejection reason's running figures.
struct Reason {
    stats: RejectStats,
    retry_sum: f64,
}

/// Everything a flow-controlled run keeps besides the simulated fleet.
struct Gate<'a> {
    policy: FlowPolicy,
    bench: &'a FlowBench,
    queue: Option<FlowQueues<u64>>,
    outcome: Vec<Outcome>,
    /// When each request was sent to a pod (s).
    sent_at: Vec<Option<f64>>,
    charges: Vec<Option<ServiceCharge>>,
    reasons: Vec<Reason>,
    max_queue: u64,
    max_band: [u64; 3],
    max_wait_s: f64,
    stale: Vec<StaleWindow>,
    stale_dispatched: u64,
    /// The latest drain estimate of a saturated pick (part of the `Retry-After` of queue
    /// rejections).
    last_retry_after: f64,
}

/// What a pick did with a request.
enum Routed {
    /// Sent to a pod.
    Sent,
    /// Every candidate saturated (a queueing pick): it may wait.
    Saturated,
    /// Answered with a rejection or an error.
    Answered,
}

impl Gate<'_> {
    fn reject(&mut self, id: u64, reason: &str, status: u16, retry_after: Option<f64>, now: f64) {
        let i = match self.reasons.iter().position(|r| r.stats.reason == reason) {
            Some(i) => i,
            None => {
                self.reasons.push(Reason {
                    stats: RejectStats {
                        reason: reason.to_owned(),
                        status,
                        ..RejectStats::default()
                    },
                    retry_sum: 0.0,
                });
                self.reasons.len() - 1
            }
        };
        let r = &mut self.reasons[i];
        r.stats.count += 1;
        if let Some(ra) = retry_after {
            r.stats.with_retry_after += 1;
            r.retry_sum += ra;
            r.stats.retry_after_max_s = r.stats.retry_after_max_s.max(ra);
        }
        if let Some(o) = self.outcome.get_mut(id as usize) {
            *o = Outcome::Rejected(i, now);
        }
    }

    /// `Retry-After` for a request of `priority` the queues turned away: infergate tells the
    /// client the longer of the pool's drain estimate (its latest saturated pick's) and the
    /// expected wait of the queue ahead of the band at the measured send rate, as
    /// `infergate_pool::flow` does ([`FlowQueues::retry_after`]); the reference sends none.
    fn queue_retry_after(&self, priority: Priority, now: f64) -> Option<f64> {
        if self.policy != FlowPolicy::Infergate {
            return None;
        }
        let drain = std::time::Duration::try_from_secs_f64(self.last_retry_after)
            .unwrap_or(std::time::Duration::ZERO);
        let q = self.queue.as_ref()?;
        Some(q.retry_after(priority, drain, ts(now)).as_secs_f64())
    }

    fn removed(&mut self, r: Removed<u64>, now: f64) {
        self.max_wait_s = self.max_wait_s.max(r.waited.as_secs_f64());
        let retry = self.queue_retry_after(r.priority, now);
        let reason = match r.reason {
            Removal::Expired => "rejected-ttl-expired",
            Removal::Evicted => "evicted-priority",
        };
        self.reject(r.payload, reason, 429, retry, now);
    }

    /// The reference-like saturation detector: some pod with fresh scraped metrics under its
    /// thresholds (nothing routed since the scrape is counted).
    fn reference_headroom(&self, sim: &Sim<'_>) -> bool {
        let g = &self.bench.reference;
        (0..sim.kinds.len()).any(|i| {
            let Some((_, waiting, kv)) = sim.seen[i] else {
                return false;
            };
            sim.metrics_age(i) * 1e3 <= g.staleness_ms && waiting < g.queue_depth && kv < g.kv_cache
        })
    }
}

/// Routes one request now. With `queueing`, a pool where every candidate is saturated (or
/// every one the request may take, after leaving `reserve` clear pods to others) gives
/// [`Routed::Saturated`] and the request is left unanswered for the caller to queue.
#[allow(clippy::too_many_arguments, reason = "private; the pieces of one pick")]
fn route(
    sim: &mut Sim<'_>,
    gate: &mut Gate<'_>,
    a: &Arrival,
    queueing: bool,
    reserve: u16,
    model: &str,
    adapters: &[Arc<str>],
    rng: &mut SmallRng,
    errors: &mut u64,
) -> Result<Routed, BenchError> {
    let now = sim.fleet.now();
    let text = workload::prompt_text(a);
    let segments = [&*text];
    let lora = a.lora.and_then(|i| adapters.get(usize::from(i)));
    let cx = RequestContext::new(model, a.prompt_tokens)
        .with_prompt(&segments)
        .with_lora(lora.map(|l| &**l))
        .with_priority(a.priority)
        .with_output_tokens(a.output_tokens)
        .with_queueing(queueing)
        .with_reserved_endpoints(reserve);
    match sim.sched.pick(&cx, ts(now), rng) {
        Err(Rejection::Shed { retry_after }) if queueing => {
            gate.last_retry_after = retry_after.as_secs_f64();
            Ok(Routed::Saturated)
        }
        Err(rej) => {
            gate.reject(
                a.id,
                rej.metric_label(),
                rej.http_status(),
                rej.retry_after().map(|d| d.as_secs_f64()),
                now,
            );
            Ok(Routed::Answered)
        }
        Ok(decision) => {
            if sim.place(a, &decision, &text, lora)?.is_some() {
                if let Some(o) = gate.outcome.get_mut(a.id as usize) {
                    *o = Outcome::Sent;
                }
                if let Some(s) = gate.sent_at.get_mut(a.id as usize) {
                    *s = Some(now);
                }
                if gate.stale.iter().any(|w| w.contains(now)) {
                    gate.stale_dispatched += 1;
                }
                Ok(Routed::Sent)
            } else {
                *errors += 1;
                gate.reject(a.id, "upstream-error", 502, None, now);
                Ok(Routed::Answered)
            }
        }
    }
}

fn flow_request<'t>(a: &Arrival, tenant: &'t str) -> FlowRequest<'t> {
    let bytes =
        u64::from(a.prompt_tokens) * infergate_sim::tokens::BYTES_PER_TOKEN as u64 + BODY_OVERHEAD;
    FlowRequest::new(tenant, a.priority, bytes).with_tokens(a.prompt_tokens, a.output_tokens)
}

/// The flow configuration a policy runs with.
fn queue_config(policy: FlowPolicy, bench: &FlowBench) -> Option<FlowConfig> {
    match policy {
        FlowPolicy::None => None,
        FlowPolicy::Reference => Some(FlowConfig {
            enabled: true,
            fairness: Fairness::GlobalStrict,
            ordering: Ordering::Fcfs,
            headroom: Headroom::default(),
            ..bench.config
        }),
        FlowPolicy::Infergate => Some(FlowConfig {
            enabled: true,
            ..bench.config
        }),
    }
}

/// The stale windows of a run: those the scrapes suffer, and those its figures are taken over
/// (the same, except for the direct path, which reads no metrics).
#[derive(Clone, Copy)]
pub(super) struct Stale<'a> {
    applied: &'a [StaleWindow],
    measured: &'a [StaleWindow],
}

/// One run of one flow policy.
#[allow(
    clippy::too_many_arguments,
    reason = "private; one call per run of the matrix"
)]
pub(super) fn run_one(
    scenario: &Scenario,
    spec: &FleetSpec,
    adapters: &[Arc<str>],
    cfg: SchedulerConfig,
    policy: FlowPolicy,
    arrivals: &[Arrival],
    seed: u64,
    stale: Stale<'_>,
    record_load: bool,
    progress: &mut dyn Progress,
    stop: &mut Stop<'_>,
) -> Result<Ran, BenchError> {
    let default_bench = FlowBench::default();
    let bench = scenario.flow.as_ref().unwrap_or(&default_bench);
    let preset = cfg.preset;
    let mut sim = setup(
        scenario,
        spec,
        cfg,
        arrivals,
        seed,
        record_load,
        stale.applied,
    )?;
    sim.prime();
    let model = model_of(spec);
    let tenants: Vec<Arc<str>> = scenario
        .workload
        .tenant_names()
        .into_iter()
        .map(Arc::from)
        .collect();
    let mut gate = Gate {
        policy,
        bench,
        queue: queue_config(policy, bench).map(FlowQueues::new),
        outcome: vec![Outcome::Pending; arrivals.len()],
        sent_at: vec![None; arrivals.len()],
        charges: vec![None; arrivals.len()],
        reasons: Vec::new(),
        max_queue: 0,
        max_band: [0; 3],
        max_wait_s: 0.0,
        stale: stale.measured.to_vec(),
        stale_dispatched: 0,
        last_retry_after: 1.0,
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7363_6865_645f_726e);
    let mut errors = 0u64;
    let mut next = 0usize;
    loop {
        if stop.now() {
            return Ok(Ran::Interrupted);
        }
        let queued = gate.queue.as_ref().is_some_and(|q| !q.is_empty());
        let t_arrival = arrivals.get(next).map_or(f64::INFINITY, |a| a.at);
        if !queued && t_arrival.is_infinite() {
            break;
        }
        // While requests wait, the gate may open at any fleet event (a first token, a
        // completion), at a scrape becoming visible, or a deadline may pass.
        let mut t = t_arrival;
        if queued {
            if let Some(e) = sim.fleet.next_event_time() {
                t = t.min(e);
            }
            t = t.min(sim.next_scrape + sim.lag);
            if let Some(&(visible, _, _)) = sim.scrapes.front() {
                t = t.min(visible);
            }
            if let Some(d) = gate.queue.as_ref().and_then(FlowQueues::next_deadline) {
                // A microsecond past the deadline: seconds in f64 and back to nanoseconds may
                // land a nanosecond short of it, and the expiry would never come due.
                t = t.min((d.as_nanos() + 1_000) as f64 / 1e9);
            }
        }
        let t = t.max(sim.fleet.now());
        sim.advance(t);
        sim.absorb();
        for (id, input, output) in sim.just_completed.drain(..) {
            if let (Some(q), Some(Some(c))) = (&mut gate.queue, gate.charges.get(id as usize)) {
                q.settle(*c, input, output);
            }
        }
        sim.refresh_metrics();
        let now = sim.fleet.now();
        if let Some(mut q) = gate.queue.take() {
            let mut removed = Vec::new();
            q.expire(ts(now), |r| removed.push(r));
            gate.queue = Some(q);
            for r in removed {
                gate.removed(r, now);
            }
        }
        // Arrivals due now.
        while let Some(a) = arrivals.get(next).filter(|a| a.at <= now) {
            next += 1;
            progress.advance(next as u64);
            let tenant = tenants
                .get(usize::from(a.tenant))
                .map_or("default", |t| &**t);
            let waiting_ahead = gate
                .queue
                .as_ref()
                .map(|q| q.has_queued_at_or_above(a.priority));
            let send_now = match (policy, waiting_ahead) {
                (FlowPolicy::None, _) | (_, None) => {
                    route(
                        &mut sim,
                        &mut gate,
                        a,
                        false,
                        0,
                        &model,
                        adapters,
                        &mut rng,
                        &mut errors,
                    )?;
                    continue;
                }
                (_, Some(true)) => false,
                (FlowPolicy::Reference, Some(false)) => gate.reference_headroom(&sim),
                (FlowPolicy::Infergate, Some(false)) => true,
            };
            if send_now {
                let queueing = policy == FlowPolicy::Infergate;
                let reserve = match (&gate.queue, queueing) {
                    (Some(q), true) => q.reserve_for(tenant, a.priority, ts(now)),
                    _ => 0,
                };
                match route(
                    &mut sim,
                    &mut gate,
                    a,
                    queueing,
                    reserve,
                    &model,
                    adapters,
                    &mut rng,
                    &mut errors,
                )? {
                    Routed::Sent => {
                        if let Some(q) = &mut gate.queue {
                            gate.charges[a.id as usize] =
                                Some(q.charge(&flow_request(a, tenant), ts(now)));
                        }
                        continue;
                    }
                    Routed::Answered => continue,
                    Routed::Saturated => {}
                }
            }
            let Some(mut q) = gate.queue.take() else {
                continue;
            };
            let mut evicted = Vec::new();
            let refused = q
                .enqueue(flow_request(a, tenant), a.id, ts(now), |r| evicted.push(r))
                .err();
            gate.max_queue = gate.max_queue.max(q.len() as u64);
            for (b, p) in [Priority::Critical, Priority::Standard, Priority::Sheddable]
                .into_iter()
                .enumerate()
            {
                gate.max_band[b] = gate.max_band[b].max(q.band_len(p) as u64);
            }
            gate.queue = Some(q);
            for r in evicted {
                gate.removed(r, now);
            }
            if let Some(r) = refused {
                let retry = gate.queue_retry_after(a.priority, now);
                let reason = match r.reason {
                    Refusal::BandFull | Refusal::QueueFull => "rejected-saturated",
                };
                gate.reject(r.payload, reason, 429, retry, now);
            }
        }
        // The head of the queues gets turns while pods have headroom. A head held back by the
        // headroom reservation lets the first protected request try (one pick) before the
        // turns stop.
        while let Some(head) = gate.queue.as_ref().and_then(FlowQueues::peek) {
            if policy == FlowPolicy::Reference && !gate.reference_headroom(&sim) {
                break;
            }
            let queueing = policy == FlowPolicy::Infergate;
            let mut turn = head;
            let mut routed = None;
            for _ in 0..2 {
                let Some(&id) = gate.queue.as_ref().and_then(|q| q.get(turn)) else {
                    break;
                };
                let Some(a) = arrivals.get(id as usize) else {
                    break;
                };
                let reserve = match (&gate.queue, queueing) {
                    (Some(q), true) => q.reserve_of(turn, ts(now)),
                    _ => 0,
                };
                // A pick before the dispatch: a saturated one leaves the request in its place.
                let r = route(
                    &mut sim,
                    &mut gate,
                    a,
                    queueing,
                    reserve,
                    &model,
                    adapters,
                    &mut rng,
                    &mut errors,
                )?;
                if !matches!(r, Routed::Saturated) {
                    routed = Some((r, id));
                    break;
                }
                match gate.queue.as_ref().and_then(|q| q.peek_protected(ts(now))) {
                    Some(p) if reserve > 0 && p != turn => turn = p,
                    _ => break,
                }
            }
            let Some((routed, id)) = routed else {
                break;
            };
            let Some(d) = gate.queue.as_mut().and_then(|q| q.dispatch(turn, ts(now))) else {
                break;
            };
            gate.max_wait_s = gate.max_wait_s.max(d.waited.as_secs_f64());
            if matches!(routed, Routed::Sent)
                && let Some(c) = gate.charges.get_mut(id as usize)
            {
                *c = Some(d.charge);
            }
        }
        let stuck = gate.queue.as_ref().is_some_and(|q| !q.is_empty())
            && next >= arrivals.len()
            && sim.fleet.next_event_time().is_none()
            && gate
                .queue
                .as_ref()
                .and_then(FlowQueues::next_deadline)
                .is_none()
            && sim.stale.iter().all(|w| w.to_s <= now);
        if stuck {
            // Nothing can open the gate any more (no TTL, an idle fleet): what is left is
            // unanswered, and reported as such.
            break;
        }
    }
    if !sim.drain(stop) {
        return Ok(Ran::Interrupted);
    }
    sim.absorb();
    let flow = flow_figures(scenario, &sim, &gate, arrivals, &tenants);
    let rejected = gate.reasons.iter().map(|r| r.stats.count).sum::<u64>() - errors;
    let mut r = finish(
        sim,
        format!("{}/{}", policy.as_str(), preset.as_str()),
        seed,
        rejected,
        errors,
    );
    r.flow = Some(flow);
    Ok(Ran::Done(Box::new(r)))
}

fn flow_figures(
    _scenario: &Scenario,
    sim: &Sim<'_>,
    gate: &Gate<'_>,
    arrivals: &[Arrival],
    tenants: &[Arc<str>],
) -> FlowRun {
    let group = |name: &str, keep: &dyn Fn(&Arrival) -> bool| {
        let mut g = GroupStats {
            name: name.to_owned(),
            ..GroupStats::default()
        };
        let (mut ttft, mut queued, mut at_pod) = (Vec::new(), Vec::new(), Vec::new());
        for a in arrivals.iter().filter(|a| keep(a)) {
            g.offered += 1;
            if let Some(Some((t, tokens))) = sim.served.get(a.id as usize) {
                g.completed += 1;
                g.served_tokens += tokens;
                ttft.push(*t);
                let q = gate
                    .sent_at
                    .get(a.id as usize)
                    .copied()
                    .flatten()
                    .map_or(0.0, |s| (s - a.at).max(0.0));
                queued.push(q);
                at_pod.push(t - q);
            } else if let Some(Outcome::Rejected(_, at)) = gate.outcome.get(a.id as usize) {
                g.rejected += 1;
                g.first_rejected_s = Some(g.first_rejected_s.map_or(*at, |f: f64| f.min(*at)));
            }
        }
        g.ttft = Percentiles::of(&mut ttft);
        g.queued = Percentiles::of(&mut queued);
        g.at_pod = Percentiles::of(&mut at_pod);
        g
    };
    let per_tenant: Vec<GroupStats> = tenants
        .iter()
        .enumerate()
        .map(|(k, name)| group(name, &|a| usize::from(a.tenant) == k))
        .collect();
    let priorities = [Priority::Critical, Priority::Standard, Priority::Sheddable]
        .into_iter()
        .map(|p| group(p.as_str(), &|a| a.priority == p))
        .collect();
    let served: Vec<f64> = per_tenant.iter().map(|g| g.served_tokens as f64).collect();
    let unanswered = arrivals
        .iter()
        .filter(|a| {
            sim.served.get(a.id as usize).is_some_and(Option::is_none)
                && !matches!(gate.outcome.get(a.id as usize), Some(Outcome::Rejected(..)))
        })
        .count() as u64;
    let stale = (!gate.stale.is_empty()).then(|| {
        let in_window = |a: &Arrival| gate.stale.iter().any(|w| w.contains(a.at));
        let g = group("stale", &in_window);
        StaleStats {
            arrived: g.offered,
            dispatched: gate.stale_dispatched,
            completed: g.completed,
            ttft: g.ttft,
        }
    });
    FlowRun {
        jain: crate::report::flow::jain(&served),
        tenants: per_tenant,
        priorities,
        rejects: gate
            .reasons
            .iter()
            .map(|r| RejectStats {
                retry_after_mean_s: if r.stats.with_retry_after > 0 {
                    r.retry_sum / r.stats.with_retry_after as f64
                } else {
                    0.0
                },
                ..r.stats.clone()
            })
            .collect(),
        max_queue: gate.max_queue,
        max_band: gate.max_band,
        max_wait_s: gate.max_wait_s,
        unanswered,
        stale,
    }
}

/// The router of every flow policy: the preset, with the scenario's saturation thresholds. The
/// reference-like policy never sheds what its saturation detector let through (the reference
/// picker routes every request it dispatches).
fn router_config(preset: Preset, fp: FlowPolicy, bench: &FlowBench) -> SchedulerConfig {
    let mut cfg = SchedulerConfig::preset(preset);
    if fp == FlowPolicy::Reference {
        cfg.shedding = false;
    }
    if let Some(t) = bench.saturation {
        cfg.saturation = t;
        cfg.overload.queue_depth = cfg.overload.queue_depth.max(t.queue_depth);
        cfg.overload.kv_cache = cfg.overload.kv_cache.max(t.kv_cache);
    }
    cfg
}

/// One run of each seed of a flow scenario: a row of the comparison, or a reference run that
/// its targets need (kept as a baseline, not a row).
#[derive(Clone, Copy)]
enum Step {
    /// A flow policy in front of a router preset, on all the seed's arrivals.
    Row(Preset, FlowPolicy),
    /// A flow policy on the arrivals of the isolation target's tenant alone.
    Alone(FlowPolicy),
    /// A flow policy on the critical arrivals alone.
    CriticalOnly(FlowPolicy),
    /// The direct path: a Service's round-robin, no metrics, no queue; the stale windows are
    /// only measured.
    Direct,
}

/// Runs a scenario with a `flow:` section: every router preset × flow policy on every seed,
/// plus the reference runs its targets need, until `stop` is set ([`super::run_until`]).
pub(super) fn run(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
    stop: &AtomicBool,
) -> Result<Report, BenchError> {
    let catalog = infergate_sim::Catalog::builtin()?;
    let spec = scenario.fleet_spec(&catalog, origin)?;
    let default_bench = FlowBench::default();
    let bench = scenario.flow.as_ref().unwrap_or(&default_bench);
    let adapters: Vec<Arc<str>> = scenario
        .workload
        .lora
        .as_ref()
        .map(|l| l.adapters.iter().map(|a| a.as_str().into()).collect())
        .unwrap_or_default();
    let names = scenario.workload.tenant_names();
    let one_preset = scenario.policies.len() == 1;
    let label = |fp: FlowPolicy, preset: Preset| {
        if one_preset {
            fp.as_str().to_owned()
        } else {
            format!("{}/{}", fp.as_str(), preset.as_str())
        }
    };
    let mut rows = Vec::new();
    // Each seed's runs, in order, by their progress labels.
    let mut steps = Vec::new();
    // Validation keeps precise policies out of flow scenarios: the preset is the policy.
    for preset in scenario.policies.iter().map(|p| p.preset) {
        for &fp in &bench.policies {
            rows.push((label(fp, preset), fp));
            steps.push((label(fp, preset), Step::Row(preset, fp)));
        }
    }
    let t = &bench.targets;
    let isolated = t.isolation.as_ref().and_then(|iso| {
        let k = names.iter().position(|n| *n == iso.tenant)?;
        Some((&iso.tenant, u16::try_from(k).unwrap_or(u16::MAX)))
    });
    for &fp in &bench.policies {
        if isolated.is_some() {
            steps.push((format!("{} alone", fp.as_str()), Step::Alone(fp)));
        }
    }
    for &fp in &bench.policies {
        if t.critical_vs_unloaded.is_some() {
            steps.push((
                format!("{} critical only", fp.as_str()),
                Step::CriticalOnly(fp),
            ));
        }
    }
    if t.stale_vs_direct.is_some() {
        steps.push(("direct".to_owned(), Step::Direct));
    }
    // The reference runs route with the first preset.
    let first = scenario
        .policies
        .first()
        .map_or(Preset::Infergate, |p| p.preset);
    let mut until = Until::new(
        scenario,
        steps.iter().map(|(n, _)| n.clone()).collect(),
        stop,
    );
    let mut runs = Vec::new();
    let mut floors = Vec::new();
    let mut baselines = Vec::new();
    'seeds: for (si, &seed) in scenario.seeds.iter().enumerate() {
        let arrivals = workload::generate(&scenario.workload, seed);
        floors.push(super::floor(&spec, &arrivals, seed));
        let alone = isolated
            .map(|(_, k)| workload::only_tenants(&arrivals, &[k]))
            .unwrap_or_default();
        let mut only: Vec<Arrival> = Vec::new();
        if t.critical_vs_unloaded.is_some() {
            only.extend(
                arrivals
                    .iter()
                    .filter(|a| a.priority == Priority::Critical)
                    .cloned(),
            );
            for (i, a) in only.iter_mut().enumerate() {
                a.id = i as u64;
            }
        }
        let both = Stale {
            applied: &scenario.stale,
            measured: &scenario.stale,
        };
        for (ri, (name, step)) in steps.iter().enumerate() {
            let (preset, fp, arr, stale, record) = match *step {
                Step::Row(preset, fp) => (preset, fp, &arrivals, both, si == 0),
                Step::Alone(fp) => (first, fp, &alone, both, false),
                Step::CriticalOnly(fp) => (first, fp, &only, both, false),
                Step::Direct => (
                    Preset::RoundRobin,
                    FlowPolicy::None,
                    &arrivals,
                    Stale {
                        applied: &[],
                        measured: &scenario.stale,
                    },
                    false,
                ),
            };
            let cfg = router_config(preset, fp, bench);
            let ran = until.run(si, ri, arr.len(), progress, |progress, stop| {
                run_one(
                    scenario, &spec, &adapters, cfg, fp, arr, seed, stale, record, progress, stop,
                )
            })?;
            let Some(mut r) = ran else {
                break 'seeds;
            };
            let kind = match step {
                Step::Row(..) => {
                    r.policy.clone_from(name);
                    runs.push(r);
                    continue;
                }
                Step::Alone(_) => format!("alone:{}", isolated.map_or("", |(t, _)| t.as_str())),
                Step::CriticalOnly(_) => "critical-only".to_owned(),
                Step::Direct => "direct".to_owned(),
            };
            r.policy = fp.as_str().to_owned();
            baselines.push(BaselineRun { kind, run: r });
        }
    }
    let mut report = until.report(&spec, runs.clone(), floors);
    report.flow = Some(FlowReport::new(scenario, &rows, &runs, baselines));
    Ok(report)
}

#[cfg(test)]
mod tests;
