//! Active-active pickers in simulation (a scenario's `replicas:` section): several independent
//! schedulers route one fleet, as several picker replicas behind a Kubernetes Service do.
//!
//! Every replica is a full `Scheduler` of the run's policy. Each arrival goes to one replica
//! (round-robin or seeded random, as the Service spreads connections); that replica picks and
//! learns from its own requests only (their first tokens and completions), so its in-flight,
//! prefix and LoRA accounting covers its share of the traffic. Every replica applies the same
//! scraped pages at the same times (each scrapes every pod; the simulated scraper is shared).
//!
//! With `sharing: inflight`, replica `r` reports its own per-endpoint load
//! (`Scheduler::peer_loads`) every `exchange.interval_ms`, out of phase with the others by
//! `r/N` of the interval, and every other replica applies the report `exchange.delay_ms` later
//! (`Scheduler::apply_peer_loads`); with `exchange.push` (the default, as the picker does) a
//! replica also reports right after a pick when its previous report is at least an interval old,
//! and its periodic schedule restarts from there. With `sharing: exchange` the report also carries the rate
//! samples the sender learned since its previous report (`Scheduler::take_rate_samples`), which
//! its peers learn from (`Scheduler::learn_from_peer`). Between events the run is the single-picker runner's: one
//! replica without sharing gives exactly its figures (tested).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use infergate_scheduler::{
    Decision, MetricsSnapshot, PeerLoad, RateSample, RequestContext, Scheduler, ScrapeState, Usage,
};
use infergate_sim::fleet::Request;
use infergate_sim::{FleetSpec, Prompt, SimError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{
    MAX_LATE_S, Precise, Sim, Stop, Until, finish, floor, model_of, pod_addr, pod_index, setup,
    snapshot, ts,
};
use crate::BenchError;
use crate::plan::Ran;
use crate::policy::RoutePolicy;
use crate::progress::Progress;
use crate::report::Report;
use crate::scenario::{ReplicaBench, Scenario, Sharing, Spread};
use crate::workload::{self, Arrival};

/// The label of one run in the report: the policy alone for one replica (so the scenario's
/// targets judge the single picker), else `infergate x3 none` / `infergate x3 exchange`.
pub fn label(policy: &RoutePolicy, count: u32, sharing: Sharing) -> String {
    if count <= 1 {
        policy.as_str().to_owned()
    } else {
        format!("{} x{count} {}", policy.as_str(), sharing.as_str())
    }
}

/// Runs every policy of `scenario` on every seed, once per replica count and sharing mode,
/// until `stop` is set ([`super::run_until`]).
pub(super) fn run(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
    stop: &AtomicBool,
) -> Result<Report, BenchError> {
    let bench = scenario.replicas.clone().unwrap_or_default();
    let catalog = infergate_sim::Catalog::builtin()?;
    let spec = scenario.fleet_spec(&catalog, origin)?;
    let adapters: Vec<Arc<str>> = scenario
        .workload
        .lora
        .as_ref()
        .map(|l| l.adapters.iter().map(|a| a.as_str().into()).collect())
        .unwrap_or_default();
    // Each seed's runs, in order.
    let mut order = Vec::new();
    for policy in &scenario.policies {
        for &count in &bench.counts {
            let modes: &[Sharing] = if count <= 1 {
                &[Sharing::None]
            } else {
                &bench.sharing
            };
            order.extend(modes.iter().map(|&sharing| (policy, count, sharing)));
        }
    }
    let names = order.iter().map(|&(p, c, s)| label(p, c, s)).collect();
    let mut until = Until::new(scenario, names, stop);
    let mut runs = Vec::new();
    let mut floors = Vec::new();
    'seeds: for (si, &seed) in scenario.seeds.iter().enumerate() {
        let arrivals = workload::generate(&scenario.workload, seed);
        floors.push(floor(&spec, &arrivals, seed));
        for (ri, &(policy, count, sharing)) in order.iter().enumerate() {
            let run = Run {
                scenario,
                spec: &spec,
                adapters: &adapters,
                arrivals: &arrivals,
                seed,
                record_load: si == 0,
                bench: &bench,
                count,
                sharing,
            };
            let ran = until.run(si, ri, arrivals.len(), progress, |progress, stop| {
                run.go(policy, progress, stop)
            })?;
            let Some(mut r) = ran else {
                break 'seeds;
            };
            r.policy = label(policy, count, sharing);
            runs.push(r);
        }
    }
    Ok(until.report(&spec, runs, floors))
}

