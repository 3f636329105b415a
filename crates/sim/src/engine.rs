//! The engine: one pod's vLLM-like continuous-batching state machine, with no clock of its own.
//!
//! Time is passed in. A step is planned with [`Engine::start_step`] (scheduling, KV allocation and
//! its duration from the [`Profile`]) and applied with [`Engine::finish_step`] at its end time, so
//! the live server (tokio timers) and the discrete-event fleet (a virtual clock) drive the very same
//! code. When a pod only decodes, the fleet may ask for a *bulk* step: `k` decode iterations priced
//! in closed form and applied at once, cut short by [`Engine::interrupt_at`] when a request
//! arrives. Live serving uses single steps so that every token can be streamed.
//!
//! Scheduling follows vLLM V1: running requests first (decode one token each, or the next chunk of a
//! prefill) within `max_num_batched_tokens`; if the KV cache cannot grow, the last running request
//! is preempted (recomputed later); then waiting requests are admitted in order while the batch has
//! room, their cached prompt prefix taken from the prefix cache.

mod kv;

pub use kv::KvEvent;
pub(crate) use kv::PassThrough;

use std::collections::VecDeque;
use std::sync::Arc;

use crate::SimError;
use crate::histogram::{
    Histogram, ITERATION_BUCKETS, ITL_BUCKETS, LATENCY_BUCKETS, N_BUCKETS, PREEMPTION_BUCKETS,
    TOKEN_BUCKETS, TTFT_BUCKETS,
};
use crate::profile::{Profile, StepShape, pairs};
use crate::tokens::{Prompt, lora_seed, prompt_block_hashes, salt_seed, synthetic_block_hash};
use kv::BlockPool;

/// A request as the engine sees it.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Caller's id, echoed in events and the completion record.
    pub id: u64,
    /// Arrival time (s); the request is not scheduled before it.
    pub arrival: f64,
    /// The prompt.
    pub prompt: Prompt,
    /// Output tokens to generate (the emulator always generates exactly this many).
    pub max_tokens: u32,
    /// LoRA adapter, as an index into the engine's adapter table.
    pub lora: Option<u16>,
    /// The request's `cache_salt`: its prefix-cache blocks are its salt's alone
    /// ([`crate::tokens::salt_seed`]).
    pub cache_salt: Option<Arc<str>>,
}

/// What happened to one finished request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    /// Caller's id.
    pub id: u64,
    /// Pod index in the fleet (0 when the engine runs alone).
    pub pod: u32,
    /// Arrival time (s).
    pub arrival: f64,
    /// When the request first entered the running batch (s).
    pub scheduled: f64,
    /// When the first output token was produced (s).
    pub first_token: f64,
    /// When the last output token was produced (s).
    pub last_token: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Times the request was preempted and recomputed.
    pub preemptions: u32,
}

impl Completion {
    /// Time to first token (s).
    pub fn ttft(&self) -> f64 {
        self.first_token - self.arrival
    }

    /// Mean inter-token latency over the decode phase (s); 0 with a single output token.
    pub fn mean_itl(&self) -> f64 {
        if self.output_tokens > 1 {
            (self.last_token - self.first_token) / f64::from(self.output_tokens - 1)
        } else {
            0.0
        }
    }
}

/// Receives what a step produced.
pub trait Sink {
    /// Output token `index` (1-based) of request `id` was produced at `t`. Only single steps report
    /// tokens one by one; bulk steps report completions only.
    fn token(&mut self, id: u64, index: u32, t: f64) {
        let _ = (id, index, t);
    }
    /// A request finished.
    fn completed(&mut self, completion: Completion);
}

impl Sink for Vec<Completion> {
    fn completed(&mut self, completion: Completion) {
        self.push(completion);
    }
}

/// The engine-neutral state a metrics scraper would see.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineView {
    /// Requests waiting (queued or preempted).
    pub waiting: u32,
    /// Requests in the running batch.
    pub running: u32,
    /// Fraction of KV blocks referenced by requests, 0–1.
    pub kv_usage: f64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks in the pool.
    pub num_blocks: u64,
    /// Prompt tokens looked up in the prefix cache (cumulative).
    pub prefix_queries: u64,
    /// Prompt tokens found in the prefix cache (cumulative, whole blocks).
    pub prefix_hits: u64,
    /// LoRA adapter slots.
    pub max_loras: u32,
    /// Adapters with requests in the running batch.
    pub running_loras: Vec<Arc<str>>,
    /// Adapters with requests waiting.
    pub waiting_loras: Vec<Arc<str>>,
}

