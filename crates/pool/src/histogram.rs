//! A histogram recorded with atomic adds only, for per-request timings.
//!
//! `prometheus_client`'s `Histogram` takes a lock on every observation. On a path that already
//! counts its locks (the picker's per-request path), [`AtomicHistogram`] records with one atomic
//! add per observation for the bucket and a compare-and-swap loop for the sum, and is encoded as
//! an ordinary Prometheus histogram.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A lock-free histogram with fixed upper bounds. Cloning shares the same series.
#[derive(Clone, Debug)]
pub struct AtomicHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds, ascending.
    bounds: Box<[f64]>,
    /// Observations per bucket (not cumulative); the last one is above every bound.
    counts: Box<[AtomicU64]>,
    /// Sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with these upper bounds (sorted here; duplicates and NaNs dropped).
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let mut b: Vec<f64> = bounds.into_iter().filter(|v| !v.is_nan()).collect();
        b.sort_by(f64::total_cmp);
        b.dedup();
        let counts = (0..=b.len()).map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram {
            inner: Arc::new(Inner {
                bounds: b.into_boxed_slice(),
                counts,
                sum: AtomicU64::new(0f64.to_bits()),
            }),
        }
    }

    /// Records one value.
    pub fn observe(&self, v: f64) {
        let i = self.inner.bounds.partition_point(|b| *b < v);
        self.inner.counts[i].fetch_add(1, Ordering::Relaxed);
        let mut old = self.inner.sum.load(Ordering::Relaxed);
        loop {
            let new = (f64::from_bits(old) + v).to_bits();
            match self.inner.sum.compare_exchange_weak(
                old,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(current) => old = current,
            }
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of the observations so far.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.inner.sum.load(Ordering::Relaxed))
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // Per-bucket counts, as `prometheus_client`'s own histogram hands them over (the text
        // encoder accumulates them, and writes the `f64::MAX` bound as `+Inf`).
        let mut total = 0u64;
        let mut buckets = Vec::with_capacity(self.inner.counts.len());
        for (i, c) in self.inner.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            total += n;
            let bound = self.inner.bounds.get(i).copied().unwrap_or(f64::MAX);
            buckets.push((bound, n));
        }
        encoder.encode_histogram::<NoLabelSet>(self.sum(), total, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn encodes_as_a_cumulative_prometheus_histogram() {
        let h = AtomicHistogram::new([0.1, 1.0, 0.5]);
        for v in [0.05, 0.1, 0.3, 2.0] {
            h.observe(v);
        }
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 2.45).abs() < 1e-9);
        let mut r = Registry::default();
        r.register("t_seconds", "T", h.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(out.contains("# TYPE t_seconds histogram"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"0.1\"} 2"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"0.5\"} 3"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"1.0\"} 3"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"+Inf\"} 4"), "{out}");
        assert!(out.contains("t_seconds_count 4"), "{out}");
    }
}
