//! The [`Scheduler`]'s side of the exchange between active-active picker replicas: what it
//! reports of its own load, and how it applies its peers' reports (see [`crate::peers`]).

use std::net::SocketAddr;

use super::Scheduler;
use crate::endpoint::Timestamp;
use crate::peers::{MAX_RATE_SAMPLES, PeerError, PeerLoad, RateSample};

impl Scheduler {
    /// This replica's own load on every endpoint of the pool, for its peers, into `out` (cleared
    /// first). Endpoints with no load are left out ([`PeerLoad::is_idle`]): an endpoint missing
    /// from a report carries none. Never includes what the peers reported.
    pub fn peer_loads(&self, out: &mut Vec<PeerLoad>) {
        out.clear();
        for ep in self.endpoints.iter() {
            let l = PeerLoad {
                addr: ep.cold.meta.addr,
                inflight: ep.inflight,
                inflight_tokens: ep.inflight_tokens,
                pending: ep.pending,
                pending_tokens: ep.pending_tokens,
                since_requests: ep.since_requests,
                since_pending: ep.since_pending,
                since_pending_tokens: ep.since_pending_tokens,
            };
            if !l.is_idle() {
                out.push(l);
            }
        }
    }

    /// Applies the newest report of peer replica `peer` (any stable name, e.g. its pod name),
    /// received at `now`: it replaces that peer's previous report. Endpoints not in the pool are
    /// ignored; endpoints it does not name carry no load of it. Its requests then count in every
    /// pick as this replica's own do (see [`crate::peers`]) until its next report,
    /// [`forget_peer`](Self::forget_peer) or [`expire_peers`](Self::expire_peers).
    pub fn apply_peer_loads(
        &mut self,
        peer: &str,
        loads: &[PeerLoad],
        now: Timestamp,
    ) -> Result<(), PeerError> {
        let mut touched = std::mem::take(&mut self.peer_scratch);
        touched.clear();
        let endpoints = &self.endpoints;
        let out = self.peers.apply(
            peer,
            loads,
            now,
            |a| endpoints.slot_of(a).is_some(),
            |a| touched.push(a),
        );
        self.resum_peers(&touched);
        self.peer_scratch = touched;
        out
    }

    /// Drops peer `peer`'s report (it left the pool of replicas). False when it had none.
    pub fn forget_peer(&mut self, peer: &str) -> bool {
        let mut touched = Vec::new();
        let known = self.peers.forget(peer, |a| touched.push(a));
        self.resum_peers(&touched);
        known
    }

