//! The KV-cache block pool with prefix caching.
//!
//! Blocks are counted, not stored: a block only needs an identity while it carries a prompt-block
//! hash. Hashed blocks live in a slab with an intrusive LRU list of the unreferenced ones, so an
//! allocation that runs out of never-hashed free blocks evicts the least recently freed cached
//! block, as vLLM's free-block queue does. Freed chains are queued tail-first so that a chain is
//! evicted from its end and its start (the part other prompts share) survives longest.
//!
//! When asked to, the pool also records the KV-cache events vLLM publishes for its prefix cache
//! ([`KvEvent`]): a block stored under a hash, a cached block removed by eviction, the whole
//! cache cleared. Recording is off by default, so runs that do not read the events pay nothing.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: u32 = u32::MAX;

/// A change to a pod's prefix cache, as vLLM's KV-event publisher reports it.
///
/// vLLM's `BlockStored` also carries the parent hash, the block's token ids and the LoRA
/// adapter (id and name) so that a subscriber can derive its own keys; here the router and the
/// engine share one hash chain (see [`crate::tokens`]), seeded by the adapter for a LoRA request,
/// so the hash alone identifies the prefix up to the block and the adapter it was computed under.
/// The real-time server's publisher adds the rest (`crate::serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A full prompt block got its hash and joined the prefix cache (`BlockStored`).
    Stored {
        /// The block's chain hash.
        hash: u64,
    },
    /// A cached block was evicted to make room (`BlockRemoved`).
    Removed {
        /// The block's chain hash.
        hash: u64,
    },
    /// The prefix cache was reset: every cached block is gone (`AllBlocksCleared`).
    Cleared,
}

/// Keys are already xxh64 hashes: pass them through instead of hashing them again.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    refs: u32,
    /// Blocks this LRU entry stands for: 1 for a cached block; more for a run of blocks that no
    /// lookup can ever match (a request's unique prompt tail), kept only for their LRU place.
    count: u32,
    /// Whether `hash` is in the map (false for runs).
    mapped: bool,
    prev: u32,
    next: u32,
}

/// Block accounting for one engine.
#[derive(Debug)]
pub(crate) struct BlockPool {
    total: u64,
    /// Free blocks that carry no hash.
    free_plain: u64,
    /// Cached blocks with no reference (evictable, in `head..tail` LRU order).
    lru_len: u64,
    head: u32,
    tail: u32,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    map: HashMap<u64, u32, BuildHasherDefault<PassThrough>>,
    /// Cached blocks evicted so far.
    pub(crate) evictions: u64,
    /// Events since the engine last took them; `None` when not recorded.
    events: Option<Vec<KvEvent>>,
}

impl BlockPool {
    pub(crate) fn new(total: u64) -> Self {
        BlockPool {
            total,
            free_plain: total,
            lru_len: 0,
            head: NIL,
            tail: NIL,
            slots: Vec::new(),
            free_slots: Vec::new(),
            map: HashMap::default(),
            evictions: 0,
            events: None,
        }
    }

    /// Starts (or stops, dropping what was held) recording [`KvEvent`]s.
    pub(crate) fn record_events(&mut self, on: bool) {
        match (on, self.events.is_some()) {
            (true, false) => self.events = Some(Vec::new()),
            (false, true) => self.events = None,
            _ => {}
        }
    }

    /// Whether events are recorded.
    pub(crate) fn records_events(&self) -> bool {
        self.events.is_some()
    }

    /// Moves the recorded events, oldest first, to `out` (`f` maps each one).
    pub(crate) fn take_events<T>(&mut self, out: &mut impl Extend<T>, f: impl Fn(KvEvent) -> T) {
        if let Some(ev) = &mut self.events {
            out.extend(ev.drain(..).map(f));
        }
    }

    fn emit(&mut self, e: KvEvent) {
        if let Some(ev) = &mut self.events {
            ev.push(e);
        }
    }

