//! Per-endpoint state: the hot fields every pick reads, pre-digested at snapshot time, and the
//! cold identity and raw snapshot kept out of line (crate-internal).

use crate::endpoint::{EndpointMeta, MetricsSnapshot, ScrapeState, Timestamp};
use crate::gpu::SpeedFactors;
use crate::lora::{self, AdapterInflight, LoraHot};
use crate::peers::PeerSum;
use crate::rates::{LogEwma, PoolRates};

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
    /// The same, from first tokens that waited for at least
    /// [`MIN_PREFILL_SAMPLE_TOKENS`](crate::rates::MIN_PREFILL_SAMPLE_TOKENS) of work only: the
    /// pod's speed on long prompts without its fixed cost per request, which `prefill` keeps
    /// (every queued request pays it); once `fixed_cost` is learned, each sample's time is taken
    /// without it. Not shared with the pool's typical rate or the peers.
    pub(crate) prefill_bulk: LogEwma,
    /// Its fixed cost per request, seconds, from first tokens that waited for at most
    /// [`MAX_FIXED_COST_SAMPLE_TOKENS`](crate::rates::MAX_FIXED_COST_SAMPLE_TOKENS) of work:
    /// what a short prompt's first token takes whatever its length. Not shared either.
    pub(crate) fixed_cost: LogEwma,
    /// Learned per-request decode rate, tokens/s.
    pub(crate) decode: LogEwma,
    /// Its GPU type's speed against the reference, read when it joins ([`crate::gpu`]).
    pub(crate) speed: SpeedFactors,
    pub(crate) lora: LoraHot,
    /// In-flight requests still waiting for their first token.
    pub(crate) pending: u32,
    /// KV capacity in tokens, when reported.
    pub(crate) capacity: Option<u64>,
    /// Requests picked onto this endpoint, ever.
    pub(crate) picked: u64,
    /// How its scrapes are going, as the shell reports it (see [`ScrapeState`]).
    pub(crate) scrape: ScrapeState,
    /// While its scrapes fail: whether they still reach the server (it answers, its metrics do
    /// not), as the shell reports it. Such a pod may be routed on in fail-open
    /// ([`crate::config::StaleMetrics`]); an unreachable one never.
    pub(crate) reachable: bool,
    /// The other picker replicas' load on it, summed ([`crate::peers`]); zero without peers.
    pub(crate) peer: PeerSum,
    /// This gateway's requests in flight per LoRA adapter: which running adapter's slot frees
    /// first ([`AdapterInflight`]).
    pub(crate) adapters: AdapterInflight,
    /// Its failed answers in a row and ejections (`outlierDetection`, [`crate::outlier`]).
    pub(crate) outlier: crate::outlier::EndpointOutlier,
    pub(crate) cold: Box<Cold>,
}

impl EndpointState {
    pub(crate) fn new(meta: EndpointMeta) -> Self {
        let speed = SpeedFactors::of(meta.gpu.as_deref());
        EndpointState {
            speed,
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
            prefill_bulk: LogEwma::default(),
            fixed_cost: LogEwma::default(),
            decode: LogEwma::default(),
            picked: 0,
            scrape: ScrapeState::Ok,
            reachable: false,
            peer: PeerSum::default(),
            adapters: AdapterInflight::default(),
            outlier: crate::outlier::EndpointOutlier::default(),
        }
    }

    /// Learns a prefill-rate sample (tokens/s) and updates the pool's typical speed, which is
    /// kept per reference GPU.
    pub(crate) fn learn_prefill(&mut self, rate: f64, min_alpha: f64, pool: &mut PoolRates) {
        let (before, after) = self.prefill.update(rate, min_alpha);
        let f = self.speed.ln_prefill;
        pool.prefill_changed(before.map(|b| b - f), after - f);
    }

    /// Learns a per-request decode-rate sample (tokens/s), as [`Self::learn_prefill`].
    pub(crate) fn learn_decode(&mut self, rate: f64, min_alpha: f64, pool: &mut PoolRates) {
        let (before, after) = self.decode.update(rate, min_alpha);
        let f = self.speed.ln_decode;
        pool.decode_changed(before.map(|b| b - f), after - f);
    }

    /// Takes this endpoint's learned rates out of the pool's typical speed (it leaves the pool,
    /// or its rates are forgotten).
    pub(crate) fn unlearn_from(&self, pool: &mut PoolRates) {
        pool.forget(
            self.prefill.ln().map(|l| l - self.speed.ln_prefill),
            self.decode.ln().map(|l| l - self.speed.ln_decode),
        );
    }

    /// Its learned prefill rate, else the pool's typical rate scaled to its GPU.
    pub(crate) fn prefill_rate(&self, pool: &PoolRates) -> f64 {
        self.prefill
            .get()
            .unwrap_or_else(|| self.prefill_at_its_speed(pool.prefill_prior()))
    }

    /// A prefill rate of the reference GPU scaled to its GPU.
    pub(crate) fn prefill_at_its_speed(&self, reference: f64) -> f64 {
        reference / self.speed.inv_prefill
    }

    /// Its learned decode rate, else the pool's typical rate scaled to its GPU.
    pub(crate) fn decode_rate(&self, pool: &PoolRates) -> f64 {
        self.decode
            .get()
            .unwrap_or_else(|| self.decode_at_its_speed(pool.decode_prior()))
    }

    /// A per-request decode rate of the reference GPU scaled to its GPU.
    pub(crate) fn decode_at_its_speed(&self, reference: f64) -> f64 {
        reference * self.speed.decode
    }

    /// Installs a (validated) snapshot and its pre-digested hot fields.
    pub(crate) fn set_metrics(&mut self, m: MetricsSnapshot) {
        self.sampled_at = Some(m.sampled_at);
        self.waiting = m.waiting;
        self.running = m.running;
        self.kv = m.kv_cache_usage;
        self.capacity = m.cache.map(|c| c.capacity_tokens()).filter(|t| *t > 0);
        self.inv_capacity = self.capacity.map_or(0.0, |c| 1.0 / c as f64);
        self.lora = self.lora.next(m.lora.as_ref());
        self.cold.metrics = Some(m);
    }

    /// Whether the endpoint may be routed on its metrics: sampled at most `max_age_nanos` before
    /// `now`; or older while its scrape is late (the server is alive and slow: its last page
    /// stands, aged, and this gateway's requests since then are added by in-flight accounting);
    /// never while its scrapes fail.
    pub(crate) fn fresh(&self, now: Timestamp, max_age_nanos: u64) -> bool {
        match self.scrape {
            ScrapeState::Failed => false,
            ScrapeState::Late => self.sampled_at.is_some(),
            ScrapeState::Ok => self
                .sampled_at
                .is_some_and(|t| now.as_nanos().saturating_sub(t.as_nanos()) <= max_age_nanos),
        }
    }

    /// LoRA affinity for the adapter `name` (hash `hash`) as the pod stands now: its page, and the
    /// adapters sent here since ([`LoraHot::affinity_with`]); `None` when the pod reports no LoRA
    /// state.
    pub(crate) fn lora_affinity(&self, name: &str, hash: u64) -> Option<f64> {
        if !self.lora.known {
            return None;
        }
        if self.lora.overflow {
            let l = self.cold.metrics.as_ref().and_then(|m| m.lora.as_ref())?;
            return Some(lora::affinity(l, name));
        }
        if self.since_requests == 0 {
            // Nothing sent here since the page was read: it shows every slot as it stands (and
            // the per-adapter counts, another cache line, stay unread).
            return Some(self.lora.affinity(hash));
        }
        Some(self.lora.affinity_with(hash, &self.adapters))
    }
}
