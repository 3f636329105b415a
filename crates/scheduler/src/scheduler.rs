//! The [`Scheduler`]: endpoint table, in-flight accounting, prefix index, learned rates, and the
//! pick pipeline (candidates → filters → views → saturation/admission → scorers → picker).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use rand::Rng;

use crate::config::{AllFilteredAction, Policy, SchedulerConfig};
use crate::decision::{Decision, MAX_RETURNED, Ranked, Rejection, Ticket, Usage};
use crate::endpoint::{EndpointMeta, MetricsSnapshot, Timestamp};
use crate::error::Error;
use crate::explain::{CandidateRecord, Explanation, FilteredOut, ScoreRecord};
use crate::filter::{Filter, FilterContext, FreshnessFilter, LoraFilter};
use crate::prefix::{PrefixIndex, PrefixStats, hash_blocks, model_seed};
use crate::rates::PoolRates;
use crate::request::{Priority, RequestContext};
use crate::scorer::{self, Scorer, ScorerKind, Spans, View};
use crate::state::{EndpointState, Entry, InflightTable, Phase, Slot, adapter_hash};

/// Scores closer than this are a tie, broken by the seeded generator.
const TIE_EPSILON: f64 = 1e-9;

/// KV-cache use above which a new request is expected to wait for memory to free up.
const KV_PRESSURE_START: f64 = 0.9;

/// A read-only view of one endpoint, for metrics and debugging.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointInfo {
    /// Identity and labels.
    pub meta: EndpointMeta,
    /// The latest metrics snapshot, if any.
    pub metrics: Option<MetricsSnapshot>,
    /// This gateway's requests in flight on it.
    pub inflight: u32,
    /// Of those, the ones waiting for their first token.
    pub awaiting_first_token: u32,
    /// Learned prefill rate in tokens/s (`None` until a streamed request has completed).
    pub prefill_tokens_per_sec: Option<f64>,
    /// Learned per-request decode rate in tokens/s.
    pub decode_tokens_per_sec: Option<f64>,
    /// Completed requests the prefill rate was learned from.
    pub rate_samples: u32,
    /// Requests routed to it, ever.
    pub picked: u64,
}

/// Reusable buffers so that a pick allocates nothing once the pool's size is stable.
#[derive(Default)]
struct Scratch {
    candidates: Vec<u32>,
    views: Vec<View>,
    hashes: Vec<u64>,
    matched: Vec<u32>,
    touched: Vec<u32>,
    seen: Vec<u64>,
    seen_mark: u64,
}

/// The routing core for one pool. Synchronous and `Send`; shells keep it behind a mutex.
///
/// ```
/// use std::collections::BTreeMap;
/// use infergate_scheduler::*;
/// use rand::{SeedableRng, rngs::SmallRng};
///
/// let mut s = Scheduler::new(SchedulerConfig::default()).unwrap();
/// let addr = "10.0.0.1:8000".parse().unwrap();
/// s.upsert_endpoint(EndpointMeta {
///     namespace: "default".into(), pod: "vllm-0".into(), addr,
///     engine: EngineType::Vllm, gpu: None, labels: BTreeMap::new(),
/// });
/// let now = Timestamp::from_millis(1_000);
/// s.apply_metrics(addr, MetricsSnapshot { sampled_at: now, ..Default::default() }).unwrap();
///
/// let mut rng = SmallRng::seed_from_u64(7);
/// let d = s.pick(&RequestContext::new("llama", 100), now, &mut rng).unwrap();
/// assert_eq!(d.endpoints.first(), addr);
/// s.first_token(d.ticket, Timestamp::from_millis(1_050));
/// assert!(s.complete(d.ticket, Timestamp::from_millis(2_000),
///     Usage { prompt_tokens: 100, cached_tokens: 0, output_tokens: 40 }));
/// assert!(!s.cancel(d.ticket, Timestamp::from_millis(2_001))); // released exactly once
/// ```
pub struct Scheduler {
    cfg: SchedulerConfig,
    scorers: Vec<(ScorerKind, f64)>,
    freshness: Option<FreshnessFilter>,
    lora: Option<LoraFilter>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    live: Vec<u32>,
    by_addr: HashMap<SocketAddr, u32>,
    inflight: InflightTable,
    prefix: PrefixIndex,
    pool: PoolRates,
    rr_next: usize,
    scratch: Scratch,
}