/// Cumulative counters and histograms (the histograms only when asked for).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Prompt tokens of admitted requests, computed locally.
    pub prompt_tokens_computed: u64,
    /// Prompt tokens of admitted requests, served from the prefix cache.
    pub prompt_tokens_cached: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Requests finished.
    pub requests_finished: u64,
    /// Requests aborted (client went away).
    pub requests_aborted: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prefix-cache queries (tokens).
    pub prefix_queries: u64,
    /// Prefix-cache hits (tokens).
    pub prefix_hits: u64,
    /// Engine iterations (a bulk step counts each of its iterations).
    pub steps: u64,
    /// Steps planned one iteration at a time.
    pub single_steps: u64,
    /// Bulk steps planned (each covering several decode iterations).
    pub bulk_steps: u64,
    /// LoRA adapter loads.
    pub lora_loads: u64,
    /// Cached KV blocks evicted.
    pub evictions: u64,
    /// Histograms, if recorded.
    pub histograms: Option<Box<Histograms>>,
}

/// The latency and size histograms a vLLM page shows.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Histograms {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub inference: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub prompt_tokens: Histogram,
    pub generation_tokens: Histogram,
    pub max_tokens: Histogram,
    pub params_n: Histogram,
    pub iteration_tokens: Histogram,
    pub num_preemptions: Histogram,
    pub prefill_kv_computed: Histogram,
}

impl Histograms {
    /// Empty histograms with vLLM's bucket bounds.
    pub fn empty() -> Self {
        Histograms {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue: Histogram::new(LATENCY_BUCKETS),
            inference: Histogram::new(LATENCY_BUCKETS),
            prefill: Histogram::new(LATENCY_BUCKETS),
            decode: Histogram::new(LATENCY_BUCKETS),
            prompt_tokens: Histogram::new(TOKEN_BUCKETS),
            generation_tokens: Histogram::new(TOKEN_BUCKETS),
            max_tokens: Histogram::new(TOKEN_BUCKETS),
            params_n: Histogram::new(N_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            num_preemptions: Histogram::new(PREEMPTION_BUCKETS),
            prefill_kv_computed: Histogram::new(TOKEN_BUCKETS),
        }
    }
}

#[derive(Debug)]
struct Seq {
    id: u64,
    uid: u64,
    arrival: f64,
    prompt_len: u32,
    max_tokens: u32,
    group: u64,
    shared_tokens: u32,
    hashes: Option<Box<[u64]>>,
    /// The chain seed of this request's block hashes: the engine's, mixed with the adapter's
    /// name for a LoRA request and with its `cache_salt` (see [`crate::tokens::lora_seed`],
    /// [`crate::tokens::salt_seed`]).
    seed: u64,
    lora: Option<u16>,
    computed: u32,
    generated: u32,
    scheduled: u32,
    held_hashed: u32,
    plain_blocks: u32,
    cached_tokens: u32,
    admitted_once: bool,
    first_scheduled: f64,
    first_token: f64,
    last_token: f64,
    preemptions: u32,
}

impl Seq {
    fn num_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }

    fn full_prompt_blocks(&self, bs: u32) -> u32 {
        match &self.hashes {
            Some(h) => u32::try_from(h.len())
                .unwrap_or(u32::MAX)
                .min(self.prompt_len / bs),
            None => self.prompt_len / bs,
        }
    }

    /// Prompt blocks that are published in the prefix cache: every full block of a text prompt;
    /// only the shared part of a synthetic one (its unique tail can never match anything).
    fn publishable_blocks(&self, bs: u32) -> u32 {
        match &self.hashes {
            Some(_) => self.full_prompt_blocks(bs),
            None => self.full_prompt_blocks(bs).min(self.shared_tokens / bs),
        }
    }

    fn block_hash(&self, bs: u32, i: u32) -> u64 {
        match &self.hashes {
            Some(h) => h.get(i as usize).copied().unwrap_or(0),
            None => {
                let shared = (u64::from(i) + 1) * u64::from(bs) <= u64::from(self.shared_tokens);
                let key = if shared { self.group } else { self.uid };
                synthetic_block_hash(self.seed, key, i, shared)
            }
        }
    }

    fn is_decode(&self) -> bool {
        self.generated >= 1
            && self.computed + 1 == self.num_tokens()
            && self.computed >= self.prompt_len
    }
}

#[derive(Debug, Clone, Copy)]
struct Bulk {
    /// Iterations in the segment.
    k: u32,
    /// Duration of the first iteration (s).
    a: f64,
    /// Growth of the duration per iteration (s).
    b: f64,
    /// Blocks reserved for the whole segment at its start.
    reserved: u64,
}

impl Bulk {
    fn elapsed(&self, j: u32) -> f64 {
        let j = f64::from(j);
        j * self.a + self.b * j * (j - 1.0) / 2.0
    }

    /// Smallest j in 1..=k with `elapsed(j) >= x` (k if none): the iteration in progress at `x`.
    fn boundary_at_or_after(&self, x: f64) -> u32 {
        if self.elapsed(self.k) <= x {
            return self.k;
        }
        let (a, b) = (self.a, self.b);
        let root = if b.abs() < 1e-18 {
            x / a
        } else {
            let p = a - b / 2.0;
            (-p + (p * p + 2.0 * b * x).max(0.0).sqrt()) / b
        };
        let mut j = if root.is_finite() {
            root.ceil().clamp(1.0, f64::from(self.k)) as u32
        } else {
            1
        };
        while j > 1 && self.elapsed(j - 1) >= x {
            j -= 1;
        }
        while j < self.k && self.elapsed(j) < x {
            j += 1;
        }
        j
    }

