//! The scraper's own Prometheus metrics.
//!
//! Registered into the caller's [`Registry`] so that the picker, proxy or benchmark exposes them on
//! its existing metrics port. Recording is a few atomic operations; the error family takes a read
//! lock only on the error path.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Label set of the error counter: `reason` is a [`crate::ScrapeError::metric_label`].
type ReasonLabel = [(&'static str, &'static str); 1];

/// Handles to the scraper's metrics. Cloning shares the same underlying series.
#[derive(Clone, Debug)]
pub struct ScrapeMetrics {
    duration: Histogram,
    errors: Family<ReasonLabel, Counter>,
    stale: Gauge,
    late: Gauge,
    targets: Gauge,
    wakeup_delay: Histogram,
    stalls: Counter,
}

impl Default for ScrapeMetrics {
    fn default() -> Self {
        ScrapeMetrics {
            // 0.25 ms .. ~4 s: a local page takes well under a millisecond, a loaded vLLM tens of ms.
            duration: Histogram::new(exponential_buckets(0.000_25, 2.0, 15)),
            errors: Family::default(),
            stale: Gauge::default(),
            late: Gauge::default(),
            targets: Gauge::default(),
            // 0.5 ms .. ~4 s: an idle thread wakes within a millisecond; a starved one, hundreds.
            wakeup_delay: Histogram::new(exponential_buckets(0.000_5, 2.0, 14)),
            stalls: Counter::default(),
        }
    }
}

impl ScrapeMetrics {
    /// Creates the metrics and registers them in `registry` under `infergate_metrics_`:
    /// `scrape_duration_seconds` (histogram, successful and failed scrapes),
    /// `scrape_errors_total{reason}` (every reason of [`crate::ScrapeError::REASONS`] at 0 from the
    /// start), `stale_targets` (failed: not routed on), `late_targets`
    /// (connected, slow: routed on their last page) and `targets` (gauges), and the scraper
    /// thread's own health: `scraper_wakeup_delay_seconds` (histogram) and `scraper_stalls_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ScrapeMetrics::default();
        // Every reason exported at 0 from the start: a series that appears only with its first
        // failure hides that failure from `rate()` and `increase()`, which need a sample before it.
        for reason in crate::ScrapeError::REASONS {
            let _created = m.errors.get_or_create(&[("reason", reason)]);
        }
        let sub = registry.sub_registry_with_prefix("infergate_metrics");
        sub.register_with_unit(
            "scrape_duration",
            "Time to fetch and parse one model-server metrics page",
            Unit::Seconds,
            m.duration.clone(),
        );
        sub.register(
            "scrape_errors",
            "Failed scrapes of model-server metrics pages, by reason",
            m.errors.clone(),
        );
        sub.register(
            "stale_targets",
            "Scrape targets whose scrapes failed (refused, reset, an HTTP or parse error, nothing connected within the staleness threshold); not routed on",
            m.stale.clone(),
        );
        sub.register(
            "late_targets",
            "Scrape targets with no page within the staleness threshold but a scrape connected to a server that answered its last one; routed on their last page",
            m.late.clone(),
        );
        sub.register("targets", "Scrape targets being polled", m.targets.clone());
        sub.register_with_unit(
            "scraper_wakeup_delay",
            "How long after its due time a scrape or staleness timer of the scraper ran: the scraper thread's scheduling delay (near zero unless the gateway is short of CPU)",
            Unit::Seconds,
            m.wakeup_delay.clone(),
        );
        sub.register(
            "scraper_stalls",
            "Times the scraper thread ran later than the staleness threshold behind its schedule (the gateway short of CPU: a busy host or a CPU limit); freshness was judged that much late",
            m.stalls.clone(),
        );
        m
    }

    pub(crate) fn observe_duration(&self, d: Duration) {
        self.duration.observe(d.as_secs_f64());
    }

    pub(crate) fn observe_wakeup_delay(&self, d: Duration) {
        self.wakeup_delay.observe(d.as_secs_f64());
    }

    pub(crate) fn count_stall(&self) {
        self.stalls.inc();
    }

    pub(crate) fn count_error(&self, reason: &'static str) {
        self.errors.get_or_create(&[("reason", reason)]).inc();
    }

    pub(crate) fn state_delta(&self, state: crate::ScrapeState, delta: i64) {
        match state {
            crate::ScrapeState::Ok => {}
            crate::ScrapeState::Late => {
                self.late.inc_by(delta);
            }
            crate::ScrapeState::Failed => {
                self.stale.inc_by(delta);
            }
        }
    }

    pub(crate) fn targets_delta(&self, delta: i64) {
        self.targets.inc_by(delta);
    }

    /// Scrape errors counted so far for `reason` (for tests and in-process reports).
    pub fn errors(&self, reason: &'static str) -> u64 {
        self.errors.get_or_create(&[("reason", reason)]).get()
    }

    /// Targets currently failed (stale).
    pub fn stale_targets(&self) -> i64 {
        self.stale.get()
    }

    /// Targets currently late.
    pub fn late_targets(&self) -> i64 {
        self.late.get()
    }

    /// Stalls of the scraper thread counted so far (see `scraper_stalls_total`).
    pub fn stalls(&self) -> u64 {
        self.stalls.get()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn every_error_reason_is_exported_at_zero_before_any_error() {
        let mut registry = Registry::default();
        let _metrics = ScrapeMetrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for reason in crate::ScrapeError::REASONS {
            let want = format!("infergate_metrics_scrape_errors_total{{reason=\"{reason}\"}} 0\n");
            assert!(text.contains(&want), "{want} missing:\n{text}");
        }
    }
}