impl Scheduler {
    /// A scheduler with an empty pool. Fails when the configuration does not validate.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, Error> {
        cfg.validate()?;
        let mut scratch = Scratch::default();
        scratch.hashes.reserve(cfg.prefix.max_blocks as usize);
        scratch.touched.reserve(crate::prefix::ENDPOINTS_PER_BLOCK);
        Ok(Scheduler {
            scorers: scorer::build(&cfg.weights),
            freshness: cfg.max_metrics_age.map(FreshnessFilter::new),
            lora: cfg.lora_filter.then_some(LoraFilter),
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: Vec::new(),
            by_addr: HashMap::new(),
            inflight: InflightTable::default(),
            prefix: PrefixIndex::new(cfg.prefix),
            pool: PoolRates::new(
                cfg.rates.prefill_tokens_per_sec,
                cfg.rates.decode_tokens_per_sec,
            ),
            rr_next: 0,
            scratch,
            cfg,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Endpoints in the pool.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when the pool has no endpoint.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Requests picked and not yet reported complete, failed or cancelled.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Occupancy and estimated memory of the prefix index.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats()
    }

    /// Adds an endpoint, or updates the identity and labels of the one at `meta.addr` (keeping its
    /// metrics, learned rates and in-flight requests).
    pub fn upsert_endpoint(&mut self, meta: EndpointMeta) {
        if let Some(&slot) = self.by_addr.get(&meta.addr) {
            if let Some(ep) = self.slots[slot as usize].state.as_mut() {
                ep.cold.meta = meta;
            }
            return;
        }
        let addr = meta.addr;
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let s = &mut self.slots[slot as usize];
        s.state = Some(EndpointState::new(meta));
        s.live_pos = u32::try_from(self.live.len()).unwrap_or(u32::MAX);
        self.live.push(slot);
        self.by_addr.insert(addr, slot);
        if self.scratch.matched.len() < self.slots.len() {
            self.scratch.matched.resize(self.slots.len(), 0);
            self.scratch.seen.resize(self.slots.len(), 0);
        }
        self.prefix.set_endpoint(slot, None);
    }

    /// Removes an endpoint. Its in-flight tickets stay valid to report but no longer count.
    /// Returns false when it was not in the pool.
    pub fn remove_endpoint(&mut self, addr: SocketAddr) -> bool {
        let Some(slot) = self.by_addr.remove(&addr) else {
            return false;
        };
        let s = &mut self.slots[slot as usize];
        let pos = s.live_pos as usize;
        if let Some(ep) = s.state.take() {
            self.pool.forget(ep.prefill.ln(), ep.decode.ln());
        }
        s.generation = s.generation.wrapping_add(1);
        self.live.swap_remove(pos);
        if let Some(&moved) = self.live.get(pos) {
            self.slots[moved as usize].live_pos = u32::try_from(pos).unwrap_or(u32::MAX);
        }
        self.free_slots.push(slot);
        self.prefix.remove_endpoint(slot);
        true
    }

    /// Applies one metrics snapshot. Snapshots older than the one held are ignored (scrapes can
    /// finish out of order). Non-finite gauges are rejected; fractions are clamped to [0, 1].
    pub fn apply_metrics(&mut self, addr: SocketAddr, mut m: MetricsSnapshot) -> Result<(), Error> {
        let slot = *self
            .by_addr
            .get(&addr)
            .ok_or(Error::UnknownEndpoint(addr))?;
        for (field, v) in [
            ("kv_cache_usage", m.kv_cache_usage),
            ("prefix_cache_hit_rate", m.prefix_cache_hit_rate),
        ] {
            if v.is_some_and(|v| !v.is_finite()) {
                return Err(Error::InvalidMetric { addr, field });
            }
        }
        m.kv_cache_usage = m.kv_cache_usage.map(|v| v.clamp(0.0, 1.0));
        m.prefix_cache_hit_rate = m.prefix_cache_hit_rate.map(|v| v.clamp(0.0, 1.0));
        let Some(ep) = self.slots[slot as usize].state.as_mut() else {
            return Err(Error::UnknownEndpoint(addr));
        };
        if ep.sampled_at.is_some_and(|old| old > m.sampled_at) {
            return Ok(());
        }
        let old_capacity = ep.capacity;
        ep.set_metrics(m);
        ep.epoch = ep.epoch.wrapping_add(1);
        ep.since_requests = 0;
        ep.since_pending = 0;
        ep.since_pending_tokens = 0;
        let capacity = ep.capacity;
        if capacity != old_capacity {
            self.prefix.set_endpoint(slot, capacity);
        }
        Ok(())
    }

    /// A read-only view of one endpoint.
    pub fn endpoint(&self, addr: SocketAddr) -> Option<EndpointInfo> {
        let slot = *self.by_addr.get(&addr)?;
        let ep = self.slots[slot as usize].state.as_ref()?;
        Some(EndpointInfo {
            meta: ep.cold.meta.clone(),
            metrics: ep.cold.metrics.clone(),
            inflight: ep.inflight,
            awaiting_first_token: ep.pending,
            prefill_tokens_per_sec: ep.prefill.get(),
            decode_tokens_per_sec: ep.decode.get(),
            rate_samples: ep.prefill.samples(),
            picked: ep.picked,
        })
    }

    /// The endpoints in the pool, in no particular order.
    pub fn endpoints(&self) -> impl Iterator<Item = &EndpointMeta> + '_ {
        self.live
            .iter()
            .filter_map(|&s| self.slots[s as usize].state.as_ref().map(|e| &e.cold.meta))
    }