    /// Iterations completed by `x` after the segment's start.
    fn done_by(&self, x: f64) -> u32 {
        let j = self.boundary_at_or_after(x);
        if self.elapsed(j) <= x { j } else { j - 1 }
    }
}

#[derive(Debug, Clone, Copy)]
struct Step {
    start: f64,
    end: f64,
    bulk: Option<Bulk>,
}

/// One pod's engine.
#[derive(Debug)]
pub struct Engine {
    profile: Arc<Profile>,
    bs: u32,
    seed: u64,
    next_uid: u64,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pool: BlockPool,
    adapters: Vec<Arc<str>>,
    max_loras: u32,
    /// Resident adapters and the step they were last used in (LRU).
    resident: Vec<(u16, u64)>,
    /// Running requests per adapter.
    lora_running: Vec<u32>,
    /// Waiting requests per adapter.
    lora_waiting: Vec<u32>,
    /// The chain seed of each adapter's requests ([`crate::tokens::lora_seed`]), computed once.
    lora_seeds: Vec<u64>,
    step: Option<Step>,
    slowdown: f64,
    stats: Stats,
    hash_buf: Vec<u64>,
    /// KV-cache events with the time the engine publishes them (the end of the step they belong
    /// to, as vLLM publishes each step's batch), oldest first; empty unless recorded.
    kv_events: VecDeque<(f64, KvEvent)>,
}

impl Engine {
    /// An idle engine for `profile`, serving `adapters` with `max_loras` slots. `seed` keys the
    /// prefix hashes (use [`crate::tokens::chain_seed`] of the model so pods of one model agree).
    pub fn new(
        profile: Arc<Profile>,
        adapters: Vec<Arc<str>>,
        max_loras: u32,
        seed: u64,
        histograms: bool,
    ) -> Self {
        let n = adapters.len();
        let lora_seeds = adapters.iter().map(|a| lora_seed(seed, Some(a))).collect();
        Engine {
            bs: profile.block_size.max(1),
            pool: BlockPool::new(profile.num_blocks()),
            profile,
            seed,
            next_uid: 1,
            waiting: VecDeque::new(),
            running: Vec::new(),
            adapters,
            max_loras,
            resident: Vec::new(),
            lora_running: vec![0; n],
            lora_waiting: vec![0; n],
            lora_seeds,
            step: None,
            slowdown: 1.0,
            stats: Stats {
                histograms: histograms.then(|| Box::new(Histograms::empty())),
                ..Stats::default()
            },
            hash_buf: Vec::new(),
            kv_events: VecDeque::new(),
        }
    }

    /// Starts (or stops) recording the KV-cache events vLLM would publish (see [`KvEvent`]).
    /// Off by default: nothing is recorded or allocated for them.
    pub fn record_kv_events(&mut self, on: bool) {
        self.pool.record_events(on);
        if !on {
            self.kv_events.clear();
        }
    }

    /// Moves the KV-cache events published at or before `t` to `out` as (publish time, event),
    /// oldest first. Events of a step in progress are published at its end (an eviction made
    /// when a bulk step starts, at its first iteration's end), so they wait until then.
    pub fn drain_kv_events(&mut self, t: f64, out: &mut Vec<(f64, KvEvent)>) {
        while self.kv_events.front().is_some_and(|(at, _)| *at <= t) {
            if let Some(e) = self.kv_events.pop_front() {
                out.push(e);
            }
        }
    }

    /// Publishes the events the pool recorded since the last call at time `t`.
    fn stamp_kv_events(&mut self, t: f64) {
        if self.pool.records_events() {
            self.pool.take_events(&mut self.kv_events, |e| (t, e));
        }
    }

    /// Drops every cached prefix block, as vLLM's `/reset_prefix_cache` does (an
    /// [`KvEvent::Cleared`] published at `now`). Refused (false) while any request holds blocks,
    /// as in vLLM.
    pub fn reset_prefix_cache(&mut self, now: f64) -> bool {
        if self.has_work() || self.step.is_some() {
            return false;
        }
        let done = self.pool.reset();
        self.stamp_kv_events(now);
        done
    }

    /// Leading prompt tokens of `prompt` under LoRA adapter `lora` (`None`: the base model)
    /// whose blocks this engine's prefix cache holds now (whole blocks): the engine's truth,
    /// which a router's event-fed view trails.
    pub fn held_prefix_tokens(&self, prompt: &Prompt, lora: Option<&str>) -> u32 {
        self.held_salted_prefix_tokens(prompt, lora, None)
    }

