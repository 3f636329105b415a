//! Which pod holds which token blocks, kept from the engines' KV-cache events.
//!
//! Each block is keyed by a chain hash over its token ids seeded by the hash of the block before
//! it (block 0 by the LoRA adapter's name and the request's `cache_salt`, [`request_seed`]), so
//! one key stands for the whole prefix up to that block — computed the same way from an event's
//! `token_ids` and `extra_keys` and from a request's tokens and salt. The
//! engine's own block hashes (sha256 over pickled tuples by default) cannot be reproduced outside
//! the engine; they are kept per pod only to resolve `BlockRemoved` and parent links.
//!
//! Matching walks the request's blocks in order and, per pod, counts the leading blocks it
//! holds: O(blocks × holders), independent of the pool size. The index is bounded by a byte
//! budget shared evenly by the pods; a pod at its share stores no new blocks until the engine
//! evicts some (a missed match, never a wrong one).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;

use xxhash_rust::xxh64::xxh64;

use crate::event::{Batch, Event, ExtraKey, Stored};

/// Bytes one (pod, block) entry costs, counted conservatively: the pod's engine-hash entry and
/// its share of the block's holder entry, with the maps' slack. `examples/index_memory.rs`
/// measures the real figure with a counting allocator.
pub const BYTES_PER_ENTRY: u64 = 112;

/// Block keys are uniformly distributed already: the maps use them as they are.
#[derive(Default, Clone, Copy)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<IdentityHasher>>;

/// A key that never matches a request (a block whose hash depends on more than its tokens).
const UNMATCHABLE: u64 = 0;

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The key of a block of `tokens` following the block keyed `prev` (never `UNMATCHABLE`).
pub fn block_key(prev: u64, tokens: &[u32]) -> u64 {
    let mut h = prev ^ K;
    for t in tokens {
        h = (h.rotate_left(23) ^ u64::from(*t)).wrapping_mul(K);
    }
    let k = fmix(h ^ tokens.len() as u64);
    if k == UNMATCHABLE { 1 } else { k }
}

/// The seed of a prompt's first block: the adapter's name, or none for the base model.
pub fn adapter_seed(lora: Option<&str>) -> u64 {
    match lora {
        None => 0x6261_7365,
        Some(name) => {
            let mut h = 0x6c6f_7261u64;
            for b in name.as_bytes() {
                h = (h.rotate_left(8) ^ u64::from(*b)).wrapping_mul(K);
            }
            fmix(h)
        }
    }
}

/// The seed of the first block of a request under the adapter `lora` with the `cache_salt`
/// `salt`: [`adapter_seed`] without a salt, else that mixed with the salt. vLLM adds a salt to
/// the extra keys of a request's first block only (`generate_block_hash_extra_keys` in
/// `vllm/v1/core/kv_cache_utils.py`), and every later block's hash chains through it, so a salted
/// prefix shares no block with another salt's or an unsalted one. An empty salt is no salt, as
/// there (vLLM's API refuses one anyway).
pub fn request_seed(lora: Option<&str>, salt: Option<&str>) -> u64 {
    let seed = adapter_seed(lora);
    match salt {
        None | Some("") => seed,
        Some(s) => match fmix(seed ^ xxh64(s.as_bytes(), 0x7361_6c74)) {
            UNMATCHABLE => 1,
            k => k,
        },
    }
}

/// Whether `key` is the event's adapter as vLLM lists it in a LoRA block's extra keys: its name,
/// or its integer id in releases before the name.
fn is_adapter(key: &ExtraKey, s: &Stored) -> bool {
    match key {
        ExtraKey::Str(n) => s.lora_name.as_deref() == Some(n.as_str()),
        ExtraKey::Int(id) => s.lora_id == Some(*id),
        ExtraKey::Other(_) => false,
    }
}

/// The extra keys of block `i` of `s` once its adapter is taken off the front; `None` when
/// they hold something else first (the block is then unmatchable).
fn past_adapter(s: &Stored, i: usize) -> Option<&[ExtraKey]> {
    let keys = s
        .extra_keys
        .get(i)
        .and_then(Option::as_deref)
        .unwrap_or(&[]);
    let adapter = s.lora_name.is_some() || s.lora_id.is_some();
    match keys.split_first() {
        None => Some(keys),
        Some((first, rest)) if adapter && is_adapter(first, s) => Some(rest),
        Some(_) if adapter => None,
        Some(_) => Some(keys),
    }
}

