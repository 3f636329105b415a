//! Tickets: the table of in-flight requests, and how each one is charged to its endpoint's
//! counters from pick to release (crate-internal).
//!
//! A request is charged at pick, leaves the prefill counters at its first token and is uncharged
//! at release (complete, fail, cancel). The "since the last snapshot" counters are only touched
//! while the endpoint's snapshot epoch is the one the request was picked in: a newer snapshot
//! already counts the request itself.

use crate::decision::Ticket;
use crate::endpoint::Timestamp;
use crate::prefix::Recorded;
use crate::state::EndpointState;

/// Where an in-flight request is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Free,
    Prefill,
    Decode,
}

/// One in-flight request.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) generation: u32,
    pub(crate) phase: Phase,
    pub(crate) slot: u32,
    pub(crate) slot_generation: u32,
    pub(crate) epoch: u32,
    pub(crate) picked_at: Timestamp,
    pub(crate) first_token_at: Option<Timestamp>,
    /// Estimated uncached prompt tokens.
    pub(crate) prefill_tokens: u32,
    /// Estimated prompt + output tokens.
    pub(crate) total_tokens: u32,
    /// Prefill tokens estimated ahead of it at pick time.
    pub(crate) queued_tokens: f64,
    /// Hash of its LoRA adapter, 0 for none.
    pub(crate) adapter: u64,
    /// Whether its endpoint's per-adapter table ([`crate::lora::AdapterInflight`]) counts it.
    pub(crate) adapter_counted: bool,
    /// Its prompt's blocks as the prefix index recorded them on its endpoint.
    pub(crate) prefix: Recorded,
}

impl Entry {
    const FREE: Entry = Entry {
        generation: 0,
        phase: Phase::Free,
        slot: 0,
        slot_generation: 0,
        epoch: 0,
        picked_at: Timestamp::ZERO,
        first_token_at: None,
        prefill_tokens: 0,
        total_tokens: 0,
        queued_tokens: 0.0,
        adapter: 0,
        adapter_counted: false,
        prefix: Recorded::NOTHING,
    };
}

/// The table of in-flight requests, addressed by [`Ticket`]s.
#[derive(Default)]
pub(crate) struct InflightTable {
    entries: Vec<Entry>,
    /// Each entry's prompt blocks (prefix hashes), by entry index: a fallback takes them to the
    /// endpoint that serves the request. A freed entry's buffer is reused.
    blocks: Vec<Vec<u64>>,
    free: Vec<u32>,
    live: usize,
}

impl InflightTable {
    /// Adds `e` with its prompt's `blocks`.
    pub(crate) fn insert(&mut self, mut e: Entry, blocks: &[u64]) -> Ticket {
        self.live += 1;
        let ticket = if let Some(i) = self.free.pop() {
            let slot = &mut self.entries[i as usize];
            e.generation = slot.generation;
            *slot = e;
            Ticket {
                index: i,
                generation: e.generation,
            }
        } else {
            let i = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
            e.generation = 0;
            self.entries.push(e);
            self.blocks.push(Vec::new());
            Ticket {
                index: i,
                generation: 0,
            }
        };
        if let Some(b) = self.blocks.get_mut(ticket.index as usize) {
            b.clear();
            b.extend_from_slice(blocks);
        }
        ticket
    }

    /// The entry of `t` and its prompt's blocks.
    pub(crate) fn get_with_blocks(&mut self, t: Ticket) -> Option<(&mut Entry, &[u64])> {
        let e = self
            .entries
            .get_mut(t.index as usize)
            .filter(|e| e.generation == t.generation && e.phase != Phase::Free)?;
        Some((
            e,
            self.blocks.get(t.index as usize).map_or(&[], Vec::as_slice),
        ))
    }

    pub(crate) fn get_mut(&mut self, t: Ticket) -> Option<&mut Entry> {
        self.entries
            .get_mut(t.index as usize)
            .filter(|e| e.generation == t.generation && e.phase != Phase::Free)
    }