    /// [`Engine::held_prefix_tokens`] for a request with the `cache_salt` `salt`.
    pub fn held_salted_prefix_tokens(
        &self,
        prompt: &Prompt,
        lora: Option<&str>,
        salt: Option<&str>,
    ) -> u32 {
        let mut hashes = Vec::new();
        let seed = salt_seed(lora_seed(self.seed, lora), salt);
        prompt_block_hashes(prompt, self.bs, seed, &mut hashes);
        let run = hashes
            .iter()
            .take_while(|h| self.pool.contains(**h))
            .count();
        u32::try_from(run)
            .unwrap_or(u32::MAX)
            .saturating_mul(self.bs)
    }

    /// The seed of this engine's prefix hash chain for base-model requests; a LoRA request's
    /// chain starts from [`crate::tokens::lora_seed`] of it and the adapter's name.
    pub fn prefix_seed(&self) -> u64 {
        self.seed
    }

    /// The chain seed of a request under adapter index `lora` (checked by [`Engine::check`]).
    fn request_seed(&self, lora: Option<u16>) -> u64 {
        lora.and_then(|a| self.lora_seeds.get(usize::from(a)))
            .copied()
            .unwrap_or(self.seed)
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// LoRA adapters this engine serves.
    pub fn adapters(&self) -> &[Arc<str>] {
        &self.adapters
    }

    /// Index of an adapter by name.
    pub fn adapter_index(&self, name: &str) -> Option<u16> {
        self.adapters
            .iter()
            .position(|a| &**a == name)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// Multiplies every later step's duration (fault injection: a slow pod). Values ≤ 0 are
    /// treated as 1.
    pub fn set_slowdown(&mut self, factor: f64) {
        self.slowdown = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            1.0
        };
    }

    /// Counters (and histograms if enabled).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Whether a step is in progress.
    pub fn in_step(&self) -> bool {
        self.step.is_some()
    }

    /// End time of the step in progress.
    pub fn step_end(&self) -> Option<f64> {
        self.step.map(|s| s.end)
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Checks a request against the engine's limits.
    pub fn check(
        &self,
        prompt_tokens: u32,
        max_tokens: u32,
        lora: Option<u16>,
    ) -> Result<(), SimError> {
        if max_tokens == 0 {
            return Err(SimError::Rejected("max_tokens must be at least 1".into()));
        }
        let total = u64::from(prompt_tokens) + u64::from(max_tokens);
        if total > u64::from(self.profile.max_model_len) {
            return Err(SimError::Rejected(format!(
                "This model's maximum context length is {} tokens. However, you requested {total} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                self.profile.max_model_len
            )));
        }
        if total.div_ceil(u64::from(self.bs)) > self.pool.total() {
            return Err(SimError::Rejected(format!(
                "request needs {total} tokens of KV cache but the pod holds {}",
                self.pool.total() * u64::from(self.bs)
            )));
        }
        if let Some(a) = lora {
            if usize::from(a) >= self.adapters.len() {
                return Err(SimError::Rejected(format!(
                    "unknown LoRA adapter index {a}"
                )));
            }
            if self.max_loras == 0 {
                return Err(SimError::Rejected(
                    "this pod has no LoRA slots (max_loras: 0)".into(),
                ));
            }
        }
        Ok(())
    }

    /// Queues a request. It is scheduled at the first step boundary at or after its arrival.
    pub fn submit(&mut self, req: EngineRequest) -> Result<(), SimError> {
        let prompt_len = req.prompt.token_count();
        self.check(prompt_len, req.max_tokens, req.lora)?;
        let seed = salt_seed(self.request_seed(req.lora), req.cache_salt.as_deref());
        let (group, shared_tokens, hashes) = match &req.prompt {
            Prompt::Text(_) | Prompt::Ids(_) => {
                self.hash_buf.clear();
                prompt_block_hashes(&req.prompt, self.bs, seed, &mut self.hash_buf);
                (0, 0, Some(self.hash_buf.as_slice().into()))
            }
            Prompt::Tokens {
                prefix_group,
                prefix_tokens,
                ..
            } => (*prefix_group, (*prefix_tokens).min(prompt_len), None),
        };
        let uid = self.next_uid;
        self.next_uid += 1;
        if let Some(a) = req.lora {
            self.lora_waiting[usize::from(a)] += 1;
        }
        self.waiting.push_back(Seq {
            id: req.id,
            uid,
            arrival: req.arrival,
            prompt_len,
            max_tokens: req.max_tokens,
            group,
            shared_tokens,
            hashes,
            seed,
            lora: req.lora,
            computed: 0,
            generated: 0,
            scheduled: 0,
            held_hashed: 0,
            plain_blocks: 0,
            cached_tokens: 0,
            admitted_once: false,
            first_scheduled: f64::NAN,
            first_token: f64::NAN,
            last_token: f64::NAN,
            preemptions: 0,
        });
        Ok(())
    }

    /// Drops request `id` (waiting or running), freeing its KV blocks: the client went away.
    /// Returns whether it was found.
    pub fn abort(&mut self, id: u64) -> bool {
        let seq = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let s = self.waiting.remove(i);
            if let Some(a) = s.as_ref().and_then(|s| s.lora) {
                let a = usize::from(a);
                self.lora_waiting[a] = self.lora_waiting[a].saturating_sub(1);
            }
            s
        } else if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let s = self.running.remove(i);
            if let Some(a) = s.lora {
                let a = usize::from(a);
                self.lora_running[a] = self.lora_running[a].saturating_sub(1);
            }
            Some(s)
        } else {
            None
        };
        let Some(s) = seq else { return false };
        self.free_blocks(&s);
        self.stats.requests_aborted += 1;
        true
    }

