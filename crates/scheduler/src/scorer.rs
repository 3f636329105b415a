//! Scorers: each turns a candidate's [`View`] into a score in `[0, 1]`.
//!
//! Scores are combined as Σ weight·score (see [`Weights`]); a scorer with weight 0 is never built.
//! Min-max scorers give every candidate 1.0 when all candidates are equal, so an uninformative
//! signal never decides a pick.

use crate::config::Weights;
use crate::explain::{CandidateRecord, Explanation, ScoreRecord};
use crate::table::EndpointTable;
use crate::view::View;

/// Pool-wide quantities the relative scorers normalise by, computed once per pick over the final
/// candidates.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Spans {
    waiting: MinMax,
    running: MinMax,
    inflight_tokens: MinMax,
    /// The least estimated wait over the candidates (as [`Spans::wait`] gives it).
    best_wait: f64,
    /// 1 when some candidate is idle, else 0: the weight of each view's `step_wait` in its wait.
    step: f64,
}

#[derive(Copy, Clone, Debug)]
struct MinMax {
    hi: f64,
    /// `1 / (max − min)`, or 0 when every candidate is equal.
    inv_span: f64,
}

impl MinMax {
    fn new(lo: f64, hi: f64) -> Self {
        let span = hi - lo;
        MinMax {
            hi,
            inv_span: if span > 0.0 { 1.0 / span } else { 0.0 },
        }
    }

    /// `(max − x) / (max − min)`, and 1.0 when `max == min`.
    fn lower_better(&self, x: f64) -> f64 {
        if self.inv_span > 0.0 {
            ((self.hi - x) * self.inv_span).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

impl Spans {
    pub(crate) fn of(views: &[View]) -> Self {
        let (mut wl, mut wh) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut rl, mut rh) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut tl, mut th) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut best_wait = f64::INFINITY;
        let mut best_stepped = f64::INFINITY;
        let mut idle = false;
        for v in views {
            wl = wl.min(v.waiting);
            wh = wh.max(v.waiting);
            rl = rl.min(v.running);
            rh = rh.max(v.running);
            tl = tl.min(v.inflight_tokens);
            th = th.max(v.inflight_tokens);
            best_wait = best_wait.min(v.wait);
            best_stepped = best_stepped.min(v.wait + f64::from(v.step_wait));
            idle |= v.step_wait == 0.0;
        }
        Spans {
            waiting: MinMax::new(wl, wh),
            running: MinMax::new(rl, rh),
            inflight_tokens: MinMax::new(tl, th),
            best_wait: if idle { best_stepped } else { best_wait },
            step: if idle { 1.0 } else { 0.0 },
        }
    }

    /// A candidate's estimated time to first token, seconds. Where some candidate is idle, a busy
    /// one's wait includes the decode step its prefill would share (an engine step runs the
    /// batch's decodes with the prefill it carries, an idle pod's does not). Among busy
    /// candidates only, every one pays it; as a common term it would only flatten the ratios
    /// [`ScorerKind::EstimatedWait`] compares, and a busy pod's learned prefill rate already
    /// holds the decodes interleaved with its queue (docs/scheduler.md, `step_p`).
    #[inline]
    pub(crate) fn wait(&self, v: &View) -> f64 {
        v.wait + self.step * f64::from(v.step_wait)
    }
}

/// One scoring signal.
pub(crate) trait Scorer: Send + Sync {
    /// Stable name, used in explanations, docs and metrics.
    fn name(&self) -> &'static str;
    /// The score in `[0, 1]` of one candidate, given the spans over all candidates.
    fn score(&self, view: &View, spans: &Spans) -> f64;
}

/// Seconds added to both sides of the wait ratio so that idle pods compare by a meaningful margin
/// instead of dividing by ~0.
pub(crate) const WAIT_EPSILON_SECS: f64 = 0.001;

/// The built-in scorers. An enum rather than boxed trait objects so the per-candidate loop is
/// statically dispatched; each variant's formula is below and in `docs/scheduler.md`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScorerKind {
    /// `queue`: `(max_q − q) / (max_q − min_q)` over candidates (1 when all equal), q = waiting
    /// requests (scraped queue + routed since the scrape, awaiting the first token).
    Queue,
    /// `kv-cache`: `1 − use`; 0.5 (neutral) when the engine reports no KV gauge (TGI).
    KvCache,
    /// `prefix`: matched leading blocks / prompt blocks (0 for prompts shorter than one block).
    Prefix,
    /// `lora-affinity`: the view's affinity, computed by [`crate::lora`]: 1.0 adapter running,
    /// 0.8 free adapter slot (0.3 while another candidate runs the adapter unblocked), 0.6 adapter
    /// waiting, 0.5 running while another adapter waits for the slot, 0 otherwise; 1.0 for every
    /// pod when the request names no adapter, 0.5 when the pod reports no LoRA state.
    LoraAffinity,
    /// `running-requests`: `(max_r − r) / (max_r − min_r)` over candidates.
    RunningRequests,
    /// `inflight-tokens`: `(max_t − t) / (max_t − min_t)` over candidates, t = prompt + output
    /// tokens in flight from this gateway.
    InflightTokens,
    /// `estimated-wait`: `(w_min + ε) / (w + ε)`, w = estimated time to first token, ε = 1 ms.
    /// A pod with twice the best wait scores about 0.5; one five times slower about 0.2.
    EstimatedWait,
}

#[inline]
fn queue(v: &View, spans: &Spans) -> f64 {
    spans.waiting.lower_better(v.waiting)
}

