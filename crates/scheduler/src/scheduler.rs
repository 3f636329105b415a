//! The [`Scheduler`]: the public face of the crate. It owns the endpoint table, the in-flight
//! tickets, the prefix index and the learned rates, and runs the pick pipeline stage by stage:
//! candidates and views ([`crate::view`], with the endpoint filters of [`crate::filter`]
//! inlined) → admission ([`crate::admission`]) → the saturation filter → scorers
//! ([`crate::scorer`]) → picker ([`crate::picker`]).

use std::net::SocketAddr;

use rand::Rng;

use crate::admission;
use crate::config::{AllFilteredAction, Policy, SchedulerConfig};
use crate::decision::{Decision, Ranked, Rejection, Ticket, Usage};
use crate::endpoint::{EndpointMeta, MetricsSnapshot, ScrapeState, Timestamp};
use crate::error::Error;
use crate::explain::Explanation;
use crate::filter::{FilterContext, Filters};
use crate::inflight::{self, Entry, InflightTable, Phase};
use crate::lora::adapter_hash;
use crate::outlier::{Answer, AnswerCounts, Ejection, Judged};
use crate::peers::PeerTable;
use crate::picker::Picker;
use crate::prefix::{PrefixIndex, PrefixStats, Recorded, hash_blocks, request_seed};
use crate::rates::PoolRates;
use crate::request::RequestContext;
use crate::sample;
use crate::scorer::{self, ScorerKind};
use crate::stale;
use crate::table::{EndpointTable, Upsert};
use crate::view::{self, Sources, View};

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
    /// Their estimated uncached prompt tokens: the prefill work this gateway's requests still
    /// queue there (what the in-flight accounting charges; the heartbeat counts it).
    pub awaiting_first_token_tokens: u64,
    /// The peer replicas' requests in flight on it, as they last reported
    /// ([`Scheduler::apply_peer_loads`]).
    pub peer_inflight: u32,
    /// Of those, the ones waiting for their first token.
    pub peer_awaiting_first_token: u32,
    /// Learned prefill rate in tokens/s (`None` until a streamed request has completed).
    pub prefill_tokens_per_sec: Option<f64>,
    /// Learned prefill rate on long prompts, tokens/s: from first tokens that waited for at least
    /// 256 tokens of work only, so without the server's fixed cost per request that short
    /// prompts' samples are mostly made of (`None` until such a streamed request has completed).
    /// Once `fixed_cost_secs` is learned, each sample's time is taken without it: the speed per
    /// token alone. What a long prompt's prefill is extrapolated with.
    pub bulk_prefill_tokens_per_sec: Option<f64>,
    /// Learned fixed cost per request in seconds: the time to first token of a short prompt
    /// (at most 64 tokens of work waited for) less its work at the bulk rate (`None` until such a
    /// streamed request has completed). What a short prompt's estimate starts from.
    pub fixed_cost_secs: Option<f64>,
    /// Learned per-request decode rate in tokens/s.
    pub decode_tokens_per_sec: Option<f64>,
    /// Its cold-start prefill rate, tokens/s: the configured prior (`rates`, per reference
    /// GPU) scaled by its GPU type ([`crate::gpu`]), what the scheduler assumes for it while
    /// nothing is learned in the pool. (Once other endpoints have learned, it assumes their
    /// typical rate instead; that one is learned from every first token, and short prompts',
    /// mostly the server's fixed cost, read as rates many times too slow: an estimate that must
    /// not take them for the pod's speed uses this one.)
    pub cold_prefill_tokens_per_sec: f64,
    /// Its cold-start per-request decode rate, tokens/s, the same way.
    pub cold_decode_tokens_per_sec: f64,
    /// Completed requests the prefill rate was learned from.
    pub rate_samples: u32,
    /// Requests routed to it, ever.
    pub picked: u64,
    /// How its scrapes are going, as last reported ([`Scheduler::set_scrape_state`]).
    pub scrape: ScrapeState,
    /// While its scrapes fail, whether they still reach the server
    /// ([`Scheduler::set_reachable`]).
    pub reachable: bool,
    /// When its last ejection by outlier detection ends or ended ([`Scheduler::observe_answer`]):
    /// ejected while that is later than now.
    pub ejected_until: Option<Timestamp>,
    /// The answers it gave since it joined the pool, by verdict ([`Scheduler::observe_answer`],
    /// counted with outlier detection on or off).
    pub answers: AnswerCounts,
    /// The last interval of `outlierDetection.failurePercentage` judged (`None` without it, or
    /// before the first interval closed).
    pub failure_interval: Option<Judged>,
}