    /// Plans the next step at `now`. Returns its end time, or `None` if there is nothing to run
    /// (idle, or every waiting request arrives later). With `allow_bulk`, a pod that only decodes
    /// runs several iterations as one step.
    pub fn start_step(&mut self, now: f64, allow_bulk: bool) -> Option<f64> {
        if self.step.is_some() || !self.has_work() {
            return self.step.map(|s| s.end);
        }
        if allow_bulk
            && self.admission_blocked()
            && let Some(end) = self.try_bulk(now)
        {
            return Some(end);
        }
        let end = self.plan_single(now);
        self.stamp_kv_events(end.unwrap_or(now));
        end
    }

    /// Plans one iteration (scheduling, KV allocation); its end time, if anything was scheduled.
    fn plan_single(&mut self, now: f64) -> Option<f64> {
        let mut shape = StepShape::default();
        let mut budget = self.profile.max_num_batched_tokens;
        let mut preempted = false;
        let mut scheduled_any = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (n, need) = {
                let s = &self.running[i];
                let n = (s.num_tokens() - s.computed).min(budget);
                let need = u64::from((s.computed + n).div_ceil(self.bs))
                    .saturating_sub(u64::from(s.held_hashed + s.plain_blocks));
                (n, need)
            };
            let mut self_preempted = false;
            while !self.pool.alloc(need) {
                let last = self.running.len() - 1;
                self.preempt_last();
                preempted = true;
                if last == i {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            let s = &mut self.running[i];
            s.plain_blocks += u32::try_from(need).unwrap_or(u32::MAX);
            s.scheduled = n;
            budget -= n;
            scheduled_any = true;
            add_to_shape(&mut shape, s, n);
            i += 1;
        }
        if !preempted {
            scheduled_any |= self.admit(now, &mut budget, &mut shape);
        }
        if !scheduled_any {
            return None;
        }
        let d = self.profile.step_seconds(&shape) * self.slowdown;
        self.stats.steps += 1;
        self.stats.single_steps += 1;
        if let Some(h) = self.stats.histograms.as_mut() {
            h.iteration_tokens
                .observe((shape.prefill_tokens + shape.decode_seqs) as f64);
        }
        self.step = Some(Step {
            start: now,
            end: now + d,
            bulk: None,
        });
        Some(now + d)
    }

    fn admit(&mut self, now: f64, budget: &mut u32, shape: &mut StepShape) -> bool {
        let mut admitted = false;
        let mut j = 0;
        while j < self.waiting.len()
            && *budget > 0
            && self.running.len() < self.profile.max_num_seqs as usize
        {
            if self.waiting[j].arrival > now {
                break;
            }
            // LoRA: the adapter must be resident, or a slot must be free or freeable.
            let lora = self.waiting[j].lora;
            let mut load = false;
            if let Some(a) = lora
                && !self.resident.iter().any(|(r, _)| *r == a)
            {
                let active = self
                    .resident
                    .iter()
                    .filter(|(r, _)| self.lora_running[usize::from(*r)] > 0)
                    .count();
                if active >= self.max_loras as usize {
                    j += 1;
                    continue;
                }
                load = true;
            }
            // Prefix cache lookup (only for a request with nothing computed): count the hits
            // without touching the cache, check that the rest fits, then take the references.
            let hits = if self.waiting[j].computed == 0 {
                self.cached_prefix_blocks(&self.waiting[j])
            } else {
                0
            };
            let (n, need) = {
                let s = &self.waiting[j];
                let computed = hits * self.bs;
                let n = (s.num_tokens() - computed).min(*budget);
                let need =
                    u64::from((computed + n).div_ceil(self.bs)).saturating_sub(u64::from(hits));
                (n, need)
            };
            if need > self.pool.available() {
                break;
            }
            for b in 0..hits {
                let h = self.waiting[j].block_hash(self.bs, b);
                self.pool.acquire(h);
            }
            if !self.pool.alloc(need) {
                let s = &self.waiting[j];
                for b in (0..hits).rev() {
                    self.pool.release(s.block_hash(self.bs, b));
                }
                break;
            }
            let Some(mut s) = self.waiting.remove(j) else {
                break;
            };
            if load {
                self.load_adapter(lora);
            }
            if let Some(a) = lora {
                let a = usize::from(a);
                self.lora_waiting[a] = self.lora_waiting[a].saturating_sub(1);
                self.lora_running[a] += 1;
                let step_no = self.stats.steps;
                if let Some(r) = self.resident.iter_mut().find(|(r, _)| usize::from(*r) == a) {
                    r.1 = step_no;
                }
            }
            if load {
                shape.lora_loads += 1;
            }
            s.computed = hits * self.bs;
            s.held_hashed = hits;
            s.plain_blocks = u32::try_from(need).unwrap_or(u32::MAX);
            s.scheduled = n;
            let cached = hits * self.bs;
            self.stats.prefix_queries += u64::from(s.num_tokens());
            self.stats.prefix_hits += u64::from(cached);
            if !s.admitted_once {
                s.admitted_once = true;
                s.cached_tokens = cached;
                s.first_scheduled = now;
                self.stats.prompt_tokens_cached += u64::from(cached);
                self.stats.prompt_tokens_computed +=
                    u64::from(s.prompt_len - cached.min(s.prompt_len));
                if let Some(h) = self.stats.histograms.as_mut() {
                    h.queue.observe(now - s.arrival);
                    h.prefill_kv_computed
                        .observe(f64::from(s.prompt_len - cached.min(s.prompt_len)));
                }
            }
            add_to_shape(shape, &s, n);
            *budget -= n;
            self.running.push(s);
            admitted = true;
        }
        admitted
    }

    /// Leading prompt blocks of `s` found in the prefix cache (never the whole prompt: the last
    /// token is always computed, as in vLLM).
    fn cached_prefix_blocks(&self, s: &Seq) -> u32 {
        let max_hits = s
            .publishable_blocks(self.bs)
            .min((s.num_tokens() - 1) / self.bs);
        let mut hits = 0;
        while hits < max_hits && self.pool.contains(s.block_hash(self.bs, hits)) {
            hits += 1;
        }
        hits
    }

    /// Whether no waiting request could be admitted at the next step boundary, nor at any of the
    /// next decode-only iterations (KV only shrinks and no slot frees up until a request finishes).
    fn admission_blocked(&self) -> bool {
        if self.waiting.is_empty() || self.running.len() >= self.profile.max_num_seqs as usize {
            return true;
        }
        if self.waiting.iter().any(|s| s.lora.is_some()) {
            return false;
        }
        let Some(s) = self.waiting.front() else {
            return true;
        };
        let budget = self
            .profile
            .max_num_batched_tokens
            .saturating_sub(u32::try_from(self.running.len()).unwrap_or(u32::MAX));
        if budget == 0 {
            return true;
        }
        let hits = if s.computed == 0 {
            self.cached_prefix_blocks(s)
        } else {
            0
        };
        let computed = hits * self.bs;
        let n = (s.num_tokens() - computed).min(budget);
        let need = u64::from((computed + n).div_ceil(self.bs)).saturating_sub(u64::from(hits));
        need > self.pool.available()
    }

    fn load_adapter(&mut self, lora: Option<u16>) {
        let Some(a) = lora else { return };
        if self.resident.len() >= self.max_loras as usize {
            // Evict the least recently used adapter that no running request uses.
            let victim = self
                .resident
                .iter()
                .enumerate()
                .filter(|(_, (r, _))| self.lora_running[usize::from(*r)] == 0)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(i, _)| i);
            if let Some(i) = victim {
                self.resident.swap_remove(i);
            }
        }
        self.resident.push((a, self.stats.steps));
        self.stats.lora_loads += 1;
    }

