//! Passive outlier detection (`outlierDetection:`): what the router's own requests say against a
//! cluster, for the failures its heartbeat cannot see — a gateway that answers 503 to every
//! request while its admin port serves a good heartbeat. Pure: time is passed in.
//!
//! - **Counting** ([`Consecutive`], [`verdict`]): 502, 503 and 504 answers and requests that
//!   got no response headers (a broken connection, `timeouts.firstByteMs`) count against the
//!   cluster; a 2xx resets the count. Anything else (a 500, a 4xx, a 429, and a 503 the gateway
//!   marks as its own overload with `x-infergate-overloaded`) neither counts nor resets: it is
//!   the request's problem or overload, and a client must not be able to eject a cluster, or
//!   keep one in, with requests of its own making; a busy cluster is failed over, not ejected.
//! - **Ejection** ([`Ejection`]): `consecutiveGatewayFailures` in a row eject the cluster for
//!   `baseEjectionMs` × the times it was ejected in a row, at most `maxEjectionMs`. Each
//!   `baseEjectionMs` it then stays in takes one off that count. An ejected cluster has share 0
//!   (ordered with the drained ones, never dropped); once the ejection ends its share ramps
//!   over `heartbeat.slowStartMs` as a returning cluster's does.
//! - **Failure percentage** ([`Window`], [`Rate`], optional: `failurePercentage:`): a cluster
//!   that fails some of its requests but never `consecutiveGatewayFailures` in a row (half of
//!   them, say) is ejected too when, over an interval of `intervalMs` with at least
//!   `minimumRequests` routed requests, `threshold` percent or more were gateway failures. The
//!   interval is closed by the first request after it ends, which judges it: no timer.
//! - **The cap** ([`may_eject`]): an ejection that would leave more than `maxEjectionPercent`
//!   of a model's clusters ejected is held back.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::OutlierDetection;
use crate::health::MIN_RAMP_WEIGHT;

/// What one routed attempt says about its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The cluster served it (2xx): the count starts again.
    Success,
    /// A gateway failure: 502, 503, 504, or no response headers.
    Failure,
    /// Says nothing about the cluster: a 500 or another 5xx that is not a gateway's (the
    /// request's problem, as a client could provoke it), a 4xx, a 429 (overload, already
    /// failed over), a gateway's own overload 503, a redirect.
    Neutral,
}

/// The verdict on an answer with `status`; `overloaded`: it carries
/// [`infergate_openai::OVERLOADED_HEADER`] (a gateway full itself: busy, not broken). A request
/// without response headers is a [`Verdict::Failure`] without a status.
pub fn verdict(status: u16, overloaded: bool) -> Verdict {
    match status {
        200..=299 => Verdict::Success,
        503 if overloaded => Verdict::Neutral,
        502..=504 => Verdict::Failure,
        _ => Verdict::Neutral,
    }
}

/// Gateway failures in a row of one cluster, counted by every request without a lock.
#[derive(Debug, Default)]
pub struct Consecutive(AtomicU32);

impl Consecutive {
    /// A success: the count starts again. Written only when it is not zero already, so that the
    /// requests of a healthy cluster only read the shared counter.
    pub fn succeed(&self) {
        if self.0.load(Ordering::Relaxed) != 0 {
            self.0.store(0, Ordering::Relaxed);
        }
    }

    /// A failure. True when the count reached a multiple of `threshold` (each multiple is seen
    /// by exactly one caller): the cluster is due an ejection. An ejection held back by the cap
    /// is thus tried again after as many failures more, not on every one.
    pub fn fail(&self, threshold: u32) -> bool {
        let n = self.0.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        threshold > 0 && n.is_multiple_of(threshold)
    }

    /// Starts the count again (the cluster was ejected).
    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// The count.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One cluster's successes and gateway failures over the current interval, for the failure
/// percentage ([`Rate`]), counted by every routed request without a lock.
#[derive(Debug, Default)]
pub struct Window {
    /// When the interval began, in nanoseconds since the caller's epoch.
    began: AtomicU64,
    successes: AtomicU32,
    failures: AtomicU32,
}

/// An interval's routed requests, as [`Window::record`] closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// 2xx answers.
    pub successes: u32,
    /// Gateway failures (502, 503, 504, no response headers).
    pub failures: u32,
}

impl Interval {
    /// The failures' share of the requests, percent (0 without requests).
    pub fn failure_percent(&self) -> f64 {
        let total = u64::from(self.successes) + u64::from(self.failures);
        if total == 0 {
            0.0
        } else {
            f64::from(self.failures) * 100.0 / total as f64
        }
    }

    /// Whether the interval ejects its cluster: at least `rate.minimum` requests, of which at
    /// least `rate.threshold` percent failed.
    pub fn trips(&self, rate: &Rate) -> bool {
        let total = u64::from(self.successes) + u64::from(self.failures);
        total >= u64::from(rate.minimum.max(1))
            && u64::from(self.failures) * 100 >= u64::from(rate.threshold) * total
    }
}

