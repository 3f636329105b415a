//! Percentiles and spread across seeds.

use serde::{Deserialize, Serialize};

/// Latency percentiles of one run (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// Percentiles of `values` (sorted in place). Empty input gives zeros.
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_unstable_by(f64::total_cmp);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        Percentiles {
            mean,
            p50: quantile(values, 0.50),
            p95: quantile(values, 0.95),
            p99: quantile(values, 0.99),
        }
    }
}

/// The `q` quantile of sorted `values` (nearest rank). Empty input gives 0.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A value over several seeds: mean and range.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Spread {
    /// Mean over seeds.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// Spread of `values`; zeros when empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut n = 0usize;
        let (mut sum, mut min, mut max) = (0.0, f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            n += 1;
            sum += v;
            min = min.min(v);
            max = max.max(v);
        }
        if n == 0 {
            return Spread::default();
        }
        Spread {
            mean: sum / n as f64,
            min,
            max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 95.0, 99.0));
        assert!((p.mean - 50.5).abs() < 1e-9);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        assert_eq!(quantile(&[3.0], 0.0), 3.0);
    }

    #[test]
    fn spread_reports_mean_and_range() {
        let s = Spread::of([1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of([]), Spread::default());
    }
}
