//! LoRA-adapter arithmetic: affinity levels, slot accounting and the pre-hashed residency the pick
//! compares by integer.
//!
//! One home for the rules the LoRA filter ([`crate::filter::LoraFilter`]), the endpoint state
//! ([`crate::state::EndpointState::lora_affinity`]) and the candidate views feeding the
//! `lora-affinity` scorer all apply, so they cannot drift apart. Depends on nothing in the crate
//! but [`LoraState`].

use crate::endpoint::LoraState;

/// Affinity of a pod that runs the adapter.
pub(crate) const RUNNING: f64 = 1.0;

/// Affinity of a pod that runs the adapter while another adapter waits there for a slot: below a
/// free slot and a waiting adapter, so that, where another pod can take the request, this pod's
/// running adapter drains and the waiting one gets its slot instead of starving.
pub(crate) const RUNNING_BLOCKED: f64 = 0.5;

/// Affinity of a pod that ran the adapter since its page last showed other adapters filling every
/// slot, and shows it no longer running: the engine keeps a loaded adapter in its slot until
/// another adapter needs the slot (vLLM's LRU of `max_loras` active adapters), so it is still
/// there, with no load to wait for, though the page (running and waiting lists only) cannot say so.
pub(crate) const RESIDENT: f64 = 0.9;

/// Affinity of a pod with a free adapter slot.
pub(crate) const FREE_SLOT: f64 = 0.8;

/// Affinity of a free slot when another candidate already runs the adapter unblocked: loading the
/// adapter there would take a slot that an adapter running nowhere may need.
pub(crate) const FREE_SLOT_SPREAD: f64 = 0.3;

/// Affinity of a pod where the adapter waits (no free slot).
pub(crate) const WAITING: f64 = 0.6;

/// Affinity of every pod when the request names no adapter.
pub(crate) const NOT_REQUESTED: f64 = 1.0;

/// Affinity of a pod that reports no LoRA state (unknown is neither good nor bad).
pub(crate) const UNKNOWN: f64 = 0.5;

/// Adapters inline per list; longer lists fall back to comparing names.
pub(crate) const INLINE: usize = 4;

/// Adapters whose in-flight requests one pod's [`AdapterInflight`] counts; a request for one more
/// is not counted there (a pod with two or four slots rarely has more than a few adapters in
/// flight: its running ones and those waiting for a slot).
pub(crate) const TRACKED: usize = 8;

/// Hash of an adapter name, for allocation-free comparisons on the hot path.
pub(crate) fn adapter_hash(name: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(name.as_bytes(), 0x4c6f_5241)
}

/// The LoRA affinity of a pod for `adapter`: 1.0 running, 0.8 free slot, 0.6 waiting, 0 otherwise;
/// running but with another adapter blocked there (see [`blocked`]), [`RUNNING_BLOCKED`].
///
/// Distinct adapters across the running and waiting lists count as loaded (vLLM repeats running
/// adapters in its waiting list), and a slot is free when fewer than `max_lora` are loaded.
pub(crate) fn affinity(l: &LoraState, adapter: &str) -> f64 {
    if l.running.iter().any(|a| a == adapter) {
        return if blocked(l) { RUNNING_BLOCKED } else { RUNNING };
    }
    if has_free_slot(l) {
        return FREE_SLOT;
    }
    if l.waiting.iter().any(|a| a == adapter) {
        return WAITING;
    }
    0.0
}

/// Whether a pod with this (unconsolidated) affinity must load the adapter before it can serve
/// it: a free slot, or the adapter only waiting there.
pub(crate) fn must_load(affinity: f64) -> bool {
    affinity == FREE_SLOT || affinity == WAITING
}

