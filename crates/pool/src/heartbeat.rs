//! The heartbeat document: a small JSON status per model (or pool), served on the admin port at
//! [`PATH`] by the standalone gateway and the endpoint picker, and polled by the global router
//! (`infergate global`) to drain, ramp and route between clusters.
//!
//! ```json
//! {"schema":"infergate.heartbeat/v1","instance":"1764604800123-4242","generation":17,
//!  "timestampMs":1764604817456,
//!  "models":[{"name":"llama","pods":3,"readyPods":2,"saturation":0.25,"queue":4,"flowQueue":0,"running":9,
//!             "inflight":6,"estimatedTtftMs":310.5,"prefillMs":103.5,"fixedCostMs":35.2,"waitMs":96.4,
//!             "drainMs":0.0,"newestMetricsAgeMs":41,"adapters":["sql-lora"]}]}
//! ```
//!
//! - `instance` changes when the process restarts and `generation` grows by one with every
//!   document that process renders, so a poller can tell a live document from a replayed or
//!   cached one; `timestampMs` is the renderer's wall clock (Unix milliseconds), for display: a
//!   poller judges staleness by its own clock, when the document arrived.
//! - `readyPods` counts the pods routed on now (fresh metrics, or a late scrape of a live pod):
//!   `0` with `pods > 0` is a gray failure — the process answers, its pods do not.
//! - `saturation` is the mean over ready pods of each pod's load against the scheduler's
//!   saturation thresholds (`max(waiting / queueDepth, kvCache / kvCache threshold)`, capped at
//!   1); `1` when no pod is ready.
//! - `estimatedTtftMs` is what a typical request ([`TYPICAL_PROMPT_TOKENS`] prompt tokens) would
//!   wait for its first token on the best ready pod: its queue (each queued request counted as a
//!   typical one) and itself prefilled at the pod's prefill rate on long prompts (learned from first tokens that waited for 256 tokens of work
//!   or more; until then the rate learned from shorter ones where it is above the scheduler's
//!   prior, else the prior: a short prompt's first token is mostly the server's fixed cost per
//!   request, and read as a rate it made this estimate twenty times too long after short
//!   prompts), plus, on a pod whose KV
//!   cache is over the saturation threshold, the time for running requests to free it. Absent
//!   when no pod is ready. `prefillMs` is the part of it that is the request's own prefill:
//!   what each further request sent to that pod adds.
//! - `fixedCostMs` is the part of `prefillMs` that does not grow with the prompt: that pod's
//!   fixed cost per request (a forward pass, its scheduling step, the HTTP exchange), learned
//!   from first tokens that waited for 64 tokens of work or fewer, less that work at the bulk
//!   rate. Once it is learned, the bulk rate is learned without it and every request's prefill
//!   in the estimates above is the fixed cost plus its tokens at that rate. A poller estimating
//!   a request of `n` prompt tokens from a document without `waitMs` scales the estimate by
//!   `(fixedCostMs + (prefillMs − fixedCostMs) · n / 512) / prefillMs` rather than `n / 512`:
//!   a seven-token prompt's first token takes the fixed cost (35 ms on an emulated A10G), not
//!   1/73 of a 512-token one's. Absent until a short prompt completed on that pod (a poller
//!   then scales linearly, as it does with a gateway that predates the field).
//! - `waitMs` is the rest of the wait in real terms: how long the best pod's queue takes before a
//!   new request's own prefill starts (each queued request's fixed cost and its prompt tokens at
//!   the bulk rate), plus the KV-free time. A request of `n` prompt tokens then waits `waitMs`
//!   plus its own prefill, `fixedCostMs + (prefillMs − fixedCostMs) · n / 512`: only that part
//!   grows with its prompt. `estimatedTtftMs` counts every queued request as a typical one, and
//!   scaled whole by a request's prompt it is wrong both ways in a mixed workload (a 4,000-token
//!   prompt behind 50-token ones saw their queue ×8, a 20-token one behind 4,000-token ones saw
//!   it shrink to nothing). The queued requests are counted at the prompt tokens this process
//!   routed them with, where it knows them: its own requests on the pod still without a first
//!   token (the uncached tokens its in-flight accounting charged the pod with, which the
//!   scheduler already keeps for its own estimate: the document adds no work per request). Those
//!   are the queue itself, whatever the mix of the moment; a smoothed mean of recent prompts
//!   would misjudge exactly the burst of long prompts among short ones. Only the requests it
//!   cannot see — a scraped queue longer than its own requests there (another gateway's or a
//!   peer replica's, or its own from before a restart) and the requests held in flow control —
//!   count at the smoothed mean of the prompts it routed (each pick moves it 2% of the way;
//!   512 before the first, so with nothing known `waitMs` is `estimatedTtftMs − prefillMs`). The
//!   best ready pod is the one where `waitMs + prefillMs` is least; every per-pod figure of the
//!   document is for that pod. Absent when no pod is ready, and from a gateway that predates the
//!   field (a poller then scales the whole estimate, as before).
//! - `flowQueue` counts the requests this process holds in the model's flow-control queue (its
//!   pods saturated). They reach the pods before a request sent now, so `saturation`,
//!   `estimatedTtftMs`, `waitMs` and `drainMs` count them, spread evenly over the ready pods'
//!   queues.
//! - The prior of a pod that has learned no rate is its cold-start rate as its scheduler has it
//!   (`EndpointInfo::cold_prefill_tokens_per_sec`, and the decode one for the KV-free time): the
//!   configured `rates` (per reference GPU) scaled by the pod's GPU type
//!   (`infergate_scheduler::gpu`). A pool of fresh A10Gs then says a typical prefill takes
//!   1,013 ms where fresh H100s say 128 ms; with one prior for both, both said 128 ms until
//!   traffic taught them. (The pool's typical rate, which the scheduler assumes once other pods
//!   have learned, is not taken: it is learned from every first token, short prompts' included,
//!   and would undo the guard above.)
//! - `drainMs` is the time until the least loaded ready pod is back under the saturation
//!   thresholds (`0` while one is under them): the requests over the queue threshold go through
//!   their prefill first, timed as `waitMs` times the whole queue (each its fixed cost, and its
//!   tokens at the bulk rate; which of the queued requests come first is not known, so each
//!   counts at the queue's mean, as the scheduler's `Retry-After` counts them), plus the KV-free
//!   time. Counting each as a typical request, it said 600 ms for five 20-token prompts over the
//!   threshold that take 120 ms. The global router does not read it; it is for operators.
//! - `adapters` names the LoRA adapters served by the entry's pods (a gateway model's
//!   `loraAdapters`): requests naming one are routed to the same pool, so they queue on the
//!   same engines as the model's own. A poller that counts the requests it sent since the last
//!   document (the global router) counts those of every name of the entry against each of them.
//!   Left out when there are none (a picker's entry, whose adapters the body-based router maps
//!   before it, has none), and absent from a gateway that predates the field: a poller then
//!   knows no adapter of the entry.
//!
//! Rendering takes each pool's lock a few times, briefly (the settings, the same copy the
//! per-pod gauges make, the requests in flight and the mean prompt); it runs on the admin port,
//! never on the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::LivePool;
use crate::pods::PodSample;