/// One run's inputs.
struct Run<'a> {
    scenario: &'a Scenario,
    spec: &'a FleetSpec,
    adapters: &'a [Arc<str>],
    arrivals: &'a [Arrival],
    seed: u64,
    record_load: bool,
    bench: &'a ReplicaBench,
    count: u32,
    sharing: Sharing,
}

/// The fleet, its scraper and records (the single-picker runner's [`Sim`], whose scheduler is
/// replica 0), the other replicas, and the reports in transit between them.
struct Multi<'a> {
    sim: Sim<'a>,
    /// Replicas 1..N.
    others: Vec<Scheduler>,
    /// Per request: the replica that routed it.
    owner: Vec<usize>,
    /// Each replica's name, as its peers know it.
    names: Vec<String>,
    /// Exchange interval and delay (s), when the replicas share.
    exchange: Option<(f64, f64)>,
    /// Whether a pick is pushed at once when the replica's previous report is older than the
    /// interval.
    push: bool,
    /// Per replica: when it last reported, and what.
    last_report: Vec<f64>,
    last_loads: Vec<Vec<PeerLoad>>,
    /// Whether reports carry rate samples too.
    rates: bool,
    /// Per replica: when it next reports.
    next_report: Vec<f64>,
    /// Reports sent and not yet applied, in time order.
    transit: VecDeque<InTransit>,
}

/// One report in transit.
struct InTransit {
    /// When its peers apply it (s).
    at: f64,
    from: usize,
    loads: Vec<PeerLoad>,
    samples: Vec<RateSample>,
}

impl Run<'_> {
    fn go(
        &self,
        route: &RoutePolicy,
        progress: &mut dyn Progress,
        stop: &mut Stop<'_>,
    ) -> Result<Ran, BenchError> {
        let cfg = route.scheduler_config();
        let policy = route.as_str().to_owned();
        let n = self.count.max(1) as usize;
        let mut others = Vec::with_capacity(n - 1);
        for _ in 1..n {
            others.push(
                setup(
                    self.scenario,
                    self.spec,
                    cfg.clone(),
                    &[],
                    self.seed,
                    false,
                    &[],
                )?
                .sched,
            );
        }
        let sim = setup(
            self.scenario,
            self.spec,
            cfg,
            self.arrivals,
            self.seed,
            self.record_load,
            &self.scenario.stale,
        )?;
        let exchange = (self.sharing != Sharing::None && n > 1).then(|| {
            let x = self.bench.exchange;
            (x.interval_ms / 1e3, x.delay_ms / 1e3)
        });
        let mut m = Multi {
            sim,
            others,
            owner: vec![0; self.arrivals.len()],
            names: (0..n).map(|r| format!("picker-{r}")).collect(),
            next_report: (0..n)
                .map(|r| exchange.map_or(f64::INFINITY, |(i, _)| i * r as f64 / n as f64))
                .collect(),
            exchange,
            push: self.bench.exchange.push,
            last_report: vec![f64::NEG_INFINITY; n],
            last_loads: vec![Vec::new(); n],
            rates: self.sharing == Sharing::Exchange,
            transit: VecDeque::new(),
        };
        // Every replica subscribes to every pod's events with the same lag, so one view serves all.
        let mut precise = route.precise.then(|| {
            let ev = self.scenario.kv_events;
            Precise::new(&mut m.sim.fleet, ev.lag_ms / 1e3, ev.provisional)
        });
        let model = model_of(self.spec);
        // The same pick generator as the single-picker runner, so one replica gives its figures.
        let mut rng = SmallRng::seed_from_u64(self.seed ^ 0x7363_6865_645f_726e);
        let mut spread = SmallRng::seed_from_u64(self.seed ^ 0x7265_706c_6963_6173);
        let (mut rejected, mut errors) = (0u64, 0u64);
        for (done, a) in self.arrivals.iter().enumerate() {
            if stop.now() {
                return Ok(Ran::Interrupted);
            }
            m.exchange_until(a.at);
            m.sim.advance(a.at);
            m.absorb();
            if let Some(p) = precise.as_mut() {
                for (id, _, _) in m.sim.just_completed.drain(..) {
                    p.completed(id);
                }
            }
            m.refresh_metrics();
            let r = match self.bench.spread {
                Spread::RoundRobin => done % n,
                Spread::Random => spread.random_range(0..n),
            };
            let text = workload::prompt_text(a);
            let segments = [&*text];
            let lora = a.lora.and_then(|i| self.adapters.get(usize::from(i)));
            let cached = precise
                .as_mut()
                .map(|p| p.cached(&mut m.sim.fleet, &text, lora.map(|l| &**l)));
            let cx = RequestContext::new(&model, a.prompt_tokens)
                .with_prompt(&segments)
                .with_lora(lora.map(|l| &**l))
                .with_priority(a.priority)
                .with_output_tokens(a.output_tokens)
                .with_cached(cached);
            match m.sched(r).pick(&cx, ts(a.at), &mut rng) {
                Err(_) => rejected += 1,
                Ok(decision) => {
                    if !m.place(a, &decision, &text, lora, r)? {
                        errors += 1;
                    } else if let Some(p) = precise.as_mut() {
                        p.placed(decision.endpoints.first(), a.id, &text, lora.map(|l| &**l));
                    }
                    m.pushed(r, a.at);
                }
            }
            progress.advance(done as u64 + 1);
        }
        if !m.sim.drain(stop) {
            return Ok(Ran::Interrupted);
        }
        m.absorb();
        Ok(Ran::Done(Box::new(finish(
            m.sim, policy, self.seed, rejected, errors,
        ))))
    }
}

