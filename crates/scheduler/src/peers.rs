//! Active-active pickers: the load that the other picker replicas of the same pool have in flight.
//!
//! Every replica keeps its own in-flight accounting: the requests it routed and that have not
//! produced a first token or completed. Scraped metrics show what the engines already hold, and
//! in-flight accounting adds what a scrape cannot know yet — but only for the replica's own
//! picks. Behind a Kubernetes Service each replica sees a share of the arrivals and would send
//! its share of a burst to the same pod its peers chose from the same scrape (herding), and it
//! under-estimates the prefill queued on each pod by the peers' share.
//!
//! The remedy is an exchange of deltas: each replica periodically sends its peers its own load
//! per endpoint ([`PeerLoad`], from [`Scheduler::peer_loads`](crate::Scheduler::peer_loads)) and
//! applies theirs ([`Scheduler::apply_peer_loads`](crate::Scheduler::apply_peer_loads)). The
//! newest report of each peer replaces its previous one, so a lost report costs one interval and
//! nothing accumulates; a peer that stops reporting is dropped by
//! [`Scheduler::expire_peers`](crate::Scheduler::expire_peers). The views the scorers read add
//! the peers' sums to the replica's own counters:
//!
//! - requests in flight and their tokens, and requests awaiting their first token and their
//!   uncached prompt tokens (the estimated prefill queue: `max(own + peers' pending tokens,
//!   scraped queue + routed since the scrape)`), always;
//! - requests routed since the scrape (queue depth, running batch and KV use "since the
//!   snapshot"), until this replica applies a newer snapshot of the endpoint — that snapshot
//!   already counts them, as it does the replica's own — and again from the peer's next report.
//!
//! Each replica also learns every pod's prefill and decode speed from the completions of its own
//! requests, 1/N of the pod's; the same samples are passed on ([`RateSample`], from
//! [`Scheduler::take_rate_samples`](crate::Scheduler::take_rate_samples) to
//! [`Scheduler::learn_from_peer`](crate::Scheduler::learn_from_peer)) so that every replica's
//! estimate tracks the pod as one picker's would.
//!
//! Only deltas travel: a replica reports its own counters, never the sums it holds of its peers,
//! so reports do not echo. Timestamps are never compared across replicas (each process has its
//! own clock origin); a report's age is the receiver's business.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::endpoint::Timestamp;

/// Peers a replica keeps reports from. Beyond it a new peer's report is refused: a pool is served
/// by a handful of replicas, and a bound keeps a misconfigured sender from growing the table.
pub const MAX_PEERS: usize = 64;

/// One replica's own load on one endpoint, as it reports it to its peers.
///
/// Counts only the reporting replica's requests (never what it holds of its peers).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerLoad {
    /// The endpoint.
    pub addr: SocketAddr,
    /// Requests in flight on it (picked, not yet completed, failed or cancelled).
    pub inflight: u32,
    /// Their estimated prompt + output tokens.
    pub inflight_tokens: u64,
    /// Of those, the requests still awaiting their first token.
    pub pending: u32,
    /// Their estimated uncached prompt tokens.
    pub pending_tokens: u64,
    /// Requests routed to it since the reporter's newest snapshot of it.
    pub since_requests: u32,
    /// Of those, the ones awaiting their first token.
    pub since_pending: u32,
    /// Their estimated uncached prompt tokens.
    pub since_pending_tokens: u64,
}

impl PeerLoad {
    /// No load on `addr`.
    pub fn idle(addr: SocketAddr) -> Self {
        PeerLoad {
            addr,
            inflight: 0,
            inflight_tokens: 0,
            pending: 0,
            pending_tokens: 0,
            since_requests: 0,
            since_pending: 0,
            since_pending_tokens: 0,
        }
    }

    /// Whether the report carries no load at all (a replica may leave such endpoints out).
    pub fn is_idle(&self) -> bool {
        self.inflight == 0 && self.pending == 0 && self.since_requests == 0
    }
}

