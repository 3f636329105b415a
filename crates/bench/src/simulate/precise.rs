//! The `infergate-precise` policy's extra input: each pod's KV-cache events, turned into the
//! exact cached prompt tokens of every pod for each pick, and (with `kv_events.provisional`) the
//! requests it routed that have not completed yet.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use infergate_sim::tokens::{lora_seed, prompt_block_hashes};
use infergate_sim::{Fleet, KvView, Prompt};

use super::{pod_addr, pod_index};

/// What the `infergate-precise` policy knows beyond the preset: the pods' KV-cache events, and
/// optionally where it sent the requests still in flight.
#[derive(Debug)]
pub struct Precise {
    view: KvView,
    /// Per pod: its hash chain seed and block size, so prompts are keyed as the pod keys them.
    keys: Vec<(u64, u32)>,
    /// With provisional entries: per pod, the prompt blocks of the requests routed there and not
    /// yet completed (a count per block hash).
    provisional: Option<Vec<HashMap<u64, u32>>>,
    /// Requests in flight with provisional entries: their pod and prompt block hashes.
    routed: HashMap<u64, (usize, Vec<u64>)>,
    hashes: Vec<u64>,
    cached: Vec<(SocketAddr, u32)>,
}

impl Precise {
    /// Subscribes to every pod of `fleet` (turning its event recording on), with events applied
    /// `lag` seconds after the pod publishes them. With `provisional`, a request's prompt also
    /// counts as cached on the pod it was sent to from the pick until it completes: the events
    /// only show blocks once computed, so a request still queued would otherwise leave its
    /// prefix on no pod.
    pub fn new(fleet: &mut Fleet, lag: f64, provisional: bool) -> Self {
        let keys: Vec<(u64, u32)> = (0..fleet.len())
            .filter_map(|i| fleet.engine(i))
            .map(|e| (e.prefix_seed(), e.profile().block_size.max(1)))
            .collect();
        Precise {
            view: KvView::new(fleet, lag),
            provisional: provisional.then(|| vec![HashMap::new(); keys.len()]),
            keys,
            routed: HashMap::new(),
            hashes: Vec::new(),
            cached: Vec::new(),
        }
    }

    /// Every pod's cached prompt tokens for `text` under adapter `lora`, as the pick's
    /// [`infergate_scheduler::RequestContext::cached`] (every pod listed, 0 included): the
    /// longest run of the prompt's leading blocks that the events delivered up to the fleet's
    /// current time show on the pod (or, with provisional entries, that a request in flight there
    /// carries).
    pub fn cached(
        &mut self,
        fleet: &mut Fleet,
        text: &Arc<str>,
        lora: Option<&str>,
    ) -> &[(SocketAddr, u32)] {
        self.view.sync(fleet);
        let prompt = Prompt::Text(text.clone());
        self.cached.clear();
        let mut keyed = None;
        for (i, &(seed, bs)) in self.keys.iter().enumerate() {
            if keyed != Some((seed, bs)) {
                self.hashes.clear();
                prompt_block_hashes(&prompt, bs, lora_seed(seed, lora), &mut self.hashes);
                keyed = Some((seed, bs));
            }
            let pending = self.provisional.as_ref().and_then(|p| p.get(i));
            let run = self
                .hashes
                .iter()
                .take_while(|h| {
                    self.view.holds(i, **h) || pending.is_some_and(|p| p.contains_key(*h))
                })
                .count();
            let tokens = u32::try_from(run).unwrap_or(u32::MAX).saturating_mul(bs);
            self.cached.push((pod_addr(i), tokens));
        }
        &self.cached
    }

    /// Request `id` with prompt `text` under adapter `lora` was sent to `addr` (a provisional
    /// entry, if kept).
    pub fn placed(&mut self, addr: SocketAddr, id: u64, text: &Arc<str>, lora: Option<&str>) {
        let Some(prov) = self.provisional.as_mut() else {
            return;
        };
        let Some(pod) = pod_index(&addr, self.keys.len()) else {
            return;
        };
        let (seed, bs) = self.keys[pod];
        let mut hashes = Vec::new();
        prompt_block_hashes(
            &Prompt::Text(text.clone()),
            bs,
            lora_seed(seed, lora),
            &mut hashes,
        );
        for h in &hashes {
            *prov[pod].entry(*h).or_default() += 1;
        }
        self.routed.insert(id, (pod, hashes));
    }

    /// Request `id` completed: its provisional entry goes, and the pod's events decide.
    pub fn completed(&mut self, id: u64) {
        let (Some(prov), Some((pod, hashes))) =
            (self.provisional.as_mut(), self.routed.remove(&id))
        else {
            return;
        };
        for h in hashes {
            if let Some(n) = prov[pod].get_mut(&h) {
                *n -= 1;
                if *n == 0 {
                    prov[pod].remove(&h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
