//! The router's view of every pod's prefix cache, built from the pods' KV-cache events.
//!
//! A precise prefix router subscribes to each vLLM pod's KV events (`BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`, published per engine step over ZMQ) and keeps, per pod,
//! the set of block hashes the pod holds. [`KvView`] is that subscriber on the virtual clock: it
//! sees an event `lag` seconds after the pod published it, and answers, for a prompt, how many
//! leading prompt tokens each pod holds *according to the events received so far* — the router's
//! view, which trails the engines' truth by the step in progress plus the lag.

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use crate::engine::PassThrough;
use crate::fleet::{Fleet, PodKvEvent};
use crate::tokens::{lora_seed, prompt_block_hashes};
use crate::{KvEvent, Prompt};

/// One pod as the subscriber knows it.
#[derive(Debug)]
struct ViewPod {
    /// The pod's hash chain seed and block size, so the view hashes prompts as the pod does.
    seed: u64,
    block_size: u32,
    /// Block hashes the pod holds, by the events applied so far.
    held: HashSet<u64, BuildHasherDefault<PassThrough>>,
    /// Events received from the fleet and not yet delivered: (publish time, event).
    pending: VecDeque<(f64, KvEvent)>,
}

/// The router's event-fed view of what each pod's prefix cache holds.
#[derive(Debug)]
pub struct KvView {
    lag: f64,
    pods: Vec<ViewPod>,
    incoming: Vec<PodKvEvent>,
    hashes: Vec<u64>,
}

impl KvView {
    /// A view of `fleet`'s pods (empty caches) whose events arrive `lag` seconds after they are
    /// published. Turns the fleet's event recording on.
    pub fn new(fleet: &mut Fleet, lag: f64) -> Self {
        fleet.record_kv_events(true);
        let pods = (0..fleet.len())
            .filter_map(|i| fleet.engine(i))
            .map(|e| ViewPod {
                seed: e.prefix_seed(),
                block_size: e.profile().block_size.max(1),
                held: HashSet::default(),
                pending: VecDeque::new(),
            })
            .collect();
        KvView {
            lag: if lag.is_finite() { lag.max(0.0) } else { 0.0 },
            pods,
            incoming: Vec::new(),
            hashes: Vec::new(),
        }
    }

    /// Seconds between a pod publishing an event and the view applying it.
    pub fn lag(&self) -> f64 {
        self.lag
    }

    /// Takes the events `fleet` has published up to its current time and applies every one
    /// whose delivery time (publication + lag) has come.
    pub fn sync(&mut self, fleet: &mut Fleet) {
        fleet.drain_kv_events(&mut self.incoming);
        for e in self.incoming.drain(..) {
            if let Some(p) = self.pods.get_mut(e.pod as usize) {
                p.pending.push_back((e.t, e.event));
            }
        }
        let now = fleet.now();
        for p in &mut self.pods {
            while p.pending.front().is_some_and(|(t, _)| t + self.lag <= now) {
                let Some((_, event)) = p.pending.pop_front() else {
                    break;
                };
                match event {
                    KvEvent::Stored { hash } => {
                        p.held.insert(hash);
                    }
                    KvEvent::Removed { hash } => {
                        p.held.remove(&hash);
                    }
                    KvEvent::Cleared => p.held.clear(),
                }
            }
        }
    }

    /// Whether the view holds block `hash` on pod `pod`.
    pub fn holds(&self, pod: usize, hash: u64) -> bool {
        self.pods.get(pod).is_some_and(|p| p.held.contains(&hash))
    }

    /// Blocks the view holds on pod `pod`.
    pub fn held_blocks(&self, pod: usize) -> usize {
        self.pods.get(pod).map_or(0, |p| p.held.len())
    }

    /// Writes into `out`, one entry per pod, the prompt tokens of `prompt` under LoRA adapter
    /// `lora` (`None`: the base model) that the view says each pod holds: its longest run of
    /// leading blocks present, times its block size. Blocks cached under another adapter do not
    /// count, as in the engine.
    pub fn cached_tokens(&mut self, prompt: &Prompt, lora: Option<&str>, out: &mut Vec<u32>) {
        out.clear();
        let mut keyed: Option<(u64, u32)> = None;
        for p in &self.pods {
            if keyed != Some((p.seed, p.block_size)) {
                self.hashes.clear();
                let seed = lora_seed(p.seed, lora);
                prompt_block_hashes(prompt, p.block_size, seed, &mut self.hashes);
                keyed = Some((p.seed, p.block_size));
            }
            let run = self
                .hashes
                .iter()
                .take_while(|h| p.held.contains(h))
                .count();
            out.push(
                u32::try_from(run)
                    .unwrap_or(u32::MAX)
                    .saturating_mul(p.block_size),
            );
        }
    }
}

#[cfg(test)]
mod tests;
