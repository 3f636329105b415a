//! The router's own measured TTFT of a cluster, kept as a correction of the heartbeat-based
//! estimate rather than as an estimate of its own. Pure: the samples, the estimates and the
//! time are passed in.
//!
//! Each streamed answer's first token (and each first-byte timeout, at the time waited) is
//! compared with what the heartbeat-based estimate said for that same request, its own prompt
//! and the requests pending before it included. What the measurement adds to that estimate is
//! the WAN round trip of the request itself, the cluster's gateway, and the queue that formed
//! since the heartbeat: none of them grows with the prompt. So the correction is smoothed as a
//! **difference**, added to the estimate of each new request, whatever its prompt: a cluster
//! 300 ms away is 300 ms slower for a 14-token prompt and for a 4,000-token one. A ratio would
//! have turned those 300 ms into ×8 on a 40 ms short prompt, and so into 4.8 s on a 600 ms long
//! one.
//!
//! A measurement below the estimate (a heartbeat that counts a queue already drained, a heartbeat
//! round trip on a new connection where requests reuse one, prefix-cache hits the per-token rate
//! does not know) is a difference too, but it never takes from an estimate more than the
//! **share** it took from the estimates it was learned on (a smoothed ratio, at most 1): an
//! over-estimate of 540 ms learned on 600 ms long prompts takes 36 ms from a 40 ms short one,
//! not all of it. An estimate corrected this way is never negative.
//!
//! Samples are bounded (at most [`MAX_SAMPLE_MS`]; an estimate that is not a number is no
//! sample), so a hostile or broken heartbeat cannot leave a correction that takes dozens of
//! requests to wear off, nor a NaN. Each sample costs a few floating-point operations under the
//! cluster's lock; applying the correction, a few more: nothing is allocated.

use std::time::{Duration, Instant};

/// Weight of a new sample in the smoothed difference and share.
const ALPHA: f64 = 0.2;

/// The largest measured TTFT or estimate a sample counts, ms (an hour): beyond it a figure says
/// only "far too slow", and a bound keeps one absurd figure from outweighing every sample after
/// it.
pub(crate) const MAX_SAMPLE_MS: f64 = 3_600_000.0;

/// The smoothed correction of one cluster's estimates, and when its last sample came.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Correction {
    smoothed: Option<Smoothed>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Smoothed {
    /// Measured minus estimated, ms.
    difference: f64,
    /// Measured over estimated, at most 1 (only a measurement below its estimate uses it).
    share: f64,
    at: Instant,
}

impl Correction {
    /// A request sent at `sent`, whose heartbeat-based estimate was `estimated_ms`, got its
    /// first token (or timed out) `measured_ms` after, at `at`. The sample is smoothed into the
    /// correction that was in force when the request was sent; when none was (the last sample
    /// was more than `fresh_for` older than the request: the cluster was judged by its
    /// heartbeat alone), it starts the smoothing again. Judged at the send rather than at the
    /// first token, a slow answer does not throw away the samples its own estimate was
    /// corrected by.
    pub(crate) fn observe(
        &mut self,
        measured_ms: f64,
        estimated_ms: f64,
        sent: Instant,
        at: Instant,
        fresh_for: Duration,
    ) {
        if measured_ms.is_nan() || estimated_ms.is_nan() {
            return;
        }
        let measured = measured_ms.clamp(0.0, MAX_SAMPLE_MS);
        let estimated = estimated_ms.clamp(0.0, MAX_SAMPLE_MS);
        let difference = measured - estimated;
        // Below its estimate the measurement's share of it; at or above it, 1 (takes nothing).
        let share = if measured < estimated {
            measured / estimated
        } else {
            1.0
        };
        self.smoothed = Some(match self.fresh(sent, fresh_for) {
            Some(s) => Smoothed {
                difference: s.difference + ALPHA * (difference - s.difference),
                share: s.share + ALPHA * (share - s.share),
                at,
            },
            None => Smoothed {
                difference,
                share,
                at,
            },
        });
    }

    /// `estimated_ms` (a heartbeat-based estimate for some request) corrected by the samples of
    /// the last `fresh_for` before `now`; as it is without any. An estimate that is not a
    /// non-negative number is left as it is.
    pub(crate) fn apply(&self, estimated_ms: f64, now: Instant, fresh_for: Duration) -> f64 {
        let Some(s) = self
            .fresh(now, fresh_for)
            .filter(|_| estimated_ms.is_sign_positive() && !estimated_ms.is_nan())
        else {
            return estimated_ms;
        };
        if s.difference >= 0.0 {
            estimated_ms + s.difference
        } else {
            (estimated_ms + s.difference).max(estimated_ms * s.share)
        }
    }

    /// The smoothed samples, while the last is at most `fresh_for` old at `now`.
    fn fresh(&self, now: Instant, fresh_for: Duration) -> Option<Smoothed> {
        self.smoothed
            .filter(|s| now.saturating_duration_since(s.at) <= fresh_for)
    }
}

#[cfg(test)]
mod tests;