#[inline]
fn kv_cache(v: &View, _: &Spans) -> f64 {
    v.kv.map_or(0.5, |k| (1.0 - k).clamp(0.0, 1.0))
}

#[inline]
fn prefix(v: &View, _: &Spans) -> f64 {
    v.prefix.clamp(0.0, 1.0)
}

#[inline]
fn lora_affinity(v: &View, _: &Spans) -> f64 {
    v.lora.clamp(0.0, 1.0)
}

#[inline]
fn running_requests(v: &View, spans: &Spans) -> f64 {
    spans.running.lower_better(v.running)
}

#[inline]
fn inflight_tokens(v: &View, spans: &Spans) -> f64 {
    spans.inflight_tokens.lower_better(v.inflight_tokens)
}

#[inline]
fn estimated_wait(v: &View, spans: &Spans) -> f64 {
    let r = (spans.best_wait + WAIT_EPSILON_SECS) / (spans.wait(v) + WAIT_EPSILON_SECS);
    if r.is_finite() {
        r.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The number of [`ScorerKind`]s.
const KINDS: usize = 7;

impl ScorerKind {
    /// Position in the one order [`build`] lists the scorers in (the declaration order).
    fn index(self) -> usize {
        self as usize
    }
}

impl Scorer for ScorerKind {
    fn name(&self) -> &'static str {
        match self {
            ScorerKind::Queue => "queue",
            ScorerKind::KvCache => "kv-cache",
            ScorerKind::Prefix => "prefix",
            ScorerKind::LoraAffinity => "lora-affinity",
            ScorerKind::RunningRequests => "running-requests",
            ScorerKind::InflightTokens => "inflight-tokens",
            ScorerKind::EstimatedWait => "estimated-wait",
        }
    }

    #[inline]
    fn score(&self, v: &View, spans: &Spans) -> f64 {
        match self {
            ScorerKind::Queue => queue(v, spans),
            ScorerKind::KvCache => kv_cache(v, spans),
            ScorerKind::Prefix => prefix(v, spans),
            ScorerKind::LoraAffinity => lora_affinity(v, spans),
            ScorerKind::RunningRequests => running_requests(v, spans),
            ScorerKind::InflightTokens => inflight_tokens(v, spans),
            ScorerKind::EstimatedWait => estimated_wait(v, spans),
        }
    }
}

/// Builds the weighted scorers a configuration asks for, skipping zero weights, in the order of
/// kinds ([`score_all`] sums them in that order on both of its paths).
pub(crate) fn build(weights: &Weights) -> Vec<(ScorerKind, f64)> {
    [
        (ScorerKind::Queue, weights.queue),
        (ScorerKind::KvCache, weights.kv_cache),
        (ScorerKind::Prefix, weights.prefix),
        (ScorerKind::LoraAffinity, weights.lora_affinity),
        (ScorerKind::RunningRequests, weights.running_requests),
        (ScorerKind::InflightTokens, weights.inflight_tokens),
        (ScorerKind::EstimatedWait, weights.estimated_wait),
    ]
    .into_iter()
    .filter(|(_, w)| *w > 0.0)
    .collect()
}

/// The combination step: every view's `total` = Σ weight·score over `scorers`. With an
/// explanation, the same arithmetic in the same order, recording every value per candidate.
pub(crate) fn score_all(
    scorers: &[(ScorerKind, f64)],
    views: &mut [View],
    table: &EndpointTable,
    now: crate::endpoint::Timestamp,
    ex: Option<&mut Explanation>,
) {
    let spans = Spans::of(views);
    match ex {
        None => {
            // The hot path: one pass over the candidates, each view read once while it is in
            // cache. `build` lists the scorers in one fixed order of kinds, so each is a branch
            // on a per-pick constant here instead of a dispatch per view; the sum runs in that
            // order, the explained path's, so both give bit-identical totals.
            let mut w = [None; KINDS];
            for (s, weight) in scorers {
                w[s.index()] = Some(*weight);
            }
            debug_assert!(
                scorers.windows(2).all(|p| p[0].0.index() < p[1].0.index()),
                "scorers come from `build`, in the order of kinds"
            );
            for v in views.iter_mut() {
                let mut total = 0.0;
                macro_rules! add {
                    ($k:expr, $f:path) => {
                        if let Some(w) = w[$k as usize] {
                            total += w * $f(v, &spans);
                        }
                    };
                }
                add!(ScorerKind::Queue, queue);
                add!(ScorerKind::KvCache, kv_cache);
                add!(ScorerKind::Prefix, prefix);
                add!(ScorerKind::LoraAffinity, lora_affinity);
                add!(ScorerKind::RunningRequests, running_requests);
                add!(ScorerKind::InflightTokens, inflight_tokens);
                add!(ScorerKind::EstimatedWait, estimated_wait);
                v.total = total;
            }
        }
        Some(ex) => {
            ex.candidates.clear();
            for v in views.iter_mut() {
                let Some(ep) = table.get(v.slot) else {
                    continue;
                };
                let mut scores = Vec::with_capacity(scorers.len());
                let mut total = 0.0;
                for (s, w) in scorers {
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
                    scores,
                    total,
                    waiting: v.waiting,
                    running: v.running,
                    estimated_wait_secs: spans.wait(v),
                    prefix_blocks: v.prefix_blocks,
                    saturated: v.saturated,
                    ..CandidateRecord::of(ep, now)
                });
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests;