    /// Drops every cached block, as vLLM's `reset_prefix_cache` does: only when no request holds
    /// a block (false, and nothing changed, otherwise).
    pub(crate) fn reset(&mut self) -> bool {
        if self.used() > 0 {
            return false;
        }
        self.free_plain = self.total;
        self.lru_len = 0;
        self.head = NIL;
        self.tail = NIL;
        self.slots.clear();
        self.free_slots.clear();
        self.map.clear();
        self.emit(KvEvent::Cleared);
        true
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Blocks that an allocation may take (plain free + evictable cached).
    pub(crate) fn available(&self) -> u64 {
        self.free_plain + self.lru_len
    }

    /// Blocks referenced by requests.
    pub(crate) fn used(&self) -> u64 {
        self.total - self.available()
    }

    /// Takes `n` plain blocks, evicting cached ones if needed. False (and nothing taken) if short.
    pub(crate) fn alloc(&mut self, n: u64) -> bool {
        if n > self.available() {
            return false;
        }
        let from_plain = n.min(self.free_plain);
        self.free_plain -= from_plain;
        let mut left = n - from_plain;
        while left > 0 && self.head != NIL {
            left -= self.evict_head(left);
        }
        true
    }

    /// Returns `n` plain blocks.
    pub(crate) fn free(&mut self, n: u64) {
        self.free_plain += n;
    }

    /// Looks `hash` and its slot up and discards them: issued for a run of blocks before they
    /// are used, the lookups do not wait for one another, so in a fleet whose pools together
    /// outgrow the CPU's caches their memory accesses overlap instead of being paid one after the
    /// other.
    pub(crate) fn prefetch(&self, hash: u64) {
        if let Some(&idx) = self.map.get(&hash) {
            std::hint::black_box(self.slots.get(idx as usize).map(|s| s.refs));
        }
    }

    /// Whether a block with this hash is cached (referenced or not).
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Adds a reference to a cached block (taking it off the LRU list if it was unreferenced).
    /// Returns false if the hash is not cached.
    pub(crate) fn acquire(&mut self, hash: u64) -> bool {
        let Some(&idx) = self.map.get(&hash) else {
            return false;
        };
        let i = idx as usize;
        if self.slots[i].refs == 0 {
            self.unlink(idx);
            self.lru_len -= 1;
        }
        self.slots[i].refs += 1;
        true
    }

    /// Drops a reference; an unreferenced block joins the LRU tail (most recently freed).
    pub(crate) fn release(&mut self, hash: u64) {
        let Some(&idx) = self.map.get(&hash) else {
            return;
        };
        let i = idx as usize;
        if self.slots[i].refs == 0 {
            return;
        }
        self.slots[i].refs -= 1;
        if self.slots[i].refs == 0 {
            self.push_tail(idx);
            self.lru_len += 1;
        }
    }

    /// A request has computed a full prompt block it holds as a plain block: publish it under
    /// `hash`. If another request published the same block meanwhile, share that one and return
    /// the plain block to the pool.
    pub(crate) fn publish(&mut self, hash: u64) {
        if self.acquire(hash) {
            self.free_plain += 1;
            return;
        }
        let idx = self.new_slot(Slot {
            hash,
            refs: 1,
            count: 1,
            mapped: true,
            prev: NIL,
            next: NIL,
        });
        self.map.insert(hash, idx);
        self.emit(KvEvent::Stored { hash });
    }

    /// Returns `n` blocks that hold KV nobody can ever look up again: they go to the LRU tail as
    /// one entry, so they are evicted in their turn (and push older cached blocks out, as in vLLM)
    /// without costing a map entry each.
    pub(crate) fn free_unmatchable(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let count = u32::try_from(n).unwrap_or(u32::MAX);
        let idx = self.new_slot(Slot {
            hash: 0,
            refs: 0,
            count,
            mapped: false,
            prev: NIL,
            next: NIL,
        });
        self.push_tail(idx);
        self.lru_len += u64::from(count);
    }

    fn new_slot(&mut self, slot: Slot) -> u32 {
        match self.free_slots.pop() {
            Some(idx) => {
                self.slots[idx as usize] = slot;
                idx
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).unwrap_or(NIL)
            }
        }
    }

    /// Evicts up to `n` blocks from the LRU head entry (a run gives up several at once, a cached
    /// block one); returns how many it evicted (0 when the list is empty).
    fn evict_head(&mut self, n: u64) -> u64 {
        let idx = self.head;
        if idx == NIL || n == 0 {
            return 0;
        }
        let slot = &mut self.slots[idx as usize];
        if u64::from(slot.count) > n {
            // n < count ≤ u32::MAX
            slot.count -= n as u32;
            self.lru_len -= n;
            self.evictions += n;
            return n;
        }
        let taken = u64::from(slot.count);
        self.lru_len -= taken;
        self.evictions += taken;
        let (hash, mapped) = (slot.hash, slot.mapped);
        self.unlink(idx);
        if mapped {
            self.map.remove(&hash);
            self.emit(KvEvent::Removed { hash });
        }
        self.free_slots.push(idx);
        taken
    }