    /// Picks endpoints for one request: the first choice plus up to `returnedEndpoints − 1`
    /// distinct fallbacks, and a ticket charged to the first choice. Allocation-free once the pool
    /// and the prefix index have warmed up.
    pub fn pick<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        now: Timestamp,
        rng: &mut R,
    ) -> Result<Decision, Rejection> {
        self.pick_inner(req, now, rng, None)
    }

    /// Like [`pick`](Self::pick) (same decision for the same generator state) and also returns the
    /// decision record: candidates, which filter removed which pod, every scorer's value per pod.
    pub fn pick_explained<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        now: Timestamp,
        rng: &mut R,
    ) -> (Result<Decision, Rejection>, Explanation) {
        let mut ex = Explanation {
            policy: Some(self.cfg.policy),
            priority: req.priority,
            ..Explanation::default()
        };
        let out = self.pick_inner(req, now, rng, Some(&mut ex));
        match &out {
            Ok(d) => ex.chosen = d.endpoints.as_slice().to_vec(),
            Err(r) => {
                ex.rejection = Some(r.metric_label());
                ex.retry_after_secs = r.retry_after().map(|d| d.as_secs());
            }
        }
        (out, ex)
    }

    /// Records the request's first token (streamed responses). Returns false for an unknown or
    /// released ticket, or when the first token was already reported.
    pub fn first_token(&mut self, ticket: Ticket, now: Timestamp) -> bool {
        let Some(e) = self.inflight.get_mut(ticket) else {
            return false;
        };
        if e.phase != Phase::Prefill {
            return false;
        }
        e.phase = Phase::Decode;
        e.first_token_at = Some(now);
        let e = *e;
        if let Some(ep) = self.state_of(&e) {
            Self::leave_prefill(ep, &e);
        }
        true
    }

    /// Records a successful completion with the server's token usage, releases the in-flight
    /// entry and teaches the rate learner. Returns false when the ticket was already released.
    pub fn complete(&mut self, ticket: Ticket, now: Timestamp, usage: Usage) -> bool {
        let Some(e) = self.release(ticket) else {
            return false;
        };
        if usage.output_tokens > 0 {
            self.pool.observe_output(usage.output_tokens);
        }
        let min_alpha = self.cfg.rates.min_alpha;
        let Some(first) = e.first_token_at else {
            return true;
        };
        let slot_generation = e.slot_generation;
        let Some(s) = self.slots.get_mut(e.slot as usize) else {
            return true;
        };
        if s.generation != slot_generation {
            return true;
        }
        let Some(ep) = s.state.as_mut() else {
            return true;
        };
        // Prefill: the work that had to clear before this first token, over the time it took.
        let own = if usage.prompt_tokens > 0 {
            f64::from(usage.prompt_tokens.saturating_sub(usage.cached_tokens))
        } else {
            f64::from(e.prefill_tokens)
        };
        let ttft = first.saturating_since(e.picked_at).as_secs_f64().max(1e-3);
        let work = (e.queued_tokens + own).max(1.0);
        let (before, after) = ep.prefill.update(work / ttft, min_alpha);
        self.pool.prefill_changed(before, after);
        // Decode: tokens after the first, over the time after the first.
        if usage.output_tokens > 1 {
            let dt = now.saturating_since(first).as_secs_f64();
            if dt > 0.0 {
                let rate = f64::from(usage.output_tokens - 1) / dt;
                let (before, after) = ep.decode.update(rate, min_alpha);
                self.pool.decode_changed(before, after);
            }
        }
        true
    }

    /// Records a failed request (error status, reset, timeout) and releases its entry.
    pub fn fail(&mut self, ticket: Ticket, _now: Timestamp) -> bool {
        self.release(ticket).is_some()
    }

    /// Records a request the client abandoned and releases its entry.
    pub fn cancel(&mut self, ticket: Ticket, _now: Timestamp) -> bool {
        self.release(ticket).is_some()
    }

    /// Moves a ticket's charge to `addr` (the proxy fell back to another endpoint). Returns false
    /// when the ticket is released or `addr` is not in the pool.
    pub fn reassign(&mut self, ticket: Ticket, addr: SocketAddr) -> bool {
        let Some(&slot) = self.by_addr.get(&addr) else {
            return false;
        };
        let Some(old) = self.inflight.get_mut(ticket).copied() else {
            return false;
        };
        if old.slot == slot && self.slots[slot as usize].generation == old.slot_generation {
            return true;
        }
        if let Some(ep) = self.state_of(&old) {
            Self::uncharge(ep, &old);
        }
        let s = &mut self.slots[slot as usize];
        let Some(ep) = s.state.as_mut() else {
            return false;
        };
        let mut e = old;
        e.slot = slot;
        e.slot_generation = s.generation;
        e.epoch = ep.epoch;
        Self::charge(ep, &e);
        if let Some(entry) = self.inflight.get_mut(ticket) {
            *entry = e;
        }
        true
    }

    fn state_of(&mut self, e: &Entry) -> Option<&mut EndpointState> {
        let s = self.slots.get_mut(e.slot as usize)?;
        if s.generation != e.slot_generation {
            return None;
        }
        s.state.as_mut()
    }

    fn release(&mut self, ticket: Ticket) -> Option<Entry> {
        let e = self.inflight.release(ticket)?;
        if let Some(ep) = self.state_of(&e) {
            Self::uncharge(ep, &e);
        }
        Some(e)
    }

    fn charge(ep: &mut EndpointState, e: &Entry) {
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

    fn leave_prefill(ep: &mut EndpointState, e: &Entry) {
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

    fn uncharge(ep: &mut EndpointState, e: &Entry) {
        if e.phase == Phase::Prefill {
            Self::leave_prefill(ep, e);
        }
        ep.inflight = ep.inflight.saturating_sub(1);
        ep.inflight_tokens = ep.inflight_tokens.saturating_sub(u64::from(e.total_tokens));
        if e.epoch == ep.epoch {
            ep.since_requests = ep.since_requests.saturating_sub(1);
        }
    }

    // ---- the pipeline ----

    fn pick_inner<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        now: Timestamp,
        rng: &mut R,
        mut ex: Option<&mut Explanation>,
    ) -> Result<Decision, Rejection> {
        self.collect_candidates(req);
        if let Some(ex) = ex.as_deref_mut() {
            ex.considered = self.scratch.candidates.len();
        }
        if self.scratch.candidates.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        let scored = self.cfg.policy == Policy::Scored;
        let use_prefix =
            scored && (self.cfg.weights.prefix > 0.0 || self.cfg.weights.estimated_wait > 0.0);
        self.scratch.hashes.clear();
        if use_prefix && !req.prompt.is_empty() {
            let seed = model_seed(req.model, req.lora_adapter);
            hash_blocks(
                seed,
                req.prompt,
                self.cfg.prefix.block_chars as usize,
                self.cfg.prefix.max_blocks as usize,
                &mut self.scratch.hashes,
            );
        }
        if let Some(ex) = ex.as_deref_mut() {
            ex.prompt_blocks = self.scratch.hashes.len();
        }
        let sc = &mut self.scratch;
        if !sc.hashes.is_empty() {
            self.prefix
                .match_prefix(&sc.hashes, &mut sc.matched, &mut sc.touched);
        }
        let cx = FilterContext {
            request: req,
            now,
            adapter_hash: req.lora_adapter.map_or(0, adapter_hash),
        };
        let fresh = self.build_views(&cx, true, ex.as_deref_mut());
        // Freshness is never relaxed: a pod whose scrapes fail is most likely down, and routing
        // on its last numbers turns an outage into upstream errors. The fallback relaxes LoRA only.
        let none_fresh = fresh == 0 && self.freshness.is_some();
        if self.scratch.views.is_empty()
            && !none_fresh
            && self.cfg.on_all_filtered == AllFilteredAction::AllReady
        {
            self.build_views(&cx, false, None);
            if let Some(ex) = ex.as_deref_mut() {
                ex.fell_back_to_all_ready = true;
            }
        }
        let sc = &mut self.scratch;
        for t in sc.touched.drain(..) {
            if let Some(m) = sc.matched.get_mut(t as usize) {
                *m = 0;
            }
        }
        if self.scratch.views.is_empty() {
            return Err(if none_fresh {
                Rejection::Unavailable {
                    retry_after: self.cfg.retry_after_min,
                }
            } else {
                Rejection::NoEndpoints
            });
        }
        self.pool.observe_prompt(req.prompt_tokens);
        let ranked = match self.cfg.policy {
            Policy::Scored => self.select_scored(req, rng, ex)?,
            Policy::RoundRobin => self.select_round_robin(),
            Policy::Random => self.select_random(rng),
            Policy::LeastRequest => self.select_least_request(rng),
        };
        let first = ranked.0;
        let v = self.scratch.views[first];
        let mut endpoints = Ranked::new();
        for &i in &ranked.1[..ranked.2] {
            let slot = self.scratch.views[i].slot;
            if let Some(ep) = self.slots[slot as usize].state.as_ref() {
                endpoints.push(ep.cold.meta.addr);
            }
        }
        let s = &mut self.slots[v.slot as usize];
        let Some(ep) = s.state.as_mut() else {
            return Err(Rejection::NoEndpoints);
        };
        let entry = Entry {
            generation: 0,
            phase: Phase::Prefill,
            slot: v.slot,
            slot_generation: s.generation,
            epoch: ep.epoch,
            picked_at: now,
            first_token_at: None,
            prefill_tokens: v.own_tokens.round() as u32,
            total_tokens: req.prompt_tokens.saturating_add(req.output_tokens),
            queued_tokens: v.queued_tokens,
        };
        Self::charge(ep, &entry);
        ep.picked += 1;
        let ticket = self.inflight.insert(entry);
        if use_prefix && !self.scratch.hashes.is_empty() {
            self.prefix.insert(v.slot, &self.scratch.hashes);
        }
        Ok(Decision { endpoints, ticket })
    }

    /// Candidates from the subset hint (deduplicated, unknown addresses ignored) or the whole pool.
    fn collect_candidates(&mut self, req: &RequestContext<'_>) {
        let sc = &mut self.scratch;
        sc.candidates.clear();
        match req.subset {
            None => sc.candidates.extend_from_slice(&self.live),
            Some(subset) => {
                sc.seen_mark += 1;
                for addr in subset {
                    if let Some(&slot) = self.by_addr.get(addr) {
                        let seen = &mut sc.seen[slot as usize];
                        if *seen != sc.seen_mark {
                            *seen = sc.seen_mark;
                            sc.candidates.push(slot);
                        }
                    }
                }
            }
        }
    }

    /// Runs the filters — freshness always, LoRA when `lora` — and builds one [`View`] per
    /// surviving candidate, from the scraped metrics, in-flight accounting, the prefix match and
    /// the learned rates. One pass over the candidates, reading only each endpoint's hot fields.
    /// Returns how many candidates passed the freshness filter.
    fn build_views(
        &mut self,
        cx: &FilterContext<'_, '_>,
        lora: bool,
        mut ex: Option<&mut Explanation>,
    ) -> usize {
        let req = cx.request;
        let scored = self.cfg.policy == Policy::Scored;
        // Static dispatch: the filters are inlined into this loop.
        let freshness = self.freshness.as_ref();
        let lora_filter = self
            .lora
            .as_ref()
            .filter(|_| lora && scored && req.lora_adapter.is_some());
        let mut fresh = 0usize;
        let sc = &mut self.scratch;
        let nblocks = sc.hashes.len();
        let adj = self.cfg.inflight_accounting;
        let inv_prefill_prior = 1.0 / self.pool.prefill_prior();
        let decode_prior = self.pool.decode_prior();
        let mean_prompt = self.pool.mean_prompt;
        let mean_output = self.pool.mean_output;
        let sat = self.cfg.saturation;
        let over = self.cfg.overload;
        let inv_blocks = if nblocks > 0 {
            1.0 / nblocks as f64
        } else {
            0.0
        };
        sc.views.clear();
        'candidates: for &slot in &sc.candidates {
            let Some(ep) = self.slots[slot as usize].state.as_ref() else {
                continue;
            };
            let removed_by = if freshness.is_some_and(|f| !f.keep(cx, ep)) {
                freshness.map(Filter::name)
            } else {
                fresh += 1;
                if lora_filter.is_some_and(|f| !f.keep(cx, ep)) {
                    lora_filter.map(Filter::name)
                } else {
                    None
                }
            };
            if let Some(name) = removed_by {
                if let Some(ex) = ex.as_deref_mut() {
                    ex.filtered.push(FilteredOut {
                        addr: ep.cold.meta.addr,
                        filter: name,
                    });
                }
                continue 'candidates;
            }
            let (since_pending, since_decoding, since_tokens) = if adj {
                (
                    f64::from(ep.since_pending),
                    f64::from(ep.since_requests.saturating_sub(ep.since_pending)),
                    ep.since_pending_tokens as f64,
                )
            } else {
                (0.0, 0.0, 0.0)
            };
            let m_wait = f64::from(ep.waiting);
            let waiting = m_wait + since_pending;
            let running = f64::from(ep.running) + since_decoding;
            let kv = ep.kv.map(|k| {
                if since_tokens > 0.0 {
                    (k + since_tokens * ep.inv_capacity).min(1.0)
                } else {
                    k
                }
            });
            let prefix_blocks = sc.matched.get(slot as usize).copied().unwrap_or(0);
            let prefix = f64::from(prefix_blocks) * inv_blocks;
            let lora = match req.lora_adapter {
                None => 1.0,
                Some(a) => ep.lora_affinity(a, cx.adapter_hash).unwrap_or(0.5),
            };
            let scraped_queue = m_wait * mean_prompt;
            let queued_tokens = if adj {
                (ep.pending_tokens as f64).max(scraped_queue + since_tokens)
            } else {
                scraped_queue
            };
            let own_tokens = f64::from(req.prompt_tokens) * (1.0 - prefix);
            let inv_prefill_rate = ep.prefill.inv().unwrap_or(inv_prefill_prior);
            let kv_wait = match kv {
                Some(k) if k > KV_PRESSURE_START => {
                    let decode_rate = ep.decode.get().unwrap_or(decode_prior);
                    (k - KV_PRESSURE_START) / (1.0 - KV_PRESSURE_START) * 0.5 * mean_output
                        / decode_rate
                }
                _ => 0.0,
            };
            let wait = (queued_tokens + own_tokens) * inv_prefill_rate + kv_wait;
            let kv_or_zero = kv.unwrap_or(0.0);
            sc.views.push(View {
                slot,
                waiting,
                running,
                kv,
                inflight_tokens: ep.inflight_tokens as f64,
                inflight: f64::from(ep.inflight),
                prefix_blocks,
                prefix,
                lora,
                queued_tokens,
                own_tokens,
                wait,
                saturated: waiting >= f64::from(sat.queue_depth) || kv_or_zero >= sat.kv_cache,
                overloaded: waiting >= f64::from(over.queue_depth) || kv_or_zero >= over.kv_cache,
                total: 0.0,
            });
        }
        // Consolidate adapters: where a pod runs the adapter with no other adapter blocked, a free
        // slot elsewhere is worth less — loading the adapter there would take a slot another
        // adapter may need.
        if req.lora_adapter.is_some() && sc.views.iter().any(|v| v.lora >= 1.0) {
            for v in sc.views.iter_mut() {
                if v.lora == crate::filter::LORA_FREE_SLOT {
                    v.lora = crate::filter::LORA_FREE_SLOT_SPREAD;
                }
            }
        }
        fresh
    }

    /// Estimated seconds until a saturated endpoint is back under the saturation thresholds.
    fn drain_secs(&self, v: &View) -> f64 {
        let Some(ep) = self.slots[v.slot as usize].state.as_ref() else {
            return f64::INFINITY;
        };
        let sat = self.cfg.saturation;
        let prefill_rate = ep.prefill.get().unwrap_or(self.pool.prefill_prior());
        let decode_rate = ep.decode.get().unwrap_or(self.pool.decode_prior());
        let excess = (v.waiting - f64::from(sat.queue_depth) + 1.0).max(0.0);
        let queue = if v.waiting > 0.0 {
            v.queued_tokens * excess / v.waiting
        } else {
            0.0
        };
        let mut secs = queue / prefill_rate;
        if let Some(k) = v.kv
            && k >= sat.kv_cache
        {
            let frac = ((k - sat.kv_cache) / (1.0 - sat.kv_cache).max(0.01)).clamp(0.1, 1.0);
            secs += frac * self.pool.mean_output / decode_rate;
        }
        secs
    }

    fn retry_after(&self) -> Duration {
        let secs = self
            .scratch
            .views
            .iter()
            .map(|v| self.drain_secs(v))
            .fold(f64::INFINITY, f64::min);
        let lo = self.cfg.retry_after_min;
        let hi = self.cfg.retry_after_max;
        let d = if secs.is_finite() {
            Duration::from_secs_f64(secs.max(0.0).ceil())
        } else {
            hi
        };
        d.clamp(lo, hi)
    }

    /// Saturation headroom, admission, scoring and the max-score picker. Returns (first view index,
    /// ranked view indices, count).
    fn select_scored<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        rng: &mut R,
        mut ex: Option<&mut Explanation>,
    ) -> Result<(usize, [usize; MAX_RETURNED], usize), Rejection> {
        let total = self.scratch.views.len();
        let unsaturated = self.scratch.views.iter().filter(|v| !v.saturated).count();
        if unsaturated == 0 {
            let shed = self.cfg.shedding
                && match req.priority {
                    Priority::Critical => false,
                    Priority::Standard => self.scratch.views.iter().all(|v| v.overloaded),
                    Priority::Sheddable => true,
                };
            if shed {
                return Err(Rejection::Shed {
                    retry_after: self.retry_after(),
                });
            }
        } else if unsaturated < total {
            let slots = &self.slots;
            self.scratch.views.retain(|v| {
                if v.saturated {
                    if let Some(ex) = ex.as_deref_mut()
                        && let Some(ep) = slots[v.slot as usize].state.as_ref()
                    {
                        ex.filtered.push(FilteredOut {
                            addr: ep.cold.meta.addr,
                            filter: "saturation",
                        });
                    }
                    false
                } else {
                    true
                }
            });
        }
        let sc = &mut self.scratch;
        let spans = Spans::of(&sc.views);
        match ex {
            None => {
                // The hot path: one straight pass per weighted scorer.
                for v in sc.views.iter_mut() {
                    v.total = 0.0;
                }
                for (s, w) in &self.scorers {
                    s.accumulate(*w, &mut sc.views, &spans);
                }
            }
            Some(ex) => {
                // Same arithmetic in the same order, recording every value.
                ex.candidates.clear();
                for v in sc.views.iter_mut() {
                    let Some(ep) = self.slots[v.slot as usize].state.as_ref() else {
                        continue;
                    };
                    let mut scores = Vec::with_capacity(self.scorers.len());
                    let mut total = 0.0;
                    for (s, w) in &self.scorers {
                        let value = s.score(v, &spans);
                        total += *w * value;
                        scores.push(ScoreRecord {
                            scorer: s.name(),
                            weight: *w,
                            value,
                        });
                    }
                    v.total = total;
                    ex.candidates.push(CandidateRecord {
                        addr: ep.cold.meta.addr,
                        name: format!("{}/{}", ep.cold.meta.namespace, ep.cold.meta.pod),
                        scores,
                        total,
                        waiting: v.waiting,
                        estimated_wait_secs: v.wait,
                        prefix_blocks: v.prefix_blocks,
                        saturated: v.saturated,
                    });
                }
            }
        }
        let k = usize::from(self.cfg.returned_endpoints);
        let (idx, len) = top_k(&sc.views, k, rng, |v| v.total);
        Ok((idx[0], idx, len))
    }

    fn select_round_robin(&mut self) -> (usize, [usize; MAX_RETURNED], usize) {
        let n = self.scratch.views.len();
        let k = usize::from(self.cfg.returned_endpoints).min(n);
        let start = self.rr_next % n;
        self.rr_next = self.rr_next.wrapping_add(1);
        let mut idx = [0usize; MAX_RETURNED];
        for (j, slot) in idx.iter_mut().enumerate().take(k) {
            *slot = (start + j) % n;
        }
        (idx[0], idx, k)
    }

    fn select_random<R: Rng + ?Sized>(
        &mut self,
        rng: &mut R,
    ) -> (usize, [usize; MAX_RETURNED], usize) {
        let n = self.scratch.views.len();
        let k = usize::from(self.cfg.returned_endpoints).min(n);
        let mut idx = [0usize; MAX_RETURNED];
        // Partial Fisher–Yates over the views (their order is scratch).
        for (j, slot) in idx.iter_mut().enumerate().take(k) {
            let r = rng.random_range(j..n);
            self.scratch.views.swap(j, r);
            *slot = j;
        }
        (idx[0], idx, k)
    }

    fn select_least_request<R: Rng + ?Sized>(
        &mut self,
        rng: &mut R,
    ) -> (usize, [usize; MAX_RETURNED], usize) {
        let k = usize::from(self.cfg.returned_endpoints);
        let (idx, len) = top_k(&self.scratch.views, k, rng, |v| -v.inflight);
        (idx[0], idx, len)
    }
}

