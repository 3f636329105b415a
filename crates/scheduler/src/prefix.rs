//! The approximate prefix index: which endpoints probably hold a prompt's prefix in their KV cache.
//!
//! The prompt is cut into fixed-size blocks of bytes (`prefix.blockChars`, 64 by default); block
//! `i` is hashed with xxHash64 seeded by the hash of block `i − 1`, and block 0 with a seed derived
//! from the model (and LoRA adapter) name. A block hash therefore stands for the whole prefix up to
//! and including that block, and two models never share entries. A trailing partial block is not
//! hashed: an engine caches whole blocks only.
//!
//! The index maps a block hash to the few endpoints that were last sent that prefix (at most
//! [`ENDPOINTS_PER_BLOCK`], most recent kept). Each endpoint has an LRU of its blocks whose capacity
//! is auto-tuned from the KV capacity the engine reports (`num_blocks × block_size` tokens ×
//! `charsPerToken` / `blockChars`), and capped so that the whole index stays within
//! `prefix.byteBudget`. Matching walks the request's blocks in order and, per endpoint, counts how
//! many leading blocks it holds; it costs O(blocks), independent of the number of endpoints.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh64::{Xxh64, xxh64};

use crate::config::PrefixConfig;

/// The most endpoints remembered per block. Enough to spread a hot shared prefix over several
/// replicas; small enough that an entry is a fixed inline array and matching never scans the pool.
pub const ENDPOINTS_PER_BLOCK: usize = 8;

/// Bytes one (endpoint, block) membership costs, counted conservatively: the map slot (key, inline
/// entry, control byte, load-factor slack) shared by up to [`ENDPOINTS_PER_BLOCK`] endpoints, plus
/// one or two LRU records per endpoint.
pub const BYTES_PER_ENTRY: u64 = 128;

const EMPTY: u32 = u32::MAX;

/// Distinct blocks from which [`PrefixIndex::insert`] looks its map slots up ahead of use: about
/// 1.7 MB of map, beyond which its accesses mostly miss the CPU's caches. Below it the look-ahead
/// would only repeat lookups that hit.
const PREFETCH_MIN_BLOCKS: usize = 16_384;

/// The seed of a prompt's first block: the model name, then the adapter name when there is one, so
/// that prefixes cached under different models or adapters never match.
pub fn model_seed(model: &str, adapter: Option<&str>) -> u64 {
    let s = xxh64(model.as_bytes(), 0);
    match adapter {
        Some(a) => xxh64(a.as_bytes(), s ^ 0x9e37_79b9_7f4a_7c15),
        None => s,
    }
}

/// The seed of a request's first block: [`model_seed`], then the request's `cache_salt` when it
/// has one. vLLM hashes the salt into a request's first block (and so into every block after
/// it), so a salted prompt shares no cached block with another salt or none; its prefixes are
/// matched and recorded under the salt for the same reason.
pub fn request_seed(model: &str, adapter: Option<&str>, salt: Option<&str>) -> u64 {
    let s = model_seed(model, adapter);
    match salt.filter(|s| !s.is_empty()) {
        Some(salt) => xxh64(salt.as_bytes(), s ^ 0xc2b2_ae3d_27d4_eb4f),
        None => s,
    }
}

/// Hashes the prompt `segments` (as if concatenated) into chained block hashes, appending at most
/// `max_blocks` of them to `out`. Returns how many were appended.
pub fn hash_blocks(
    seed: u64,
    segments: &[&str],
    block: usize,
    max_blocks: usize,
    out: &mut Vec<u64>,
) -> usize {
    let block = block.clamp(1, MAX_BLOCK);
    // A block that straddles segments is hashed incrementally (same result as hashing it whole):
    // no block-sized buffer to zero and copy into on every request.
    let mut partial = Xxh64::new(0);
    let mut fill = 0usize;
    let mut prev = seed;
    let mut n = 0usize;
    for seg in segments {
        let mut bytes = seg.as_bytes();
        while !bytes.is_empty() {
            if n >= max_blocks {
                return n;
            }
            if fill == 0 && bytes.len() >= block {
                // Whole block inside this segment: hash in place.
                let (head, rest) = bytes.split_at(block);
                prev = xxh64(head, prev);
                out.push(prev);
                n += 1;
                bytes = rest;
                continue;
            }
            if fill == 0 {
                partial.reset(prev);
            }
            let take = (block - fill).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            partial.update(head);
            fill += take;
            bytes = rest;
            if fill == block {
                prev = partial.digest();
                out.push(prev);
                n += 1;
                fill = 0;
            }
        }
    }
    n
}

