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
//! - **The cap** ([`may_eject`]): an ejection that would leave more than `maxEjectionPercent`
//!   of a model's clusters ejected is held back.

use std::sync::atomic::{AtomicU32, Ordering};
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