    fn unlink(&mut self, idx: u32) {
        let Slot { prev, next, .. } = self.slots[idx as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let s = &mut self.slots[idx as usize];
        s.prev = NIL;
        s.next = NIL;
    }

    fn push_tail(&mut self, idx: u32) {
        let tail = self.tail;
        {
            let s = &mut self.slots[idx as usize];
            s.prev = tail;
            s.next = NIL;
        }
        if tail == NIL {
            self.head = idx;
        } else {
            self.slots[tail as usize].next = idx;
        }
        self.tail = idx;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_oldest_unreferenced_and_keeps_accounting() {
        let mut p = BlockPool::new(4);
        assert!(p.alloc(3));
        p.publish(1);
        p.publish(2);
        p.publish(3);
        assert_eq!(p.used(), 3);
        p.release(3);
        p.release(2);
        p.release(1);
        assert_eq!(p.used(), 0);
        assert_eq!(p.available(), 4);
        // one plain block, then the oldest freed (3) goes first
        assert!(p.alloc(2));
        assert!(!p.contains(3));
        assert!(p.contains(2) && p.contains(1));
        assert!(p.acquire(1));
        assert_eq!(p.used(), 3);
        assert!(!p.alloc(2));
        assert!(p.alloc(1));
        assert!(!p.contains(2));
        assert_eq!(p.evictions, 2);
    }

    #[test]
    fn unmatchable_runs_take_their_lru_turn() {
        let mut p = BlockPool::new(6);
        assert!(p.alloc(6));
        p.publish(1);
        p.release(1);
        p.free_unmatchable(3);
        p.free(2);
        assert_eq!(p.available(), 6);
        assert!(p.alloc(3)); // 2 plain + the cached block 1
        assert!(!p.contains(1));
        assert!(p.alloc(3)); // the run
        assert_eq!(p.available(), 0);
        assert_eq!(p.evictions, 4);
    }

    #[test]
    fn events_follow_stores_evictions_and_resets() {
        let mut p = BlockPool::new(4);
        let mut ev = Vec::new();
        let take = |p: &mut BlockPool, ev: &mut Vec<KvEvent>| {
            ev.clear();
            p.take_events(ev, |e| e);
        };
        // Not recording: nothing is kept.
        assert!(p.alloc(1));
        p.publish(9);
        take(&mut p, &mut ev);
        assert!(ev.is_empty());
        p.release(9);
        p.record_events(true);
        assert!(p.alloc(3));
        p.publish(1);
        p.publish(2);
        p.publish(2); // shared, not stored again
        take(&mut p, &mut ev);
        assert_eq!(
            ev,
            [KvEvent::Stored { hash: 1 }, KvEvent::Stored { hash: 2 }]
        );
        p.release(2);
        p.release(2);
        p.release(1);
        // One plain block is free (the duplicate gave its own back); then 9 was freed first,
        // then 2, then 1: evictions go in that order.
        assert!(p.alloc(2));
        take(&mut p, &mut ev);
        assert_eq!(ev, [KvEvent::Removed { hash: 9 }]);
        assert!(p.alloc(1));
        take(&mut p, &mut ev);
        assert_eq!(ev, [KvEvent::Removed { hash: 2 }]);
        assert!(p.contains(1));
        assert!(!p.reset(), "blocks in use: refused");
        take(&mut p, &mut ev);
        assert!(ev.is_empty());
        p.free(3);
        assert!(p.reset());
        take(&mut p, &mut ev);
        assert_eq!(ev, [KvEvent::Cleared]);
        assert!(!p.contains(1));
        assert_eq!(p.available(), 4);
    }

    #[test]
    fn publishing_a_duplicate_shares_the_block() {
        let mut p = BlockPool::new(2);
        assert!(p.alloc(2));
        p.publish(7);
        p.publish(7);
        assert_eq!(p.used(), 1);
        p.release(7);
        assert_eq!(p.used(), 1);
        p.release(7);
        assert_eq!(p.used(), 0);
    }
}
