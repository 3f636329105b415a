//! Decision records: why a pick went where it did. Built only by
//! [`Scheduler::pick_explained`](crate::Scheduler::pick_explained); a plain pick builds none.

use std::net::SocketAddr;

use serde::Serialize;

use crate::config::Policy;
use crate::endpoint::Timestamp;
use crate::request::Priority;
use crate::state::EndpointState;

/// A pod a filter removed, and which filter.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FilteredOut {
    /// The endpoint.
    pub addr: SocketAddr,
    /// The filter's name (`freshness`, `lora`, `saturation`; `stale-metrics-cap` for a pod at
    /// the fail-open cap; `admission` for a fresh pod that would have shed the request, when a
    /// pod without a page took it fail-open instead; `outlier` for a pod outlier detection
    /// ejected).
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
    /// Running requests the scorers saw (engine batch plus routed since the last scrape that
    /// have had their first token).
    pub running: f64,
    /// Estimated time to first token on this pod, in seconds.
    pub estimated_wait_secs: f64,
    /// Leading prompt blocks the pod probably holds.
    pub prefix_blocks: u32,
    /// Whether the pod was at or over the saturation thresholds.
    pub saturated: bool,
    /// How its scrapes were going: `late` means it was scored on an old page (plus this
    /// gateway's requests since then).
    pub scrape: crate::endpoint::ScrapeState,
    /// Age of the metrics it was scored on, in seconds.
    pub metrics_age_secs: Option<f64>,
    /// This gateway's requests in flight on the pod.
    pub inflight: f64,
    /// Ranked fail-open (`staleMetrics`): its scrapes fail, so it was ranked on `inflight`, the
    /// prefix match and its last LoRA state only; `scores` is empty and the page's numbers
    /// (`waiting`, `running`, `estimated_wait_secs`) are not known.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fail_open: bool,
}

impl CandidateRecord {
    /// The record of `ep` as the gateway knows it without scoring (name, scrapes, requests in
    /// flight); the callers fill in what they scored.
    pub(crate) fn of(ep: &EndpointState, now: Timestamp) -> Self {
        Self {
            addr: ep.cold.meta.addr,
            name: format!("{}/{}", ep.cold.meta.namespace, ep.cold.meta.pod),
            scores: Vec::new(),
            total: 0.0,
            waiting: 0.0,
            running: 0.0,
            estimated_wait_secs: 0.0,
            prefix_blocks: 0,
            saturated: false,
            scrape: ep.scrape,
            metrics_age_secs: ep.sampled_at.map(|t| now.saturating_since(t).as_secs_f64()),
            inflight: f64::from(ep.inflight),
            fail_open: false,
        }
    }
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
    /// Candidates the pool had when the pick scored a random sample of them
    /// (`candidateSample`); 0 when every candidate was considered.
    #[serde(skip_serializing_if = "is_zero")]
    pub sampled_from: usize,
    /// Full prompt blocks hashed for prefix affinity.
    pub prompt_blocks: usize,
    /// Endpoints whose prefix match came from the engine's KV-cache events (exact, counted in
    /// prompt tokens) rather than from the approximate index.
    #[serde(skip_serializing_if = "is_zero")]
    pub exact_prefix: usize,
    /// Which filter removed which pod.
    pub filtered: Vec<FilteredOut>,
    /// Clear pods this request had to leave to protected requests (flow control's headroom
    /// reservation): counted as saturated for it, so the saturation filter removed them too.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserve_held: Vec<SocketAddr>,
    /// True when every pod was filtered out and the configured fallback scored all ready pods.
    pub fell_back_to_all_ready: bool,
    /// True when no candidate had fresh metrics and the pick was made fail-open, on in-flight
    /// accounting (`staleMetrics.mode: failOpen`), or shed at the fail-open cap.
    pub fail_open: bool,
    /// Candidates that reached scoring (empty for baseline policies), in pool order.
    pub candidates: Vec<CandidateRecord>,
    /// The endpoints returned, best first (empty on rejection).
    pub chosen: Vec<SocketAddr>,
    /// The rejection's metric label, when rejected.
    pub rejection: Option<&'static str>,
    /// The rejection's `Retry-After`, in seconds, when shed.
    pub retry_after_secs: Option<u64>,
}