    /// Drops every peer whose newest report was applied more than `max_age` before `now` (it
    /// stopped reporting: restarted, partitioned or gone). Returns how many were dropped.
    pub fn expire_peers(&mut self, now: Timestamp, max_age: std::time::Duration) -> usize {
        let cutoff = Timestamp::from_nanos(
            now.as_nanos()
                .saturating_sub(u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX)),
        );
        let mut touched = Vec::new();
        let n = self.peers.expire(cutoff, |a| touched.push(a));
        self.resum_peers(&touched);
        n
    }

    /// The rate samples this replica learned from its completions since the previous call, for
    /// its peers' [`learn_from_peer`](Self::learn_from_peer), into `out` (cleared first). The
    /// first call turns collection on: until a shell asks, nothing is kept; after it, at most
    /// [`MAX_RATE_SAMPLES`] wait between two calls.
    pub fn take_rate_samples(&mut self, out: &mut Vec<RateSample>) {
        self.peers.take_samples(out);
    }

    /// Teaches this replica's per-endpoint learners the rate samples a peer learned (its
    /// [`take_rate_samples`](Self::take_rate_samples)), as if its own completions had: with N
    /// replicas each one would otherwise learn a pod's speed from 1/N of its requests. Samples
    /// for endpoints not in the pool, and samples that are not finite and positive, are skipped;
    /// at most [`MAX_RATE_SAMPLES`] are taken. Returns how many were learned from.
    pub fn learn_from_peer(&mut self, samples: &[RateSample]) -> usize {
        let min_alpha = self.cfg.rates.min_alpha;
        let mut learned = 0;
        for s in samples.iter().take(MAX_RATE_SAMPLES) {
            if !s.is_valid() {
                continue;
            }
            let Some(ep) = self
                .endpoints
                .slot_of(&s.addr)
                .and_then(|slot| self.endpoints.get_mut(slot))
            else {
                continue;
            };
            ep.learn_prefill(s.prefill_tokens_per_sec, min_alpha, &mut self.rates);
            if let Some(d) = s.decode_tokens_per_sec {
                ep.learn_decode(d, min_alpha, &mut self.rates);
            }
            learned += 1;
        }
        learned
    }

    /// Peers whose report is held.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Recomputes the peers' sum held by each endpoint in `addrs`.
    pub(super) fn resum_peers(&mut self, addrs: &[SocketAddr]) {
        for a in addrs {
            let Some(slot) = self.endpoints.slot_of(a) else {
                continue;
            };
            let sum = self.peers.sum(a);
            if let Some(ep) = self.endpoints.get_mut(slot) {
                ep.peer = sum;
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use std::time::Duration;

    use crate::fixtures::*;
    use crate::*;

    fn loads(s: &Scheduler) -> Vec<PeerLoad> {
        let mut v = Vec::new();
        s.peer_loads(&mut v);
        v
    }

    #[test]
    fn a_report_counts_only_the_reporters_own_requests() {
        let mut a = scheduler(SchedulerConfig::default(), 2);
        let mut b = scheduler(SchedulerConfig::default(), 2);
        let d = a
            .pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        let ra = loads(&a);
        assert_eq!(ra.len(), 1, "idle endpoints are left out");
        let l = ra[0];
        assert_eq!(l.addr, d.endpoints.first());
        assert_eq!(
            (l.inflight, l.pending, l.since_requests, l.since_pending),
            (1, 1, 1, 1)
        );
        assert_eq!(l.pending_tokens, 300);
        b.apply_peer_loads("a", &ra, T0).unwrap();
        // B's own report does not echo A's load back.
        assert!(loads(&b).is_empty());
        assert_eq!(b.peer_count(), 1);
    }

    #[test]
    fn peers_see_each_others_picks_and_spread_a_burst() {
        // Two replicas, four idle pods, one scrape. Without the exchange each replica's first
        // pick lands on the same best pod; with it the second replica avoids the first's.
        for seed in 0..20 {
            let mut a = scheduler(SchedulerConfig::default(), 4);
            let mut b = scheduler(SchedulerConfig::default(), 4);
            let mut picked = Vec::new();
            for i in 0..2 {
                let d = a
                    .pick(&RequestContext::new("m", 2_000), T0, &mut rng(seed * 7 + i))
                    .unwrap();
                picked.push(d.endpoints.first());
            }
            b.apply_peer_loads("a", &loads(&a), T0).unwrap();
            for i in 0..2 {
                let d = b
                    .pick(
                        &RequestContext::new("m", 2_000),
                        T0,
                        &mut rng(seed * 11 + i),
                    )
                    .unwrap();
                picked.push(d.endpoints.first());
            }
            picked.sort();
            picked.dedup();
            assert_eq!(picked.len(), 4, "seed {seed}: four picks on four pods");
        }
    }

    #[test]
    fn a_newer_report_replaces_the_old_one() {
        let mut a = scheduler(SchedulerConfig::default(), 1);
        let mut b = scheduler(SchedulerConfig::default(), 1);
        let d = a
            .pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        b.apply_peer_loads("a", &loads(&a), T0).unwrap();
        b.apply_peer_loads("a", &loads(&a), T0).unwrap();
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), T0, &mut rng(2));
        assert_eq!(
            ex.candidates[0].waiting, 1.0,
            "counted once, not per report"
        );
        assert!(a.complete(d.ticket, T0, Usage::default()));
        b.apply_peer_loads("a", &loads(&a), T0).unwrap();
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), T0, &mut rng(3));
        // Only B's own pick of the line above remains.
        assert_eq!(ex.candidates[0].waiting, 1.0);
    }

    #[test]
    fn a_newer_snapshot_retires_the_peers_since_counters() {
        let mut a = scheduler(SchedulerConfig::default(), 1);
        let mut b = scheduler(SchedulerConfig::default(), 1);
        a.pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        b.apply_peer_loads("a", &loads(&a), T0).unwrap();
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), T0, &mut rng(2));
        assert_eq!(ex.candidates[0].waiting, 1.0);
        // The engine now reports A's request in its queue: not counted twice.
        let t1 = T0.saturating_add(Duration::from_millis(50));
        b.apply_metrics(addr(0), snapshot(t1, 2, 0.1)).unwrap();
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), t1, &mut rng(3));
        assert_eq!(ex.candidates[0].waiting, 2.0);
    }

    #[test]
    fn a_peers_pending_requests_age_out_at_the_pods_rate() {
        let mut a = scheduler(SchedulerConfig::default(), 1);
        a.pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        let report = loads(&a);
        let waiting_at = |ms: u64| {
            let mut b = scheduler(SchedulerConfig::default(), 1);
            b.apply_peer_loads("a", &report, T0).unwrap();
            let now = T0.saturating_add(Duration::from_millis(ms));
            let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), now, &mut rng(2));
            ex.candidates[0].waiting
        };
        assert_eq!(waiting_at(0), 1.0);
        // 300 tokens at the prior 4,000 tokens/s clear in 75 ms: half of them after 37.5 ms.
        let half = waiting_at(37);
        assert!(half > 0.45 && half < 0.55, "{half}");
        assert_eq!(waiting_at(200), 0.0);
    }

    #[test]
    fn silent_peers_expire_and_forgotten_peers_leave() {
        let mut a = scheduler(SchedulerConfig::default(), 1);
        let mut b = scheduler(SchedulerConfig::default(), 1);
        a.pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        b.apply_peer_loads("a", &loads(&a), T0).unwrap();
        b.apply_peer_loads(
            "c",
            &loads(&a),
            T0.saturating_add(Duration::from_millis(995)),
        )
        .unwrap();
        let now = T0.saturating_add(Duration::from_secs(1));
        assert_eq!(b.expire_peers(now, Duration::from_millis(500)), 1);
        assert_eq!(b.peer_count(), 1);
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), now, &mut rng(2));
        // Only c's report is left, its request aged 5 ms of its 75.
        let w = ex.candidates[0].waiting;
        assert!(w > 0.9 && w < 1.0, "{w}");
        assert!(b.forget_peer("c"));
        assert!(!b.forget_peer("c"));
        let (_, ex) = b.pick_explained(&RequestContext::new("m", 300), now, &mut rng(3));
        assert_eq!(ex.candidates[0].waiting, 1.0, "b's own pick above");
    }

    #[test]
    fn unknown_endpoints_are_ignored_and_peers_are_bounded() {
        let mut b = scheduler(SchedulerConfig::default(), 1);
        let stranger = PeerLoad {
            addr: addr(9),
            inflight: 5,
            pending: 5,
            since_requests: 5,
            since_pending: 5,
            ..PeerLoad::idle(addr(9))
        };
        b.apply_peer_loads("a", &[stranger], T0).unwrap();
        // An endpoint that joins later gets the load with the peer's next report.
        b.upsert_endpoint(meta(9));
        b.apply_metrics(addr(9), snapshot(T0, 0, 0.1)).unwrap();
        let cx = RequestContext::new("m", 300);
        let (_, ex) = b.pick_explained(&cx, T0, &mut rng(1));
        let waiting = |ex: &Explanation| {
            ex.candidates
                .iter()
                .find(|c| c.addr == addr(9))
                .map(|c| c.waiting)
        };
        assert_eq!(waiting(&ex), Some(0.0));
        b.apply_peer_loads("a", &[stranger], T0).unwrap();
        let (_, ex) = b.pick_explained(&cx, T0, &mut rng(2));
        assert!(waiting(&ex).unwrap() >= 5.0, "{:?}", waiting(&ex));
        for i in 1..MAX_PEERS {
            b.apply_peer_loads(&format!("p{i}"), &[], T0).unwrap();
        }
        assert_eq!(b.peer_count(), MAX_PEERS);
        assert!(matches!(
            b.apply_peer_loads("one-too-many", &[], T0),
            Err(PeerError::TooManyPeers { .. })
        ));
        // A known peer still reports.
        b.apply_peer_loads("a", &[stranger], T0).unwrap();
    }

    #[test]
    fn rate_samples_teach_the_peers_learners() {
        let mut a = scheduler(SchedulerConfig::default(), 1);
        let mut b = scheduler(SchedulerConfig::default(), 1);
        let mut samples = Vec::new();
        // Nothing is kept before the shell first asks.
        let d = a
            .pick(&RequestContext::new("m", 300), T0, &mut rng(1))
            .unwrap();
        let t1 = T0.saturating_add(Duration::from_millis(100));
        let t2 = T0.saturating_add(Duration::from_millis(1_100));
        let usage = Usage {
            prompt_tokens: 300,
            cached_tokens: 0,
            output_tokens: 41,
        };
        a.first_token(d.ticket, t1);
        a.complete(d.ticket, t2, usage);
        a.take_rate_samples(&mut samples);
        assert!(samples.is_empty());
        let d = a
            .pick(&RequestContext::new("m", 300), t2, &mut rng(2))
            .unwrap();
        let t3 = t2.saturating_add(Duration::from_millis(100));
        let t4 = t2.saturating_add(Duration::from_millis(1_100));
        a.first_token(d.ticket, t3);
        a.complete(d.ticket, t4, usage);
        a.take_rate_samples(&mut samples);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].decode_tokens_per_sec, Some(40.0));
        assert_eq!(b.learn_from_peer(&samples), 1);
        let (ea, eb) = (a.endpoint(addr(0)).unwrap(), b.endpoint(addr(0)).unwrap());
        assert_eq!(eb.rate_samples, 1);
        assert_eq!(eb.decode_tokens_per_sec, ea.decode_tokens_per_sec);
        let bad = RateSample {
            prefill_tokens_per_sec: f64::NAN,
            ..samples[0]
        };
        let stranger = RateSample {
            addr: addr(9),
            ..samples[0]
        };
        assert_eq!(b.learn_from_peer(&[bad, stranger]), 0);
        assert_eq!(b.endpoint(addr(0)).unwrap().rate_samples, 1);
        // Collected once: the next call starts empty.
        a.take_rate_samples(&mut samples);
        assert!(samples.is_empty());
    }

    #[test]
    fn reports_round_trip_as_json() {
        let l = PeerLoad {
            addr: addr(1),
            inflight: 3,
            inflight_tokens: 900,
            pending: 1,
            pending_tokens: 300,
            since_requests: 1,
            since_pending: 1,
            since_pending_tokens: 300,
        };
        let s = serde_json::to_string(&l).unwrap();
        assert!(s.contains("\"pendingTokens\":300"), "{s}");
        assert_eq!(serde_json::from_str::<PeerLoad>(&s).unwrap(), l);
    }
}
