//! Passive outlier detection per endpoint (`outlierDetection:` of a model): what the answers
//! of the requests routed to a pod say about it, for the failure its metrics cannot show — a
//! model server whose `/metrics` page is fine while every inference request fails (an engine
//! in an error state answering 500 at once). Such a pod looks idle, so a load-aware picker
//! sends it *more* requests than the others: each costs a round trip there before the retry.
//!
//! - **Counting** ([`Answer::of_status`]): a 500, 502, 503 or 504 from the pod, or a request
//!   that got no response headers from it (a connection broken after it was made, the
//!   first-byte timeout), counts against it; a 2xx starts the count again; anything else (a 4xx,
//!   a 501 or 505) neither counts nor resets — it is the request's problem.
//! - **Failure percentage** (`failurePercentage:`, off unless given): a pod failing every other
//!   request never fails `consecutive5xx` in a row. With it, each pod also counts its successes
//!   and failures over an interval of `intervalMs`; the first answer after the interval ends
//!   closes it (no timer) and judges it: at least `minimumRequests` answers of which
//!   `threshold` percent or more failed eject the pod as a run does.
//! - **Ejection**: `consecutive5xx` in a row take the pod out of the candidates for
//!   `baseEjectionMs` × the times it was ejected in a row, at most `maxEjectionMs`; each
//!   `baseEjectionMs` it then serves without an ejection takes one off that count. It is back
//!   at the first pick after its time is up (no timer).
//! - **The cap**: at most `maxEjectionPercent` of the pool's endpoints are ejected at once
//!   (rounded down: a pool of one is never ejected from, one of two only at 50% or more); an
//!   ejection over it is held back, and tried again after as many failures more.
//! - **Never empty**: when every candidate of a request is ejected (a subset hint naming only
//!   ejected pods), they are candidates after all: an answer from a failing pod is no worse
//!   than none.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::endpoint::Timestamp;
use crate::error::ConfigError;

/// `outlierDetection:` of a scheduler (off unless given).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Failed answers in a row that eject an endpoint (default 5, at least 1).
    #[serde(rename = "consecutive5xx")]
    pub consecutive_5xx: u32,
    /// The first ejection's length, ms (default 30,000); the n-th in a row lasts n times as long.
    pub base_ejection_ms: u64,
    /// The longest ejection, ms (default 300,000; at least `baseEjectionMs`).
    pub max_ejection_ms: u64,
    /// The most of the pool's endpoints ejected at once, percent (default 50, at most 100).
    pub max_ejection_percent: u32,
    /// Ejection by the share of failed answers over an interval (off unless given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage: Option<FailurePercentage>,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_5xx: 5,
            base_ejection_ms: 30_000,
            max_ejection_ms: 300_000,
            max_ejection_percent: 50,
            failure_percentage: None,
        }
    }
}

/// `outlierDetection.failurePercentage:`: an endpoint is ejected when, over an interval of
/// `intervalMs` with at least `minimumRequests` answers, `threshold` percent or more failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FailurePercentage {
    /// The share of failed answers that ejects, percent (default 50, 1 to 100).
    pub threshold: u32,
    /// The fewest answers an interval must have to be judged (default 20, at least 1).
    pub minimum_requests: u32,
    /// The interval's length, ms (default 10,000).
    pub interval_ms: u64,
}

impl Default for FailurePercentage {
    fn default() -> Self {
        FailurePercentage {
            threshold: 50,
            minimum_requests: 20,
            interval_ms: 10_000,
        }
    }
}

impl FailurePercentage {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=100).contains(&self.threshold) {
            return Err(ConfigError::new(
                "outlierDetection.failurePercentage.threshold",
                format!(
                    "{} is not a percentage from 1 to 100 (to turn it off, leave failurePercentage out)",
                    self.threshold
                ),
            ));
        }
        if self.minimum_requests == 0 {
            return Err(ConfigError::new(
                "outlierDetection.failurePercentage.minimumRequests",
                "must be at least 1",
            ));
        }
        if self.interval_ms == 0 || self.interval_ms > WEEK_MS {
            return Err(ConfigError::new(
                "outlierDetection.failurePercentage.intervalMs",
                format!(
                    "must be from 1 to {WEEK_MS} (a week), got {}",
                    self.interval_ms
                ),
            ));
        }
        Ok(())
    }
}

/// A week, in ms: the longest duration a setting takes.
const WEEK_MS: u64 = 7 * 24 * 3600 * 1000;