/// The seed of a chain that starts with the event's first block (one without a parent: the
/// request's block 0), from the adapter and the block's extra keys: nothing past the adapter,
/// or exactly one string — the request's `cache_salt`. Anything else (multimodal inputs, prompt
/// embeddings, an adapter known by id only) is [`UNMATCHABLE`].
fn chain_start(s: &Stored) -> u64 {
    let lora = match (&s.lora_name, s.lora_id) {
        (Some(n), _) => Some(n.as_str()),
        (None, Some(_)) => return UNMATCHABLE, // an adapter known by id only
        (None, None) => None,
    };
    match past_adapter(s, 0) {
        Some([]) => request_seed(lora, None),
        Some([ExtraKey::Str(salt)]) if !salt.is_empty() => request_seed(lora, Some(salt)),
        _ => UNMATCHABLE,
    }
}

/// The pods holding one block.
#[derive(Clone, Debug)]
enum Holders {
    One(u32),
    Many(Vec<u32>),
}

impl Holders {
    fn add(&mut self, pod: u32) {
        match self {
            Holders::One(p) if *p == pod => {}
            Holders::One(p) => *self = Holders::Many(vec![*p, pod]),
            Holders::Many(v) => {
                if !v.contains(&pod) {
                    v.push(pod);
                }
            }
        }
    }

    /// Removes `pod`; true when no holder is left.
    fn remove(&mut self, pod: u32) -> bool {
        match self {
            Holders::One(p) => *p == pod,
            Holders::Many(v) => {
                v.retain(|p| *p != pod);
                match v.as_slice() {
                    [] => true,
                    [one] => {
                        *self = Holders::One(*one);
                        false
                    }
                    _ => false,
                }
            }
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Holders::One(p) => std::slice::from_ref(p),
            Holders::Many(v) => v,
        }
    }
}

#[derive(Debug, Default)]
struct Pod {
    addr: Option<SocketAddr>,
    /// Engine hash → our key (or [`UNMATCHABLE`]).
    engine: Map<u64>,
    /// Tokens per block, from the engine's events (0 until the first store).
    block_size: u32,
    /// True while the pod's event feed is connected and in sequence: only then is its match
    /// exact and listed.
    synced: bool,
}

/// What applying a batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Blocks stored.
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// `AllBlocksCleared` events.
    pub cleared: u64,
    /// Blocks not stored: the pod was at its share of the byte budget.
    pub over_budget: u64,
    /// Blocks stored without a known parent, or with extra keys: kept for removal only.
    pub unmatchable: u64,
    /// Blocks of another medium (CPU offload) or KV-cache group, stored or removed: ignored.
    pub ignored: u64,
}

/// Occupancy and estimated memory of the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Distinct block keys held by at least one pod.
    pub blocks: usize,
    /// (pod, block) entries, the unmatchable ones included.
    pub entries: usize,
    /// Pods whose feed is in sequence.
    pub synced_pods: usize,
    /// The estimated bytes of the index ([`BYTES_PER_ENTRY`] an entry).
    pub bytes: u64,
}

/// Per-request scratch for [`KvIndex::match_tokens`], reused so a match does not allocate.
#[derive(Debug, Default)]
pub struct MatchScratch {
    keys: Vec<u64>,
    matched: Vec<u32>,
    sizes: Vec<u32>,
}

/// The index of every pod's cached blocks.
#[derive(Debug)]
pub struct KvIndex {
    pods: Vec<Pod>,
    free: Vec<u32>,
    by_addr: HashMap<SocketAddr, u32>,
    blocks: Map<Holders>,
    entries: usize,
    /// Pods in sequence, kept as they change: [`KvIndex::stats`] runs under the write lock after
    /// every batch, and must not walk every pod to count them.
    synced: usize,
    budget_bytes: u64,
}

impl KvIndex {
    /// An empty index bounded by `budget_bytes`.
    pub fn new(budget_bytes: u64) -> Self {
        KvIndex {
            pods: Vec::new(),
            free: Vec::new(),
            by_addr: HashMap::new(),
            blocks: Map::default(),
            entries: 0,
            synced: 0,
            budget_bytes,
        }
    }