    fn preempt_last(&mut self) {
        let Some(mut s) = self.running.pop() else {
            return;
        };
        self.free_blocks(&s);
        s.computed = 0;
        s.scheduled = 0;
        s.held_hashed = 0;
        s.plain_blocks = 0;
        s.preemptions += 1;
        self.stats.preemptions += 1;
        if let Some(a) = s.lora {
            let a = usize::from(a);
            self.lora_running[a] = self.lora_running[a].saturating_sub(1);
            self.lora_waiting[a] += 1;
        }
        self.waiting.push_front(s);
    }

    fn free_blocks(&mut self, s: &Seq) {
        release_blocks(&mut self.pool, s, self.bs);
    }

    fn try_bulk(&mut self, now: f64) -> Option<f64> {
        if self.running.is_empty() || !self.running.iter().all(Seq::is_decode) {
            return None;
        }
        let k_max = self
            .running
            .iter()
            .map(|s| s.max_tokens - s.generated)
            .min()?;
        if k_max < 2 {
            return None;
        }
        let avail = self.pool.available();
        let need = |k: u32, run: &[Seq], bs: u32| -> u64 {
            run.iter()
                .map(|s| {
                    u64::from((s.computed + k).div_ceil(bs))
                        .saturating_sub(u64::from(s.held_hashed + s.plain_blocks))
                })
                .sum()
        };
        let (mut lo, mut hi) = (1u32, k_max);
        if need(1, &self.running, self.bs) > avail {
            return None;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if need(mid, &self.running, self.bs) <= avail {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let k = lo;
        if k < 2 {
            return None;
        }
        let reserved = need(k, &self.running, self.bs);
        if !self.pool.alloc(reserved) {
            return None;
        }
        let b_seqs = self.running.len() as u64;
        let k0: u64 = self.running.iter().map(|s| u64::from(s.computed) + 1).sum();
        let shape = |kv: u64| StepShape {
            decode_seqs: b_seqs,
            decode_kv_tokens: kv,
            ..StepShape::default()
        };
        let a = self.profile.step_seconds(&shape(k0)) * self.slowdown;
        let b = self.profile.step_seconds(&shape(k0 + b_seqs)) * self.slowdown - a;
        let bulk = Bulk { k, a, b, reserved };
        // The blocks for the whole segment were taken now; vLLM would take them iteration by
        // iteration, so what that evicted is published at the first iteration's end.
        self.stamp_kv_events(now + a);
        self.stats.bulk_steps += 1;
        let end = now + bulk.elapsed(k);
        self.step = Some(Step {
            start: now,
            end,
            bulk: Some(bulk),
        });
        Some(end)
    }

    /// A request arrived at `t` during the step in progress: if it is a bulk step, cut it at the
    /// first iteration boundary at or after `t` (at least one iteration). Returns the step's end.
    pub fn interrupt_at(&mut self, t: f64) -> Option<f64> {
        let step = self.step.as_mut()?;
        if let Some(bulk) = step.bulk.as_mut() {
            let j = bulk.boundary_at_or_after(t - step.start);
            bulk.k = j;
            step.end = step.start + bulk.elapsed(j);
        }
        Some(step.end)
    }

    /// Applies the step in progress at its end time, reporting tokens and completions to `sink`.
    /// Returns the end time, or `None` if no step was in progress.
    pub fn finish_step(&mut self, sink: &mut impl Sink) -> Option<f64> {
        let step = self.step.take()?;
        let t = step.end;
        match step.bulk {
            None => self.finish_single(t, step.end - step.start, sink),
            Some(bulk) => self.finish_bulk(&step, bulk, sink),
        }
        self.stamp_kv_events(t);
        self.stats.evictions = self.pool.evictions;
        Some(t)
    }

    fn finish_single(&mut self, t: f64, _d: f64, sink: &mut impl Sink) {
        let mut finished = false;
        for i in 0..self.running.len() {
            if self.running[i].scheduled == 0 {
                continue;
            }
            let bs = self.bs;
            let s = &mut self.running[i];
            s.computed += s.scheduled;
            s.scheduled = 0;
            let full = s.publishable_blocks(bs).min(s.computed / bs);
            for b in s.held_hashed..full {
                self.pool.prefetch(s.block_hash(bs, b));
            }
            while s.held_hashed < full {
                let h = s.block_hash(bs, s.held_hashed);
                s.plain_blocks = s.plain_blocks.saturating_sub(1);
                self.pool.publish(h);
                s.held_hashed += 1;
            }
            if s.computed == s.num_tokens() {
                s.generated += 1;
                self.stats.generation_tokens += 1;
                if let Some(h) = self.stats.histograms.as_mut() {
                    if s.generated == 1 {
                        h.ttft.observe(t - s.arrival);
                    } else if s.last_token.is_finite() {
                        h.itl.observe(t - s.last_token);
                    }
                }
                if s.first_token.is_nan() {
                    s.first_token = t;
                }
                s.last_token = t;
                sink.token(s.id, s.generated, t);
                finished |= s.generated >= s.max_tokens;
            }
        }
        if finished {
            self.reap(sink);
        }
    }

    fn finish_bulk(&mut self, step: &Step, bulk: Bulk, sink: &mut impl Sink) {
        let k = bulk.k;
        let mut used = 0u64;
        let mut finished = false;
        for s in &mut self.running {
            let before = u64::from(s.held_hashed + s.plain_blocks);
            s.computed += k;
            s.generated += k;
            let now_needed = u64::from(s.computed.div_ceil(self.bs));
            let extra = now_needed.saturating_sub(before);
            s.plain_blocks += u32::try_from(extra).unwrap_or(u32::MAX);
            used += extra;
            s.last_token = step.end;
            finished |= s.generated >= s.max_tokens;
        }
        self.pool.free(bulk.reserved.saturating_sub(used));
        let n = self.running.len() as u64;
        self.stats.generation_tokens += n * u64::from(k);
        self.stats.steps += u64::from(k);
        if let Some(h) = self.stats.histograms.as_mut() {
            for j in 0..k {
                let d = bulk.a + bulk.b * f64::from(j);
                h.itl.observe_n(d, n);
                h.iteration_tokens.observe(n as f64);
            }
        }
        if finished {
            self.reap(sink);
        }
    }

    /// Removes finished requests (keeping the batch order) and reports them.
    fn reap(&mut self, sink: &mut impl Sink) {
        let mut w = 0;
        for r in 0..self.running.len() {
            let done = self.running[r].generated >= self.running[r].max_tokens;
            if done {
                let s = &self.running[r];
                let c = Completion {
                    id: s.id,
                    pod: 0,
                    arrival: s.arrival,
                    scheduled: s.first_scheduled,
                    first_token: s.first_token,
                    last_token: s.last_token,
                    prompt_tokens: s.prompt_len,
                    cached_tokens: s.cached_tokens,
                    output_tokens: s.generated,
                    preemptions: s.preemptions,
                };
                release_blocks(&mut self.pool, s, self.bs);
                if let Some(a) = s.lora {
                    let a = usize::from(a);
                    self.lora_running[a] = self.lora_running[a].saturating_sub(1);
                }
                self.stats.requests_finished += 1;
                if let Some(h) = self.stats.histograms.as_mut() {
                    let out = f64::from(c.output_tokens);
                    h.e2e.observe(c.last_token - c.arrival);
                    h.inference.observe(c.last_token - c.scheduled);
                    h.prefill.observe(c.first_token - c.scheduled);
                    h.decode.observe(c.last_token - c.first_token);
                    h.prompt_tokens.observe(f64::from(c.prompt_tokens));
                    h.generation_tokens.observe(out);
                    h.max_tokens.observe(out);
                    h.params_n.observe(1.0);
                    h.num_preemptions.observe(f64::from(c.preemptions));
                    h.tpot.observe(c.mean_itl());
                }
                sink.completed(c);
            } else {
                self.running.swap(w, r);
                w += 1;
            }
        }
        self.running.truncate(w);
    }

    /// What a scraper would read at `now`, written into `out` (its vectors are reused).
    pub fn view_into(&self, now: f64, out: &mut EngineView) {
        out.waiting = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        out.running = u32::try_from(self.running.len()).unwrap_or(u32::MAX);
        let mut used = self.pool.used();
        if let Some(Step {
            start,
            bulk: Some(bulk),
            ..
        }) = self.step
        {
            // Blocks reserved for iterations that have not happened yet are not in use yet.
            let done = bulk.done_by(now - start);
            let due: u64 = self
                .running
                .iter()
                .map(|s| {
                    u64::from((s.computed + done).div_ceil(self.bs))
                        .saturating_sub(u64::from(s.held_hashed + s.plain_blocks))
                })
                .sum();
            used = used.saturating_sub(bulk.reserved.saturating_sub(due));
        }
        out.kv_usage = used as f64 / self.pool.total().max(1) as f64;
        out.block_size = self.bs;
        out.num_blocks = self.pool.total();
        out.prefix_queries = self.stats.prefix_queries;
        out.prefix_hits = self.stats.prefix_hits;
        out.max_loras = self.max_loras;
        out.running_loras.clear();
        out.waiting_loras.clear();
        for (i, name) in self.adapters.iter().enumerate() {
            if self.lora_running[i] > 0 {
                out.running_loras.push(name.clone());
            }
            if self.lora_waiting[i] > 0 {
                out.waiting_loras.push(name.clone());
            }
        }
    }

    /// [`Engine::view_into`] into a fresh view.
    pub fn view(&self, now: f64) -> EngineView {
        let mut v = EngineView::default();
        self.view_into(now, &mut v);
        v
    }
}

/// Returns a request's blocks to the pool, tail first: the unique computed prompt tail as one LRU
/// run, then the published prefix blocks last to first, then the rest (decode blocks) as plain.
fn release_blocks(pool: &mut BlockPool, s: &Seq, bs: u32) {
    let unique = s
        .full_prompt_blocks(bs)
        .min(s.computed / bs)
        .saturating_sub(s.publishable_blocks(bs))
        .min(s.plain_blocks);
    pool.free_unmatchable(u64::from(unique));
    // Independent lookups first, so that their cache misses overlap (see `BlockPool::prefetch`).
    for b in 0..s.held_hashed {
        pool.prefetch(s.block_hash(bs, b));
    }
    for b in (0..s.held_hashed).rev() {
        pool.release(s.block_hash(bs, b));
    }
    pool.free(u64::from(s.plain_blocks - unique));
}

fn add_to_shape(shape: &mut StepShape, s: &Seq, n: u32) {
    if n == 1 && s.is_decode() {
        shape.decode_seqs += 1;
        shape.decode_kv_tokens += u64::from(s.computed) + 1;
    } else {
        shape.prefill_tokens += u64::from(n);
        shape.prefill_pairs += pairs(u64::from(s.computed), u64::from(n));
    }
}

#[cfg(test)]
mod tests;