/// Where the admin port serves the document.
pub const PATH: &str = "/heartbeat";

/// The value of `schema` in this version of the document.
pub const SCHEMA: &str = "infergate.heartbeat/v1";

/// Prompt tokens of the "typical request" whose time to first token is estimated.
pub const TYPICAL_PROMPT_TOKENS: f64 = 512.0;

/// Output tokens a running request is assumed to still generate when estimating how long a full
/// KV cache takes to free.
pub const TYPICAL_OUTPUT_TOKENS: f64 = 128.0;

/// The document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// [`SCHEMA`].
    pub schema: String,
    /// Changes when the serving process restarts.
    pub instance: String,
    /// Grows by one with each document the process renders.
    pub generation: u64,
    /// The renderer's wall clock, Unix milliseconds.
    pub timestamp_ms: u64,
    /// One entry per model (gateway) or pool (picker).
    pub models: Vec<ModelStatus>,
}

/// The status of one model's pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelStatus {
    /// The model (gateway) or pool (picker) name.
    pub name: String,
    /// Endpoints configured or discovered.
    pub pods: u32,
    /// Endpoints routed on now.
    pub ready_pods: u32,
    /// Load against the saturation thresholds, 0–1 (1 with no ready pod).
    pub saturation: f64,
    /// Requests waiting in the ready pods' queues (scraped).
    pub queue: u32,
    /// Requests this process holds in the model's flow-control queue (every pod saturated):
    /// they reach the pods before a request sent now, so the estimates below count them too.
    #[serde(default)]
    pub flow_queue: u32,
    /// Requests running on the ready pods (scraped).
    pub running: u32,
    /// This process's requests in flight to the pool.
    pub inflight: u32,
    /// Estimated time to first token of a typical request, ms (absent with no ready pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_ttft_ms: Option<f64>,
    /// Of that, the typical request's own prefill on the pod the estimate is for, ms: what each
    /// request sent there before the next heartbeat adds to the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<f64>,
    /// Of `prefillMs`, the part that does not grow with the prompt, ms: the pod's fixed cost per
    /// request, learned from short prompts' first tokens (absent until one completed there); the
    /// estimates count it once for every request, queued or sent. A
    /// poller scales only the rest of the estimate with a request's prompt; without it (a gateway
    /// before this field) it scales the whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_cost_ms: Option<f64>,
    /// The wait before a new request's own prefill starts on that pod, ms: its queue at the
    /// prompt sizes this process routed it with (the smoothed mean for requests it cannot see),
    /// plus the time to free a full KV cache. A request's time to first token is this plus its
    /// own prefill; the queue does not grow with its prompt. Absent with no ready pod, and from
    /// a gateway before this field (a poller then scales `estimatedTtftMs` whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<f64>,
    /// Estimated time until a ready pod is back under the saturation thresholds, ms: the
    /// requests over the queue threshold timed as `waitMs` times the queue (in the tokens it
    /// holds), plus the time to free a full KV cache; 0 while a pod is under them.
    pub drain_ms: f64,
    /// Age of the newest metrics page of any pod, ms (absent before the first page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_metrics_age_ms: Option<u64>,
    /// The LoRA adapters served by the same pods (requests naming one are routed to this pool
    /// and queue on its engines): left out when there are none, and absent from a gateway
    /// before this field (a poller then knows of no adapter sharing the pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
}