impl OutlierDetection {
    /// Refuses values that cannot be used, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.consecutive_5xx == 0 {
            return Err(ConfigError::new(
                "outlierDetection.consecutive5xx",
                "must be at least 1 (leave outlierDetection out to turn it off)",
            ));
        }
        for (field, v) in [
            ("outlierDetection.baseEjectionMs", self.base_ejection_ms),
            ("outlierDetection.maxEjectionMs", self.max_ejection_ms),
        ] {
            if v == 0 || v > WEEK_MS {
                return Err(ConfigError::new(
                    field,
                    format!("must be from 1 to {WEEK_MS} (a week), got {v}"),
                ));
            }
        }
        if self.max_ejection_ms < self.base_ejection_ms {
            return Err(ConfigError::new(
                "outlierDetection.maxEjectionMs",
                format!(
                    "{} is below baseEjectionMs ({})",
                    self.max_ejection_ms, self.base_ejection_ms
                ),
            ));
        }
        if self.max_ejection_percent > 100 {
            return Err(ConfigError::new(
                "outlierDetection.maxEjectionPercent",
                format!("{} is over 100", self.max_ejection_percent),
            ));
        }
        if let Some(f) = &self.failure_percentage {
            f.validate()?;
        }
        Ok(())
    }

    fn base(&self) -> Duration {
        Duration::from_millis(self.base_ejection_ms)
    }

    fn max(&self) -> Duration {
        Duration::from_millis(self.max_ejection_ms)
    }
}

/// What one answer from an endpoint says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx: its failures in a row start again.
    Success,
    /// 500, 502, 503, 504, or no response headers: counts against it.
    Failure,
    /// Anything else (a 4xx, a 501, a 505, a redirect): the request's own problem.
    Neutral,
}

impl Answer {
    /// The verdict on an answer with `status`.
    pub fn of_status(status: u16) -> Answer {
        match status {
            200..=299 => Answer::Success,
            500 | 502..=504 => Answer::Failure,
            _ => Answer::Neutral,
        }
    }
}

/// What [`crate::Scheduler::observe_answer`] did about an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ejection {
    /// Ejected for `length`, the `in_a_row`-th time in a row.
    Ejected {
        /// How long.
        length: Duration,
        /// Times ejected in a row, this one included.
        in_a_row: u32,
        /// What ejected it.
        cause: Cause,
    },
    /// Due, but `maxEjectionPercent` of the pool is ejected already.
    HeldBack,
}

/// What made an endpoint due for ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `consecutive5xx` failed answers in a row.
    Consecutive5xx,
    /// An interval of `failurePercentage` in which `failed` of `answers` failed.
    FailurePercentage {
        /// Failed answers in the interval.
        failed: u32,
        /// Answers in the interval.
        answers: u32,
    },
}

/// The answers an endpoint gave since it joined the pool, by verdict ([`Answer`]), counted
/// whether outlier detection is on or off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnswerCounts {
    /// 2xx answers.
    pub success: u64,
    /// 500, 502, 503, 504, or no response headers.
    pub failure: u64,
    /// Any other status.
    pub neutral: u64,
}

impl AnswerCounts {
    fn count(&mut self, answer: Answer) {
        let n = match answer {
            Answer::Success => &mut self.success,
            Answer::Failure => &mut self.failure,
            Answer::Neutral => &mut self.neutral,
        };
        *n = n.saturating_add(1);
    }
}

/// The last `failurePercentage` interval judged: `failed` of `answers` failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    /// Failed answers in it.
    pub failed: u32,
    /// Answers in it (success or failure; neutral ones are not counted).
    pub answers: u32,
}

impl Judged {
    /// The failures' share of the answers, percent (0 without answers).
    pub fn failure_percent(&self) -> f64 {
        if self.answers == 0 {
            0.0
        } else {
            f64::from(self.failed) * 100.0 / f64::from(self.answers)
        }
    }
}

/// One endpoint's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EndpointOutlier {
    /// Its answers, by verdict.
    counts: AnswerCounts,
    /// The last `failurePercentage` interval judged, whether or not it ejected.
    judged: Option<Judged>,
    /// Failures in a row.
    failures: u32,
    /// When the current (or last) ejection ends.
    until: Option<Timestamp>,
    /// Times ejected in a row, as of the last ejection.
    streak: u32,
    /// The current `failurePercentage` interval.
    interval: Interval,
}

