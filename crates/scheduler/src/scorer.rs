//! Scorers: each turns the candidates' [`View`]s into one score per candidate in `[0, 1]`.
//!
//! Scores are combined as Σ weight·score (see [`Weights`]); a scorer with weight 0 is never built.
//! Min-max scorers give every candidate 1.0 when all candidates are equal, so an uninformative
//! signal never decides a pick.

use crate::config::Weights;

/// What a scorer may read about one candidate. Built once per candidate per pick.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct View {
    pub(crate) slot: u32,
    /// Engine queue, plus (with in-flight accounting) this gateway's requests routed since the
    /// last scrape that have not produced a first token.
    pub(crate) waiting: f64,
    /// Engine running batch, plus this gateway's requests routed since the last scrape that have.
    pub(crate) running: f64,
    /// KV-cache use in [0, 1], adjusted by routed-since-scrape prompt tokens when the capacity is known.
    pub(crate) kv: Option<f64>,
    /// Tokens (prompt + expected output) of this gateway's requests in flight on the endpoint.
    pub(crate) inflight_tokens: f64,
    /// This gateway's requests in flight on the endpoint.
    pub(crate) inflight: f64,
    /// Leading prompt blocks the endpoint probably holds.
    pub(crate) prefix_blocks: u32,
    /// `prefix_blocks / prompt blocks` (0 for prompts shorter than one block).
    pub(crate) prefix: f64,
    /// LoRA affinity score for the requested adapter.
    pub(crate) lora: f64,
    /// Prefill tokens estimated ahead of this request on the endpoint.
    pub(crate) queued_tokens: f64,
    /// This request's uncached prefill tokens on the endpoint.
    pub(crate) own_tokens: f64,
    /// Estimated time to first token, seconds.
    pub(crate) wait: f64,
    /// At or over the saturation thresholds.
    pub(crate) saturated: bool,
    /// At or over the overload thresholds.
    pub(crate) overloaded: bool,
    /// Weighted total, filled by the combination step.
    pub(crate) total: f64,
}

/// One scoring signal.
pub(crate) trait Scorer: Send + Sync {
    /// Stable name, used in explanations, docs and metrics.
    fn name(&self) -> &'static str;
    /// Writes one score in `[0, 1]` per view into `out` (same length as `views`).
    fn score(&self, views: &[View], out: &mut [f64]);
}

/// Min-max normalisation where lower is better: `(max − x) / (max − min)`, and 1.0 when
/// `max == min`.
fn min_max_lower_better(views: &[View], out: &mut [f64], x: impl Fn(&View) -> f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in views {
        let x = x(v);
        lo = lo.min(x);
        hi = hi.max(x);
    }
    let span = hi - lo;
    for (o, v) in out.iter_mut().zip(views) {
        *o = if span > 0.0 {
            ((hi - x(v)) / span).clamp(0.0, 1.0)
        } else {
            1.0
        };
    }
}

/// `queue`: `(max_q − q) / (max_q − min_q)` over candidates, q = waiting requests.
pub(crate) struct QueueScorer;
impl Scorer for QueueScorer {
    fn name(&self) -> &'static str {
        "queue"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        min_max_lower_better(views, out, |v| v.waiting);
    }
}

/// `kv-cache`: `1 − use`; 0.5 (neutral) when the engine reports no KV gauge (TGI).
pub(crate) struct KvCacheScorer;
impl Scorer for KvCacheScorer {
    fn name(&self) -> &'static str {
        "kv-cache"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        for (o, v) in out.iter_mut().zip(views) {
            *o = v.kv.map_or(0.5, |k| (1.0 - k).clamp(0.0, 1.0));
        }
    }
}

/// `prefix`: matched leading blocks / prompt blocks.
pub(crate) struct PrefixScorer;
impl Scorer for PrefixScorer {
    fn name(&self) -> &'static str {
        "prefix"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        for (o, v) in out.iter_mut().zip(views) {
            *o = v.prefix.clamp(0.0, 1.0);
        }
    }
}

/// `lora-affinity`: 1.0 adapter running, 0.8 free adapter slot, 0.6 adapter waiting, 0 otherwise;
/// 1.0 for every pod when the request names no adapter.
pub(crate) struct LoraAffinityScorer;
impl Scorer for LoraAffinityScorer {
    fn name(&self) -> &'static str {
        "lora-affinity"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        for (o, v) in out.iter_mut().zip(views) {
            *o = v.lora.clamp(0.0, 1.0);
        }
    }
}

/// `running-requests`: `(max_r − r) / (max_r − min_r)` over candidates.
pub(crate) struct RunningRequestsScorer;
impl Scorer for RunningRequestsScorer {
    fn name(&self) -> &'static str {
        "running-requests"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        min_max_lower_better(views, out, |v| v.running);
    }
}

/// `inflight-tokens`: `(max_t − t) / (max_t − min_t)` over candidates, t = tokens in flight from
/// this gateway.
pub(crate) struct InflightTokensScorer;
impl Scorer for InflightTokensScorer {
    fn name(&self) -> &'static str {
        "inflight-tokens"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        min_max_lower_better(views, out, |v| v.inflight_tokens);
    }
}

/// Seconds added to both sides of the wait ratio so that idle pods compare by a meaningful margin
/// instead of dividing by ~0.
pub(crate) const WAIT_EPSILON_SECS: f64 = 0.001;

/// `estimated-wait`: `(w_min + ε) / (w + ε)`, w = estimated time to first token, ε = 1 ms.
/// A pod with twice the best wait scores 0.5; one five times slower scores ~0.2.
pub(crate) struct EstimatedWaitScorer;
impl Scorer for EstimatedWaitScorer {
    fn name(&self) -> &'static str {
        "estimated-wait"
    }
    fn score(&self, views: &[View], out: &mut [f64]) {
        let best = views.iter().map(|v| v.wait).fold(f64::INFINITY, f64::min);
        for (o, v) in out.iter_mut().zip(views) {
            let r = (best + WAIT_EPSILON_SECS) / (v.wait + WAIT_EPSILON_SECS);
            *o = if r.is_finite() {
                r.clamp(0.0, 1.0)
            } else {
                0.0
            };
        }
    }
}

/// Builds the weighted scorers a configuration asks for, skipping zero weights.
pub(crate) fn build(weights: &Weights) -> Vec<(Box<dyn Scorer>, f64)> {
    let all: [(Box<dyn Scorer>, f64); 7] = [
        (Box::new(QueueScorer), weights.queue),
        (Box::new(KvCacheScorer), weights.kv_cache),
        (Box::new(PrefixScorer), weights.prefix),
        (Box::new(LoraAffinityScorer), weights.lora_affinity),
        (Box::new(RunningRequestsScorer), weights.running_requests),
        (Box::new(InflightTokensScorer), weights.inflight_tokens),
        (Box::new(EstimatedWaitScorer), weights.estimated_wait),
    ];
    all.into_iter().filter(|(_, w)| *w > 0.0).collect()
}