impl Explanation {
    /// The record on one line of printable ASCII (safe as an HTTP header value): the chosen
    /// endpoints or the rejection, what was considered and filtered (and by which filter), then
    /// `max_candidates` candidates with their totals and every scorer's value
    /// (`scorer=value*weight`): the chosen endpoints first, in the order returned, then the
    /// others best-scored first. Used for the debug log line and the opt-in response header.
    pub fn summary(&self, max_candidates: usize) -> String {
        let mut s = String::with_capacity(128 + 160 * self.candidates.len().min(max_candidates));
        // Writing into a String cannot fail.
        let _ = self.write_summary(&mut s, max_candidates);
        // Names come from configuration and pod labels: keep the line one printable line.
        s.retain(|c| c.is_ascii() && !c.is_ascii_control());
        s
    }

    fn write_summary(&self, s: &mut String, max_candidates: usize) -> std::fmt::Result {
        use std::fmt::Write as _;
        match self.rejection {
            Some(r) => {
                write!(s, "rejected={r}")?;
                if let Some(secs) = self.retry_after_secs {
                    write!(s, " retry_after={secs}s")?;
                }
            }
            None => {
                s.push_str("chosen=");
                for (i, a) in self.chosen.iter().enumerate() {
                    if i > 0 {
                        s.push(',');
                    }
                    write!(s, "{a}")?;
                }
            }
        }
        if let Some(p) = self.policy {
            write!(s, " policy={}", p.as_str())?;
        }
        write!(
            s,
            " priority={} considered={} prompt_blocks={}",
            self.priority.as_str(),
            self.considered,
            self.prompt_blocks
        )?;
        if self.sampled_from > 0 {
            write!(s, " sampled_from={}", self.sampled_from)?;
        }
        if self.exact_prefix > 0 {
            write!(s, " exact_prefix={}", self.exact_prefix)?;
        }
        if self.fell_back_to_all_ready {
            s.push_str(" fell_back_to_all_ready");
        }
        if self.fail_open {
            s.push_str(" fail_open");
        }
        if !self.reserve_held.is_empty() {
            s.push_str(" reserve_held=");
            for (i, a) in self.reserve_held.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write!(s, "{a}")?;
            }
        }
        if !self.filtered.is_empty() {
            s.push_str(" filtered=");
            for (i, f) in self.filtered.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write!(s, "{}:{}", f.addr, f.filter)?;
            }
        }
        // The endpoints returned first, in their order (with equal totals the pick broke the tie
        // at random, and a line read for "why there" must start with "there"), then the rest
        // best first.
        let rank = |c: &CandidateRecord| {
            self.chosen
                .iter()
                .position(|a| *a == c.addr)
                .unwrap_or(usize::MAX)
        };
        let mut order: Vec<&CandidateRecord> = self.candidates.iter().collect();
        order.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then_with(|| b.total.total_cmp(&a.total))
        });
        for c in order.iter().take(max_candidates) {
            if c.fail_open {
                write!(
                    s,
                    " | {} {} total={:.3} inflight={:.0} prefix_blocks={} scrape={}",
                    c.name,
                    c.addr,
                    c.total,
                    c.inflight,
                    c.prefix_blocks,
                    c.scrape.as_str()
                )?;
                if let Some(age) = c.metrics_age_secs {
                    write!(s, " metrics_age_ms={:.0}", age * 1e3)?;
                }
                continue;
            }
            write!(
                s,
                " | {} {} total={:.3} waiting={:.0} running={:.0} est_wait_ms={:.1} prefix_blocks={}",
                c.name,
                c.addr,
                c.total,
                c.waiting,
                c.running,
                c.estimated_wait_secs * 1e3,
                c.prefix_blocks
            )?;
            if c.saturated {
                s.push_str(" saturated");
            }
            if c.scrape != crate::endpoint::ScrapeState::Ok {
                write!(s, " scrape={}", c.scrape.as_str())?;
                if let Some(age) = c.metrics_age_secs {
                    write!(s, " metrics_age_ms={:.0}", age * 1e3)?;
                }
            }
            for r in &c.scores {
                write!(s, " {}={:.3}*{}", r.scorer, r.value, r.weight)?;
            }
        }
        if order.len() > max_candidates {
            write!(s, " | +{} more", order.len() - max_candidates)?;
        }
        Ok(())
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
