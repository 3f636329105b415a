//! Per-endpoint state and the in-flight table (crate-internal).

use crate::decision::Ticket;
use crate::endpoint::{EndpointMeta, MetricsSnapshot, Timestamp};
use crate::rates::LogEwma;

/// One endpoint in the pool.
#[derive(Clone, Debug)]
pub(crate) struct EndpointState {
    pub(crate) meta: EndpointMeta,
    pub(crate) metrics: Option<MetricsSnapshot>,
    /// Bumped on every applied snapshot; in-flight entries remember the epoch they were picked in.
    pub(crate) epoch: u32,
    /// This gateway's requests in flight.
    pub(crate) inflight: u32,
    /// Their estimated prompt + output tokens.
    pub(crate) inflight_tokens: u64,
    /// In-flight requests still waiting for their first token.
    pub(crate) pending: u32,
    /// Their estimated uncached prompt tokens.
    pub(crate) pending_tokens: u64,
    /// In-flight requests picked since the last snapshot (the snapshot cannot know them).
    pub(crate) since_requests: u32,
    /// Of those, the ones still waiting for their first token.
    pub(crate) since_pending: u32,
    /// Their estimated uncached prompt tokens.
    pub(crate) since_pending_tokens: u64,
    /// Learned prefill rate, tokens/s of work cleared before this pod's first token.
    pub(crate) prefill: LogEwma,
    /// Learned per-request decode rate, tokens/s.
    pub(crate) decode: LogEwma,
    /// Requests picked onto this endpoint, ever.
    pub(crate) picked: u64,
}

impl EndpointState {
    pub(crate) fn new(meta: EndpointMeta) -> Self {
        EndpointState {
            meta,
            metrics: None,
            epoch: 0,
            inflight: 0,
            inflight_tokens: 0,
            pending: 0,
            pending_tokens: 0,
            since_requests: 0,
            since_pending: 0,
            since_pending_tokens: 0,
            prefill: LogEwma::default(),
            decode: LogEwma::default(),
            picked: 0,
        }
    }

    /// Whether the metrics are fresh enough at `now`.
    pub(crate) fn fresh(&self, now: Timestamp, max_age: std::time::Duration) -> bool {
        self.metrics
            .as_ref()
            .is_some_and(|m| now.saturating_since(m.sampled_at) <= max_age)
    }

    pub(crate) fn capacity_tokens(&self) -> Option<u64> {
        self.metrics
            .as_ref()
            .and_then(|m| m.cache)
            .map(|c| c.capacity_tokens())
            .filter(|t| *t > 0)
    }
}

/// A slot of the endpoint table. Slots are reused; the generation tells reuses apart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    pub(crate) generation: u32,
    pub(crate) state: Option<EndpointState>,
    /// Position in the dense list of live slots.
    pub(crate) live_pos: u32,
}

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
    };
}

/// The table of in-flight requests, addressed by [`Ticket`]s.
#[derive(Default)]
pub(crate) struct InflightTable {
    entries: Vec<Entry>,
    free: Vec<u32>,
    live: usize,
}

impl InflightTable {
    pub(crate) fn insert(&mut self, mut e: Entry) -> Ticket {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let slot = &mut self.entries[i as usize];
            e.generation = slot.generation;
            *slot = e;
            return Ticket {
                index: i,
                generation: e.generation,
            };
        }
        let i = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        e.generation = 0;
        self.entries.push(e);
        Ticket {
            index: i,
            generation: 0,
        }
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