impl Window {
    /// Counts `verdict` (a [`Verdict::Neutral`] counts nothing) at `at_ns` (nanoseconds since
    /// the epoch the window's times are taken from). When the interval under way began
    /// `interval_ns` or more before, the first caller to see it closes it and gets what it
    /// counted; a new interval begins at `at_ns`, and the verdict at hand is its first. An
    /// interval with no request closes when the next request comes, so one interval can span
    /// more than `interval_ns` of an idle cluster: `minimumRequests` keeps a handful of old
    /// requests from judging it.
    pub fn record(&self, verdict: Verdict, at_ns: u64, interval_ns: u64) -> Option<Interval> {
        let began = self.began.load(Ordering::Relaxed);
        let closed = (at_ns.saturating_sub(began) >= interval_ns
            && self
                .began
                .compare_exchange(began, at_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok())
        .then(|| Interval {
            successes: self.successes.swap(0, Ordering::Relaxed),
            failures: self.failures.swap(0, Ordering::Relaxed),
        });
        match verdict {
            Verdict::Success => {
                self.successes.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Failure => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Neutral => {}
        }
        closed
    }

    /// Forgets what was counted and begins a new interval at `at_ns` (the cluster was ejected:
    /// its requests before say nothing about it when it returns).
    pub fn reset(&self, at_ns: u64) {
        self.began.store(at_ns, Ordering::Relaxed);
        self.successes.store(0, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
    }
}

/// Why a cluster is due an ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `consecutiveGatewayFailures` in a row.
    Consecutive,
    /// An interval whose share of failures reached `failurePercentage.threshold`.
    FailurePercentage(Interval),
}

/// `outlierDetection.failurePercentage` as the state machine uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// `threshold`: the failures' share of an interval's requests that ejects, percent.
    pub threshold: u32,
    /// `minimumRequests`: fewer routed requests in an interval judge nothing.
    pub minimum: u32,
    /// `intervalMs`.
    pub interval: Duration,
}

/// `outlierDetection:` as the state machine uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `consecutiveGatewayFailures`.
    pub threshold: u32,
    /// `baseEjectionMs`.
    pub base: Duration,
    /// `maxEjectionMs`.
    pub max: Duration,
    /// `maxEjectionPercent`.
    pub max_percent: u32,
    /// `heartbeat.slowStartMs`: the ramp after an ejection.
    pub slow_start: Duration,
    /// `failurePercentage`, if set.
    pub rate: Option<Rate>,
}

impl Settings {
    /// From the configuration.
    pub fn new(config: &OutlierDetection, slow_start: Duration) -> Self {
        Settings {
            threshold: config.consecutive_gateway_failures,
            base: config.base_ejection(),
            max: config.max_ejection(),
            max_percent: config.max_ejection_percent,
            slow_start,
            rate: config.failure_percentage.as_ref().map(|f| Rate {
                threshold: f.threshold,
                minimum: f.minimum_requests,
                interval: Duration::from_millis(f.interval_ms),
            }),
        }
    }
}

/// One cluster's ejections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ejection {
    /// When the current (or last) ejection ends.
    until: Option<Instant>,
    /// Times ejected in a row, the current ejection included.
    streak: u32,
}

impl Ejection {
    /// Whether the cluster is ejected at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// Ejects the cluster at `now`; returns how long for. The count of ejections in a row loses
    /// one for each `base` the cluster stayed in since its last ejection ended, so a cluster
    /// that fails again soon after its return stays out longer each time, and one that served
    /// for a while starts again from `base`.
    pub fn eject(&mut self, now: Instant, s: &Settings) -> Duration {
        let streak = match self.until {
            Some(end) if now >= end && !s.base.is_zero() => {
                let stayed = now.duration_since(end).as_nanos() / s.base.as_nanos();
                self.streak
                    .saturating_sub(u32::try_from(stayed).unwrap_or(u32::MAX))
            }
            _ => self.streak,
        };
        self.streak = streak.saturating_add(1);
        let length = s.base.saturating_mul(self.streak).min(s.max);
        self.until = Some(now.checked_add(length).unwrap_or(now));
        length
    }

    /// Times ejected in a row (as of the last ejection).
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// The share the ejection leaves the cluster at `now`: 0 while ejected, then ramping from
    /// [`MIN_RAMP_WEIGHT`] to 1 over `slow_start` after the ejection ended, as a returning
    /// cluster's does; 1 when it was never ejected.
    pub fn weight(&self, now: Instant, slow_start: Duration) -> f64 {
        match self.until {
            None => 1.0,
            Some(end) if now < end => 0.0,
            Some(_) if slow_start.is_zero() => 1.0,
            Some(end) => (now.duration_since(end).as_secs_f64() / slow_start.as_secs_f64())
                .clamp(MIN_RAMP_WEIGHT, 1.0),
        }
    }
}

/// Whether one more cluster may be ejected: for each model the cluster serves, `(clusters
/// serving it, of them ejected now)`. Held back when, for some model, one more ejected would be
/// over `max_percent` of its clusters. A model only this cluster serves holds nothing back:
/// ejecting its one cluster moves none of its requests (ejected clusters are still served when
/// no other can take a request), while keeping the cluster in would let it fail the requests of
/// the models it shares. `max_percent` 0 ejects none.
pub fn may_eject(max_percent: u32, models: impl IntoIterator<Item = (usize, usize)>) -> bool {
    if max_percent == 0 {
        return false;
    }
    models.into_iter().all(|(serving, ejected)| {
        serving < 2 || (ejected as u64 + 1) * 100 <= u64::from(max_percent) * serving as u64
    })
}

#[cfg(test)]
mod tests;