/// Typical request lifetimes charged to a pod's estimated wait for what routing the request there
/// costs the adapters around it, not the request itself (crate-internal; the views add
/// `lifetimes × mean output ÷ the pod's decode rate`).
///
/// - The adapter runs on the pod while another adapter waits there for a slot
///   ([`RUNNING_BLOCKED`]): one more request keeps that slot taken about one more lifetime, and
///   the waiting requests pay it. One lifetime.
/// - The pod has a free slot and another candidate runs the adapter unblocked or holds it
///   resident (`consolidating`): loading it here takes one of the `free_slots` pods' slots for at
///   least a lifetime, and an adapter that later finds none free waits for one. The last free
///   slot costs a whole lifetime, one of two a quarter, one of `n` 1/n².
/// - Anything else: nothing.
///
/// `known`: the pod reports LoRA state (an unknown pod's [`UNKNOWN`] level equals
/// [`RUNNING_BLOCKED`]'s and is charged nothing).
pub(crate) fn slot_cost_lifetimes(
    affinity: f64,
    known: bool,
    consolidating: bool,
    free_slots: usize,
) -> f64 {
    if !known {
        0.0
    } else if affinity == RUNNING_BLOCKED {
        1.0
    } else if consolidating && affinity == FREE_SLOT {
        let f = free_slots.max(1) as f64;
        1.0 / (f * f)
    } else {
        0.0
    }
}

/// Consolidation: where some candidate runs the adapter unblocked (`running_elsewhere`), a free
/// slot is worth [`FREE_SLOT_SPREAD`] instead of [`FREE_SLOT`]; every other level is unchanged.
pub(crate) fn consolidated(affinity: f64, running_elsewhere: bool) -> f64 {
    if running_elsewhere && affinity == FREE_SLOT {
        FREE_SLOT_SPREAD
    } else {
        affinity
    }
}

/// Whether an adapter waits for a slot: as many distinct adapters run as there are slots, and the
/// waiting list names one that is not running. The engine admits it only once one of the running
/// adapters has no request left.
pub(crate) fn blocked(l: &LoraState) -> bool {
    (distinct_running(l) as u64) >= u64::from(l.max_lora)
        && l.waiting.iter().any(|w| !l.running.contains(w))
}

/// Distinct adapters in the running list (engines may repeat a name: one entry per series or per
/// request).
fn distinct_running(l: &LoraState) -> usize {
    l.running
        .iter()
        .enumerate()
        .filter(|(i, r)| !l.running[..*i].contains(r))
        .count()
}

/// Whether fewer distinct adapters than `max_lora` are loaded (running or waiting).
pub(crate) fn has_free_slot(l: &LoraState) -> bool {
    (loaded(l) as u64) < u64::from(l.max_lora)
}

/// Distinct adapters loaded: running, or only waiting.
fn loaded(l: &LoraState) -> usize {
    let waiting_only = l
        .waiting
        .iter()
        .enumerate()
        .filter(|(i, w)| !l.running.contains(w) && !l.waiting[..*i].contains(w))
        .count();
    distinct_running(l) + waiting_only
}

/// This gateway's requests in flight on one pod, per adapter. A page says which adapters run,
/// not when their slots free: an adapter's slot frees when its last request there ends, and for
/// its own requests this gateway can tell how many are left.
///
/// Kept from pick to release with the pod's other in-flight counters ([`crate::inflight`]).
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct AdapterInflight {
    /// Adapter hashes; 0 marks an unused entry.
    hashes: [u64; TRACKED],
    counts: [u32; TRACKED],
}

impl AdapterInflight {
    /// Counts one more request for the adapter `hash`. False (and nothing counted) when `hash` is
    /// 0 or every entry holds another adapter.
    pub(crate) fn add(&mut self, hash: u64) -> bool {
        if hash == 0 {
            return false;
        }
        let i = match self.hashes.iter().position(|&h| h == hash) {
            Some(i) => i,
            None => match self.hashes.iter().position(|&h| h == 0) {
                Some(i) => {
                    self.hashes[i] = hash;
                    self.counts[i] = 0;
                    i
                }
                None => return false,
            },
        };
        self.counts[i] += 1;
        true
    }