/// One rate sample a replica learned from a completion (the same sample its own learner took),
/// for its peers' learners: with N replicas each one completes only 1/N of each pod's requests,
/// and its estimate of the pod's speed would track changes N times slower.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateSample {
    /// The endpoint.
    pub addr: SocketAddr,
    /// Prefill work cleared before the first token over the time to it (tokens/s).
    pub prefill_tokens_per_sec: f64,
    /// Output tokens after the first over the time after it (tokens/s), when measured.
    pub decode_tokens_per_sec: Option<f64>,
}

impl RateSample {
    /// Whether every rate is a usable measurement (finite and positive).
    pub fn is_valid(&self) -> bool {
        let ok = |r: f64| r.is_finite() && r > 0.0;
        ok(self.prefill_tokens_per_sec) && self.decode_tokens_per_sec.is_none_or(ok)
    }
}

/// Rate samples a replica keeps for its peers between two reports; beyond it new samples are
/// dropped (a shell that stopped collecting them must not grow the buffer), and at most this
/// many of a peer's report are learned from.
pub const MAX_RATE_SAMPLES: usize = 4_096;

/// A peer report that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The table already holds [`MAX_PEERS`] peers and this one is new.
    #[error("peer {peer:?} refused: already {MAX_PEERS} peers")]
    TooManyPeers {
        /// The refused peer's name.
        peer: String,
    },
}

/// The sum of every peer's load on one endpoint, kept in the endpoint's hot state.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerSum {
    pub(crate) inflight: u32,
    pub(crate) inflight_tokens: u64,
    pub(crate) pending: u32,
    pub(crate) pending_tokens: u64,
    pub(crate) since_requests: u32,
    pub(crate) since_pending: u32,
    pub(crate) since_pending_tokens: u64,
    /// When the pending tokens were reported: the receipt times of the peers' reports, weighted
    /// by each one's pending tokens.
    pub(crate) pending_at: Timestamp,
}