/// Reusable buffers so that a pick allocates nothing once the pool's size is stable.
#[derive(Default)]
struct Scratch {
    /// Candidate slots (subset hint or whole pool).
    candidates: Vec<u32>,
    /// One view per candidate that passed the filters.
    views: Vec<View>,
    /// The prompt's chained block hashes.
    hashes: Vec<u64>,
    /// Per slot: leading blocks matched (reset through `touched` before each pick).
    matched: Vec<u32>,
    /// Slots with a non-zero `matched` entry.
    touched: Vec<u32>,
    /// Per slot: the subset-hint mark it was last seen with.
    seen: Vec<u64>,
    seen_mark: u64,
    /// A large pool's sampled candidates (swapped with `candidates` while the sample is scored).
    sample: Vec<u32>,
    /// Scratch of the sample's draw.
    order: Vec<u32>,
    /// Scratch of the sample's draw: the pods it keeps, with their order of preference.
    kept: Vec<(u64, u32)>,
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
    filters: Filters,
    picker: Picker,
    endpoints: EndpointTable,
    inflight: InflightTable,
    prefix: PrefixIndex,
    /// Pool-wide learned rates (the cold-start priors) and typical request sizes.
    rates: PoolRates,
    scratch: Scratch,
    /// The other picker replicas' newest reports ([`crate::peers`]).
    peers: PeerTable,
    /// Endpoints a peer report touched (reused between reports).
    peer_scratch: Vec<SocketAddr>,
    /// Endpoints ejected as of the last count (may count one since removed, or whose ejection
    /// ended, until `readmit_at`).
    ejected: usize,
    /// When the next ejection ends (the count is taken again then).
    readmit_at: Timestamp,
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
            filters: Filters::new(&cfg),
            picker: Picker::new(cfg.policy),
            endpoints: EndpointTable::default(),
            inflight: InflightTable::default(),
            prefix: PrefixIndex::new(cfg.prefix),
            rates: PoolRates::new(
                cfg.rates.prefill_tokens_per_sec,
                cfg.rates.decode_tokens_per_sec,
            ),
            scratch,
            peers: PeerTable::default(),
            peer_scratch: Vec::new(),
            ejected: 0,
            readmit_at: Timestamp::ZERO,
            cfg,
        })
    }

    /// What an answer from `addr` to a request routed there says about it. The answer is counted
    /// in the endpoint's [`EndpointInfo::answers`] in any case; the rest needs
    /// `outlierDetection` configured (`None` otherwise, and for an endpoint not in the pool). Returns
    /// what was done when the answer completed a run of failures: the endpoint ejected (out of
    /// the candidates until the returned length has passed), or the ejection held back by
    /// `maxEjectionPercent`.
    pub fn observe_answer(
        &mut self,
        addr: SocketAddr,
        answer: Answer,
        now: Timestamp,
    ) -> Option<Ejection> {
        let slot = self.endpoints.slot_of(&addr)?;
        let Some(cfg) = self.cfg.outlier_detection else {
            self.endpoints.get_mut(slot)?.outlier.tally(answer);
            return None;
        };
        if answer == Answer::Neutral {
            self.endpoints.get_mut(slot)?.outlier.tally(answer);
            return None;
        }
        if self.ejected > 0 && now >= self.readmit_at {
            self.recount_ejected(now);
        }
        let pool = self.endpoints.len();
        let ejected = self.ejected;
        let ep = self.endpoints.get_mut(slot)?;
        let done = ep.outlier.observe(answer, now, &cfg, ejected, pool);
        if let Some(Ejection::Ejected { .. }) = done {
            let until = ep.outlier.ejected_until(now).unwrap_or(now);
            self.readmit_at = if self.ejected == 0 {
                until
            } else {
                self.readmit_at.min(until)
            };
            self.ejected += 1;
        }
        done
    }

    /// How many endpoints are ejected at `now`.
    pub fn ejected_endpoints(&mut self, now: Timestamp) -> usize {
        if self.ejected > 0 && now >= self.readmit_at {
            self.recount_ejected(now);
        }
        self.ejected
    }

    /// Counts the endpoints ejected at `now` and when the first of them returns.
    fn recount_ejected(&mut self, now: Timestamp) {
        let mut n = 0;
        let mut next: Option<Timestamp> = None;
        for ep in self.endpoints.iter() {
            if let Some(until) = ep.outlier.ejected_until(now) {
                n += 1;
                next = Some(next.map_or(until, |t| t.min(until)));
            }
        }
        self.ejected = n;
        self.readmit_at = next.unwrap_or(Timestamp::ZERO);
    }

    /// The configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Endpoints in the pool.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// True when the pool has no endpoint.
    pub fn is_empty(&self) -> bool {
        self.endpoints.len() == 0
    }

    /// Requests picked and not yet reported complete, failed or cancelled.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// The smoothed mean of the estimated prompt tokens of the requests this pool routed (each
    /// pick moves it 2% of the way to its request's; 512 before the first): the size the pick
    /// gives a queued request it knows nothing else of.
    pub fn mean_prompt_tokens(&self) -> f64 {
        self.rates.mean_prompt
    }

    /// Occupancy and estimated memory of the prefix index.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats()
    }

    /// Adds an endpoint, or updates the identity and labels of the one at `meta.addr` (keeping its
    /// metrics, learned rates and in-flight requests).
    pub fn upsert_endpoint(&mut self, meta: EndpointMeta) {
        let addr = meta.addr;
        let Upsert::Added(slot) = self.endpoints.upsert(meta) else {
            return;
        };
        let slots = self.endpoints.slot_count();
        if self.scratch.matched.len() < slots {
            self.scratch.matched.resize(slots, 0);
            self.scratch.seen.resize(slots, 0);
        }
        self.prefix.set_endpoint(slot, None);
        if !self.peers.is_empty() {
            self.resum_peers(&[addr]);
        }
    }

    /// Removes an endpoint. Its in-flight tickets stay valid to report but no longer count.
    /// Returns false when it was not in the pool.
    pub fn remove_endpoint(&mut self, addr: SocketAddr) -> bool {
        let Some((slot, state)) = self.endpoints.remove(addr) else {
            return false;
        };
        if let Some(ep) = state {
            ep.unlearn_from(&mut self.rates);
            if self.ejected > 0 && ep.outlier.until().is_some() {
                // It may be counted among the ejected: the count is taken again at the next
                // pick.
                self.readmit_at = Timestamp::ZERO;
            }
        }
        self.prefix.remove_endpoint(slot);
        true
    }

    /// Applies one metrics snapshot. Snapshots older than the one held are ignored (scrapes can
    /// finish out of order). Non-finite gauges are rejected; fractions are clamped to [0, 1].
    pub fn apply_metrics(&mut self, addr: SocketAddr, mut m: MetricsSnapshot) -> Result<(), Error> {
        let slot = self
            .endpoints
            .slot_of(&addr)
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
        let Some(ep) = self.endpoints.get_mut(slot) else {
            return Err(Error::UnknownEndpoint(addr));
        };
        if ep.sampled_at.is_some_and(|old| old > m.sampled_at) {
            return Ok(());
        }
        let old_capacity = ep.capacity;
        ep.set_metrics(m);
        ep.scrape = ScrapeState::Ok;
        ep.epoch = ep.epoch.wrapping_add(1);
        ep.since_requests = 0;
        ep.since_pending = 0;
        ep.since_pending_tokens = 0;
        let capacity = ep.capacity;
        if capacity != old_capacity {
            self.prefix.set_endpoint(slot, capacity);
        }
        if !self.peers.is_empty() {
            // The snapshot counts what the peers had routed before it, as it does our own.
            self.peers.snapshot_applied(&addr);
            self.resum_peers(&[addr]);
        }
        Ok(())
    }

    /// Records how the endpoint's scrapes are going. [`ScrapeState::Late`] keeps it a candidate
    /// on its last snapshot however old (with this gateway's requests since then added by
    /// in-flight accounting); [`ScrapeState::Failed`] removes it from the candidates at once,
    /// however recent that snapshot; [`ScrapeState::Ok`] leaves the age check to `maxMetricsAge`.
    /// A new snapshot ([`Scheduler::apply_metrics`]) sets `Ok` by itself.
    pub fn set_scrape_state(&mut self, addr: SocketAddr, state: ScrapeState) -> Result<(), Error> {
        let slot = self
            .endpoints
            .slot_of(&addr)
            .ok_or(Error::UnknownEndpoint(addr))?;
        if let Some(ep) = self.endpoints.get_mut(slot) {
            ep.scrape = state;
        }
        Ok(())
    }

    /// Records whether the endpoint's failing scrapes still reach the server (it is alive, its
    /// metrics are not usable). With `staleMetrics.mode: failOpen`, when no candidate has fresh
    /// metrics, the reachable ones keep receiving requests on in-flight accounting; unreachable
    /// ones are never routed on. A new snapshot makes the question moot (the pod is fresh).
    pub fn set_reachable(&mut self, addr: SocketAddr, reachable: bool) -> Result<(), Error> {
        let slot = self
            .endpoints
            .slot_of(&addr)
            .ok_or(Error::UnknownEndpoint(addr))?;
        if let Some(ep) = self.endpoints.get_mut(slot) {
            ep.reachable = reachable;
        }
        Ok(())
    }

    /// Forgets what was learned about the endpoint's speed (its prefill and decode rates), so the
    /// pool's prior applies until it has taught again. For a process that restarted: its old
    /// rates (or those learned from the requests that broke when it died) no longer describe
    /// it, and a pod that looks slow is sent no streamed request to prove otherwise. The LoRA
    /// adapters remembered as resident in its slots are forgotten too (a new process holds
    /// none but those its page shows running). Returns false when it is not in the pool.
    pub fn forget_learned_rates(&mut self, addr: SocketAddr) -> bool {
        let Some(ep) = self
            .endpoints
            .slot_of(&addr)
            .and_then(|slot| self.endpoints.get_mut(slot))
        else {
            return false;
        };
        ep.unlearn_from(&mut self.rates);
        ep.prefill.reset();
        ep.prefill_bulk.reset();
        ep.fixed_cost.reset();
        ep.decode.reset();
        ep.lora.forget_resident();
        true
    }

    /// A read-only view of one endpoint.
    pub fn endpoint(&self, addr: SocketAddr) -> Option<EndpointInfo> {
        let ep = self.endpoints.get(self.endpoints.slot_of(&addr)?)?;
        Some(EndpointInfo {
            meta: ep.cold.meta.clone(),
            metrics: ep.cold.metrics.clone(),
            inflight: ep.inflight,
            awaiting_first_token: ep.pending,
            awaiting_first_token_tokens: ep.pending_tokens,
            peer_inflight: ep.peer.inflight,
            peer_awaiting_first_token: ep.peer.pending,
            prefill_tokens_per_sec: ep.prefill.get(),
            bulk_prefill_tokens_per_sec: ep.prefill_bulk.get(),
            fixed_cost_secs: ep.fixed_cost.get(),
            decode_tokens_per_sec: ep.decode.get(),
            cold_prefill_tokens_per_sec: ep
                .prefill_at_its_speed(self.cfg.rates.prefill_tokens_per_sec),
            cold_decode_tokens_per_sec: ep
                .decode_at_its_speed(self.cfg.rates.decode_tokens_per_sec),
            rate_samples: ep.prefill.samples(),
            picked: ep.picked,
            scrape: ep.scrape,
            reachable: ep.reachable,
            ejected_until: ep.outlier.until(),
            answers: ep.outlier.counts(),
            failure_interval: ep.outlier.judged(),
        })
    }

    /// The endpoints in the pool, in no particular order.
    pub fn endpoints(&self) -> impl Iterator<Item = &EndpointMeta> + '_ {
        self.endpoints.iter().map(|e| &e.cold.meta)
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
        if let Some(ep) = self.endpoints.current_mut(e.slot, e.slot_generation) {
            inflight::leave_prefill(ep, &e);
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
            self.rates.observe_output(usage.output_tokens);
        }
        let min_alpha = self.cfg.rates.min_alpha;
        let Some(first) = e.first_token_at else {
            return true;
        };
        let Some(ep) = self.endpoints.current_mut(e.slot, e.slot_generation) else {
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
        ep.learn_prefill(work / ttft, min_alpha, &mut self.rates);
        if work >= crate::rates::MIN_PREFILL_SAMPLE_TOKENS {
            // The work's own time: the fixed cost per request, once learned, is not the pod's
            // speed (a 2,000-token prompt on the emulated H100 is 20 ms of it in 90).
            let fixed = ep.fixed_cost.get().unwrap_or(0.0);
            let prefill = (ttft - fixed).max(ttft * crate::rates::MIN_PREFILL_SHARE);
            ep.prefill_bulk.update(work / prefill, min_alpha);
        }
        if work <= crate::rates::MAX_FIXED_COST_SAMPLE_TOKENS {
            // Without a bulk rate, the configured prior: the pool's typical rate is learned
            // from these short samples too, and would take their whole time as prefill.
            let rate = ep
                .prefill_bulk
                .get()
                .unwrap_or(self.cfg.rates.prefill_tokens_per_sec);
            let fixed = (ttft - work / rate.max(1.0)).max(crate::rates::MIN_FIXED_COST_SECS);
            ep.fixed_cost.update(fixed, min_alpha);
        }
        let mut decode = None;
        // Decode: tokens after the first, over the time after the first.
        if usage.output_tokens > 1 {
            let dt = now.saturating_since(first).as_secs_f64();
            if dt > 0.0 {
                let rate = f64::from(usage.output_tokens - 1) / dt;
                ep.learn_decode(rate, min_alpha, &mut self.rates);
                decode = Some(rate);
            }
        }
        // For the peer replicas, once a shell exchanges rate samples ([`crate::peers`]).
        let addr = ep.cold.meta.addr;
        self.peers.learned(addr, work / ttft, decode);
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
        let Some(slot) = self.endpoints.slot_of(&addr) else {
            return false;
        };
        let Some((&mut old, _)) = self.inflight.get_with_blocks(ticket) else {
            return false;
        };
        if old.slot == slot && self.endpoints.generation(slot) == old.slot_generation {
            return true;
        }
        if let Some(ep) = self.endpoints.current_mut(old.slot, old.slot_generation) {
            inflight::uncharge(ep, &old);
        }
        let generation = self.endpoints.generation(slot);
        let Some(ep) = self.endpoints.get_mut(slot) else {
            return false;
        };
        let mut e = old;
        e.slot = slot;
        e.slot_generation = generation;
        e.epoch = ep.epoch;
        inflight::charge(ep, &mut e);
        if let Some((entry, blocks)) = self.inflight.get_with_blocks(ticket) {
            // The prompt's blocks go where the request is served: left on the endpoint that
            // failed, they would draw the next requests of that prefix back to it.
            if !blocks.is_empty() {
                self.prefix.withdraw(old.slot, blocks, old.prefix);
                e.prefix = self.prefix.insert(slot, blocks);
            }
            *entry = e;
        }
        true
    }

    fn release(&mut self, ticket: Ticket) -> Option<Entry> {
        let e = self.inflight.release(ticket)?;
        if let Some(ep) = self.endpoints.current_mut(e.slot, e.slot_generation) {
            inflight::uncharge(ep, &e);
        }
        Some(e)
    }

    // ---- the pipeline ----

    fn pick_inner<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        now: Timestamp,
        rng: &mut R,
        mut ex: Option<&mut Explanation>,
    ) -> Result<Decision, Rejection> {
        // Candidates: the subset hint (never relaxed) or the whole pool.
        if self.ejected > 0 && now >= self.readmit_at {
            self.recount_ejected(now);
        }
        let sc = &mut self.scratch;
        view::collect_candidates(
            &self.endpoints,
            req,
            &mut sc.seen,
            &mut sc.seen_mark,
            &mut sc.candidates,
        );
        if let Some(ex) = ex.as_deref_mut() {
            ex.considered = sc.candidates.len();
        }
        if self.ejected > 0 {
            view::drop_ejected(&self.endpoints, now, &mut sc.candidates, ex.as_deref_mut());
        }
        if sc.candidates.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        // The prompt's blocks and each candidate's matched prefix.
        let scored = self.cfg.policy == Policy::Scored;
        let use_prefix =
            scored && (self.cfg.weights.prefix > 0.0 || self.cfg.weights.estimated_wait > 0.0);
        // The last pick's matches, zeroed here rather than at its end: it may return early.
        for t in sc.touched.drain(..) {
            if let Some(m) = sc.matched.get_mut(t as usize) {
                *m = 0;
            }
        }
        sc.hashes.clear();
        if use_prefix && !req.prompt.is_empty() {
            let seed = request_seed(req.model, req.lora_adapter, req.cache_salt);
            hash_blocks(
                seed,
                req.prompt,
                self.cfg.prefix.block_chars as usize,
                self.cfg.prefix.max_blocks as usize,
                &mut sc.hashes,
            );
        }
        if let Some(ex) = ex.as_deref_mut() {
            ex.prompt_blocks = sc.hashes.len();
        }
        if !sc.hashes.is_empty() {
            self.prefix
                .match_prefix(&sc.hashes, &mut sc.matched, &mut sc.touched);
        }
        // Exact matches from the engines' KV events: `matched` is counted in prompt tokens for
        // this request (the approximate matches rescaled), so both kinds compare on one scale.
        let mut prompt_units = sc.hashes.len();
        if use_prefix
            && let Some(cached) = req.cached.filter(|c| !c.is_empty())
            && req.prompt_tokens > 0
        {
            let tokens = u64::from(req.prompt_tokens);
            let blocks = sc.hashes.len() as u64;
            for &t in &sc.touched {
                if let Some(m) = sc.matched.get_mut(t as usize) {
                    *m = (u64::from(*m) * tokens / blocks.max(1)).min(tokens) as u32;
                }
            }
            let mut exact = 0usize;
            for (addr, held) in cached {
                let Some(slot) = self.endpoints.slot_of(addr) else {
                    continue;
                };
                if let Some(m) = sc.matched.get_mut(slot as usize) {
                    if *m == 0 {
                        sc.touched.push(slot);
                    }
                    *m = (*held).min(req.prompt_tokens);
                    exact += 1;
                }
            }
            prompt_units = req.prompt_tokens as usize;
            if let Some(ex) = ex.as_deref_mut() {
                ex.exact_prefix = exact;
            }
        }
        // Large pools: score a random sample first (`candidateSample`, `crate::sample`); what the
        // sample cannot take goes to every candidate.
        let k = self.cfg.candidate_sample;
        if scored && sample::applies(k, sc.candidates.len()) {
            let adapter_hash = req.lora_adapter.map_or(0, adapter_hash);
            sample::draw(
                &self.endpoints,
                &sc.candidates,
                &sc.matched,
                req.lora_adapter.map(|a| (a, adapter_hash)),
                k as usize,
                rng,
                &mut sc.order,
                &mut sc.kept,
                &mut sc.sample,
            );
            let all = sc.candidates.len();
            std::mem::swap(&mut sc.candidates, &mut sc.sample);
            if let Some(ex) = ex.as_deref_mut() {
                ex.considered = sc.candidates.len();
                ex.sampled_from = all;
            }
            let picked = self.decide(
                req,
                now,
                rng,
                ex.as_deref_mut(),
                scored,
                use_prefix,
                prompt_units,
                true,
            );
            let sc = &mut self.scratch;
            std::mem::swap(&mut sc.candidates, &mut sc.sample);
            if picked.is_ok() {
                return picked;
            }
            if let Some(ex) = ex.as_deref_mut() {
                ex.considered = sc.candidates.len();
                ex.sampled_from = 0;
                ex.filtered.clear();
                ex.reserve_held.clear();
                ex.candidates.clear();
            }
            return self
                .decide(req, now, rng, ex, scored, use_prefix, prompt_units, false)
                .map(|d| Decision {
                    sample_fallback: true,
                    ..d
                });
        }
        self.decide(req, now, rng, ex, scored, use_prefix, prompt_units, false)
    }

    /// Filters, views, admission, scoring and the pick over `scratch.candidates` (the pool, or
    /// with `sampled` a random sample of it). A sampled pick returns an error instead of falling
    /// back (all-ready, fail-open) or shedding, and the caller then picks over every candidate.
    #[allow(clippy::too_many_arguments, reason = "the pick's per-request state")]
    fn decide<R: Rng + ?Sized>(
        &mut self,
        req: &RequestContext<'_>,
        now: Timestamp,
        rng: &mut R,
        mut ex: Option<&mut Explanation>,
        scored: bool,
        use_prefix: bool,
        prompt_units: usize,
        sampled: bool,
    ) -> Result<Decision, Rejection> {
        let sc = &mut self.scratch;
        // Endpoint filters and views.
        let cx = FilterContext {
            request: req,
            now,
            adapter_hash: req.lora_adapter.map_or(0, adapter_hash),
        };
        let src = Sources {
            table: &self.endpoints,
            filters: &self.filters,
            rates: &self.rates,
            cfg: &self.cfg,
            matched: &sc.matched,
            prompt_blocks: prompt_units,
            peers: !self.peers.is_empty(),
        };
        let fresh = view::build(
            &src,
            &cx,
            &sc.candidates,
            true,
            &mut sc.views,
            ex.as_deref_mut(),
        );
        if sampled && sc.views.is_empty() {
            // Nothing in the sample passed the filters: the caller tries every candidate.
            return Err(Rejection::NoEndpoints);
        }
        // Freshness is never relaxed: a pod whose scrapes fail is most likely down, and routing
        // on its last numbers turns an outage into upstream errors. The fallback relaxes LoRA only.
        let none_fresh = fresh == 0 && self.filters.freshness.is_some();
        // Fail-open (`staleMetrics`): no fresh candidate, but some still answer.
        let mut fail_open = false;
        let mut capped = false;
        if none_fresh && let Some(cap) = self.cfg.stale_metrics.fail_open_cap() {
            match stale::build(
                &src,
                &cx,
                &sc.candidates,
                cap,
                &mut sc.views,
                ex.as_deref_mut(),
            ) {
                stale::Outcome::Views => fail_open = true,
                stale::Outcome::Capped => capped = true,
                stale::Outcome::NoneReachable => {}
            }
            if let Some(ex) = ex.as_deref_mut() {
                ex.fail_open = fail_open || capped;
            }
        }
        if sc.views.is_empty()
            && !none_fresh
            && self.cfg.on_all_filtered == AllFilteredAction::AllReady
        {
            view::build(&src, &cx, &sc.candidates, false, &mut sc.views, None);
            if let Some(ex) = ex.as_deref_mut() {
                ex.fell_back_to_all_ready = true;
            }
        }
        if capped {
            // Every pod that answers has its fail-open share: shed, as a saturated pool is.
            return Err(Rejection::Shed {
                retry_after: self.cfg.retry_after_min,
            });
        }
        if sc.views.is_empty() {
            return Err(if none_fresh {
                Rejection::Unavailable {
                    retry_after: self.cfg.retry_after_min,
                }
            } else {
                Rejection::NoEndpoints
            });
        }
        // Admission, the saturation filter and the scorers (scored policy only), then the pick.
        let mut scores = scored && !fail_open;
        let mut shed = None;
        let admitted = if scores {
            admission::admit(
                &self.cfg,
                req.priority,
                req.queue_when_saturated,
                req.reserved_endpoints,
                &mut sc.views,
                &self.endpoints,
                &self.rates,
                ex.as_deref_mut(),
            )
        } else {
            Ok(false)
        };
        let reserve_held = admitted == Ok(true);
        if let Err(rejection) = admitted {
            if sampled {
                // The sample would shed it: the caller tries every candidate.
                return Err(rejection);
            }
            // Every fresh candidate would shed it. Pods whose scrapes fail but which still answer
            // are capacity of unknown load, not none: in fail-open they take the request under
            // the cap (a queueing caller waits for a pod with headroom instead).
            let cap = self
                .cfg
                .stale_metrics
                .fail_open_cap()
                .filter(|_| !req.queue_when_saturated && self.filters.freshness.is_some());
            // Explained: the fresh pods that would have shed it, listed if a pod without a page
            // takes the request instead.
            let shedding: Vec<std::net::SocketAddr> = if ex.is_some() {
                sc.views
                    .iter()
                    .filter_map(|v| self.endpoints.get(v.slot))
                    .map(|ep| ep.cold.meta.addr)
                    .collect()
            } else {
                Vec::new()
            };
            let outcome = cap.map(|cap| {
                stale::build(
                    &src,
                    &cx,
                    &sc.candidates,
                    cap,
                    &mut sc.views,
                    ex.as_deref_mut(),
                )
            });
            if outcome == Some(stale::Outcome::Views) {
                fail_open = true;
                scores = false;
                if let Some(ex) = ex.as_deref_mut() {
                    ex.fail_open = true;
                    ex.filtered.extend(shedding.into_iter().map(|addr| {
                        crate::explain::FilteredOut {
                            addr,
                            filter: stale::ADMISSION,
                        }
                    }));
                }
            } else {
                shed = Some(rejection);
            }
        }
        if sampled && (reserve_held || sc.views.iter().all(|v| v.saturated)) {
            // Every sampled pod is saturated: the pool may have pods with headroom outside the
            // sample, which the caller's full pick finds. Or the headroom reservation held clear
            // pods back: it counts the clear pods left, and the sample's few say nothing of the
            // pool's (a pool with many would let this request take one).
            return Err(Rejection::NoEndpoints);
        }
        self.rates.observe_prompt(req.prompt_tokens);
        if let Some(rejection) = shed {
            return Err(rejection);
        }
        if fail_open {
            // No usable load numbers: least in flight, prefix and LoRA breaking ties.
            for v in sc.views.iter_mut() {
                v.total = stale::score(v);
            }
            if let Some(ex) = ex.as_deref_mut() {
                stale::explain(&sc.views, &self.endpoints, now, ex);
            }
        } else if scores {
            self.filters
                .saturation
                .apply(&cx, &mut sc.views, &self.endpoints, ex.as_deref_mut());
            scorer::score_all(&self.scorers, &mut sc.views, &self.endpoints, now, ex);
        }
        let k = usize::from(self.cfg.returned_endpoints);
        let ranking = if fail_open {
            crate::picker::top_k(&sc.views, k, rng, |v| v.total)
        } else {
            self.picker.pick(&mut sc.views, k, rng)
        };
        let v = sc.views[ranking.first()];
        let mut endpoints = Ranked::new();
        for &i in ranking.as_slice() {
            if let Some(ep) = self.endpoints.get(sc.views[i].slot) {
                endpoints.push(ep.cold.meta.addr);
            }
        }
        // Charge the first choice and remember the prompt's blocks there.
        let slot_generation = self.endpoints.generation(v.slot);
        let Some(ep) = self.endpoints.get_mut(v.slot) else {
            return Err(Rejection::NoEndpoints);
        };
        let mut entry = Entry {
            generation: 0,
            phase: Phase::Prefill,
            slot: v.slot,
            slot_generation,
            epoch: ep.epoch,
            picked_at: now,
            first_token_at: None,
            prefill_tokens: v.own_tokens.round() as u32,
            total_tokens: req.prompt_tokens.saturating_add(req.output_tokens),
            queued_tokens: v.queued_tokens,
            adapter: cx.adapter_hash,
            adapter_counted: false,
            prefix: Recorded::NOTHING,
        };
        inflight::charge(ep, &mut entry);
        ep.picked += 1;
        let blocks: &[u64] = if use_prefix { &sc.hashes } else { &[] };
        if !blocks.is_empty() {
            entry.prefix = self.prefix.insert(v.slot, blocks);
        }
        let ticket = self.inflight.insert(entry, blocks);
        Ok(Decision {
            endpoints,
            ticket,
            fail_open,
            sample_fallback: false,
        })
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests;

mod peers;
