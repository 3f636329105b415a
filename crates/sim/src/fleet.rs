//! The discrete-event fleet: many engines on one virtual clock.
//!
//! A router drives it: [`Fleet::submit`] a request to the pod it chose (the fleet first advances
//! to the request's arrival), read pods' state with [`Fleet::view`] (exact, now) or
//! [`Fleet::scraped`] (what a scraper polling every `interval` with `lag` would hold), and collect
//! [`Completion`]s with [`Fleet::drain_completions`]. With [`Fleet::record_kv_events`] the pods
//! also publish their prefix-cache events ([`Fleet::drain_kv_events`]), which a
//! [`crate::KvView`] turns into the router's view of what each pod holds.
//!
//! Each busy pod has one pending event (its step's end) in a binary heap; a pod that only decodes
//! runs a bulk step (many iterations priced in closed form) that an arrival cuts short, so the cost
//! per request is a handful of heap operations and one pass over the pod's batch, not one event per
//! token.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::spec::{EngineKind, FaultStep, Faults, FleetSpec};
use crate::tokens::chain_seed;
use crate::{Completion, Engine, EngineRequest, EngineView, KvEvent, Prompt, SimError};

/// A request for the fleet.
#[derive(Debug, Clone)]
pub struct Request {
    /// Caller's id, echoed in the completion.
    pub id: u64,
    /// Arrival time (virtual seconds); must not be before [`Fleet::now`].
    pub arrival: f64,
    /// The prompt (text, or a token count with an optional shared prefix).
    pub prompt: Prompt,
    /// Output tokens to generate.
    pub max_tokens: u32,
    /// LoRA adapter name, if any (must be one of the pod's adapters).
    pub lora: Option<Arc<str>>,
}

/// How the simulated scraper samples pods.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScrapeConfig {
    /// Seconds between scrapes (upstream default 0.05).
    pub interval: f64,
    /// Seconds between a scrape and the router seeing it.
    pub lag: f64,
}

#[derive(Debug)]
struct SimPod {
    name: Arc<str>,
    engine_kind: EngineKind,
    engine: Engine,
    /// Bumped whenever the pending event is replaced; stale heap entries are skipped.
    version: u32,
    scraped: EngineView,
    pending: VecDeque<(f64, EngineView)>,
    /// The pod's faults now: `error_rate` fails requests at [`Fleet::submit`], `slowdown`
    /// prices its steps.
    faults: Faults,
    /// Scripted fault changes still to come, in time order, from `next_step` on.
    script: Vec<FaultStep>,
    next_step: usize,
    /// The pod's own seed, and the draws of its `error_rate` from it.
    seed: u64,
    rng: SmallRng,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    t: f64,
    pod: u32,
    version: u32,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    // Reversed: BinaryHeap is a max-heap and we want the earliest event (then lowest pod) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .t
            .total_cmp(&self.t)
            .then_with(|| other.pod.cmp(&self.pod))
    }
}

/// A request's first generated token: the moment a streaming client sees it, and so the moment a
/// gateway reports it to its scheduler (completions alone would tell it seconds late).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct FirstToken {
    /// The request's id.
    pub id: u64,
    /// The pod that produced it.
    pub pod: u32,
    /// Virtual time of the token, in seconds.
    pub t: f64,
}

/// A KV-cache event of one pod, with the virtual time the pod published it.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PodKvEvent {
    /// The pod that published it.
    pub pod: u32,
    /// Virtual time of publication, in seconds (the end of the engine step it belongs to).
    pub t: f64,
    /// What changed.
    pub event: KvEvent,
}

/// Receives completions (and, when recorded, first tokens) and stamps the pod index.
struct PodSink<'a> {
    pod: u32,
    out: &'a mut Vec<Completion>,
    firsts: Option<&'a mut Vec<FirstToken>>,
}

impl crate::Sink for PodSink<'_> {
    fn token(&mut self, id: u64, index: u32, t: f64) {
        // Token 1 always comes from a single (prefill) step, which reports tokens one by one.
        if index == 1
            && let Some(firsts) = self.firsts.as_deref_mut()
        {
            firsts.push(FirstToken {
                id,
                pod: self.pod,
                t,
            });
        }
    }

    fn completed(&mut self, mut c: Completion) {
        c.pod = self.pod;
        self.out.push(c);
    }
}

/// A simulated fleet on a virtual clock.
#[derive(Debug)]
pub struct Fleet {
    pods: Vec<SimPod>,
    heap: BinaryHeap<Event>,
    now: f64,
    done: Vec<Completion>,
    /// First tokens, gathered only after [`Fleet::record_first_tokens`].
    firsts: Option<Vec<FirstToken>>,
    scrape: Option<ScrapeConfig>,
    next_scrape: f64,
    /// Per-pod scrape times when scrapes are staggered (each pod on its own phase).
    staggered: bool,
    scrape_heap: BinaryHeap<Event>,
    /// The time of the next scripted fault change of any pod (infinite when none is left).
    next_fault: f64,
}

