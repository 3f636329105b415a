//! A discrete-event driver over `infergate_sim::Engine`s that also reports each request's first
//! token when it happens.
//!
//! `infergate_sim::Fleet` reports completions only, so a router driven by it would hear of a first
//! token seconds late (together with the completion). A streaming gateway hears of it at once, and
//! the scheduler's in-flight accounting and rate learner depend on it; this driver keeps the
//! fleet's event logic (one pending step per pod in a heap, bulk decode steps cut by arrivals) and
//! adds a sink that catches token 1, which always comes from a single (prefill) step.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use infergate_sim::fleet::Request;
use infergate_sim::tokens::chain_seed;
use infergate_sim::{Completion, Engine, EngineRequest, EngineView, FleetSpec, SimError, Sink};

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
    // Reversed: the earliest event (then the lowest pod) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .t
            .total_cmp(&self.t)
            .then_with(|| other.pod.cmp(&self.pod))
    }
}

/// What the driver observed: first tokens `(id, t)` and completions.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub firsts: Vec<(u64, f64)>,
    pub done: Vec<Completion>,
}

struct PodSink<'a> {
    pod: u32,
    out: &'a mut Observed,
}

impl Sink for PodSink<'_> {
    fn token(&mut self, id: u64, index: u32, t: f64) {
        if index == 1 {
            self.out.firsts.push((id, t));
        }
    }

    fn completed(&mut self, mut c: Completion) {
        c.pod = self.pod;
        self.out.done.push(c);
    }
}

/// Engines on one virtual clock.
pub(super) struct Driver {
    engines: Vec<Engine>,
    versions: Vec<u32>,
    names: Vec<String>,
    heap: BinaryHeap<Event>,
    now: f64,
    observed: Observed,
}

impl Driver {
    pub fn new(spec: &FleetSpec) -> Self {
        let engines: Vec<Engine> = spec
            .pods
            .iter()
            .map(|p| {
                let mut e = Engine::new(
                    p.profile.clone(),
                    p.lora_adapters.clone(),
                    p.max_loras,
                    chain_seed(&p.model),
                    false,
                );
                e.set_slowdown(p.faults.slowdown);
                e
            })
            .collect();
        Driver {
            versions: vec![0; engines.len()],
            names: spec.pods.iter().map(|p| p.name.clone()).collect(),
            heap: BinaryHeap::with_capacity(engines.len() * 2),
            engines,
            now: 0.0,
            observed: Observed::default(),
        }
    }

    pub fn now(&self) -> f64 {
        self.now
    }

    pub fn next_event_time(&mut self) -> Option<f64> {
        while let Some(ev) = self.heap.peek() {
            if self.versions[ev.pod as usize] == ev.version {
                return Some(ev.t);
            }
            self.heap.pop();
        }
        None
    }

    /// Processes every step ending at or before `t`, then sets the clock to `t` (if later).
    pub fn advance_to(&mut self, t: f64) {
        while let Some(te) = self.next_event_time() {
            if te > t {
                break;
            }
            let Some(ev) = self.heap.pop() else { break };
            self.now = self.now.max(ev.t);
            let i = ev.pod as usize;
            let mut sink = PodSink {
                pod: ev.pod,
                out: &mut self.observed,
            };
            self.engines[i].finish_step(&mut sink);
            if let Some(end) = self.engines[i].start_step(ev.t, true) {
                self.push(i, end);
            }
        }
        if t > self.now {
            self.now = t;
        }
    }

    fn push(&mut self, i: usize, end: f64) {
        self.versions[i] = self.versions[i].wrapping_add(1);
        self.heap.push(Event {
            t: end,
            pod: i as u32,
            version: self.versions[i],
        });
    }

    /// Submits `req` to pod `pod` at `req.arrival` (the driver first advances to it).
    pub fn submit(&mut self, pod: usize, req: Request) -> Result<(), SimError> {
        if pod >= self.engines.len() {
            return Err(SimError::NoSuchPod(pod));
        }
        if req.arrival < self.now || !req.arrival.is_finite() {
            return Err(SimError::ArrivalInPast {
                arrival: req.arrival,
                now: self.now,
            });
        }
        self.advance_to(req.arrival);
        let engine = &mut self.engines[pod];
        let lora = match &req.lora {
            None => None,
            Some(name) => Some(engine.adapter_index(name).ok_or_else(|| {
                SimError::Rejected(format!(
                    "pod {} does not serve LoRA adapter {name}",
                    self.names[pod]
                ))
            })?),
        };
        engine.submit(EngineRequest {
            id: req.id,
            arrival: req.arrival,
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            lora,
        })?;
        let t = req.arrival;
        let new_end = if engine.in_step() {
            let before = engine.step_end();
            let after = engine.interrupt_at(t);
            if after == before { None } else { after }
        } else {
            engine.start_step(t, true)
        };
        if let Some(end) = new_end {
            self.push(pod, end);
        }
        Ok(())
    }

    /// The pod's state now.
    pub fn view_into(&self, pod: usize, out: &mut EngineView) {
        if let Some(e) = self.engines.get(pod) {
            e.view_into(self.now, out);
        }
    }

    /// Takes what was observed since the last call.
    pub fn take(&mut self, out: &mut Observed) {
        out.firsts.append(&mut self.observed.firsts);
        out.done.append(&mut self.observed.done);
    }
}
