//! The per-request order of clusters. Pure: the estimates, the shares and the random draws are
//! passed in.
//!
//! Each cluster that serves the model is a [`Candidate`] with its share (the slow-start weight,
//! 0 when drained or ejected by outlier detection), its estimated time to first token for this
//! request (the heartbeat's estimate plus the measured network round trip, corrected by the
//! router's own recent measurements), the price of this request there, and the rank of its
//! region in `routing.regionPreference`.
//!
//! 1. **Tiers.** Up clusters admitted by their share come first: a cluster at full share always
//!    is, one ramping at weight `w` with probability `w` (one draw each). Up clusters not
//!    admitted come next, then drained and ejected clusters (a last resort, never dropped: when
//!    every heartbeat looks bad, or every cluster is ejected, but a cluster still answers, the
//!    request is served).
//! 2. **Within a tier**, policy `costAware`: the clusters whose estimate meets the objective,
//!    cheapest first (then by region preference, then faster first), followed by the others,
//!    fastest first. Policy `latency`: fastest first, then by region preference.
//!
//! A whole region down needs nothing special: its clusters are drained, so the next region's
//! come first. The list is the retry order: a request that fails before its first byte moves on
//! to the next entry.

use crate::config::Policy;

/// One cluster, as this request sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The cluster's index in the configuration.
    pub index: usize,
    /// Its share: 1 up, 0–1 ramping, 0 drained or ejected.
    pub weight: f64,
    /// Estimated time to first token, ms, round trip included.
    pub ttft_ms: f64,
    /// What this request would cost there.
    pub cost: f64,
    /// Position of its region in the preference list (unlisted: after every listed one).
    pub region_rank: usize,
}

/// Why the first cluster was chosen (the `reason` label of the decision counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `costAware`: the cheapest cluster meeting the objective.
    CheapestWithinObjective,
    /// `costAware`: no cluster meets the objective; the fastest.
    FastestOverObjective,
    /// `latency`: the fastest.
    Fastest,
    /// Every cluster is drained or ejected; tried anyway.
    LastResort,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CheapestWithinObjective => "cheapest_within_objective",
            Reason::FastestOverObjective => "fastest_over_objective",
            Reason::Fastest => "fastest",
            Reason::LastResort => "last_resort",
        }
    }
}

/// Orders `candidates` in place (first choice first) and says why the first was chosen; `None`
/// when there is none. `draw` returns uniform numbers in `[0, 1)`, one per ramping cluster.
pub fn order(
    policy: Policy,
    objective_ms: f64,
    candidates: &mut [Candidate],
    mut draw: impl FnMut() -> f64,
) -> Option<Reason> {
    // Tier per candidate, computed once (a ramping cluster's draw must not change mid-sort).
    let mut keyed: [(u8, Candidate); MAX_CLUSTERS] = [(0, EMPTY); MAX_CLUSTERS];
    let n = candidates.len().min(MAX_CLUSTERS);
    for (slot, c) in keyed.iter_mut().zip(candidates.iter()) {
        let tier = if c.weight <= 0.0 {
            2
        } else if c.weight >= 1.0 || draw() < c.weight {
            0
        } else {
            1
        };
        *slot = (tier, *c);
    }
    let keyed = &mut keyed[..n];
    let meets = |c: &Candidate| c.ttft_ms <= objective_ms;
    keyed.sort_by(|(ta, a), (tb, b)| {
        ta.cmp(tb).then_with(|| match policy {
            Policy::CostAware => meets(b).cmp(&meets(a)).then_with(|| {
                if meets(a) {
                    a.cost
                        .total_cmp(&b.cost)
                        .then(a.region_rank.cmp(&b.region_rank))
                        .then(a.ttft_ms.total_cmp(&b.ttft_ms))
                } else {
                    a.ttft_ms
                        .total_cmp(&b.ttft_ms)
                        .then(a.region_rank.cmp(&b.region_rank))
                }
            }),
            Policy::Latency => a
                .ttft_ms
                .total_cmp(&b.ttft_ms)
                .then(a.region_rank.cmp(&b.region_rank)),
        })
    });
    for (dst, (_, c)) in candidates.iter_mut().zip(keyed.iter()) {
        *dst = *c;
    }
    let (tier, first) = keyed.first()?;
    Some(if *tier == 2 {
        Reason::LastResort
    } else {
        match policy {
            Policy::Latency => Reason::Fastest,
            Policy::CostAware if meets(first) => Reason::CheapestWithinObjective,
            Policy::CostAware => Reason::FastestOverObjective,
        }
    })
}

/// Clusters a request is ordered over at most (the configuration refuses more).
pub const MAX_CLUSTERS: usize = 64;

const EMPTY: Candidate = Candidate {
    index: 0,
    weight: 0.0,
    ttft_ms: 0.0,
    cost: 0.0,
    region_rank: 0,
};

#[cfg(test)]
mod tests;