impl PeerSum {
    /// The share of the peers' pending (awaiting first token) requests still pending at `now`.
    ///
    /// They are as of the peers' reports; since then the pod has cleared prefill work at its
    /// learned rate (`1 / inv_rate` tokens/s), from a queue of `own_pending` + the peers' pending
    /// tokens, and with it a proportional share of theirs. Without this a peer's request that has
    /// had its first token keeps counting until the next report, which biases every replica away
    /// from the fastest pods, whose requests leave the queue soonest. 1 without peer load.
    pub(crate) fn pending_left(&self, own_pending: u64, now: Timestamp, inv_rate: f64) -> f64 {
        if self.pending_tokens == 0 {
            return 1.0;
        }
        let age = now.saturating_since(self.pending_at).as_secs_f64();
        let queue = own_pending.saturating_add(self.pending_tokens) as f64;
        let left = 1.0 - age / (inv_rate * queue);
        if left.is_finite() {
            left.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    fn add(&mut self, l: &PeerLoad) {
        self.inflight = self.inflight.saturating_add(l.inflight);
        self.inflight_tokens = self.inflight_tokens.saturating_add(l.inflight_tokens);
        self.pending = self.pending.saturating_add(l.pending);
        self.pending_tokens = self.pending_tokens.saturating_add(l.pending_tokens);
        self.since_requests = self.since_requests.saturating_add(l.since_requests);
        self.since_pending = self.since_pending.saturating_add(l.since_pending);
        self.since_pending_tokens = self
            .since_pending_tokens
            .saturating_add(l.since_pending_tokens);
    }
}

/// What one peer last reported.
#[derive(Debug, Default)]
struct Peer {
    /// When its newest report was applied (this replica's clock).
    received_at: Timestamp,
    /// Its load per endpoint of this pool (endpoints it did not name carry none).
    loads: HashMap<SocketAddr, PeerLoad>,
}

/// The newest report of every peer (crate-internal; the scheduler keeps the per-endpoint sums in
/// the endpoints' hot state so a pick reads no table).
#[derive(Debug, Default)]
pub(crate) struct PeerTable {
    peers: HashMap<String, Peer>,
    /// Rate samples learned since the shell last collected them.
    outbox: Vec<RateSample>,
    /// Whether the shell collects them (it asked once); until then nothing is kept.
    collecting: bool,
}

impl PeerTable {
    /// Keeps a rate sample this replica learned, for its peers (once the shell collects them).
    pub(crate) fn learned(&mut self, addr: SocketAddr, prefill: f64, decode: Option<f64>) {
        if self.collecting && self.outbox.len() < MAX_RATE_SAMPLES {
            self.outbox.push(RateSample {
                addr,
                prefill_tokens_per_sec: prefill,
                decode_tokens_per_sec: decode,
            });
        }
    }

    /// Moves the kept rate samples into `out` (cleared first); from now on samples are kept.
    pub(crate) fn take_samples(&mut self, out: &mut Vec<RateSample>) {
        self.collecting = true;
        out.clear();
        out.append(&mut self.outbox);
    }

    /// Replaces `peer`'s report with `loads` (only the endpoints `known` accepts are kept) and
    /// calls `touched` with every endpoint whose sum may have changed: those of the old report
    /// and of the new one.
    pub(crate) fn apply(
        &mut self,
        peer: &str,
        loads: &[PeerLoad],
        now: Timestamp,
        known: impl Fn(&SocketAddr) -> bool,
        mut touched: impl FnMut(SocketAddr),
    ) -> Result<(), PeerError> {
        if !self.peers.contains_key(peer) {
            if self.peers.len() >= MAX_PEERS {
                return Err(PeerError::TooManyPeers {
                    peer: peer.to_owned(),
                });
            }
            self.peers.insert(peer.to_owned(), Peer::default());
        }
        let Some(p) = self.peers.get_mut(peer) else {
            return Ok(());
        };
        p.received_at = now;
        for addr in p.loads.keys() {
            touched(*addr);
        }
        p.loads.clear();
        for l in loads.iter().filter(|l| known(&l.addr)) {
            p.loads.insert(l.addr, *l);
            touched(l.addr);
        }
        Ok(())
    }

    /// Drops `peer`'s report, calling `touched` with the endpoints it named. False when unknown.
    pub(crate) fn forget(&mut self, peer: &str, mut touched: impl FnMut(SocketAddr)) -> bool {
        let Some(p) = self.peers.remove(peer) else {
            return false;
        };
        for addr in p.loads.keys() {
            touched(*addr);
        }
        true
    }

    /// Drops every peer whose newest report was applied before `cutoff`; returns how many.
    pub(crate) fn expire(
        &mut self,
        cutoff: Timestamp,
        mut touched: impl FnMut(SocketAddr),
    ) -> usize {
        let before = self.peers.len();
        self.peers.retain(|_, p| {
            let keep = p.received_at >= cutoff;
            if !keep {
                for addr in p.loads.keys() {
                    touched(*addr);
                }
            }
            keep
        });
        before - self.peers.len()
    }

    /// This replica applied a newer snapshot of `addr`: it counts what the peers had routed there
    /// before, so their "since the snapshot" counters no longer apply (until their next report).
    pub(crate) fn snapshot_applied(&mut self, addr: &SocketAddr) {
        for p in self.peers.values_mut() {
            if let Some(l) = p.loads.get_mut(addr) {
                l.since_requests = 0;
                l.since_pending = 0;
                l.since_pending_tokens = 0;
            }
        }
    }

    /// Every peer's load on `addr`, summed.
    pub(crate) fn sum(&self, addr: &SocketAddr) -> PeerSum {
        let mut s = PeerSum::default();
        let (mut weighted, mut weight) = (0.0, 0.0);
        for p in self.peers.values() {
            if let Some(l) = p.loads.get(addr) {
                s.add(l);
                let w = l.pending_tokens as f64;
                weighted += w * p.received_at.as_nanos() as f64;
                weight += w;
            }
        }
        if weight > 0.0 {
            s.pending_at = Timestamp::from_nanos((weighted / weight) as u64);
        }
        s
    }

    /// Peers with a report.
    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when no peer has reported.
    pub(crate) fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}