const MAX_BLOCK: usize = 4096;

/// Block hashes are already uniformly distributed: the map uses them as they are.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdentityHasher(u64);

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

type BlockMap = HashMap<u64, BlockEntry, BuildHasherDefault<IdentityHasher>>;

#[derive(Clone, Copy)]
struct BlockEntry {
    slots: [u32; ENDPOINTS_PER_BLOCK],
    stamps: [u64; ENDPOINTS_PER_BLOCK],
}

impl BlockEntry {
    const fn new() -> Self {
        BlockEntry {
            slots: [EMPTY; ENDPOINTS_PER_BLOCK],
            stamps: [0; ENDPOINTS_PER_BLOCK],
        }
    }

    fn position(&self, slot: u32) -> Option<usize> {
        self.slots.iter().position(|s| *s == slot)
    }

    fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| *s == EMPTY)
    }
}

#[derive(Default)]
struct EndpointLru {
    /// (block hash, stamp) in insertion order; records whose stamp no longer matches the map are
    /// stale (the block was touched again later, or dropped) and skipped on eviction.
    order: VecDeque<(u64, u64)>,
    /// Live memberships of this endpoint.
    count: usize,
    /// Auto-tuned capacity in blocks, before the budget cap.
    tuned: usize,
    live: bool,
}

/// Memory and occupancy of the index, for metrics and tests.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Distinct block hashes stored.
    pub blocks: usize,
    /// (endpoint, block) memberships stored.
    pub entries: usize,
    /// The most memberships the byte budget allows.
    pub max_entries: usize,
    /// Estimated bytes used (`entries × BYTES_PER_ENTRY`).
    pub estimated_bytes: u64,
}

/// What one [`PrefixIndex::insert`] recorded: block `k` of the prompt with stamp `first + k`, of
/// which the first `held` blocks the endpoint held already.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The stamp of the prompt's first block; 0 when nothing was recorded.
    pub first: u64,
    /// Leading blocks the endpoint held before.
    pub held: u32,
}

impl Recorded {
    /// Nothing recorded (an unknown endpoint, or no blocks).
    pub const NOTHING: Recorded = Recorded { first: 0, held: 0 };
}

/// The approximate prefix index. Endpoints are identified by small integer slots (the scheduler
/// uses its endpoint-table slots). Public for benchmarks and tools; the scheduler drives it.
pub struct PrefixIndex {
    map: BlockMap,
    endpoints: Vec<EndpointLru>,
    entries: usize,
    max_entries: usize,
    live_endpoints: usize,
    stamp: u64,
    cfg: PrefixConfig,
}

impl PrefixIndex {
    /// An empty index with the given settings.
    pub fn new(cfg: PrefixConfig) -> Self {
        let max_entries = usize::try_from(cfg.byte_budget / BYTES_PER_ENTRY).unwrap_or(usize::MAX);
        PrefixIndex {
            map: BlockMap::default(),
            endpoints: Vec::new(),
            entries: 0,
            max_entries: max_entries.max(1),
            live_endpoints: 0,
            stamp: 0,
            cfg,
        }
    }

