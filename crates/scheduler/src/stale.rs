//! Fail-open on stale metrics (crate-internal): when no candidate has fresh metrics, the pods
//! whose scrapes still reach the server keep receiving requests, ranked on what this gateway
//! knows without a page — its own requests in flight on each — within a per-pod cap.
//!
//! The reference endpoint picker fails closed here, and a stalled `/metrics` (a busy server
//! answers it on the event loop that streams tokens) then halts all dispatch to a pool that is
//! serving fine. Unreachable pods (connection refused, nothing connected) are never candidates:
//! routing to them would turn an outage into upstream errors.
//!
//! The same views are the fallback when pods are fresh but admission would shed the request on
//! every one: a pod that answers but whose page is missing is capacity of unknown load, and a
//! 429 while it may be idle is the worse answer (`Scheduler::pick`).

use crate::endpoint::{ScrapeState, Timestamp};
use crate::explain::{CandidateRecord, Explanation, FilteredOut};
use crate::filter::{FRESHNESS, FilterContext};
use crate::lora;
use crate::table::EndpointTable;
use crate::view::{Sources, View};

/// Name of the cap in explanations.
const CAP: &str = "stale-metrics-cap";
/// Name, in explanations, of what removed the fresh pods when every one would have shed the
/// request and a pod without a page took it.
pub(crate) const ADMISSION: &str = "admission";

/// What [`build`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// At least one pod answers and is under the cap: `views` holds them.
    Views,
    /// Pods answer, but every one is at the cap.
    Capped,
    /// No candidate answers: fail closed after all.
    NoneReachable,
}

/// Views of the candidates that still answer and are under `cap`, with only what does not need
/// a page: this gateway's in-flight count, the prefix match and the last known LoRA state.
pub(crate) fn build(
    src: &Sources<'_>,
    cx: &FilterContext<'_, '_>,
    candidates: &[u32],
    cap: u32,
    views: &mut Vec<View>,
    mut ex: Option<&mut Explanation>,
) -> Outcome {
    views.clear();
    let inv_blocks = if src.prompt_blocks > 0 {
        1.0 / src.prompt_blocks as f64
    } else {
        0.0
    };
    let mut reachable = 0usize;
    for &slot in candidates {
        let Some(ep) = src.table.get(slot) else {
            continue;
        };
        if ep.scrape != ScrapeState::Failed || !ep.reachable {
            continue;
        }
        reachable += 1;
        if ep.inflight >= cap {
            if let Some(ex) = ex.as_deref_mut() {
                ex.filtered.push(FilteredOut {
                    addr: ep.cold.meta.addr,
                    filter: CAP,
                });
            }
            continue;
        }
        if let Some(ex) = ex.as_deref_mut() {
            // The freshness filter removed it; fail-open takes it back as a candidate.
            let addr = ep.cold.meta.addr;
            ex.filtered
                .retain(|f| f.addr != addr || f.filter != FRESHNESS);
        }
        let prefix_blocks = src.matched.get(slot as usize).copied().unwrap_or(0);
        let lora = match cx.request.lora_adapter {
            None => lora::NOT_REQUESTED,
            Some(a) => ep
                .lora_affinity(a, cx.adapter_hash)
                .unwrap_or(lora::UNKNOWN),
        };
        views.push(View {
            slot,
            inflight: f64::from(ep.inflight),
            inflight_tokens: ep.inflight_tokens as f64,
            prefix_blocks,
            prefix: f64::from(prefix_blocks) * inv_blocks,
            lora,
            ..View::default()
        });
    }
    match (reachable, views.is_empty()) {
        (0, _) => Outcome::NoneReachable,
        (_, true) => Outcome::Capped,
        (_, false) => Outcome::Views,
    }
}

/// Records the fail-open candidates in `views` (ranked, `total` set by [`score`]) in `ex`.
pub(crate) fn explain(views: &[View], table: &EndpointTable, now: Timestamp, ex: &mut Explanation) {
    ex.candidates.clear();
    for v in views {
        let Some(ep) = table.get(v.slot) else {
            continue;
        };
        ex.candidates.push(CandidateRecord {
            total: v.total,
            prefix_blocks: v.prefix_blocks,
            fail_open: true,
            ..CandidateRecord::of(ep, now)
        });
    }
}

/// Fewest in flight first; among equals, the longer prefix match, then the better LoRA
/// affinity (both in [0, 1], weighted so they never outweigh one request in flight).
pub(crate) fn score(v: &View) -> f64 {
    -v.inflight + 0.5 * v.prefix + 0.25 * v.lora.clamp(0.0, 1.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
