//! The `replicas:` section of a scenario: active-active picker replicas compared in simulation.
//!
//! ```yaml
//! replicas:
//!   counts: [1, 3, 5]            # picker replicas; 1 is the single-picker baseline
//!   spread: round-robin          # how the Service spreads arrivals: round-robin | random
//!   sharing: [none, inflight, exchange]  # each count > 1 runs once per mode
//!   exchange: { interval_ms: 5, delay_ms: 1 }
//! ```

use serde::{Deserialize, Serialize};

/// Active-active pickers compared: every policy of the scenario runs once per replica count and
/// sharing mode, on the same arrivals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaBench {
    /// Picker replica counts; 1 is the single picker every other count is compared with.
    pub counts: Vec<u32>,
    /// How arrivals are spread over the replicas.
    pub spread: Spread,
    /// What the replicas share; counts above 1 run once per mode.
    pub sharing: Vec<Sharing>,
    /// The exchange of the `exchange` mode.
    pub exchange: Exchange,
}

impl Default for ReplicaBench {
    fn default() -> Self {
        ReplicaBench {
            counts: vec![1, 3, 5],
            spread: Spread::RoundRobin,
            sharing: vec![Sharing::None, Sharing::Inflight, Sharing::Exchange],
            exchange: Exchange::default(),
        }
    }
}

/// How a Kubernetes Service in front of the replicas spreads arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// Each arrival to the next replica in turn.
    RoundRobin,
    /// Each arrival to a replica drawn uniformly (seeded), as kube-proxy's random mode.
    Random,
}

/// What the replicas share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// Nothing: each replica routes on the scraped pages and its own in-flight accounting.
    None,
    /// Each replica sends its own per-endpoint load to its peers every `exchange.interval_ms`;
    /// they apply it `exchange.delay_ms` later (`Scheduler::apply_peer_loads`).
    Inflight,
    /// As `inflight`, and the report also carries the rate samples the sender learned since its
    /// previous one (`Scheduler::take_rate_samples` → `Scheduler::learn_from_peer`).
    Exchange,
}

impl Sharing {
    /// The mode as spelled in scenario files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::None => "none",
            Sharing::Inflight => "inflight",
            Sharing::Exchange => "exchange",
        }
    }
}

/// The peer exchange: how often a replica reports, and how long a report takes to be applied.
///
/// The default stands for replicas that push their changes to each peer over a standing
/// connection, coalesced to at most one report per 5 ms, inside one cluster (about 1 ms from one
/// pod to another). Longer intervals cost routing quality: peers' requests that already have
/// their first token keep counting as queued until the next report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Exchange {
    /// Milliseconds between two reports of one replica (replicas are out of phase).
    pub interval_ms: f64,
    /// Milliseconds from a report to its peers applying it.
    pub delay_ms: f64,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange {
            interval_ms: 5.0,
            delay_ms: 1.0,
        }
    }
}

impl ReplicaBench {
    /// Checks every value: `Err((field, reason))` names the offending key under `replicas.`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.counts.is_empty() {
            return Err(("replicas.counts", "must list at least one count".into()));
        }
        if let Some(c) = self.counts.iter().find(|c| !(1..=64).contains(*c)) {
            return Err(("replicas.counts", format!("must be in 1..=64, got {c}")));
        }
        if self.sharing.is_empty() {
            return Err(("replicas.sharing", "must list at least one mode".into()));
        }
        let e = &self.exchange;
        if !(e.interval_ms.is_finite() && e.interval_ms >= 1.0) {
            return Err((
                "replicas.exchange.interval_ms",
                format!("must be >= 1, got {}", e.interval_ms),
            ));
        }
        if !(e.delay_ms.is_finite() && e.delay_ms >= 0.0) {
            return Err((
                "replicas.exchange.delay_ms",
                format!("must be >= 0, got {}", e.delay_ms),
            ));
        }
        Ok(())
    }
}
