//! Candidate views: the candidate list (the subset hint or the whole pool) and one [`View`] per
//! candidate that passes the endpoint filters — its load as the scorers, the saturation filter and
//! admission see it (crate-internal).
//!
//! A view adds back what a scrape cannot know: the requests this gateway routed since the
//! snapshot (in-flight accounting), the prefix the pod probably holds, and the learned rates that
//! turn queued tokens into an estimated wait.

use crate::config::{Policy, SchedulerConfig};
use crate::endpoint::Timestamp;
use crate::explain::{Explanation, FilteredOut};
use crate::filter::{Filter, FilterContext, Filters, LoraFilter, at_or_over};
use crate::lora;
use crate::rates::PoolRates;
use crate::request::RequestContext;
use crate::table::EndpointTable;

/// KV-cache use above which a new request is expected to wait for memory to free up.
const KV_PRESSURE_START: f64 = 0.9;

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
    /// Tokens (prompt + expected output) of this gateway's requests in flight on the endpoint
    /// (with its peer replicas', [`crate::peers`]).
    pub(crate) inflight_tokens: f64,
    /// This gateway's (and its peer replicas') requests in flight on the endpoint.
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
    /// The decode part of the engine step that would carry this request's prefill (seconds: one
    /// inter-token time, or the batch's decode tokens at the prefill rate if longer) when other
    /// sequences decode there; 0 on an idle endpoint. Not in `wait`: it counts only when some
    /// candidate is idle ([`crate::scorer::Spans`]).
    pub(crate) step_wait: f32,
    /// Estimated time to first token, seconds.
    pub(crate) wait: f64,
    /// At or over the saturation thresholds.
    pub(crate) saturated: bool,
    /// At or over the overload thresholds.
    pub(crate) overloaded: bool,
    /// Weighted total, filled by the combination step.
    pub(crate) total: f64,
}

/// Candidates from the subset hint (deduplicated, unknown addresses ignored) or the whole pool,
/// into `out`. `seen` (one mark per slot) and `seen_mark` deduplicate the hint without clearing.
pub(crate) fn collect_candidates(
    table: &EndpointTable,
    req: &RequestContext<'_>,
    seen: &mut [u64],
    seen_mark: &mut u64,
    out: &mut Vec<u32>,
) {
    out.clear();
    match req.subset {
        None => out.extend_from_slice(table.live()),
        Some(subset) => {
            *seen_mark += 1;
            for addr in subset {
                if let Some(slot) = table.slot_of(addr) {
                    let seen = &mut seen[slot as usize];
                    if *seen != *seen_mark {
                        *seen = *seen_mark;
                        out.push(slot);
                    }
                }
            }
        }
    }
}

/// The filter's name, in explanations, of a pod out of the candidates because outlier
/// detection ejected it ([`crate::outlier`]).
pub(crate) const OUTLIER: &str = "outlier";

/// Drops the candidates ejected at `now` by outlier detection, unless that would drop them all
/// (an answer from a failing pod is no worse than none).
pub(crate) fn drop_ejected(
    table: &EndpointTable,
    now: Timestamp,
    candidates: &mut Vec<u32>,
    ex: Option<&mut Explanation>,
) {
    let ejected = |slot: &u32| table.get(*slot).is_some_and(|e| e.outlier.is_ejected(now));
    let out = candidates.iter().filter(|s| ejected(s)).count();
    if out == 0 || out == candidates.len() {
        return;
    }
    if let Some(ex) = ex {
        for slot in candidates.iter().filter(|s| ejected(s)) {
            if let Some(ep) = table.get(*slot) {
                ex.filtered.push(FilteredOut {
                    addr: ep.cold.meta.addr,
                    filter: OUTLIER,
                });
            }
        }
    }
    candidates.retain(|s| !ejected(s));
}

/// What the views are built from.
pub(crate) struct Sources<'s> {
    pub(crate) table: &'s EndpointTable,
    pub(crate) filters: &'s Filters,
    pub(crate) rates: &'s PoolRates,
    pub(crate) cfg: &'s SchedulerConfig,
    /// Per slot: leading prompt blocks the prefix index matched.
    pub(crate) matched: &'s [u32],
    /// The prompt's block count.
    pub(crate) prompt_blocks: usize,
    /// Whether other picker replicas report load. Without them every endpoint's peer sums are
    /// zero (they are re-summed when the last peer goes), and the views skip that arithmetic.
    pub(crate) peers: bool,
}