    /// Counts one request for the adapter `hash` fewer (the reverse of a successful [`Self::add`]).
    pub(crate) fn remove(&mut self, hash: u64) {
        if hash == 0 {
            return;
        }
        if let Some(i) = self.hashes.iter().position(|&h| h == hash) {
            self.counts[i] = self.counts[i].saturating_sub(1);
            if self.counts[i] == 0 {
                self.hashes[i] = 0;
            }
        }
    }

    /// Adapters with at least one of this gateway's requests in flight on the pod.
    fn active(&self) -> impl Iterator<Item = u64> + '_ {
        self.hashes.iter().copied().filter(|&h| h != 0)
    }

    /// This gateway's requests in flight for the adapter `hash`.
    pub(crate) fn count(&self, hash: u64) -> u32 {
        match self.hashes.iter().position(|&h| h == hash && hash != 0) {
            Some(i) => self.counts[i],
            None => 0,
        }
    }

    /// Seconds until a slot frees on the pod for the adapter `hash`, when its page (`lora`) shows
    /// no free slot: each running adapter's slot frees when its last request there ends
    /// ([`slot_free_lifetimes`] of a typical `lifetime`, in seconds); another adapter already
    /// waiting there for a slot takes the first one, so with `k` others waiting the request
    /// needs the `k + 1`-th. When the pod was sent requests since the page was read
    /// (`sent_since_page`), the adapters of those not on the page hold slots too. `None` when no
    /// adapter is known to hold a slot (no LoRA state, an overflowing list, none running or
    /// sent).
    pub(crate) fn slot_frees_in(
        &self,
        lora: &LoraHot,
        hash: u64,
        lifetime: f64,
        sent_since_page: bool,
    ) -> Option<f64> {
        if !lora.known || lora.overflow {
            return None;
        }
        let running = &lora.running[..usize::from(lora.n_running)];
        let waiting = &lora.waiting[..usize::from(lora.n_waiting)];
        let mut left = [f64::INFINITY; INLINE + TRACKED];
        for (i, &a) in running.iter().enumerate() {
            // A repeated name is one adapter, one slot.
            if !running[..i].contains(&a) {
                left[i] = slot_free_lifetimes(self.count(a)) * lifetime;
            }
        }
        // Adapters this gateway sent here since the page was read hold slots too.
        if sent_since_page {
            for (i, a) in lora.routed_since(self, hash).enumerate() {
                left[INLINE + i] = slot_free_lifetimes(self.count(a)) * lifetime;
            }
        }
        let ahead = waiting
            .iter()
            .enumerate()
            .filter(|&(i, &w)| w != hash && !running.contains(&w) && !waiting[..i].contains(&w))
            .count();
        left.sort_unstable_by(f64::total_cmp);
        let slots = left.iter().take_while(|l| l.is_finite()).count();
        if slots == 0 {
            return None;
        }
        Some(left[ahead.min(slots - 1)])
    }
}

/// Typical request lifetimes until an adapter with `n` of this gateway's requests in flight on a
/// pod has none left there: `n / (n + 1)`, the expected last end of `n` requests whose remaining
/// lifetimes are spread evenly over one lifetime. None in flight: the slot frees at once (the
/// page that still shows the adapter running is older than its last completion).
pub(crate) fn slot_free_lifetimes(n: u32) -> f64 {
    let n = f64::from(n);
    n / (n + 1.0)
}

/// LoRA residency, pre-hashed at snapshot time so the pick compares integers, not strings.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct LoraHot {
    /// The engine reported LoRA state.
    pub(crate) known: bool,
    /// A list was longer than [`INLINE`]: use the names in the snapshot instead.
    pub(crate) overflow: bool,
    /// A slot is free: fewer distinct adapters loaded than `max_lora`.
    pub(crate) free_slot: bool,
    /// An adapter waits for a slot here (see [`blocked`]).
    pub(crate) blocked: bool,
    /// Adapter slots (`max_lora`).
    slots: u32,
    /// Distinct adapters loaded on the page: running, or only waiting.
    n_loaded: u8,
    running: [u64; INLINE],
    n_running: u8,
    waiting: [u64; INLINE],
    n_waiting: u8,
    /// Adapters seen running here, most recent first, at most `max_lora` (and [`INLINE`]) of
    /// them: the ones the engine still holds in its slots (see [`RESIDENT`]).
    resident: [u64; INLINE],
    n_resident: u8,
}