    /// Frees the entry and returns what it was; `None` when the ticket is stale.
    pub(crate) fn release(&mut self, t: Ticket) -> Option<Entry> {
        let e = self.get_mut(t)?;
        let out = *e;
        *e = Entry {
            generation: out.generation.wrapping_add(1),
            ..Entry::FREE
        };
        self.free.push(t.index);
        self.live -= 1;
        Some(out)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

/// Adds a request to its endpoint's counters, its adapter (if any) to the per-adapter table while
/// that has room (`e.adapter_counted` says whether it did).
pub(crate) fn charge(ep: &mut EndpointState, e: &mut Entry) {
    e.adapter_counted = ep.adapters.add(e.adapter);
    ep.inflight += 1;
    ep.inflight_tokens += u64::from(e.total_tokens);
    ep.since_requests += 1;
    if e.phase == Phase::Prefill {
        ep.pending += 1;
        ep.pending_tokens += u64::from(e.prefill_tokens);
        ep.since_pending += 1;
        ep.since_pending_tokens += u64::from(e.prefill_tokens);
    }
}

/// Removes a request from its endpoint's awaiting-first-token counters.
pub(crate) fn leave_prefill(ep: &mut EndpointState, e: &Entry) {
    ep.pending = ep.pending.saturating_sub(1);
    ep.pending_tokens = ep
        .pending_tokens
        .saturating_sub(u64::from(e.prefill_tokens));
    if e.epoch == ep.epoch {
        ep.since_pending = ep.since_pending.saturating_sub(1);
        ep.since_pending_tokens = ep
            .since_pending_tokens
            .saturating_sub(u64::from(e.prefill_tokens));
    }
}

/// Removes a request from its endpoint's counters (the reverse of [`charge`]).
pub(crate) fn uncharge(ep: &mut EndpointState, e: &Entry) {
    if e.phase == Phase::Prefill {
        leave_prefill(ep, e);
    }
    if e.adapter_counted {
        ep.adapters.remove(e.adapter);
    }
    ep.inflight = ep.inflight.saturating_sub(1);
    ep.inflight_tokens = ep.inflight_tokens.saturating_sub(u64::from(e.total_tokens));
    if e.epoch == ep.epoch {
        ep.since_requests = ep.since_requests.saturating_sub(1);
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use crate::fixtures::*;
    use crate::*;

    #[test]
    fn tickets_release_exactly_once() {
        let mut s = scheduler(SchedulerConfig::default(), 2);
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(3))
            .unwrap();
        assert!(s.first_token(d.ticket, T0));
        assert!(!s.first_token(d.ticket, T0), "first token twice");
        assert!(s.cancel(d.ticket, T0));
        assert!(!s.cancel(d.ticket, T0));
        assert!(!s.fail(d.ticket, T0));
        assert!(!s.complete(d.ticket, T0, Usage::default()));
        assert_eq!(s.inflight(), 0);
        let e = s.endpoint(d.endpoints.first()).unwrap();
        assert_eq!((e.inflight, e.awaiting_first_token), (0, 0));
        // A recycled entry gets a new generation: the old ticket stays dead.
        let d2 = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(4))
            .unwrap();
        assert_ne!(d.ticket, d2.ticket);
        assert!(!s.complete(d.ticket, T0, Usage::default()));
        assert_eq!(s.inflight(), 1);
    }

    #[test]
    fn removed_endpoint_tickets_are_harmless() {
        let mut s = scheduler(SchedulerConfig::default(), 2);
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(5))
            .unwrap();
        assert!(s.remove_endpoint(d.endpoints.first()));
        assert!(!s.remove_endpoint(d.endpoints.first()));
        s.upsert_endpoint(meta(9));
        assert!(s.complete(d.ticket, T0, Usage::default()));
        assert_eq!(s.inflight(), 0);
        assert_eq!(s.endpoint(addr(9)).unwrap().inflight, 0);
    }

    #[test]
    fn reassign_moves_the_charge() {
        let mut s = scheduler(SchedulerConfig::default(), 3);
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(6))
            .unwrap();
        let fb = d.endpoints.as_slice()[1];
        assert!(s.reassign(d.ticket, fb));
        assert_eq!(s.endpoint(d.endpoints.first()).unwrap().inflight, 0);
        assert_eq!(s.endpoint(fb).unwrap().inflight, 1);
        assert!(s.fail(d.ticket, T0));
        assert_eq!(s.endpoint(fb).unwrap().inflight, 0);
        assert!(!s.reassign(d.ticket, fb));
    }
}
