//! The `replicas:` section of a scenario: active-active picker replicas compared in simulation.
//!
//! ```yaml
//! replicas:
//!   counts: [1, 3, 5]            # picker replicas; 1 is the single-picker baseline
//!   spread: round-robin          # how the Service spreads arrivals: round-robin | random
//!   sharing: [none, inflight, exchange]  # each count > 1 runs once per mode
//!   exchange: { interval_ms: 5, delay_ms: 1, push: true }
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
/// The default is what the picker does (`infergate_pool::peers`): each replica pushes a change
/// of its load to its peers over a standing connection at once, unless its previous report is
/// less than 5 ms old (then the change goes with the next periodic one), inside one cluster
/// (about 1 ms from one pod to another). Here a replica pushes after each of its picks; the
/// first tokens and completions of its requests go out with its periodic reports, every
/// interval (the picker pushes those too, so it is at least as fresh as modelled). Longer
/// intervals cost routing quality: peers' requests that already have their first token keep
/// counting as queued until the next report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Exchange {
    /// Milliseconds between two periodic reports of one replica (replicas are out of phase),
    /// and the shortest time between two reports.
    pub interval_ms: f64,
    /// Milliseconds from a report to its peers applying it.
    pub delay_ms: f64,
    /// Whether a pick is pushed at once when the previous report is older than the interval
    /// (`false`: periodic reports only).
    pub push: bool,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange {
            interval_ms: 5.0,
            delay_ms: 1.0,
            push: true,
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