impl LoraHot {
    /// Digests a new snapshot's LoRA state, carrying over which adapters this pod still holds in
    /// its slots from what earlier pages showed running (`self` is the previous digest).
    ///
    /// Adapters running on the new page come first; those remembered follow while slots remain
    /// (`max_lora`), so an adapter stays resident until enough others have run after it to take
    /// every slot, as the engine's LRU evicts. A page with no LoRA state, an overflowing list, or
    /// `max_lora` 0 forgets them.
    pub(crate) fn next(&self, l: Option<&LoraState>) -> Self {
        let mut h = Self::from_state(l);
        let Some(l) = l.filter(|_| h.known && !h.overflow) else {
            return h;
        };
        let slots = usize::try_from(l.max_lora).unwrap_or(INLINE).min(INLINE);
        let mut n = 0usize;
        let running = h.running;
        let previous = &self.resident[..usize::from(self.n_resident)];
        for &a in running[..usize::from(h.n_running)].iter().chain(previous) {
            if n == slots {
                break;
            }
            if !h.resident[..n].contains(&a) {
                h.resident[n] = a;
                n += 1;
            }
        }
        h.n_resident = n as u8;
        h
    }

    /// Forgets which adapters the pod holds (its process may be gone: a new one holds none).
    pub(crate) fn forget_resident(&mut self) {
        self.n_resident = 0;
    }

    /// Digests a snapshot's LoRA state (`None`: the engine reports none), remembering nothing.
    pub(crate) fn from_state(l: Option<&LoraState>) -> Self {
        let Some(l) = l else {
            return LoraHot::default();
        };
        let mut h = LoraHot {
            known: true,
            free_slot: has_free_slot(l),
            blocked: blocked(l),
            slots: l.max_lora,
            n_loaded: u8::try_from(loaded(l)).unwrap_or(u8::MAX),
            ..LoraHot::default()
        };
        if l.running.len() > INLINE || l.waiting.len() > INLINE {
            h.overflow = true;
            return h;
        }
        for (i, a) in l.running.iter().enumerate() {
            h.running[i] = adapter_hash(a);
        }
        for (i, a) in l.waiting.iter().enumerate() {
            h.waiting[i] = adapter_hash(a);
        }
        h.n_running = l.running.len() as u8;
        h.n_waiting = l.waiting.len() as u8;
        h
    }

