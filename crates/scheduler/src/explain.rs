//! Decision records: why a pick went where it did. Built only by
//! [`Scheduler::pick_explained`](crate::Scheduler::pick_explained); a plain pick builds none.

use std::net::SocketAddr;

use serde::Serialize;

use crate::config::Policy;
use crate::request::Priority;

/// A pod a filter removed, and which filter.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FilteredOut {
    /// The endpoint.
    pub addr: SocketAddr,
    /// The filter's name (`freshness`, `lora`, `saturation`).
    pub filter: &'static str,
}

/// One scorer's value for one candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScoreRecord {
    /// The scorer's name.
    pub scorer: &'static str,
    /// Its configured weight.
    pub weight: f64,
    /// Its score in [0, 1].
    pub value: f64,
}

/// A candidate that reached scoring.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CandidateRecord {
    /// The endpoint.
    pub addr: SocketAddr,
    /// `namespace/pod`.
    pub name: String,
    /// Every scorer's value.
    pub scores: Vec<ScoreRecord>,
    /// Σ weight·score.
    pub total: f64,
    /// Waiting requests the scorers saw (engine queue plus routed since the last scrape).
    pub waiting: f64,
    /// Estimated time to first token on this pod, in seconds.
    pub estimated_wait_secs: f64,
    /// Leading prompt blocks the pod probably holds.
    pub prefix_blocks: u32,
    /// Whether the pod was at or over the saturation thresholds.
    pub saturated: bool,
}

/// The full record of one pick.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Explanation {
    /// The policy that decided.
    pub policy: Option<Policy>,
    /// The request's priority.
    pub priority: Priority,
    /// Endpoints considered before filtering (after the subset hint).
    pub considered: usize,
    /// Full prompt blocks hashed for prefix affinity.
    pub prompt_blocks: usize,
    /// Which filter removed which pod.
    pub filtered: Vec<FilteredOut>,
    /// True when every pod was filtered out and the configured fallback scored all ready pods.
    pub fell_back_to_all_ready: bool,
    /// Candidates that reached scoring (empty for baseline policies), in pool order.
    pub candidates: Vec<CandidateRecord>,
    /// The endpoints returned, best first (empty on rejection).
    pub chosen: Vec<SocketAddr>,
    /// The rejection's metric label, when rejected.
    pub rejection: Option<&'static str>,
    /// The rejection's `Retry-After`, in seconds, when shed.
    pub retry_after_secs: Option<u64>,
}
