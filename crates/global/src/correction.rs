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
//! have turned those 300 ms into ×8.5 on a 40 ms short prompt, and so into 5.1 s on a 600 ms
//! long one.
//!
//! Measurements below their estimates count in the smoothing (they offset an excess), but a
//! correction never takes time away from an estimate: what makes a heartbeat-based estimate too
//! high is often particular to its request (a queue the heartbeat still shows that has drained
//! since, say), and taken from the next requests' estimates it made a loaded cheap cluster look
//! fast enough for them:
//! with it, `costAware`'s heavy-load P99 went over the objective (`cargo test -p
//! infergate-global --test cost -- --nocapture`: 1,731 and 1,734 ms against 1,500; 1,205 ms
//! without it). So a cluster is never estimated faster than its heartbeat says.
//!
//! Samples are bounded (at most [`MAX_SAMPLE_MS`]; an estimate that is not a number is no
//! sample): a hostile or broken heartbeat's figure leaves no NaN and no negative estimate, and at
//! worst a correction held at zero for a few dozen samples (from an hour's excess the other way,
//! 43 samples of +300 ms). Each sample costs a few floating-point operations under the
//! cluster's lock; applying the correction, a few more: nothing is allocated.

use std::time::{Duration, Instant};

/// Weight of a new sample in the smoothed difference.
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
        self.smoothed = Some(match self.fresh(sent, fresh_for) {
            Some(s) => Smoothed {
                difference: s.difference + ALPHA * (difference - s.difference),
                at,
            },
            None => Smoothed { difference, at },
        });
    }

    /// `estimated_ms` (a heartbeat-based estimate for some request) plus the smoothed excess of
    /// the samples of the last `fresh_for` before `now`, when they show one; as it is otherwise.
    /// An estimate that is not a non-negative number is left as it is.
    pub(crate) fn apply(&self, estimated_ms: f64, now: Instant, fresh_for: Duration) -> f64 {
        let Some(s) = self
            .fresh(now, fresh_for)
            .filter(|_| estimated_ms.is_sign_positive() && !estimated_ms.is_nan())
        else {
            return estimated_ms;
        };
        estimated_ms + s.difference.max(0.0)
    }

    /// The smoothed samples, while the last is at most `fresh_for` old at `now`.
    fn fresh(&self, now: Instant, fresh_for: Duration) -> Option<Smoothed> {
        self.smoothed
            .filter(|s| now.saturating_duration_since(s.at) <= fresh_for)
    }
}

#[cfg(test)]
mod tests;
