//! Whether a cluster (for one model) is routed on, and with what share: drain on a stale or
//! failing heartbeat, or on a heartbeat showing no ready pod (a gray failure: the gateway
//! answers, its pods do not); slow start when it comes back. Pure: time is passed in.
//!
//! - **Up**: the last good heartbeat is younger than `staleAfter`, fewer than `failuresToDrain`
//!   fetches in a row failed since, and it showed ready pods. Weight 1, or less while ramping.
//! - **Drained**: anything else. Weight 0: the cluster is tried only when no other can take
//!   the request (it stays a last-resort fallback, so a fleet whose every cluster looks
//!   drained still answers if one of them can).
//! - **Ramping**: a cluster that was drained and is up again gets `elapsed / slowStart` of its
//!   share (at least [`MIN_RAMP_WEIGHT`]) until the window has passed.

use std::time::{Duration, Instant};

/// The share a returning cluster starts with, so that the first requests teach the router its
/// TTFT at once.
pub const MIN_RAMP_WEIGHT: f64 = 0.05;

/// Why a cluster is drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrainReason {
    /// No heartbeat yet.
    Unknown,
    /// The last good heartbeat is older than `staleAfter`.
    Stale,
    /// `failuresToDrain` fetches (or routed connects) in a row failed.
    Failing,
    /// The heartbeat shows no ready pod for the model.
    NoReadyPods,
}

impl DrainReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainReason::Unknown => "unknown",
            DrainReason::Stale => "stale",
            DrainReason::Failing => "failing",
            DrainReason::NoReadyPods => "no_ready_pods",
        }
    }
}

/// The state of one cluster for one model, as far as routing goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    /// Routed on with this share (1 = full).
    Up {
        /// 0–1.
        weight: f64,
    },
    /// Not routed on while another cluster can take the request.
    Drained(DrainReason),
}

/// What the router knows of one cluster's health for one model.
#[derive(Clone, Debug)]
pub struct Health {
    stale_after: Duration,
    failures_to_drain: u32,
    slow_start: Duration,
    last_ok: Option<Instant>,
    ready: bool,
    failures: u32,
    /// When it came back after being drained (the ramp's start), if it ever was.
    up_since: Option<Instant>,
    /// Whether it was drained at the last observation (to notice a return).
    was_drained: bool,
    /// Whether it has been up at least once: the first heartbeat after start is not a return.
    seen_up: bool,
}

impl Health {
    /// A cluster not heard from yet.
    pub fn new(stale_after: Duration, failures_to_drain: u32, slow_start: Duration) -> Self {
        Health {
            stale_after,
            failures_to_drain: failures_to_drain.max(1),
            slow_start,
            last_ok: None,
            ready: false,
            failures: 0,
            up_since: None,
            was_drained: true,
            seen_up: false,
        }
    }

    /// A good heartbeat at `now`; `ready`: it shows ready pods for the model.
    pub fn observe_ok(&mut self, now: Instant, ready: bool) {
        self.last_ok = Some(now);
        self.failures = 0;
        self.ready = ready;
        self.note(now);
    }

    /// A failed heartbeat fetch (or a routed request that could not connect) at `now`.
    pub fn observe_failure(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.note(now);
    }

    /// Records a return from drained to up (the ramp starts then). Returns whether the state
    /// changed between drained and up.
    fn note(&mut self, now: Instant) -> bool {
        let drained = self.drain_reason(now).is_some();
        let changed = drained != self.was_drained;
        if self.was_drained && !drained {
            // The first time up after start takes a full share: nothing is known against it.
            self.up_since = if self.seen_up { Some(now) } else { None };
            self.seen_up = true;
        }
        self.was_drained = drained;
        changed
    }

    /// Updates the drained/up edge at `now` (call once per poll tick); returns the drain reason
    /// when the cluster has just been drained, for counting failover events.
    pub fn tick(&mut self, now: Instant) -> Option<DrainReason> {
        let before = self.was_drained;
        self.note(now);
        if !before && self.was_drained {
            self.drain_reason(now)
        } else {
            None
        }
    }

    fn drain_reason(&self, now: Instant) -> Option<DrainReason> {
        let Some(last) = self.last_ok else {
            return Some(DrainReason::Unknown);
        };
        if self.failures >= self.failures_to_drain {
            Some(DrainReason::Failing)
        } else if now.saturating_duration_since(last) > self.stale_after {
            Some(DrainReason::Stale)
        } else if !self.ready {
            Some(DrainReason::NoReadyPods)
        } else {
            None
        }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> State {
        if let Some(reason) = self.drain_reason(now) {
            return State::Drained(reason);
        }
        // Judged on the edge recorded by the last observation: a cluster that turned stale
        // and fresh again between two observations cannot skip its ramp, because a stale
        // cluster is only fresh again through `observe_ok`, which records the edge.
        let weight = match self.up_since {
            Some(since) if !self.slow_start.is_zero() => {
                let f = now.saturating_duration_since(since).as_secs_f64()
                    / self.slow_start.as_secs_f64();
                f.clamp(MIN_RAMP_WEIGHT, 1.0)
            }
            _ => 1.0,
        };
        State::Up { weight }
    }

    /// Time since the last good heartbeat (`None` before the first).
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.last_ok.map(|t| now.saturating_duration_since(t))
    }
}

#[cfg(test)]
mod tests;
