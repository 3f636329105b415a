//! Per-endpoint state and the in-flight table (crate-internal).

use crate::decision::Ticket;
use crate::endpoint::{EndpointMeta, LoraState, MetricsSnapshot, Timestamp};
use crate::rates::LogEwma;

/// Adapters inline per list; longer lists fall back to comparing names.
pub(crate) const LORA_INLINE: usize = 4;

/// Hash of an adapter name, for allocation-free comparisons on the hot path.
pub(crate) fn adapter_hash(name: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(name.as_bytes(), 0x4c6f_5241)
}

/// LoRA residency, pre-hashed at snapshot time so the pick compares integers, not strings.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct LoraHot {
    /// The engine reported LoRA state.
    pub(crate) known: bool,
    /// A list was longer than [`LORA_INLINE`]: use the names in the snapshot instead.
    pub(crate) overflow: bool,
    /// A slot is free: fewer distinct adapters loaded than `max_lora`.
    pub(crate) free_slot: bool,
    /// An adapter waits for a slot here (see [`crate::filter::lora_blocked`]).
    pub(crate) blocked: bool,
    running: [u64; LORA_INLINE],
    n_running: u8,
    waiting: [u64; LORA_INLINE],
    n_waiting: u8,
}

impl LoraHot {
    fn from_state(l: Option<&LoraState>) -> Self {
        let Some(l) = l else {
            return LoraHot::default();
        };
        let mut h = LoraHot {
            known: true,
            free_slot: crate::filter::lora_has_free_slot(l),
            blocked: crate::filter::lora_blocked(l),
            ..LoraHot::default()
        };
        if l.running.len() > LORA_INLINE || l.waiting.len() > LORA_INLINE {
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

    /// Affinity by hash (see [`crate::filter::lora_affinity`]); only valid when `known && !overflow`.
    pub(crate) fn affinity(&self, hash: u64) -> f64 {
        if self.running[..usize::from(self.n_running)].contains(&hash) {
            if self.blocked {
                crate::filter::LORA_RUNNING_BLOCKED
            } else {
                1.0
            }
        } else if self.free_slot {
            crate::filter::LORA_FREE_SLOT
        } else if self.waiting[..usize::from(self.n_waiting)].contains(&hash) {
            0.6
        } else {
            0.0
        }
    }
}

/// What the pick rarely reads, kept out of line so the hot fields of many endpoints share cache lines.
#[derive(Clone, Debug)]
pub(crate) struct Cold {
    pub(crate) meta: EndpointMeta,
    pub(crate) metrics: Option<MetricsSnapshot>,
}

/// One endpoint in the pool.
///
/// `repr(C)` so that the fields every pick reads come first, in declaration order, and share the
/// first cache lines; what only snapshots and reports touch comes after.
#[derive(Clone, Debug)]
#[repr(C)]
pub(crate) struct EndpointState {
    /// Sample time of the newest snapshot, `None` before the first.
    pub(crate) sampled_at: Option<Timestamp>,
    /// Scraped queue depth and running batch.
    pub(crate) waiting: u32,
    pub(crate) running: u32,
    /// Scraped KV-cache use.
    pub(crate) kv: Option<f64>,
    /// `1 / KV capacity in tokens` (0 when unknown), so the pick multiplies instead of dividing.
    pub(crate) inv_capacity: f64,
    /// In-flight requests picked since the last snapshot (the snapshot cannot know them).
    pub(crate) since_requests: u32,
    /// Of those, the ones still waiting for their first token.
    pub(crate) since_pending: u32,
    /// Their estimated uncached prompt tokens.
    pub(crate) since_pending_tokens: u64,
    /// Estimated uncached prompt tokens of in-flight requests still waiting for their first token.
    pub(crate) pending_tokens: u64,
    /// This gateway's requests in flight.
    pub(crate) inflight: u32,
    /// Bumped on every applied snapshot; in-flight entries remember the epoch they were picked in.
    pub(crate) epoch: u32,
    /// Their estimated prompt + output tokens.
    pub(crate) inflight_tokens: u64,
    /// Learned prefill rate, tokens/s of work cleared before this pod's first token.
    pub(crate) prefill: LogEwma,
    /// Learned per-request decode rate, tokens/s.
    pub(crate) decode: LogEwma,
    pub(crate) lora: LoraHot,
    /// In-flight requests still waiting for their first token.
    pub(crate) pending: u32,
    /// KV capacity in tokens, when reported.
    pub(crate) capacity: Option<u64>,
    /// Requests picked onto this endpoint, ever.
    pub(crate) picked: u64,
    pub(crate) cold: Box<Cold>,
}

impl EndpointState {
    pub(crate) fn new(meta: EndpointMeta) -> Self {
        EndpointState {
            cold: Box::new(Cold {
                meta,
                metrics: None,
            }),
            sampled_at: None,
            waiting: 0,
            running: 0,
            kv: None,
            capacity: None,
            inv_capacity: 0.0,
            lora: LoraHot::default(),
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

    /// Installs a (validated) snapshot and its pre-digested hot fields.
    pub(crate) fn set_metrics(&mut self, m: MetricsSnapshot) {
        self.sampled_at = Some(m.sampled_at);
        self.waiting = m.waiting;
        self.running = m.running;
        self.kv = m.kv_cache_usage;
        self.capacity = m.cache.map(|c| c.capacity_tokens()).filter(|t| *t > 0);
        self.inv_capacity = self.capacity.map_or(0.0, |c| 1.0 / c as f64);
        self.lora = LoraHot::from_state(m.lora.as_ref());
        self.cold.metrics = Some(m);
    }

    /// Whether the metrics were sampled at most `max_age_nanos` before `now`.
    pub(crate) fn fresh(&self, now: Timestamp, max_age_nanos: u64) -> bool {
        self.sampled_at
            .is_some_and(|t| now.as_nanos().saturating_sub(t.as_nanos()) <= max_age_nanos)
    }

    /// LoRA affinity for the adapter `name` (hash `hash`); `None` when the pod reports no LoRA state.
    pub(crate) fn lora_affinity(&self, name: &str, hash: u64) -> Option<f64> {
        if !self.lora.known {
            return None;
        }
        if self.lora.overflow {
            let l = self.cold.metrics.as_ref().and_then(|m| m.lora.as_ref())?;
            return Some(crate::filter::lora_affinity(l, name));
        }
        Some(self.lora.affinity(hash))
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
