//! Picking: the ranked first choice and fallbacks among the final candidate views
//! (crate-internal).
//!
//! The scored policy takes the `k` best totals ([`top_k`]); the baselines ignore scores.
//! Everything is an inline array: no allocation per pick.

use rand::Rng;

use crate::config::Policy;
use crate::decision::MAX_RETURNED;
use crate::view::View;

/// Scores closer than this are a tie, broken by the seeded generator.
const TIE_EPSILON: f64 = 1e-9;

/// Indices into the views, best first.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Ranking {
    idx: [usize; MAX_RETURNED],
    len: usize,
}

impl Ranking {
    /// The first choice (views are never empty when a picker runs).
    pub(crate) fn first(&self) -> usize {
        self.idx[0]
    }

    /// First choice then fallbacks.
    pub(crate) fn as_slice(&self) -> &[usize] {
        &self.idx[..self.len]
    }
}

/// How the endpoints are ranked, one per [`Policy`].
pub(crate) enum Picker {
    /// The `k` highest weighted totals, ties broken at random.
    MaxScore,
    /// Consecutive candidates, starting one further on each pick.
    RoundRobin { next: usize },
    /// `k` distinct candidates uniformly at random.
    Random,
    /// The `k` candidates with the fewest of this gateway's requests in flight.
    LeastRequest,
}

impl Picker {
    pub(crate) fn new(policy: Policy) -> Self {
        match policy {
            Policy::Scored => Picker::MaxScore,
            Policy::RoundRobin => Picker::RoundRobin { next: 0 },
            Policy::Random => Picker::Random,
            Policy::LeastRequest => Picker::LeastRequest,
        }
    }

    /// Ranks up to `k` distinct views (`views` is non-empty; `Random` reorders it).
    pub(crate) fn pick<R: Rng + ?Sized>(
        &mut self,
        views: &mut [View],
        k: usize,
        rng: &mut R,
    ) -> Ranking {
        match self {
            Picker::MaxScore => top_k(views, k, rng, |v| v.total),
            Picker::RoundRobin { next } => {
                let n = views.len();
                let k = k.min(n);
                let start = *next % n;
                *next = next.wrapping_add(1);
                let mut idx = [0usize; MAX_RETURNED];
                for (j, slot) in idx.iter_mut().enumerate().take(k) {
                    *slot = (start + j) % n;
                }
                Ranking { idx, len: k }
            }
            Picker::Random => {
                let n = views.len();
                let k = k.min(n);
                let mut idx = [0usize; MAX_RETURNED];
                // Partial Fisher–Yates over the views (their order is scratch).
                for (j, slot) in idx.iter_mut().enumerate().take(k) {
                    let r = rng.random_range(j..n);
                    views.swap(j, r);
                    *slot = j;
                }
                Ranking { idx, len: k }
            }
            Picker::LeastRequest => top_k(views, k, rng, |v| -v.inflight),
        }
    }
}

/// The `k` best views by `score` (ties within [`TIE_EPSILON`] broken by a seeded random key),
/// best first. One random draw per view keeps the choice among ties uniform.
pub(crate) fn top_k<R: Rng + ?Sized>(
    views: &[View],
    k: usize,
    rng: &mut R,
    score: impl Fn(&View) -> f64,
) -> Ranking {
    let k = k.min(MAX_RETURNED).min(views.len());
    let mut best: [(f64, u64, usize); MAX_RETURNED] = [(f64::NEG_INFINITY, 0, 0); MAX_RETURNED];
    let mut len = 0usize;
    let better = |a: (f64, u64), b: (f64, u64)| {
        if (a.0 - b.0).abs() <= TIE_EPSILON {
            a.1 > b.1
        } else {
            a.0 > b.0
        }
    };
    for (i, v) in views.iter().enumerate() {
        let s = score(v);
        let s = if s.is_nan() { f64::NEG_INFINITY } else { s };
        let key: u64 = rng.random();
        if len == k && !better((s, key), (best[k - 1].0, best[k - 1].1)) {
            continue;
        }
        let mut pos = if len < k { len } else { k - 1 };
        if len < k {
            len += 1;
        }
        while pos > 0 && better((s, key), (best[pos - 1].0, best[pos - 1].1)) {
            best[pos] = best[pos - 1];
            pos -= 1;
        }
        best[pos] = (s, key, i);
    }
    let mut idx = [0usize; MAX_RETURNED];
    for (o, b) in idx.iter_mut().zip(&best[..len]) {
        *o = b.2;
    }
    Ranking { idx, len }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use crate::fixtures::*;
    use crate::*;

    #[test]
    fn baselines_ignore_scores_but_account_in_flight() {
        let mut s = scheduler(SchedulerConfig::preset(Preset::RoundRobin), 3);
        s.apply_metrics(addr(0), snapshot(T0, 100, 0.99)).unwrap();
        let firsts: Vec<_> = (0..6)
            .map(|i| {
                s.pick(&RequestContext::new("m", 10), T0, &mut rng(i))
                    .unwrap()
                    .endpoints
                    .first()
            })
            .collect();
        assert_eq!(firsts[..3], firsts[3..]);
        let mut uniq = firsts[..3].to_vec();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 3);
        assert_eq!(s.inflight(), 6);

        let mut s = scheduler(SchedulerConfig::preset(Preset::LeastRequest), 3);
        for i in 0..9 {
            let d = s
                .pick(&RequestContext::new("m", 10), T0, &mut rng(i))
                .unwrap();
            assert_eq!(d.endpoints.len(), 3);
        }
        for i in 0..3 {
            assert_eq!(s.endpoint(addr(i)).unwrap().inflight, 3);
        }

        let mut s = scheduler(SchedulerConfig::preset(Preset::Random), 5);
        let d = s
            .pick(&RequestContext::new("m", 10), T0, &mut rng(9))
            .unwrap();
        let mut v = d.endpoints.as_slice().to_vec();
        v.sort();
        v.dedup();
        assert_eq!(v.len(), 3);
    }
}