/// Mixes a run seed into a pod's seed for its fault draws (the golden-ratio constant spreads
/// consecutive run seeds over the whole range).
fn fault_seed(pod_seed: u64, run_seed: u64) -> u64 {
    pod_seed ^ run_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Fleet {
    /// A fleet at virtual time 0, all pods idle.
    pub fn new(spec: &FleetSpec) -> Result<Self, SimError> {
        let mut pods = Vec::with_capacity(spec.pods.len());
        for p in &spec.pods {
            let mut engine = Engine::new(
                p.profile.clone(),
                p.lora_adapters.clone(),
                p.max_loras,
                chain_seed(&p.model),
                false,
            );
            engine.set_slowdown(p.faults.slowdown);
            let mut scraped = EngineView::default();
            engine.view_into(0.0, &mut scraped);
            pods.push(SimPod {
                name: p.name.as_str().into(),
                engine_kind: p.engine,
                engine,
                version: 0,
                scraped,
                pending: VecDeque::new(),
                faults: p.faults,
                script: p.fault_script.clone(),
                next_step: 0,
                seed: p.seed,
                rng: SmallRng::seed_from_u64(fault_seed(p.seed, 0)),
            });
        }
        if u32::try_from(pods.len()).is_err() {
            return Err(SimError::FleetInvalid("too many pods".into()));
        }
        let next_fault = first_fault_step(&pods);
        Ok(Fleet {
            next_fault,
            heap: BinaryHeap::with_capacity(pods.len() * 2),
            pods,
            now: 0.0,
            done: Vec::new(),
            firsts: None,
            scrape: None,
            next_scrape: 0.0,
            staggered: false,
            scrape_heap: BinaryHeap::new(),
        })
    }

    /// Turns on scrape simulation from the current time on: every pod is scraped at the same
    /// instants, every `interval`.
    pub fn set_scrape(&mut self, scrape: Option<ScrapeConfig>) {
        self.scrape = scrape.filter(|s| s.interval > 0.0 && s.interval.is_finite());
        self.next_scrape = self.now;
        self.staggered = false;
        self.scrape_heap.clear();
    }

    /// Like [`Fleet::set_scrape`], but each pod is scraped on its own phase, drawn uniformly in
    /// `[0, interval)` from `seed`, as independent per-pod scrape loops do.
    pub fn set_scrape_staggered(&mut self, scrape: ScrapeConfig, seed: u64) {
        self.set_scrape(Some(scrape));
        let Some(cfg) = self.scrape else { return };
        self.staggered = true;
        let mut rng = SmallRng::seed_from_u64(seed);
        for i in 0..self.pods.len() {
            let phase = rng.random::<f64>() * cfg.interval;
            self.scrape_heap.push(Event {
                t: self.now + phase,
                pod: i as u32,
                version: 0,
            });
        }
    }

    /// Current virtual time (s).
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether the fleet has no pods (never, for a fleet built from a valid spec).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Pod name.
    pub fn pod_name(&self, pod: usize) -> Option<&str> {
        self.pods.get(pod).map(|p| &*p.name)
    }

    /// Pod's engine flavour.
    pub fn pod_engine(&self, pod: usize) -> Option<EngineKind> {
        self.pods.get(pod).map(|p| p.engine_kind)
    }

    /// The pod's engine (profile, stats).
    pub fn engine(&self, pod: usize) -> Option<&Engine> {
        self.pods.get(pod).map(|p| &p.engine)
    }

    /// Changes a pod's speed (fault injection).
    pub fn set_slowdown(&mut self, pod: usize, factor: f64) -> Result<(), SimError> {
        self.pods
            .get_mut(pod)
            .ok_or(SimError::NoSuchPod(pod))?
            .engine
            .set_slowdown(factor);
        Ok(())
    }

    /// The pod's faults now (scripted changes up to [`Fleet::now`] applied).
    pub fn faults(&self, pod: usize) -> Option<&Faults> {
        self.pods.get(pod).map(|p| &p.faults)
    }

    /// Reseeds every pod's `error_rate` draws from its own seed and `seed`: a benchmark's run
    /// seed, so that each seed of a scenario (whose pods have fixed seeds) draws afresh while the
    /// same seed draws the same failures. [`Fleet::new`] seeds them as `seed` 0 does.
    pub fn seed_faults(&mut self, seed: u64) {
        for p in &mut self.pods {
            p.rng = SmallRng::seed_from_u64(fault_seed(p.seed, seed));
        }
    }

    /// Applies every pod's scripted fault changes due at `t` (the next fault time).
    fn apply_fault_steps(&mut self, t: f64) {
        for p in &mut self.pods {
            while let Some(step) = p.script.get(p.next_step).filter(|s| s.at_s <= t) {
                step.apply(&mut p.faults);
                p.next_step += 1;
                // From the pod's next step on: the one in progress keeps its price.
                p.engine.set_slowdown(p.faults.slowdown);
            }
        }
        self.next_fault = first_fault_step(&self.pods);
    }

    /// Time of the next pending event, if any.
    pub fn next_event_time(&mut self) -> Option<f64> {
        while let Some(ev) = self.heap.peek() {
            if self.pods[ev.pod as usize].version == ev.version {
                return Some(ev.t);
            }
            self.heap.pop();
        }
        None
    }

    /// Processes every event up to and including `t`, then sets the clock to `t` (if later).
    pub fn advance_to(&mut self, t: f64) {
        loop {
            let next_ev = self.next_event_time();
            let next_scrape = match (self.scrape.is_some(), self.staggered) {
                (false, _) => f64::INFINITY,
                (true, false) => self.next_scrape,
                (true, true) => self.scrape_heap.peek().map_or(f64::INFINITY, |e| e.t),
            };
            // A fault change goes before a step ending at the same time, whose next step it prices.
            if self.next_fault <= t
                && self.next_fault <= next_scrape
                && next_ev.is_none_or(|te| self.next_fault <= te)
            {
                self.now = self.now.max(self.next_fault);
                self.apply_fault_steps(self.next_fault);
                continue;
            }
            match next_ev {
                Some(te) if te <= t && te <= next_scrape => {
                    let Some(ev) = self.heap.pop() else { break };
                    self.now = self.now.max(ev.t);
                    self.step_pod(ev.pod as usize, ev.t);
                }
                _ if next_scrape <= t => {
                    self.now = self.now.max(next_scrape);
                    if self.staggered {
                        if let Some(ev) = self.scrape_heap.pop() {
                            self.take_pod_scrape(ev.pod as usize, ev.t);
                        }
                    } else {
                        self.take_scrape(next_scrape);
                    }
                }
                _ => break,
            }
        }
        if t > self.now {
            self.now = t;
        }
    }

    /// Runs until no pod has work left; returns the final time.
    pub fn run_until_idle(&mut self) -> f64 {
        while let Some(t) = self.next_event_time() {
            self.advance_to(t);
        }
        self.now
    }

    fn step_pod(&mut self, i: usize, t: f64) {
        let pod = &mut self.pods[i];
        let mut sink = PodSink {
            pod: i as u32,
            out: &mut self.done,
            firsts: self.firsts.as_mut(),
        };
        pod.engine.finish_step(&mut sink);
        if let Some(end) = pod.engine.start_step(t, true) {
            pod.version = pod.version.wrapping_add(1);
            self.heap.push(Event {
                t: end,
                pod: i as u32,
                version: pod.version,
            });
        }
    }

    fn take_pod_scrape(&mut self, i: usize, t: f64) {
        let Some(cfg) = self.scrape else { return };
        let pod = &mut self.pods[i];
        let mut v = EngineView::default();
        pod.engine.view_into(t, &mut v);
        if cfg.lag <= 0.0 {
            pod.scraped = v;
        } else {
            pod.pending.push_back((t + cfg.lag, v));
        }
        self.scrape_heap.push(Event {
            t: t + cfg.interval,
            pod: i as u32,
            version: 0,
        });
    }

    fn take_scrape(&mut self, t: f64) {
        let Some(cfg) = self.scrape else { return };
        for pod in &mut self.pods {
            let mut v = EngineView::default();
            pod.engine.view_into(t, &mut v);
            if cfg.lag <= 0.0 {
                pod.scraped = v;
            } else {
                pod.pending.push_back((t + cfg.lag, v));
            }
        }
        self.next_scrape = t + cfg.interval;
    }

    /// Submits `req` to pod `pod`. The fleet first advances to `req.arrival`.
    ///
    /// A pod with an `error_rate` fault fails that fraction of the requests it is sent, drawn
    /// from its seeded generator ([`Fleet::seed_faults`]): [`SimError::Failed`], at once and at
    /// no cost to the pod (no engine work, nothing in its metrics), as a model server that
    /// answers 500 before admitting the request. A request it can never serve is
    /// [`SimError::Rejected`] first.
    pub fn submit(&mut self, pod: usize, req: Request) -> Result<(), SimError> {
        if pod >= self.pods.len() {
            return Err(SimError::NoSuchPod(pod));
        }
        if req.arrival < self.now || !req.arrival.is_finite() {
            return Err(SimError::ArrivalInPast {
                arrival: req.arrival,
                now: self.now,
            });
        }
        self.advance_to(req.arrival);
        let p = &mut self.pods[pod];
        let lora = match &req.lora {
            None => None,
            Some(name) => Some(p.engine.adapter_index(name).ok_or_else(|| {
                SimError::Rejected(format!("pod {} does not serve LoRA adapter {name}", p.name))
            })?),
        };
        if p.faults.error_rate > 0.0 && p.rng.random::<f64>() < p.faults.error_rate {
            return Err(SimError::Failed(pod));
        }
        p.engine.submit(EngineRequest {
            id: req.id,
            arrival: req.arrival,
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            lora,
            cache_salt: None,
        })?;
        let t = req.arrival;
        let new_end = if p.engine.in_step() {
            let before = p.engine.step_end();
            let after = p.engine.interrupt_at(t);
            if after == before { None } else { after }
        } else {
            p.engine.start_step(t, true)
        };
        if let Some(end) = new_end {
            p.version = p.version.wrapping_add(1);
            self.heap.push(Event {
                t: end,
                pod: pod as u32,
                version: p.version,
            });
        }
        Ok(())
    }

    /// Starts (or stops) gathering each request's first token as it is produced; drain them with
    /// [`Fleet::drain_first_tokens`]. Off by default: large runs that only need completions keep
    /// no per-request record.
    pub fn record_first_tokens(&mut self, on: bool) {
        match (on, self.firsts.is_some()) {
            (true, false) => self.firsts = Some(Vec::new()),
            (false, true) => self.firsts = None,
            _ => {}
        }
    }

    /// Starts (or stops) recording every pod's KV-cache events (see [`KvEvent`]). Off by default:
    /// the block pools then record nothing.
    pub fn record_kv_events(&mut self, on: bool) {
        for p in &mut self.pods {
            p.engine.record_kv_events(on);
        }
    }

    /// Moves the KV-cache events published up to now into `out`: pod by pod, each pod's in the
    /// order it published them.
    pub fn drain_kv_events(&mut self, out: &mut Vec<PodKvEvent>) {
        let now = self.now;
        let mut buf = Vec::new();
        for (i, p) in self.pods.iter_mut().enumerate() {
            p.engine.drain_kv_events(now, &mut buf);
            out.extend(buf.drain(..).map(|(t, event)| PodKvEvent {
                pod: i as u32,
                t,
                event,
            }));
        }
    }

    /// Resets pod `pod`'s prefix cache now (vLLM's `/reset_prefix_cache`); false when the pod
    /// has requests holding blocks, as vLLM refuses then.
    pub fn reset_prefix_cache(&mut self, pod: usize) -> Result<bool, SimError> {
        let now = self.now;
        let p = self.pods.get_mut(pod).ok_or(SimError::NoSuchPod(pod))?;
        Ok(p.engine.reset_prefix_cache(now))
    }

    /// Moves the first tokens gathered so far into `out`, in the order they were produced per pod.
    pub fn drain_first_tokens(&mut self, out: &mut Vec<FirstToken>) {
        if let Some(firsts) = &mut self.firsts {
            out.append(firsts);
        }
    }

    /// Moves the completions gathered so far into `out`.
    pub fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.done);
    }

    /// Completions gathered so far (not drained).
    pub fn completions(&self) -> &[Completion] {
        &self.done
    }

    /// The pod's exact state now, written into `out`.
    pub fn view_into(&self, pod: usize, out: &mut EngineView) -> Result<(), SimError> {
        let p = self.pods.get(pod).ok_or(SimError::NoSuchPod(pod))?;
        p.engine.view_into(self.now, out);
        Ok(())
    }

    /// The pod's exact state now.
    pub fn view(&self, pod: usize) -> Result<EngineView, SimError> {
        let mut v = EngineView::default();
        self.view_into(pod, &mut v)?;
        Ok(v)
    }

    /// What the simulated scraper holds for the pod now (the latest scrape older than the lag).
    /// Without [`Fleet::set_scrape`], the state at time 0.
    pub fn scraped(&mut self, pod: usize) -> Result<&EngineView, SimError> {
        let now = self.now;
        let p = self.pods.get_mut(pod).ok_or(SimError::NoSuchPod(pod))?;
        while p.pending.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, v)) = p.pending.pop_front() {
                p.scraped = v;
            }
        }
        Ok(&p.scraped)
    }
}

/// The earliest scripted fault change still to come of any pod (infinite when none is left).
fn first_fault_step(pods: &[SimPod]) -> f64 {
    pods.iter()
        .filter_map(|p| p.script.get(p.next_step).map(|s| s.at_s))
        .fold(f64::INFINITY, f64::min)
}

#[cfg(test)]
mod tests;
