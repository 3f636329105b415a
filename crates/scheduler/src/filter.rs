//! Filters: each decides whether an endpoint stays a candidate for this request.
//!
//! The subset hint is applied first, while the candidate list is built (it is never relaxed; see
//! [`crate::view::collect_candidates`]). Then, in order: `freshness` and `lora`, on the endpoint's
//! state, inlined into the one pass that builds the candidate views; and `saturation`, on the
//! views themselves, because headroom includes this gateway's in-flight accounting.
//!
//! Static dispatch throughout: [`Filter`] is generic over what it inspects, and the pipeline holds
//! the concrete filters in [`Filters`], never behind `dyn`.

use std::time::Duration;

use crate::config::{SchedulerConfig, Thresholds};
use crate::endpoint::Timestamp;
use crate::explain::{Explanation, FilteredOut};
use crate::request::RequestContext;
use crate::state::EndpointState;
use crate::table::EndpointTable;
use crate::view::View;

/// Per-pick inputs of the filters.
pub(crate) struct FilterContext<'r, 'a> {
    pub(crate) request: &'r RequestContext<'a>,
    pub(crate) now: Timestamp,
    /// Hash of the requested adapter's name (0 when none).
    pub(crate) adapter_hash: u64,
}

/// One filter of the pipeline, over `T` (an endpoint's state, or a candidate's view).
pub(crate) trait Filter<T: ?Sized>: Send + Sync {
    /// Stable name, used in explanations and docs.
    fn name(&self) -> &'static str;
    /// Whether `item` stays a candidate.
    fn keep(&self, cx: &FilterContext<'_, '_>, item: &T) -> bool;
}

/// The filters a configuration asks for.
pub(crate) struct Filters {
    pub(crate) freshness: Option<FreshnessFilter>,
    pub(crate) lora: Option<LoraFilter>,
    pub(crate) saturation: SaturationFilter,
}

impl Filters {
    pub(crate) fn new(cfg: &SchedulerConfig) -> Self {
        Filters {
            freshness: cfg.max_metrics_age.map(FreshnessFilter::new),
            lora: cfg.lora_filter.then_some(LoraFilter),
            saturation: SaturationFilter {
                thresholds: cfg.saturation,
            },
        }
    }
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

/// The freshness filter's name in explanations.
pub(crate) const FRESHNESS: &str = "freshness";

impl Filter<EndpointState> for FreshnessFilter {
    fn name(&self) -> &'static str {
        FRESHNESS
    }
    fn keep(&self, cx: &FilterContext<'_, '_>, ep: &EndpointState) -> bool {
        ep.fresh(cx.now, self.max_age_nanos)
    }
}

/// `lora`: for a request naming an adapter, keeps pods that run it, have it waiting, or have a free
/// adapter slot. Pods that do not report LoRA state are kept (unknown is not incapable).
pub(crate) struct LoraFilter;

impl Filter<EndpointState> for LoraFilter {
    fn name(&self) -> &'static str {
        "lora"
    }
    fn keep(&self, cx: &FilterContext<'_, '_>, ep: &EndpointState) -> bool {
        let Some(adapter) = cx.request.lora_adapter else {
            return true;
        };
        LoraFilter::admits(ep.lora_affinity(adapter, cx.adapter_hash))
    }
}

impl LoraFilter {
    /// The rule on an affinity already computed ([`EndpointState::lora_affinity`]): the view
    /// pass reads it once for the filter and the scorer.
    #[inline]
    pub(crate) fn admits(affinity: Option<f64>) -> bool {
        affinity.is_none_or(|a| a > 0.0)
    }
}

/// Whether a load of `waiting` requests and KV-cache use `kv` is at or over `t`.
#[inline]
pub(crate) fn at_or_over(t: Thresholds, waiting: f64, kv: f64) -> bool {
    waiting >= f64::from(t.queue_depth) || kv >= t.kv_cache
}

/// `saturation`: keeps candidates below the saturation thresholds (see [`View::saturated`]) —
/// applied only while at least one candidate is below them. When none is, every candidate stays
/// and admission decides whether to shed ([`crate::admission`]).
pub(crate) struct SaturationFilter {
    pub(crate) thresholds: Thresholds,
}

impl SaturationFilter {
    /// Whether a candidate with this load is saturated.
    #[inline]
    pub(crate) fn saturated(&self, waiting: f64, kv: f64) -> bool {
        at_or_over(self.thresholds, waiting, kv)
    }

    /// Removes the saturated views when some view has headroom, recording each removal.
    pub(crate) fn apply(
        &self,
        cx: &FilterContext<'_, '_>,
        views: &mut Vec<View>,
        table: &EndpointTable,
        mut ex: Option<&mut Explanation>,
    ) {
        let headroom = views.iter().filter(|v| self.keep(cx, v)).count();
        if headroom == 0 || headroom == views.len() {
            return;
        }
        views.retain(|v| {
            if self.keep(cx, v) {
                return true;
            }
            if let Some(ex) = ex.as_deref_mut()
                && let Some(ep) = table.get(v.slot)
            {
                ex.filtered.push(FilteredOut {
                    addr: ep.cold.meta.addr,
                    filter: self.name(),
                });
            }
            false
        });
    }
}

impl Filter<View> for SaturationFilter {
    fn name(&self) -> &'static str {
        "saturation"
    }
    fn keep(&self, _: &FilterContext<'_, '_>, v: &View) -> bool {
        !v.saturated
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests;