/// Runs the endpoint filters — freshness always, LoRA when `lora` — and builds one [`View`] per
/// surviving candidate into `views`, from the scraped metrics, in-flight accounting, the prefix
/// match and the learned rates. One pass over the candidates, reading only each endpoint's hot
/// fields. Returns how many candidates passed the freshness filter.
pub(crate) fn build(
    src: &Sources<'_>,
    cx: &FilterContext<'_, '_>,
    candidates: &[u32],
    lora: bool,
    views: &mut Vec<View>,
    mut ex: Option<&mut Explanation>,
) -> usize {
    let req = cx.request;
    let cfg = src.cfg;
    let scored = cfg.policy == Policy::Scored;
    // Static dispatch: the filters are inlined into this loop.
    let freshness = src.filters.freshness.as_ref();
    let lora_filter = src
        .filters
        .lora
        .as_ref()
        .filter(|_| lora && scored && req.lora_adapter.is_some());
    let saturation = &src.filters.saturation;
    let mut fresh = 0usize;
    let nblocks = src.prompt_blocks;
    let adj = cfg.inflight_accounting;
    let inv_prefill_prior = 1.0 / src.rates.prefill_prior();
    let decode_prior = src.rates.decode_prior();
    let inv_decode_prior = 1.0 / decode_prior;
    let mean_prompt = src.rates.mean_prompt;
    let mean_output = src.rates.mean_output;
    let over = cfg.overload;
    let lora_load_secs = cfg.rates.lora_load_ms * 1e-3;
    let inv_blocks = if nblocks > 0 {
        1.0 / nblocks as f64
    } else {
        0.0
    };
    views.clear();
    'candidates: for &slot in candidates {
        let Some(ep) = src.table.get(slot) else {
            continue;
        };
        // The pod's LoRA affinity is read once, for the LoRA filter and the view.
        let mut affinity = None;
        let removed_by = if freshness.is_some_and(|f| !f.keep(cx, ep)) {
            freshness.map(Filter::name)
        } else {
            fresh += 1;
            affinity = req
                .lora_adapter
                .and_then(|a| ep.lora_affinity(a, cx.adapter_hash));
            lora_filter
                .filter(|_| !LoraFilter::admits(affinity))
                .map(Filter::name)
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
        let inv_prefill_rate = ep
            .prefill
            .inv()
            .unwrap_or(inv_prefill_prior * ep.speed.inv_prefill);
        // The other picker replicas' requests count as this one's own (zero without peers), their
        // pending ones aged since the peers reported them (`PeerSum::pending_left`). Without
        // peers the sums below are this replica's alone: adding zeros would give the same bits.
        let peer = &ep.peer;
        debug_assert!(
            src.peers || *peer == crate::peers::PeerSum::default(),
            "peer sums left behind by the last peer"
        );
        let peer_left = if src.peers {
            peer.pending_left(ep.pending_tokens, cx.now, inv_prefill_rate)
        } else {
            1.0
        };
        let (since_pending, since_decoding, since_tokens) = match (adj, src.peers) {
            (false, _) => (0.0, 0.0, 0.0),
            (true, false) => (
                f64::from(ep.since_pending),
                f64::from(ep.since_requests.saturating_sub(ep.since_pending)),
                ep.since_pending_tokens as f64,
            ),
            (true, true) => {
                let peer_since = f64::from(peer.since_pending.min(peer.since_requests)) * peer_left;
                (
                    f64::from(ep.since_pending) + peer_since,
                    f64::from(ep.since_requests.saturating_sub(ep.since_pending))
                        + (f64::from(peer.since_requests) - peer_since),
                    ep.since_pending_tokens as f64 + peer.since_pending_tokens as f64 * peer_left,
                )
            }
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
        let prefix_blocks = src.matched.get(slot as usize).copied().unwrap_or(0);
        let prefix = f64::from(prefix_blocks) * inv_blocks;
        let lora = match req.lora_adapter {
            None => lora::NOT_REQUESTED,
            Some(_) => affinity.unwrap_or(lora::UNKNOWN),
        };
        let scraped_queue = m_wait * mean_prompt;
        let queued_tokens = match (adj, src.peers) {
            (false, _) => scraped_queue,
            (true, false) => (ep.pending_tokens as f64).max(scraped_queue + since_tokens),
            (true, true) => (ep.pending_tokens as f64 + peer.pending_tokens as f64 * peer_left)
                .max(scraped_queue + since_tokens),
        };
        let own_tokens = f64::from(req.prompt_tokens) * (1.0 - prefix);
        // Seconds per generated token of one request (the inter-token time).
        let inv_decode_rate = ep
            .decode
            .inv()
            .unwrap_or(inv_decode_prior * ep.speed.inv_decode);
        // Sequences running or queued ahead decode in the step that carries this prefill (an
        // engine step runs the batch's decodes with the prefill chunk). That step takes longer
        // than the prefill alone by at least one inter-token time (a pass over the weights) and
        // at least the batch's decode tokens at the prefill rate (its compute, which is what
        // grows with the batch where compute bounds the step).
        let step_wait = if running + waiting >= 1.0 {
            inv_decode_rate.max(running * inv_prefill_rate) as f32
        } else {
            0.0
        };
        let kv_wait = match kv {
            Some(k) if k > KV_PRESSURE_START => {
                (k - KV_PRESSURE_START) / (1.0 - KV_PRESSURE_START)
                    * 0.5
                    * mean_output
                    * inv_decode_rate
            }
            _ => 0.0,
        };
        let load_wait = if req.lora_adapter.is_some() && lora::must_load(lora) {
            lora_load_secs
        } else {
            0.0
        };
        // No free slot and the adapter not running: the request waits until one of the running
        // adapters has no request left, sooner on the pod where one has the fewest in flight.
        let slot_wait = if req.lora_adapter.is_some() && (lora == 0.0 || lora == lora::WAITING) {
            ep.adapters
                .slot_frees_in(
                    &ep.lora,
                    cx.adapter_hash,
                    mean_output * inv_decode_rate,
                    ep.since_requests > 0,
                )
                .unwrap_or(0.0)
        } else {
            0.0
        };
        let wait =
            (queued_tokens + own_tokens) * inv_prefill_rate + kv_wait + load_wait + slot_wait;
        let kv_or_zero = kv.unwrap_or(0.0);
        views.push(View {
            slot,
            waiting,
            running,
            kv,
            inflight_tokens: ep.inflight_tokens.saturating_add(peer.inflight_tokens) as f64,
            inflight: f64::from(ep.inflight) + f64::from(peer.inflight),
            prefix_blocks,
            prefix,
            lora,
            queued_tokens,
            own_tokens,
            step_wait,
            wait,
            saturated: saturation.saturated(waiting, kv_or_zero),
            overloaded: at_or_over(over, waiting, kv_or_zero),
            total: 0.0,
        });
    }
    // Adapter slots. Consolidate adapters: where a pod runs the adapter with no other adapter
    // blocked (or holds it resident), a free slot elsewhere is worth less — loading the adapter
    // there would take a slot another adapter may need. And charge each pod's wait with what the
    // request would cost the adapters around it in slot time (`lora::slot_cost_lifetimes`):
    // keeping a slot busy that another adapter waits for, or taking one of the last free ones.
    if req.lora_adapter.is_some() {
        let consolidating = views.iter().any(|v| v.lora >= lora::RESIDENT);
        let blocked = views.iter().any(|v| v.lora == lora::RUNNING_BLOCKED);
        if consolidating || blocked {
            let free_slots = views.iter().filter(|v| v.lora == lora::FREE_SLOT).count();
            for v in views.iter_mut() {
                // A pod that reports no LoRA state while another runs or holds the adapter: the
                // adapter is not known to be there, so it is charged the load a free slot is
                // (a vLLM pod shows no LoRA state until its engine has run a step; without the
                // charge a fresh idle pod drew the adapter's requests from the pod running it).
                if consolidating
                    && let Some(ep) = src.table.get(v.slot)
                    && !ep.lora.known
                {
                    v.wait += lora_load_secs;
                }
                if (v.lora == lora::RUNNING_BLOCKED || v.lora == lora::FREE_SLOT)
                    && let Some(ep) = src.table.get(v.slot)
                {
                    let lifetimes =
                        lora::slot_cost_lifetimes(v.lora, ep.lora.known, consolidating, free_slots);
                    let decode_rate = ep.decode_rate(src.rates);
                    v.wait += lifetimes * mean_output / decode_rate;
                }
                v.lora = lora::consolidated(v.lora, consolidating);
            }
        }
    }
    fresh
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use std::time::Duration;

    use crate::fixtures::*;
    use crate::*;

    #[test]
    fn picks_between_two_scrapes_do_not_pile_onto_one_pod() {
        for seed in 0..20 {
            let mut s = scheduler(SchedulerConfig::default(), 4);
            let mut firsts = Vec::new();
            for i in 0..4 {
                let d = s
                    .pick(&RequestContext::new("m", 300), T0, &mut rng(seed * 10 + i))
                    .unwrap();
                firsts.push(d.endpoints.first());
            }
            firsts.sort();
            firsts.dedup();
            assert_eq!(
                firsts.len(),
                4,
                "seed {seed}: four picks spread over four pods"
            );
        }
    }

    #[test]
    fn a_new_scrape_replaces_routed_since_scrape_counts() {
        let mut s = scheduler(SchedulerConfig::default(), 1);
        let d = s
            .pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        let (_, ex) = s.pick_explained(&RequestContext::new("m", 300), T0, &mut rng(2));
        assert_eq!(ex.candidates[0].waiting, 1.0);
        // The engine now reports the request itself: it is not counted twice.
        let t1 = T0.saturating_add(Duration::from_millis(50));
        s.apply_metrics(addr(0), snapshot(t1, 2, 0.1)).unwrap();
        let (_, ex) = s.pick_explained(&RequestContext::new("m", 300), t1, &mut rng(3));
        assert_eq!(ex.candidates[0].waiting, 2.0);
        assert!(s.first_token(d.ticket, t1));
    }
}