/// One entry of a document as its renderer has it ([`Heartbeats::render`]).
pub struct Entry<'a> {
    /// The model (gateway) or pool (picker) name.
    pub name: &'a str,
    /// The LoRA adapters its pods serve (a gateway model's `loraAdapters`; none for a picker).
    pub adapters: Vec<String>,
    /// Its pool.
    pub pool: &'a LivePool,
    /// Requests held in its flow-control queue.
    pub flow_queue: usize,
}

/// Renders heartbeat documents for one process: its instance name and generation counter.
#[derive(Debug)]
pub struct Heartbeats {
    instance: String,
    generation: AtomicU64,
}

impl Default for Heartbeats {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeats {
    /// A renderer for this process: the instance is the start time and process id.
    pub fn new() -> Self {
        Heartbeats {
            instance: format!("{}-{}", unix_ms(), std::process::id()),
            generation: AtomicU64::new(0),
        }
    }

    /// The document for these entries, as JSON.
    pub fn render<'a>(&self, entries: impl Iterator<Item = Entry<'a>>) -> String {
        let models = entries
            .map(|e| ModelStatus {
                adapters: e.adapters,
                ..model_status(e.name, e.pool, e.flow_queue)
            })
            .collect();
        let doc = Heartbeat {
            schema: SCHEMA.to_owned(),
            instance: self.instance.clone(),
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            timestamp_ms: unix_ms(),
            models,
        };
        // Serialising plain numbers and strings cannot fail; an empty object is still JSON.
        serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_owned())
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The status of one pool now, with `flow_queue` requests held in its flow-control queue (its
/// `adapters` left empty: they are the renderer's to name, [`Entry::adapters`]).
pub fn model_status(name: &str, pool: &LivePool, flow_queue: usize) -> ModelStatus {
    let cfg = pool.scheduler_config();
    let limits = Limits {
        queue_depth: f64::from(cfg.saturation.queue_depth.max(1)),
        kv_cache: cfg.saturation.kv_cache,
        mean_prompt_tokens: pool.mean_prompt_tokens(),
    };
    status(
        name,
        &pool.pod_samples(),
        pool.inflight(),
        flow_queue,
        &limits,
    )
}

/// What the estimates take from the scheduler besides the pods: its settings, and the size of a
/// queued request it knows nothing else of. (The rates assumed for a pod that has learned none
/// are the pod's own, [`PodSample::cold_prefill_tokens_per_sec`]: they depend on its GPU type.)
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Saturation threshold on the queue.
    pub queue_depth: f64,
    /// Saturation threshold on KV-cache use, 0–1.
    pub kv_cache: f64,
    /// The smoothed mean of the prompt tokens of the requests routed
    /// ([`LivePool::mean_prompt_tokens`]): the size of a queued request whose own is not known.
    /// One that is not a number, or negative, counts as [`TYPICAL_PROMPT_TOKENS`].
    pub mean_prompt_tokens: f64,
}

/// A pod's queue as the estimates count it: the requests ahead of a new one, and their prompt
/// tokens (this process's own at the sizes it routed them with, the others at the mean prompt).
/// `waitMs` and `drainMs` both time it here, so that they cannot count it differently.
#[derive(Clone, Copy, Debug)]
struct Queue {
    requests: f64,
    tokens: f64,
}

impl Queue {
    /// Seconds for the first `n` of its requests to be prefilled at `rate` tokens/s, each paying
    /// `fixed_secs` once: their share of its tokens (which of them come first is not known, so
    /// each counts at its mean), all of them for `n` at least its length.
    fn secs(&self, n: f64, rate: f64, fixed_secs: f64) -> f64 {
        let share = if self.requests > n {
            n / self.requests
        } else {
            1.0
        };
        share * self.tokens / rate + n * fixed_secs
    }
}

/// The status computed from per-pod samples (pure: the tests call it directly). The
/// `flow_queue` requests held in flow control are spread evenly over the ready pods' queues in
/// the estimates: the flow controller sends each to a pod as one frees up.
pub fn status(
    name: &str,
    pods: &[PodSample],
    inflight: usize,
    flow_queue: usize,
    limits: &Limits,
) -> ModelStatus {
    let ready_count = pods.iter().filter(|p| !p.stale && !p.ejected).count();
    let held = if ready_count == 0 {
        0.0
    } else {
        flow_queue as f64 / ready_count as f64
    };
    let mut ready = 0u32;
    let mut load_sum = 0.0;
    let mut queued = 0u32;
    let mut running = 0u32;
    let mean_prompt = Some(limits.mean_prompt_tokens)
        .filter(|m| m.is_finite() && *m >= 0.0)
        .unwrap_or(TYPICAL_PROMPT_TOKENS);
    // The best pod: the least `wait + own prefill` of a typical request.
    let mut best = f64::INFINITY;
    let mut best_ttft = f64::INFINITY;
    let mut best_wait = f64::INFINITY;
    let mut best_prefill = f64::INFINITY;
    let mut best_fixed = None;
    let mut best_drain = f64::INFINITY;
    let mut newest: Option<Duration> = None;
    for p in pods {
        if let Some(age) = p.metrics_age {
            newest = Some(newest.map_or(age, |n| n.min(age)));
        }
        // Not routed on: a stale pod, or one outlier detection ejected (it looks idle, and would
        // make the model's estimates look better than any request routed now will find them).
        if p.stale || p.ejected {
            continue;
        }
        ready += 1;
        let scraped = p.waiting.unwrap_or(0);
        let waiting = f64::from(scraped.max(p.awaiting_first_token)) + held;
        // The same queue in tokens: this process's own requests without a first token at the
        // sizes it routed them with (in the pod's queue or in its prefill step), and those it
        // cannot see — a scraped queue longer than them, the requests held in flow control — at
        // the mean prompt.
        let unseen = f64::from(scraped.saturating_sub(p.awaiting_first_token)) + held;
        let queue = Queue {
            requests: waiting,
            tokens: p.awaiting_first_token_tokens as f64 + unseen * mean_prompt,
        };
        queued = queued.saturating_add(scraped);
        running = running.saturating_add(p.running.unwrap_or(0));
        let kv = p.kv_cache_usage.unwrap_or(0.0);
        let kv_load = if limits.kv_cache > 0.0 {
            kv / limits.kv_cache
        } else {
            0.0
        };
        load_sum += (waiting / limits.queue_depth).max(kv_load).min(1.0);
        // The rate learned on long prompts. Without one, the rate learned from shorter ones is a
        // lower bound (each of their samples holds the server's fixed cost per request), so it
        // counts only where it beats the prior: extrapolated to 512 tokens, seven-token prompts
        // answered in 40 ms (175 tokens/s) put 2.9 s on a first token an A10G gives in 165 ms.
        // The prior is the pod's cold-start rate, scaled by its GPU type: a cold A10G is not
        // estimated as fast as a cold H100.
        let prior = p.cold_prefill_tokens_per_sec;
        let prefill = p
            .bulk_prefill_tokens_per_sec
            .filter(|r| *r > 0.0)
            .unwrap_or_else(|| {
                p.prefill_tokens_per_sec
                    .filter(|r| *r > prior)
                    .unwrap_or(prior)
            })
            .max(1.0);
        // Every request pays the fixed cost once (learned apart from the bulk rate, which then
        // holds none of it); unknown, it is in the rate (short samples) or left out (the prior).
        let fixed = p.fixed_cost_secs.filter(|c| c.is_finite() && *c >= 0.0);
        let fixed_secs = fixed.unwrap_or(0.0);
        let decode = p
            .decode_tokens_per_sec
            .filter(|r| *r > 0.0)
            .unwrap_or(p.cold_decode_tokens_per_sec)
            .max(0.01);
        // Time for running requests to free a KV cache over the threshold.
        let kv_secs = if kv >= limits.kv_cache {
            let frac = ((kv - limits.kv_cache) / (1.0 - limits.kv_cache).max(0.01)).clamp(0.1, 1.0);
            frac * TYPICAL_OUTPUT_TOKENS / decode
        } else {
            0.0
        };
        // Every queued request counted as a typical one (`estimatedTtftMs`, which older
        // pollers scale whole), and the queue in real terms (`waitMs`).
        let ttft = (waiting + 1.0) * TYPICAL_PROMPT_TOKENS / prefill
            + (waiting + 1.0) * fixed_secs
            + kv_secs;
        let wait = queue.secs(waiting, prefill, fixed_secs) + kv_secs;
        let own = TYPICAL_PROMPT_TOKENS / prefill + fixed_secs;
        if wait + own < best {
            best = wait + own;
            best_ttft = ttft;
            best_wait = wait;
            best_prefill = own;
            best_fixed = fixed;
        }
        // The requests over the queue threshold must start before the pod is back under it:
        // timed as `waitMs` times the whole queue.
        let excess = (waiting - limits.queue_depth + 1.0).max(0.0);
        let drain = queue.secs(excess, prefill, fixed_secs) + kv_secs;
        best_drain = best_drain.min(drain);
    }
    ModelStatus {
        name: name.to_owned(),
        pods: u32::try_from(pods.len()).unwrap_or(u32::MAX),
        ready_pods: ready,
        saturation: if ready == 0 {
            1.0
        } else {
            load_sum / f64::from(ready)
        },
        queue: queued,
        flow_queue: u32::try_from(flow_queue).unwrap_or(u32::MAX),
        running,
        inflight: u32::try_from(inflight).unwrap_or(u32::MAX),
        estimated_ttft_ms: (ready > 0).then_some(best_ttft * 1e3),
        prefill_ms: (ready > 0).then_some(best_prefill * 1e3),
        fixed_cost_ms: best_fixed.filter(|_| ready > 0).map(|c| c * 1e3),
        wait_ms: Some(best_wait * 1e3).filter(|w| ready > 0 && w.is_finite()),
        drain_ms: if best_drain.is_finite() {
            best_drain * 1e3
        } else {
            0.0
        },
        newest_metrics_age_ms: newest.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        adapters: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
