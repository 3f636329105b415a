//! Prometheus-style cumulative histograms with fixed bucket bounds (the engines' own bounds).

/// vLLM's TTFT buckets (seconds).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token latency and time-per-output-token buckets (seconds).
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-latency buckets (seconds): e2e, queue, inference, prefill, decode.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's token-count buckets.
pub const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];
/// vLLM's tokens-per-step buckets.
pub const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// vLLM's `n` parameter buckets.
pub const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// vLLM's preemption-count buckets.
pub const PREEMPTION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// A histogram: per-bucket counts (not cumulative; the last is +Inf), sum and count.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds, +Inf implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records `n` observations of `value`.
    pub fn observe_n(&mut self, value: f64, n: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i] += n;
        self.sum += value * n as f64;
        self.count += n;
    }

    /// Records one observation.
    pub fn observe(&mut self, value: f64) {
        self.observe_n(value, 1);
    }

    /// Upper bounds (without +Inf).
    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Cumulative counts, one per bound then +Inf.
    pub fn cumulative(&self) -> impl Iterator<Item = u64> + '_ {
        self.counts.iter().scan(0u64, |acc, c| {
            *acc += c;
            Some(*acc)
        })
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(1.0);
        h.observe_n(1.5, 2);
        h.observe(9.0);
        assert_eq!(h.cumulative().collect::<Vec<_>>(), vec![1, 3, 4]);
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 13.0).abs() < 1e-12);
    }
}