    /// Occupancy and estimated memory.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            blocks: self.map.len(),
            entries: self.entries,
            max_entries: self.max_entries,
            estimated_bytes: self.entries as u64 * BYTES_PER_ENTRY,
        }
    }

    /// Capacity in blocks for an engine with `capacity_tokens` of KV cache (`None`: unknown).
    pub fn tuned_capacity(&self, capacity_tokens: Option<u64>) -> usize {
        match capacity_tokens {
            Some(t) if t > 0 => {
                let blocks =
                    t as f64 * self.cfg.chars_per_token / f64::from(self.cfg.block_chars.max(1));
                (blocks.ceil() as usize).max(1)
            }
            _ => self.cfg.default_endpoint_blocks as usize,
        }
    }

    fn capacity(&self, slot: usize) -> usize {
        let fair = self.max_entries / self.live_endpoints.max(1);
        self.endpoints
            .get(slot)
            .map_or(0, |e| e.tuned.min(fair.max(1)))
    }

    /// Registers (or re-tunes) an endpoint; `capacity_tokens` is the engine's KV capacity.
    pub fn set_endpoint(&mut self, slot: u32, capacity_tokens: Option<u64>) {
        let i = slot as usize;
        if self.endpoints.len() <= i {
            self.endpoints.resize_with(i + 1, EndpointLru::default);
        }
        let tuned = self.tuned_capacity(capacity_tokens);
        let e = &mut self.endpoints[i];
        if !e.live {
            e.live = true;
            self.live_endpoints += 1;
        }
        e.tuned = tuned;
        self.trim(i);
    }

    /// Forgets everything about an endpoint.
    pub fn remove_endpoint(&mut self, slot: u32) {
        let i = slot as usize;
        let Some(e) = self.endpoints.get_mut(i) else {
            return;
        };
        if !e.live {
            return;
        }
        e.live = false;
        let order = std::mem::take(&mut e.order);
        e.count = 0;
        self.live_endpoints -= 1;
        for (hash, _) in order {
            if let Some(entry) = self.map.get_mut(&hash) {
                if let Some(p) = entry.position(slot) {
                    entry.slots[p] = EMPTY;
                    self.entries -= 1;
                }
                if entry.is_empty() {
                    self.map.remove(&hash);
                }
            }
        }
    }

    /// Records that `hashes` (one prompt's blocks) were sent to `slot`; what was recorded, for
    /// [`PrefixIndex::withdraw`].
    pub fn insert(&mut self, slot: u32, hashes: &[u64]) -> Recorded {
        let i = slot as usize;
        if !self.endpoints.get(i).is_some_and(|e| e.live) {
            return Recorded::NOTHING;
        }
        let first = self.stamp + 1;
        // The leading blocks `slot` held already.
        let mut held = 0u32;
        let mut leading = true;
        // Neither the endpoint's tuned capacity nor the number of live endpoints changes here.
        let cap = self.capacity(i);
        if self.map.len() >= PREFETCH_MIN_BLOCKS {
            self.prefetch(i, hashes, cap);
        }
        for &h in hashes {
            self.stamp += 1;
            let stamp = self.stamp;
            let entry = self.map.entry(h).or_insert_with(BlockEntry::new);
            let added = if let Some(p) = entry.position(slot) {
                entry.stamps[p] = stamp;
                false
            } else {
                // Free position, else replace the least recently used endpoint of this block.
                let p = entry.position(EMPTY).unwrap_or_else(|| {
                    let mut oldest = 0;
                    for k in 1..ENDPOINTS_PER_BLOCK {
                        if entry.stamps[k] < entry.stamps[oldest] {
                            oldest = k;
                        }
                    }
                    oldest
                });
                let evicted = entry.slots[p];
                entry.slots[p] = slot;
                entry.stamps[p] = stamp;
                if evicted != EMPTY {
                    // Its LRU record for `h` is now stale and will be skipped.
                    if let Some(e) = self.endpoints.get_mut(evicted as usize) {
                        e.count -= 1;
                    }
                    self.entries -= 1;
                }
                true
            };
            leading &= !added;
            held += u32::from(leading);
            let e = &mut self.endpoints[i];
            e.order.push_back((h, stamp));
            if added {
                e.count += 1;
                self.entries += 1;
            }
            self.trim_to(i, cap);
        }
        Recorded { first, held }
    }

    /// Takes back what one [`PrefixIndex::insert`] of `hashes` on `slot` recorded (`recorded`,
    /// its return value): the request went to another endpoint (a fallback), so `slot` never
    /// prefilled it. The leading blocks `slot` held before stay, and so does a block recorded
    /// again since by a later request.
    pub fn withdraw(&mut self, slot: u32, hashes: &[u64], recorded: Recorded) {
        let i = slot as usize;
        if recorded.first == 0 || !self.endpoints.get(i).is_some_and(|e| e.live) {
            return;
        }
        let held = recorded.held as usize;
        let from = recorded.first + held as u64;
        for (stamp, h) in (from..).zip(hashes.iter().skip(held)) {
            if let Entry::Occupied(mut o) = self.map.entry(*h) {
                let entry = o.get_mut();
                if let Some(p) = entry.position(slot)
                    && entry.stamps[p] == stamp
                {
                    // Its LRU record is now stale and will be skipped.
                    entry.slots[p] = EMPTY;
                    self.endpoints[i].count -= 1;
                    self.entries -= 1;
                    if entry.is_empty() {
                        o.remove();
                    }
                }
            }
        }
    }

    /// Looks up, ahead of [`PrefixIndex::insert`]'s loop, the map slots that loop will read: the
    /// prompt's blocks and, when the endpoint is at capacity, the records next in line for
    /// eviction. The lookups do not depend on one another, so in a map much larger than the CPU's
    /// caches their memory accesses overlap instead of being paid one after the other; the loop
    /// then finds the lines in cache. The results are discarded.
    fn prefetch(&self, i: usize, hashes: &[u64], cap: usize) {
        for h in hashes {
            std::hint::black_box(self.map.get(h));
        }
        let e = &self.endpoints[i];
        let evict = (e.count + hashes.len())
            .saturating_sub(cap)
            .min(hashes.len());
        for (h, _) in e.order.iter().take(evict) {
            std::hint::black_box(self.map.get(h));
        }
    }

    /// Evicts an endpoint's least recently used blocks down to its capacity, and compacts its
    /// record queue when stale records dominate it.
    fn trim(&mut self, i: usize) {
        let cap = self.capacity(i);
        self.trim_to(i, cap);
    }

    /// [`PrefixIndex::trim`] with the endpoint's capacity already known.
    fn trim_to(&mut self, i: usize, cap: usize) {
        let slot = i as u32;
        loop {
            let e = &mut self.endpoints[i];
            if e.count <= cap {
                break;
            }
            let Some((h, stamp)) = e.order.pop_front() else {
                break;
            };
            // One probe of the map per evicted record: the entry is removed through it.
            if let Entry::Occupied(mut o) = self.map.entry(h) {
                let entry = o.get_mut();
                if let Some(p) = entry.position(slot)
                    && entry.stamps[p] == stamp
                {
                    entry.slots[p] = EMPTY;
                    e.count -= 1;
                    self.entries -= 1;
                    if entry.is_empty() {
                        o.remove();
                    }
                }
            }
        }
        let e = &self.endpoints[i];
        if e.order.len() > 2 * e.count + 64 {
            let map = &self.map;
            let e = &mut self.endpoints[i];
            e.order.retain(|(h, stamp)| {
                map.get(h)
                    .and_then(|entry| entry.position(slot).map(|p| entry.stamps[p] == *stamp))
                    .unwrap_or(false)
            });
        }
    }

    /// For each endpoint holding a prefix of `hashes`, sets `matched[slot]` to the number of
    /// leading blocks it holds and lists the slot in `touched`. `matched` must be all zeros on entry
    /// and as long as the slot table; the caller resets the touched positions afterwards.
    pub fn match_prefix(&self, hashes: &[u64], matched: &mut [u32], touched: &mut Vec<u32>) {
        for (depth, h) in hashes.iter().enumerate() {
            let Some(entry) = self.map.get(h) else {
                break;
            };
            let mut advanced = false;
            for &slot in &entry.slots {
                if slot == EMPTY {
                    continue;
                }
                let Some(m) = matched.get_mut(slot as usize) else {
                    continue;
                };
                if *m as usize == depth {
                    if depth == 0 {
                        touched.push(slot);
                    }
                    *m += 1;
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests;