impl Multi<'_> {
    fn sched(&mut self, r: usize) -> &mut Scheduler {
        match r.checked_sub(1) {
            Some(i) if i < self.others.len() => &mut self.others[i],
            _ => &mut self.sim.sched,
        }
    }

    fn all(&mut self) -> impl Iterator<Item = &mut Scheduler> {
        std::iter::once(&mut self.sim.sched).chain(self.others.iter_mut())
    }

    /// Sends and applies the reports due up to `t`, each at its own time: the fleet is advanced
    /// to it, first tokens, completions and scrapes are taken in, then the report is made (from
    /// the sender's state at that time) or applied.
    fn exchange_until(&mut self, t: f64) {
        let Some((interval, delay)) = self.exchange else {
            return;
        };
        loop {
            let (r, send) = self.next_report.iter().copied().enumerate().fold(
                (0, f64::INFINITY),
                |b, (r, at)| if at < b.1 { (r, at) } else { b },
            );
            let apply = self.transit.front().map_or(f64::INFINITY, |x| x.at);
            let next = send.min(apply);
            if next > t {
                return;
            }
            self.sim.advance(next);
            self.absorb();
            self.refresh_metrics();
            let now = ts(next);
            if apply <= send {
                let Some(x) = self.transit.pop_front() else {
                    return;
                };
                let name = self.names[x.from].clone();
                for (i, s) in self.all().enumerate() {
                    if i != x.from {
                        // At most N − 1 ≤ 63 peers (counts are validated): never refused.
                        let _ = s.apply_peer_loads(&name, &x.loads, now);
                        s.learn_from_peer(&x.samples);
                    }
                }
            } else {
                self.report(r, send, interval, delay, !self.push);
            }
        }
    }

    /// Replica `r` looks at its load at `send` and reports it (always when `always`, else only
    /// when it changed since its previous report, as the picker does); its next periodic look
    /// is an interval later.
    fn report(&mut self, r: usize, send: f64, interval: f64, delay: f64, always: bool) {
        let rates = self.rates;
        let s = self.sched(r);
        let mut x = InTransit {
            at: send + delay,
            from: r,
            loads: Vec::new(),
            samples: Vec::new(),
        };
        s.peer_loads(&mut x.loads);
        if rates {
            s.take_rate_samples(&mut x.samples);
        }
        self.next_report[r] = send + interval;
        if !always && x.samples.is_empty() && x.loads == self.last_loads[r] {
            return;
        }
        self.last_loads[r].clone_from(&x.loads);
        self.transit.push_back(x);
        self.last_report[r] = send;
    }

    /// Replica `r` picked at `t`: with `push`, its report goes at once when its previous one is
    /// at least an interval old (else the change waits for the next periodic report).
    fn pushed(&mut self, r: usize, t: f64) {
        let Some((interval, delay)) = self.exchange else {
            return;
        };
        if self.push && t >= self.last_report[r] + interval {
            self.report(r, t, interval, delay, true);
        }
    }

    /// The single-picker runner's `refresh_metrics`, for every replica.
    fn refresh_metrics(&mut self) {
        let now = self.sim.fleet.now();
        let mut newest = None;
        while self
            .sim
            .scrapes
            .front()
            .is_some_and(|(at, _, _)| *at <= now)
        {
            newest = self.sim.scrapes.pop_front();
        }
        if let Some((_, sampled_at, views)) = newest {
            for (i, view) in views.iter().enumerate() {
                let snap: MetricsSnapshot = snapshot(
                    self.sim.kinds[i],
                    view,
                    sampled_at,
                    &mut self.sim.counters[i],
                );
                for s in self.all() {
                    let _ = s.apply_metrics(pod_addr(i), snap.clone());
                }
                self.sim.seen[i] = Some((sampled_at, view.waiting, view.kv_usage));
                self.sim.since_scrape[i] = 0;
            }
        }
        if self.sim.stale.is_empty() {
            return;
        }
        let overdue = 2.0 * self.sim.interval + self.sim.lag;
        for i in 0..self.sim.seen.len() {
            let age = self.sim.seen[i].map_or(f64::INFINITY, |(at, _, _)| now - at);
            let state = if age <= overdue {
                continue;
            } else if age <= MAX_LATE_S {
                ScrapeState::Late
            } else {
                ScrapeState::Failed
            };
            for s in self.all() {
                let _ = s.set_scrape_state(pod_addr(i), state);
            }
        }
    }

    /// The single-picker runner's `place`, on replica `r`'s tickets.
    fn place(
        &mut self,
        a: &Arrival,
        decision: &Decision,
        text: &Arc<str>,
        lora: Option<&Arc<str>>,
        r: usize,
    ) -> Result<bool, BenchError> {
        let n = self.sim.kinds.len();
        let now = self.sim.fleet.now();
        if let Some(o) = self.owner.get_mut(a.id as usize) {
            *o = r;
        }
        for (j, addr) in decision.endpoints.iter().enumerate() {
            let Some(pod) = pod_index(addr, n) else {
                continue;
            };
            if j > 0 && !self.sched(r).reassign(decision.ticket, *addr) {
                continue;
            }
            let req = Request {
                id: a.id,
                arrival: now.max(a.at),
                prompt: Prompt::Text(text.clone()),
                max_tokens: a.output_tokens,
                lora: lora.cloned(),
            };
            match self.sim.fleet.submit(pod, req) {
                Ok(()) => {
                    if let Some(t) = self.sim.tickets.get_mut(a.id as usize) {
                        *t = Some(decision.ticket);
                    }
                    self.sim.inflight[pod] += 1;
                    self.sim.since_scrape[pod] += 1;
                    return Ok(true);
                }
                Err(SimError::Rejected(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        self.sched(r).fail(decision.ticket, ts(now));
        Ok(false)
    }

    /// The single-picker runner's `absorb`: each first token and completion is reported to the
    /// replica that routed the request.
    fn absorb(&mut self) {
        let mut firsts = std::mem::take(&mut self.sim.firsts);
        let mut done = std::mem::take(&mut self.sim.done);
        self.sim.fleet.drain_first_tokens(&mut firsts);
        self.sim.fleet.drain_completions(&mut done);
        firsts.sort_by(|a, b| a.t.total_cmp(&b.t));
        done.sort_by(|a, b| a.last_token.total_cmp(&b.last_token));
        let mut f = firsts.iter().peekable();
        for c in &done {
            while let Some(first) = f.next_if(|first| first.t <= c.last_token) {
                self.first_token(first.id, first.t);
            }
            let Some(ticket) = self
                .sim
                .tickets
                .get_mut(c.id as usize)
                .and_then(Option::take)
            else {
                continue;
            };
            let r = self.owner.get(c.id as usize).copied().unwrap_or(0);
            let s = self.sched(r);
            s.first_token(ticket, ts(c.first_token));
            s.complete(
                ticket,
                ts(c.last_token),
                Usage {
                    prompt_tokens: c.prompt_tokens,
                    cached_tokens: c.cached_tokens,
                    output_tokens: c.output_tokens,
                },
            );
            self.sim.record_completion(c);
        }
        for first in f {
            self.first_token(first.id, first.t);
        }
        firsts.clear();
        done.clear();
        self.sim.firsts = firsts;
        self.sim.done = done;
    }

    fn first_token(&mut self, id: u64, t: f64) {
        let Some(Some(ticket)) = self.sim.tickets.get(id as usize).copied() else {
            return;
        };
        let r = self.owner.get(id as usize).copied().unwrap_or(0);
        self.sched(r).first_token(ticket, ts(t));
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use crate::progress::Silent;
    use crate::scenario::{ReplicaBench, Scenario, Sharing};

    const SCENARIO: &str = r"
name: replicas-test
fleet:
  - { name: h100, profile: llama-3.1-8b/h100, engine: vllm, replicas: 1 }
  - { name: a10g, profile: llama-3.1-8b/a10g, engine: vllm, replicas: 2 }
workload:
  duration_s: 20
  arrival: { kind: bursty, base_rate: 2, burst_rate: 14, burst_s: 5, period_s: 10 }
  prompt_tokens: { dist: lognormal, median: 1000, sigma: 0.6, min: 64, max: 4000 }
  output_tokens: { dist: uniform, min: 16, max: 64 }
seeds: [1]
policies: [infergate]
";

    fn scenario(replicas: Option<ReplicaBench>) -> Scenario {
        let mut s = Scenario::from_yaml(SCENARIO, "test").unwrap();
        s.replicas = replicas;
        s
    }

    #[test]
    fn one_replica_is_the_single_picker() {
        let single = super::super::run(&scenario(None), "test", &mut Silent).unwrap();
        let one = super::super::run(
            &scenario(Some(ReplicaBench {
                counts: vec![1],
                ..ReplicaBench::default()
            })),
            "test",
            &mut Silent,
        )
        .unwrap();
        assert_eq!(single.runs.len(), 1);
        assert_eq!(one.runs.len(), 1);
        let (a, b) = (&single.runs[0], &one.runs[0]);
        assert_eq!(a.policy, b.policy);
        assert_eq!(a.ttft, b.ttft);
        assert_eq!(a.per_pod_requests, b.per_pod_requests);
    }

    #[test]
    fn every_count_and_mode_runs_every_request() {
        let r = super::super::run(
            &scenario(Some(ReplicaBench {
                counts: vec![1, 3],
                sharing: vec![Sharing::None, Sharing::Inflight, Sharing::Exchange],
                ..ReplicaBench::default()
            })),
            "test",
            &mut Silent,
        )
        .unwrap();
        let labels: Vec<&str> = r.runs.iter().map(|r| r.policy.as_str()).collect();
        assert_eq!(
            labels,
            [
                "infergate",
                "infergate x3 none",
                "infergate x3 inflight",
                "infergate x3 exchange"
            ]
        );
        for run in &r.runs {
            assert_eq!(run.completed + run.rejected + run.errors, run.requests);
        }
        // Sharing changes decisions.
        assert_ne!(r.runs[1].per_pod_requests, r.runs[2].per_pod_requests);
        assert_ne!(r.runs[2].ttft, r.runs[3].ttft);
    }

    #[test]
    fn replica_sections_are_validated() {
        let bad = SCENARIO.to_owned() + "replicas: { counts: [0] }\n";
        let e = Scenario::from_yaml(&bad, "test").unwrap_err().to_string();
        assert!(e.contains("replicas.counts"), "{e}");
        let bad = SCENARIO.to_owned() + "replicas: { exchange: { interval_ms: 0 } }\n";
        let e = Scenario::from_yaml(&bad, "test").unwrap_err().to_string();
        assert!(e.contains("replicas.exchange.interval_ms"), "{e}");
        let bad = SCENARIO.to_owned() + "replicas: { sharing: [gossip] }\n";
        assert!(Scenario::from_yaml(&bad, "test").is_err());
        let ok = SCENARIO.to_owned() + "replicas: { counts: [1, 3], spread: random }\n";
        Scenario::from_yaml(&ok, "test").unwrap();
    }
}