/// Answers counted since `start`, for `failurePercentage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Interval {
    /// When it began; `None` until the first answer counted.
    start: Option<Timestamp>,
    answers: u32,
    failed: u32,
}

impl Interval {
    /// Counts an answer at `now`. When `now` is past the interval, the interval is closed
    /// first: it is returned, with the cause when it ejects. The answer then opens the next
    /// one.
    fn count(
        &mut self,
        failed: bool,
        now: Timestamp,
        cfg: &FailurePercentage,
    ) -> Option<(Judged, Option<Cause>)> {
        let mut closed = None;
        match self.start {
            Some(start)
                if now.saturating_since(start) >= Duration::from_millis(cfg.interval_ms) =>
            {
                let judged = Judged {
                    failed: self.failed,
                    answers: self.answers,
                };
                let due = (self.answers >= cfg.minimum_requests
                    && u64::from(self.failed) * 100
                        >= u64::from(cfg.threshold) * u64::from(self.answers))
                .then_some(Cause::FailurePercentage {
                    failed: self.failed,
                    answers: self.answers,
                });
                closed = Some((judged, due));
                *self = Interval {
                    start: Some(now),
                    ..Interval::default()
                };
            }
            Some(_) => {}
            None => self.start = Some(now),
        }
        self.answers = self.answers.saturating_add(1);
        self.failed = self.failed.saturating_add(u32::from(failed));
        closed
    }
}

impl EndpointOutlier {
    /// Whether it is out of the candidates at `now`.
    #[inline]
    pub(crate) fn is_ejected(&self, now: Timestamp) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// When its last ejection ends or ended.
    pub(crate) fn until(&self) -> Option<Timestamp> {
        self.until
    }

    /// Its answers, by verdict.
    pub(crate) fn counts(&self) -> AnswerCounts {
        self.counts
    }

    /// The last `failurePercentage` interval judged.
    pub(crate) fn judged(&self) -> Option<Judged> {
        self.judged
    }

    /// Counts `answer` in its totals only (outlier detection off).
    pub(crate) fn tally(&mut self, answer: Answer) {
        self.counts.count(answer);
    }

    /// When its ejection ends, while one is under way at `now`.
    pub(crate) fn ejected_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.until.filter(|u| now < *u)
    }

    /// Counts `answer` at `now`; `ejected` and `pool` are how many of the pool's endpoints are
    /// ejected now and how many it has. Returns what was done when the answer completed a run.
    pub(crate) fn observe(
        &mut self,
        answer: Answer,
        now: Timestamp,
        cfg: &OutlierDetection,
        ejected: usize,
        pool: usize,
    ) -> Option<Ejection> {
        self.counts.count(answer);
        // Requests sent before an ejection and answered during it count for nothing.
        if answer == Answer::Neutral || self.is_ejected(now) {
            return None;
        }
        let failed = answer == Answer::Failure;
        let mut due = None;
        if failed {
            self.failures = self.failures.saturating_add(1);
            if self.failures.is_multiple_of(cfg.consecutive_5xx) {
                due = Some(Cause::Consecutive5xx);
            }
        } else {
            self.failures = 0;
        }
        if let Some(f) = &cfg.failure_percentage
            && let Some((judged, cause)) = self.interval.count(failed, now, f)
        {
            self.judged = Some(judged);
            due = cause.or(due);
        }
        let cause = due?;
        let room = (pool as u64 * u64::from(cfg.max_ejection_percent)) / 100;
        if ejected as u64 + 1 > room {
            return Some(Ejection::HeldBack);
        }
        Some(self.eject(now, cfg, cause))
    }

    fn eject(&mut self, now: Timestamp, cfg: &OutlierDetection, cause: Cause) -> Ejection {
        let base = cfg.base();
        let streak = match self.until {
            Some(end) if now >= end => {
                let stayed = now.saturating_since(end).as_nanos() / base.as_nanos().max(1);
                self.streak
                    .saturating_sub(u32::try_from(stayed).unwrap_or(u32::MAX))
            }
            _ => self.streak,
        };
        self.streak = streak.saturating_add(1);
        self.failures = 0;
        // Its answers after the ejection start a new interval.
        self.interval = Interval::default();
        let length = base.saturating_mul(self.streak).min(cfg.max());
        self.until = Some(now.saturating_add(length));
        Ejection::Ejected {
            length,
            in_a_row: self.streak,
            cause,
        }
    }
}

#[cfg(test)]
mod tests;
