//! Filters: each decides whether an endpoint stays a candidate for this request.
//!
//! The subset hint is applied first, while the candidate list is built (it is never relaxed).
//! Then, in order: freshness, LoRA capability. Saturation headroom runs after the candidates'
//! load views are built (see [`crate::scheduler`]) because it needs in-flight accounting.

use std::time::Duration;

use crate::endpoint::{LoraState, Timestamp};
use crate::request::RequestContext;
use crate::state::EndpointState;

/// Per-pick inputs of the filters.
pub(crate) struct FilterContext<'r, 'a> {
    pub(crate) request: &'r RequestContext<'a>,
    pub(crate) now: Timestamp,
    /// Hash of the requested adapter's name (0 when none).
    pub(crate) adapter_hash: u64,
}

/// One filter of the pipeline.
pub(crate) trait Filter: Send + Sync {
    /// Stable name, used in explanations and docs.
    fn name(&self) -> &'static str;
    /// Whether `ep` stays a candidate.
    fn keep(&self, cx: &FilterContext<'_, '_>, ep: &EndpointState) -> bool;
}

/// `freshness`: metrics sampled no longer than `max_age` ago. An endpoint with no metrics yet is
/// not fresh. The check is made on every pick, so a pod comes back the moment fresh metrics arrive.
pub(crate) struct FreshnessFilter {
    pub(crate) max_age_nanos: u64,
}

impl FreshnessFilter {
    pub(crate) fn new(max_age: Duration) -> Self {
        FreshnessFilter {
            max_age_nanos: u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

impl Filter for FreshnessFilter {
    fn name(&self) -> &'static str {
        "freshness"
    }
    fn keep(&self, cx: &FilterContext<'_, '_>, ep: &EndpointState) -> bool {
        ep.fresh(cx.now, self.max_age_nanos)
    }
}

/// `lora`: for a request naming an adapter, keeps pods that run it, have it waiting, or have a free
/// adapter slot. Pods that do not report LoRA state are kept (unknown is not incapable).
pub(crate) struct LoraFilter;

impl Filter for LoraFilter {
    fn name(&self) -> &'static str {
        "lora"
    }
    fn keep(&self, cx: &FilterContext<'_, '_>, ep: &EndpointState) -> bool {
        let Some(adapter) = cx.request.lora_adapter else {
            return true;
        };
        ep.lora_affinity(adapter, cx.adapter_hash)
            .is_none_or(|a| a > 0.0)
    }
}

/// Affinity of a pod that runs the adapter while another adapter waits there for a slot: below a
/// free slot and a waiting adapter, so that, where another pod can take the request, this pod's
/// running adapter drains and the waiting one gets its slot instead of starving.
pub(crate) const LORA_RUNNING_BLOCKED: f64 = 0.5;

/// Affinity of a pod with a free adapter slot.
pub(crate) const LORA_FREE_SLOT: f64 = 0.8;

/// Affinity of a free slot when another candidate already runs the adapter unblocked: loading the
/// adapter there would take a slot that an adapter running nowhere may need.
pub(crate) const LORA_FREE_SLOT_SPREAD: f64 = 0.3;

/// The LoRA affinity of a pod for `adapter`: 1.0 running, 0.8 free slot, 0.6 waiting, 0 otherwise;
/// running but with another adapter blocked there (see [`lora_blocked`]), [`LORA_RUNNING_BLOCKED`].
///
/// Distinct adapters across the running and waiting lists count as loaded (vLLM repeats running
/// adapters in its waiting list), and a slot is free when fewer than `max_lora` are loaded.
pub(crate) fn lora_affinity(l: &LoraState, adapter: &str) -> f64 {
    if l.running.iter().any(|a| a == adapter) {
        return if lora_blocked(l) {
            LORA_RUNNING_BLOCKED
        } else {
            1.0
        };
    }
    if lora_has_free_slot(l) {
        return LORA_FREE_SLOT;
    }
    if l.waiting.iter().any(|a| a == adapter) {
        return 0.6;
    }
    0.0
}

/// Whether an adapter waits for a slot: as many distinct adapters run as there are slots, and the
/// waiting list names one that is not running. The engine admits it only once one of the running
/// adapters has no request left.
pub(crate) fn lora_blocked(l: &LoraState) -> bool {
    (distinct_running(l) as u64) >= u64::from(l.max_lora)
        && l.waiting.iter().any(|w| !l.running.contains(w))
}

/// Distinct adapters in the running list (engines may repeat a name: one entry per series or per
/// request).
fn distinct_running(l: &LoraState) -> usize {
    l.running
        .iter()
        .enumerate()
        .filter(|(i, r)| !l.running[..*i].contains(r))
        .count()
}

/// Whether fewer distinct adapters than `max_lora` are loaded (running or waiting).
pub(crate) fn lora_has_free_slot(l: &LoraState) -> bool {
    let running = distinct_running(l);
    let waiting_only = l
        .waiting
        .iter()
        .enumerate()
        .filter(|(i, w)| !l.running.contains(w) && !l.waiting[..*i].contains(w))
        .count();
    let loaded = running + waiting_only;
    (loaded as u64) < u64::from(l.max_lora)
}