    /// The pod id of `addr`, adding the pod when new.
    pub fn pod(&mut self, addr: SocketAddr) -> u32 {
        if let Some(id) = self.by_addr.get(&addr) {
            return *id;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.pods.push(Pod::default());
                (self.pods.len() - 1) as u32
            }
        };
        self.pods[id as usize].addr = Some(addr);
        self.by_addr.insert(addr, id);
        id
    }

    /// Forgets a pod (it left the pool).
    pub fn remove_pod(&mut self, addr: SocketAddr) {
        if let Some(id) = self.by_addr.remove(&addr) {
            self.reset(id);
            // The slot goes to the next pod added, whose feed is not in sequence yet.
            let p = &mut self.pods[id as usize];
            p.addr = None;
            p.block_size = 0;
            if std::mem::take(&mut p.synced) {
                self.synced -= 1;
            }
            self.free.push(id);
        }
    }

    /// Marks a pod's feed in or out of sequence. Out of sequence, its match is not listed (the
    /// approximate index stands in) but its blocks are kept for a replay to continue from.
    pub fn set_synced(&mut self, addr: SocketAddr, synced: bool) {
        if let Some(id) = self.by_addr.get(&addr) {
            let p = &mut self.pods[*id as usize];
            if p.synced != synced {
                p.synced = synced;
                if synced {
                    self.synced += 1;
                } else {
                    self.synced -= 1;
                }
            }
        }
    }

    /// Drops everything known of a pod's cache (it was cleared, or events were missed).
    pub fn reset_pod(&mut self, addr: SocketAddr) {
        if let Some(id) = self.by_addr.get(&addr).copied() {
            self.reset(id);
        }
    }

    fn reset(&mut self, id: u32) {
        let engine = std::mem::take(&mut self.pods[id as usize].engine);
        self.entries -= engine.len();
        for key in engine.into_values() {
            self.unhold(key, id);
        }
    }

    fn unhold(&mut self, key: u64, id: u32) {
        if key == UNMATCHABLE {
            return;
        }
        if let Entry::Occupied(mut e) = self.blocks.entry(key)
            && e.get_mut().remove(id)
        {
            e.remove();
        }
    }

    fn share(&self) -> usize {
        let pods = self.by_addr.len().max(1) as u64;
        (self.budget_bytes / BYTES_PER_ENTRY / pods) as usize
    }

    /// Applies one decoded batch from the pod at `addr`.
    pub fn apply(&mut self, addr: SocketAddr, batch: &Batch) -> Applied {
        let id = self.pod(addr);
        let mut out = Applied::default();
        for ev in &batch.events {
            match ev {
                Event::Stored(s) => self.store(id, s, &mut out),
                Event::Removed(r) => {
                    if !gpu(r.medium.as_deref(), r.group_idx) {
                        out.ignored += r.block_hashes.len() as u64;
                        continue;
                    }
                    for h in &r.block_hashes {
                        if let Some(key) = self.pods[id as usize].engine.remove(h) {
                            self.entries -= 1;
                            self.unhold(key, id);
                            out.removed += 1;
                        }
                    }
                }
                Event::AllCleared => {
                    self.reset(id);
                    out.cleared += 1;
                }
            }
        }
        out
    }

    fn store(&mut self, id: u32, s: &Stored, out: &mut Applied) {
        if !gpu(s.medium.as_deref(), s.group_idx) {
            out.ignored += s.block_hashes.len() as u64;
            return;
        }
        let bs = s.block_size as usize;
        if bs == 0 {
            out.unmatchable += s.block_hashes.len() as u64;
            return;
        }
        let share = self.share();
        let mut prev = match s.parent {
            None => chain_start(s),
            Some(p) => self.pods[id as usize]
                .engine
                .get(&p)
                .copied()
                .unwrap_or(UNMATCHABLE),
        };
        self.pods[id as usize].block_size = s.block_size;
        for (i, h) in s.block_hashes.iter().enumerate() {
            let toks = s.token_ids.get(i * bs..(i + 1) * bs);
            // Past block 0 (whose keys the chain's seed stands for), a block may carry its own
            // adapter only — vLLM lists a LoRA request's adapter in every block.
            let extra = (s.parent.is_some() || i > 0) && !matches!(past_adapter(s, i), Some([]));
            let key = match toks {
                Some(t) if prev != UNMATCHABLE && !extra => block_key(prev, t),
                _ => UNMATCHABLE,
            };
            prev = key;
            let pod = &mut self.pods[id as usize];
            if !pod.engine.contains_key(h) && pod.engine.len() >= share {
                out.over_budget += 1;
                // Children cannot chain through a block that is not kept.
                prev = UNMATCHABLE;
                continue;
            }
            if let Some(old) = pod.engine.insert(*h, key) {
                // Stored again (the engine re-announced it): move the holder if the key changed.
                if old != key {
                    self.unhold(old, id);
                }
            } else {
                self.entries += 1;
            }
            if key == UNMATCHABLE {
                out.unmatchable += 1;
            } else {
                self.blocks
                    .entry(key)
                    .and_modify(|h| h.add(id))
                    .or_insert(Holders::One(id));
                out.stored += 1;
            }
        }
    }

    /// For the request's `tokens` under `lora` with the `cache_salt` `salt`, appends `(pod,
    /// cached prompt tokens)` for every pod whose feed is in sequence, 0 included, to `out`
    /// (cleared first). A salted request matches only blocks its salt was stored under: vLLM
    /// would reuse no other (see [`request_seed`]).
    pub fn match_tokens(
        &self,
        lora: Option<&str>,
        salt: Option<&str>,
        tokens: &[u32],
        scratch: &mut MatchScratch,
        out: &mut Vec<(SocketAddr, u32)>,
    ) {
        out.clear();
        scratch.matched.clear();
        scratch.matched.resize(self.pods.len(), 0);
        scratch.sizes.clear();
        for p in &self.pods {
            if p.addr.is_some()
                && p.synced
                && p.block_size > 0
                && !scratch.sizes.contains(&p.block_size)
            {
                scratch.sizes.push(p.block_size);
            }
        }
        let seed = request_seed(lora, salt);
        for &bs in &scratch.sizes {
            let bs = bs as usize;
            scratch.keys.clear();
            let mut prev = seed;
            for chunk in tokens.chunks_exact(bs) {
                prev = block_key(prev, chunk);
                scratch.keys.push(prev);
            }
            for (i, key) in scratch.keys.iter().enumerate() {
                let Some(h) = self.blocks.get(key) else {
                    break;
                };
                let mut advanced = false;
                for &pod in h.as_slice() {
                    let p = &self.pods[pod as usize];
                    if p.block_size as usize == bs
                        && let Some(m) = scratch.matched.get_mut(pod as usize)
                        && *m as usize == i
                    {
                        *m += 1;
                        advanced = true;
                    }
                }
                if !advanced {
                    break;
                }
            }
        }
        for (id, p) in self.pods.iter().enumerate() {
            if let (Some(addr), true) = (p.addr, p.synced) {
                let blocks = scratch.matched.get(id).copied().unwrap_or(0);
                out.push((addr, blocks.saturating_mul(p.block_size)));
            }
        }
    }

    /// Blocks of `addr` the index holds (unmatchable ones included).
    pub fn pod_blocks(&self, addr: SocketAddr) -> usize {
        self.by_addr
            .get(&addr)
            .map_or(0, |id| self.pods[*id as usize].engine.len())
    }

    /// Occupancy and estimated memory.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            blocks: self.blocks.len(),
            entries: self.entries,
            synced_pods: self.synced,
            bytes: self.entries as u64 * BYTES_PER_ENTRY,
        }
    }
}