/// The `k` best views by `score` (ties within [`TIE_EPSILON`] broken by a seeded random key),
/// best first. One random draw per view keeps the choice among ties uniform.
fn top_k<R: Rng + ?Sized>(
    views: &[View],
    k: usize,
    rng: &mut R,
    score: impl Fn(&View) -> f64,
) -> ([usize; MAX_RETURNED], usize) {
    let k = k.min(MAX_RETURNED).min(views.len());
    let mut best: [(f64, u64, usize); MAX_RETURNED] = [(f64::NEG_INFINITY, 0, 0); MAX_RETURNED];
    let mut len = 0usize;
    let better = |a: (f64, u64), b: (f64, u64)| {
        if (a.0 - b.0).abs() <= TIE_EPSILON {
            a.1 > b.1
        } else {
            a.0 > b.0
        }
    };
    for (i, v) in views.iter().enumerate() {
        let s = score(v);
        let s = if s.is_nan() { f64::NEG_INFINITY } else { s };
        let key: u64 = rng.random();
        if len == k && !better((s, key), (best[k - 1].0, best[k - 1].1)) {
            continue;
        }
        let mut pos = if len < k { len } else { k - 1 };
        if len < k {
            len += 1;
        }
        while pos > 0 && better((s, key), (best[pos - 1].0, best[pos - 1].1)) {
            best[pos] = best[pos - 1];
            pos -= 1;
        }
        best[pos] = (s, key, i);
    }
    let mut idx = [0usize; MAX_RETURNED];
    for (o, b) in idx.iter_mut().zip(&best[..len]) {
        *o = b.2;
    }
    (idx, len)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests;