    /// Adapters other than `hash` with this gateway's requests in flight on the pod (`own`) that
    /// the page does not name: sent since it was read, and holding a slot now.
    fn routed_since<'a>(
        &'a self,
        own: &'a AdapterInflight,
        hash: u64,
    ) -> impl Iterator<Item = u64> + 'a {
        let running = &self.running[..usize::from(self.n_running)];
        let waiting = &self.waiting[..usize::from(self.n_waiting)];
        own.active()
            .filter(move |&a| a != hash && !running.contains(&a) && !waiting.contains(&a))
    }

    /// Affinity by hash as the pod stands now: the page's [`Self::affinity`], with the adapters
    /// this gateway sent to the pod since the page was read (`own`, its requests in flight there)
    /// taking slots. A free slot they fill is no longer free, and a resident adapter they push out
    /// of the engine's LRU is no longer there: either way the request would wait for a slot (0).
    /// Only valid when `known && !overflow`.
    pub(crate) fn affinity_with(&self, hash: u64, own: &AdapterInflight) -> f64 {
        let page = self.affinity(hash);
        if page != RESIDENT && page != FREE_SLOT {
            return page;
        }
        let resident = &self.resident[..usize::from(self.n_resident)];
        let mut extra = 0u32;
        let mut ahead = 0u32;
        let pos = resident.iter().position(|&a| a == hash);
        for a in self.routed_since(own, hash) {
            extra += 1;
            // Used since the page: ahead of `hash` in the LRU unless it already was.
            if pos.is_none_or(|p| !resident[..p].contains(&a)) {
                ahead += 1;
            }
        }
        if extra == 0 {
            return page;
        }
        let slots = self.slots.min(INLINE as u32);
        if page == RESIDENT {
            let p = u32::try_from(pos.unwrap_or(INLINE)).unwrap_or(u32::MAX);
            if p.saturating_add(ahead) < slots {
                return RESIDENT;
            }
            // Pushed out: loading it again needs a slot like any other adapter.
        }
        if u32::from(self.n_loaded).saturating_add(extra) < self.slots {
            FREE_SLOT
        } else {
            0.0
        }
    }

    /// Affinity by hash (see [`affinity`]); only valid when `known && !overflow`.
    pub(crate) fn affinity(&self, hash: u64) -> f64 {
        if self.running[..usize::from(self.n_running)].contains(&hash) {
            if self.blocked {
                RUNNING_BLOCKED
            } else {
                RUNNING
            }
        } else if !self.blocked && self.resident[..usize::from(self.n_resident)].contains(&hash) {
            RESIDENT
        } else if self.free_slot {
            FREE_SLOT
        } else if self.waiting[..usize::from(self.n_waiting)].contains(&hash) {
            WAITING
        } else {
            0.0
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use super::*;
    use crate::endpoint::MetricsSnapshot;
    use crate::fixtures::{lora_state as l, meta};
    use crate::state::EndpointState;

    #[test]
    fn slot_costs_are_charged_for_a_blocked_slot_and_the_last_free_ones() {
        // Running where another adapter waits for the slot: one lifetime, consolidating or not.
        assert_eq!(slot_cost_lifetimes(RUNNING_BLOCKED, true, false, 0), 1.0);
        assert_eq!(slot_cost_lifetimes(RUNNING_BLOCKED, true, true, 3), 1.0);
        // A free slot while another candidate runs the adapter: the last one a lifetime, one of
        // two a quarter, one of four a sixteenth.
        assert_eq!(slot_cost_lifetimes(FREE_SLOT, true, true, 1), 1.0);
        assert_eq!(slot_cost_lifetimes(FREE_SLOT, true, true, 2), 0.25);
        assert_eq!(slot_cost_lifetimes(FREE_SLOT, true, true, 4), 1.0 / 16.0);
        // A free slot when no candidate runs the adapter is where it has to go: free.
        assert_eq!(slot_cost_lifetimes(FREE_SLOT, true, false, 1), 0.0);
        for level in [RUNNING, RESIDENT, WAITING, 0.0] {
            assert_eq!(slot_cost_lifetimes(level, true, true, 1), 0.0, "{level}");
        }
        // A pod that reports no LoRA state scores UNKNOWN (the same 0.5 as RUNNING_BLOCKED):
        // nothing is known to be blocked there.
        assert_eq!(slot_cost_lifetimes(UNKNOWN, false, true, 1), 0.0);
    }

    #[test]
    fn adapter_counts_take_an_entry_while_requests_are_in_flight() {
        let mut t = AdapterInflight::default();
        for h in 1..=TRACKED as u64 {
            assert!(t.add(h));
        }
        assert!(!t.add(99), "every entry holds another adapter");
        assert!(!t.add(0), "no adapter");
        assert!(t.add(3));
        assert_eq!((t.count(3), t.count(99)), (2, 0));
        t.remove(1);
        assert_eq!(t.count(1), 0);
        assert!(t.add(99), "the freed entry is reused");
        assert_eq!(t.count(99), 1);
        // The last of n requests spread over a lifetime ends n/(n+1) of one after now.
        assert_eq!(slot_free_lifetimes(0), 0.0);
        assert_eq!(slot_free_lifetimes(1), 0.5);
        assert_eq!(slot_free_lifetimes(3), 0.75);
    }

    #[test]
    fn lora_affinity_levels() {
        assert_eq!(affinity(&l(2, &["a"], &["a"]), "a"), 1.0);
        assert_eq!(affinity(&l(2, &["b"], &["b"]), "a"), 0.8);
        assert_eq!(affinity(&l(1, &["b"], &["b", "a"]), "a"), 0.6);
        assert_eq!(affinity(&l(1, &["b"], &[]), "a"), 0.0);
        // A repeated name is one adapter: one of two slots is still free.
        assert_eq!(affinity(&l(2, &["b", "b"], &[]), "a"), 0.8);
        assert_eq!(affinity(&l(2, &["b", "c", "b"], &["c"]), "a"), 0.0);
        // Running, but another adapter waits for this pod's only slot: let this one drain here.
        assert_eq!(affinity(&l(1, &["b"], &["b", "a"]), "b"), 0.5);
        assert_eq!(affinity(&l(2, &["a", "b"], &["a", "b", "c"]), "a"), 0.5);
        // Waiting with a slot still free is loading, not blocked.
        assert_eq!(affinity(&l(3, &["a", "b"], &["a", "b", "c"]), "a"), 1.0);
        // The pre-hashed hot path agrees with the names, inline and overflowing.
        let many: Vec<String> = (0..12).map(|i| format!("x{i}")).collect();
        let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        for state in [
            l(2, &["a"], &["a"]),
            l(2, &["b"], &["b"]),
            l(1, &["b"], &["b", "a"]),
            l(1, &["b"], &[]),
            l(2, &["b", "b"], &[]),
            l(2, &["a", "b"], &["a", "b", "c"]),
            l(3, &["a", "b"], &["a", "b", "c"]),
            l(20, &many, &["a"]),
            l(12, &many, &["a"]),
        ] {
            let mut ep = EndpointState::new(meta(0));
            ep.set_metrics(MetricsSnapshot {
                lora: Some(state.clone()),
                ..MetricsSnapshot::default()
            });
            for name in ["a", "b", "x3", "zz"] {
                assert_eq!(
                    ep.lora_affinity(name, adapter_hash(name)),
                    Some(affinity(&state, name)),
                    "{state:?} {name}"
                );
            }
        }
    }

    #[test]
    fn adapters_sent_since_the_page_hold_slots() {
        let h = adapter_hash;
        let mut ep = EndpointState::new(meta(0));
        // A new page, and what `Scheduler::apply_metrics` resets with it.
        let page = |ep: &mut EndpointState, running: &[&str]| {
            ep.set_metrics(MetricsSnapshot {
                lora: Some(l(2, running, &[])),
                ..MetricsSnapshot::default()
            });
            ep.since_requests = 0;
        };
        let aff = |ep: &EndpointState, name: &str| ep.lora_affinity(name, h(name));
        // A request sent to the pod, as `inflight::charge` counts it, and its release.
        let send = |ep: &mut EndpointState, name: &str| {
            assert!(ep.adapters.add(h(name)));
            ep.since_requests += 1;
        };
        let release = |ep: &mut EndpointState, name: &str| {
            ep.adapters.remove(h(name));
            ep.since_requests -= 1;
        };
        page(&mut ep, &["a"]);
        assert_eq!(aff(&ep, "c"), Some(FREE_SLOT));
        // `b` was sent here since the page: it holds the free slot.
        send(&mut ep, "b");
        assert_eq!(aff(&ep, "c"), Some(0.0));
        assert_eq!(
            aff(&ep, "b"),
            Some(FREE_SLOT),
            "its own requests take no slot from it"
        );
        assert_eq!(aff(&ep, "a"), Some(RUNNING));
        // Its slot frees when its request ends: half a lifetime for one in flight; `a`, with
        // none of this gateway's requests, frees first.
        let lifetime = 8.0;
        assert_eq!(
            ep.adapters.slot_frees_in(&ep.lora, h("c"), lifetime, true),
            Some(0.0)
        );
        send(&mut ep, "a");
        send(&mut ep, "a");
        assert_eq!(
            ep.adapters.slot_frees_in(&ep.lora, h("c"), lifetime, true),
            Some(4.0)
        );
        // With nothing sent since the page, the page's word: only `a` holds a slot (two of this
        // gateway's requests left there: two thirds of a lifetime).
        let only_a = ep.adapters.slot_frees_in(&ep.lora, h("c"), lifetime, false);
        assert!(
            only_a.is_some_and(|s| (s - 16.0 / 3.0).abs() < 1e-9),
            "{only_a:?}"
        );
        release(&mut ep, "b");
        assert_eq!(aff(&ep, "c"), Some(FREE_SLOT));
        // A page read after the send has its word: `b` would be on it if it still ran.
        send(&mut ep, "b");
        page(&mut ep, &["a"]);
        assert_eq!(aff(&ep, "c"), Some(FREE_SLOT));

        // A resident adapter is pushed out of the LRU by as many sent since as it has slots.
        let mut ep = EndpointState::new(meta(1));
        page(&mut ep, &["a"]);
        page(&mut ep, &[]);
        assert_eq!(aff(&ep, "a"), Some(RESIDENT));
        send(&mut ep, "b");
        assert_eq!(aff(&ep, "a"), Some(RESIDENT), "one slot each");
        send(&mut ep, "c");
        assert_eq!(aff(&ep, "a"), Some(0.0), "`b` and `c` took both slots");
        release(&mut ep, "c");
        assert_eq!(aff(&ep, "a"), Some(RESIDENT));
    }

    #[test]
    fn an_adapter_stays_resident_until_others_take_its_slots() {
        let mut ep = EndpointState::new(meta(0));
        let page = |ep: &mut EndpointState, max, running: &[&str], waiting: &[&str]| {
            ep.set_metrics(MetricsSnapshot {
                lora: Some(l(max, running, waiting)),
                ..MetricsSnapshot::default()
            });
        };
        let aff = |ep: &EndpointState, name: &str| ep.lora_affinity(name, adapter_hash(name));
        page(&mut ep, 2, &["a"], &[]);
        assert_eq!(aff(&ep, "a"), Some(RUNNING));
        // Its requests ended: the page says nothing of `a`, the slot still holds it.
        page(&mut ep, 2, &[], &[]);
        assert_eq!(aff(&ep, "a"), Some(RESIDENT));
        assert!(!must_load(RESIDENT));
        assert_eq!(aff(&ep, "b"), Some(FREE_SLOT));
        // One other adapter ran: two slots hold both.
        page(&mut ep, 2, &["b"], &[]);
        page(&mut ep, 2, &[], &[]);
        assert_eq!(aff(&ep, "a"), Some(RESIDENT));
        assert_eq!(aff(&ep, "b"), Some(RESIDENT));
        // A third took the least recently used slot: `a` is gone, `b` stays.
        page(&mut ep, 2, &["c"], &[]);
        assert_eq!(aff(&ep, "a"), Some(FREE_SLOT));
        assert_eq!(aff(&ep, "b"), Some(RESIDENT));
        assert_eq!(aff(&ep, "c"), Some(RUNNING));
        // A restarted process holds nothing.
        ep.lora.forget_resident();
        page(&mut ep, 2, &[], &[]);
        assert_eq!(aff(&ep, "b"), Some(FREE_SLOT));
        assert_eq!(aff(&ep, "c"), Some(FREE_SLOT));
        // Another adapter blocked on the only slot: resident or not, `a` must wait for it.
        let mut ep = EndpointState::new(meta(1));
        page(&mut ep, 1, &["a"], &[]);
        page(&mut ep, 1, &["b"], &["b", "c"]);
        assert_eq!(aff(&ep, "a"), Some(0.0));
        // A page with no LoRA state forgets.
        ep.set_metrics(MetricsSnapshot::default());
        page(&mut ep, 2, &[], &[]);
        assert_eq!(aff(&ep, "b"), Some(FREE_SLOT));
    }
}