/// Only GPU blocks of the first KV-cache group are routed on.
fn gpu(medium: Option<&str>, group: Option<u32>) -> bool {
    matches!(medium, None | Some("GPU") | Some("gpu")) && matches!(group, None | Some(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Removed;

    #[test]
    fn blocks_of_another_medium_or_group_are_counted_as_ignored_blocks() {
        let pod: SocketAddr = "10.0.0.7:8000".parse().unwrap();
        let mut ix = KvIndex::new(1 << 20);
        let cpu = Stored {
            block_hashes: vec![1, 2, 3],
            token_ids: (0..12).collect(),
            block_size: 4,
            medium: Some("CPU".into()),
            ..Default::default()
        };
        let group1 = Stored {
            group_idx: Some(1),
            medium: None,
            ..cpu.clone()
        };
        let removed = Removed {
            block_hashes: vec![1, 2],
            medium: Some("CPU".into()),
            group_idx: None,
        };
        let batch = Batch {
            events: vec![
                Event::Stored(cpu),
                Event::Stored(group1),
                Event::Removed(removed),
            ],
            ..Default::default()
        };
        let a = ix.apply(pod, &batch);
        assert_eq!(a.ignored, 8, "3 + 3 stored, 2 removed");
        assert_eq!((a.stored, a.removed), (0, 0));
        assert_eq!(ix.pod_blocks(pod), 0);
    }

    #[test]
    fn a_pod_taking_a_removed_pods_slot_is_not_in_sequence_until_its_feed_is() {
        let a: SocketAddr = "10.0.0.7:8000".parse().unwrap();
        let b: SocketAddr = "10.0.0.8:8000".parse().unwrap();
        let mut ix = KvIndex::new(1 << 20);
        ix.pod(a);
        ix.set_synced(a, true);
        ix.set_synced(a, true);
        assert_eq!(ix.stats().synced_pods, 1);
        ix.remove_pod(a);
        ix.pod(b);
        assert_eq!(ix.stats().synced_pods, 0);
        let mut out = Vec::new();
        ix.match_tokens(
            None,
            None,
            &[1, 2, 3, 4],
            &mut MatchScratch::default(),
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
    }
}
