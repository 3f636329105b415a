use std::time::Duration;

use super::*;

const MIN: Duration = Duration::from_secs(60);

fn quota(requests: Option<u64>, tokens: Option<u64>) -> TenantQuota {
    TenantQuota::new(Limits { requests, tokens }, MIN, DEFAULT_BUCKETS).unwrap()
}

#[test]
fn bad_windows_are_refused() {
    assert_eq!(
        Window::new(Duration::from_millis(1000), 7).unwrap_err(),
        QuotaError::BadWindow {
            window_ms: 1000,
            buckets: 7
        }
    );
    assert_eq!(
        Window::new(MIN, 1).unwrap_err(),
        QuotaError::TooFewBuckets { buckets: 1 }
    );
    assert!(Window::new(Duration::ZERO, 2).is_err());
    assert_eq!(Window::new(MIN, 60).unwrap().bucket_ms(), 1000);
}

#[test]
fn uses_leave_the_window_with_their_bucket() {
    let mut w = Window::new(MIN, 60).unwrap();
    w.add(500, 2);
    w.add(10_200, 3);
    assert_eq!(w.count(10_200, 1), 5);
    // Bucket 0 is live up to 59,999 ms and leaves at 60,000 ms.
    assert_eq!(w.count(59_999, 1), 5);
    assert_eq!(w.count(60_000, 1), 3);
    assert_eq!(w.count(69_999, 1), 3);
    assert_eq!(w.count(70_000, 1), 0);
    // A slot reused by a later bucket starts empty.
    w.add(120_000, 1);
    assert_eq!(w.count(120_000, 1), 1);
}

#[test]
fn retry_after_is_when_the_oldest_counted_use_leaves() {
    let mut q = quota(Some(3), None);
    q.admit(500, 1, 0).unwrap();
    q.admit(10_200, 1, 0).unwrap();
    q.admit(20_000, 1, 0).unwrap();
    let e = q.admit(30_000, 1, 0).unwrap_err();
    assert_eq!(e.kind, QuotaKind::Requests);
    assert_eq!(e.limit, 3);
    // The use at 500 ms is in bucket 0, which leaves at 60 s.
    assert_eq!(e.retry_after, Duration::from_millis(30_000));
    let e = q.admit(59_999, 1, 0).unwrap_err();
    assert_eq!(e.retry_after, Duration::from_millis(1));
    q.admit(60_000, 1, 0).unwrap();
    // Now 10.2 s, 20 s, 60 s are counted: the next leaves at 70 s.
    let e = q.admit(60_001, 1, 0).unwrap_err();
    assert_eq!(e.retry_after, Duration::from_millis(9_999));
}

#[test]
fn retry_after_for_tokens_waits_for_enough_to_leave() {
    let mut q = quota(None, Some(1000));
    q.admit(0, 1, 400).unwrap();
    q.admit(5_000, 1, 400).unwrap();
    q.admit(9_000, 1, 200).unwrap();
    // 1000 counted; 500 more need 500 to leave: the 400 at 0 s is not enough, the 400 at 5 s
    // (leaving at 65 s) makes it.
    let e = q.admit(30_000, 1, 500).unwrap_err();
    assert_eq!(e.kind, QuotaKind::Tokens);
    assert_eq!(e.retry_after, Duration::from_millis(35_000));
    // Nothing was counted for the refused request.
    assert_eq!(q.tokens().count(30_000, 1), 1000);
    assert_eq!(q.requests().count(30_000, 1), 3);
}

#[test]
fn estimates_are_corrected_to_the_reported_usage_in_their_bucket() {
    let mut q = quota(None, Some(1000));
    let c = q.admit(1_500, 1, 600).unwrap();
    assert_eq!(
        c,
        Charge {
            epoch: 1,
            tokens: 600
        }
    );
    // The response reported 100 input + 50 output tokens.
    q.settle(3_000, c, 150);
    assert_eq!(q.tokens().count(3_000, 1), 150);
    // The correction left with the bucket charged (bucket 1 leaves at 61 s).
    assert_eq!(q.tokens().count(60_999, 1), 150);
    assert_eq!(q.tokens().count(61_000, 1), 0);
    // More than estimated is counted too.
    let c = q.admit(62_000, 1, 100).unwrap();
    q.settle(63_000, c, 900);
    assert_eq!(q.tokens().count(63_000, 1), 900);
    let e = q.admit(63_000, 1, 200).unwrap_err();
    assert_eq!(e.retry_after, Duration::from_millis(122_000 - 63_000));
    // A correction for a bucket already gone is dropped.
    let mut q = quota(None, Some(1000));
    let c = q.admit(0, 1, 10).unwrap();
    q.settle(60_000, c, 500);
    assert_eq!(q.tokens().count(60_000, 1), 0);
}

#[test]
fn an_estimate_over_the_limit_is_admitted_into_an_empty_window() {
    let mut q = quota(None, Some(100));
    let c = q.admit(0, 1, 5_000).unwrap();
    assert_eq!(c.tokens, 100);
    let e = q.admit(1, 1, 1).unwrap_err();
    assert_eq!(e.retry_after, Duration::from_millis(59_999));
}

#[test]
fn the_long_run_rate_holds_within_the_bucket_bound() {
    // A client that retries every 10 ms against 600 per minute for ten minutes.
    let mut q = quota(Some(600), None);
    let mut admitted = 0u64;
    let end = 10 * 60_000;
    let mut t = 0;
    while t < end {
        if q.admit(t, 1, 0).is_ok() {
            admitted += 1;
        }
        t += 10;
    }
    // 600 per minute × 10 minutes, at most one bucket's worth over per window (N/(N-1)).
    assert!(admitted >= 6_000, "{admitted}");
    assert!(admitted as f64 <= 6_000.0 * 60.0 / 59.0 + 1.0, "{admitted}");
}

/// A store shared by two replicas, as the gateway's Redis sync uses it: each round records
/// the replica's own total per bucket, records the round's time, and reads back the sums and
/// the oldest last-round time of the replicas (none while one has never synced).
#[derive(Default)]
struct Store {
    own: std::collections::HashMap<(usize, u64), i64>,
    rounds: [Option<u64>; 2],
    out: Vec<(u64, i64)>,
}

impl Store {
    fn total(&self, epoch: u64) -> i64 {
        (0..2).filter_map(|r| self.own.get(&(r, epoch))).sum()
    }

    fn sync(&mut self, replica: usize, q: &mut TenantQuota, now: u64) {
        self.out.clear();
        let (r, _) = q.windows_mut();
        r.take_unsynced(now, &mut self.out);
        for (e, own) in &self.out {
            self.own.insert((replica, *e), *own);
        }
        self.rounds[replica] = Some(now);
        let oldest = self
            .rounds
            .iter()
            .try_fold(u64::MAX, |m, r| r.map(|r| m.min(r)));
        r.set_peers_synced(oldest);
        for e in r.live_epochs(now) {
            let v = self.total(e);
            r.apply_shared(now, e, u64::try_from(v).unwrap());
        }
    }
}

#[test]
fn replicas_share_through_synced_totals() {
    // Two replicas, a store that sums their deltas per bucket.
    let mut store = Store::default();
    let mut a = quota(Some(100), None);
    let mut b = quota(Some(100), None);
    let (mut admitted, mut t) = (0u64, 0u64);
    while t < 5 * 60_000 {
        for q in [&mut a, &mut b] {
            if q.admit(t, 2, 0).is_ok() {
                admitted += 1;
            }
        }
        if t % 100 == 0 {
            store.sync(0, &mut a, t);
            store.sync(1, &mut b, t);
        }
        t += 5;
    }
    // 100 per minute for five minutes across both replicas, within 5%.
    println!("two replicas, 100 per minute for 5 minutes: {admitted} admitted");
    assert!((475..=525).contains(&admitted), "{admitted}");
}

#[test]
fn a_replica_cut_off_from_the_store_enforces_its_share() {
    let mut q = quota(Some(100), None);
    let mut admitted = 0;
    for t in 0..1000u64 {
        if q.admit(t, 4, 0).is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 25);
}

#[test]
fn a_failed_sync_sends_the_use_again() {
    let mut w = Window::new(MIN, 60).unwrap();
    w.add(0, 5);
    let mut out = Vec::new();
    w.take_unsynced(0, &mut out);
    assert_eq!(out, vec![(0, 5)]);
    // Still counted while in flight.
    assert_eq!(w.count(0, 1), 5);
    w.sync_failed();
    out.clear();
    w.take_unsynced(0, &mut out);
    assert_eq!(out, vec![(0, 5)]);
    // The store read back 12 (another replica's 7 included); with two replicas the other's
    // part of the same round may still be on its way, so the 5 sent count once more.
    w.apply_shared(0, 0, 12);
    assert_eq!(w.count(0, 1), 12);
    assert_eq!(w.count(0, 2), 17);
    w.add(10, 1);
    assert_eq!(w.count(10, 2), 19);
    // The next round (nothing new from the others) sends this replica's total, 6; the others'
    // part of both rounds may still be on its way.
    out.clear();
    w.take_unsynced(10, &mut out);
    assert_eq!(out, vec![(0, 6)]);
    w.apply_shared(10, 0, 13);
    assert_eq!(w.count(10, 2), 19);
    // Every other replica has synced since 5: the round taken at 0 is in the store, the one
    // taken at 10 may not be.
    w.set_peers_synced(Some(5));
    assert_eq!(w.count(10, 2), 14);
    // ... and since 10: the store's total is the count.
    w.set_peers_synced(Some(10));
    assert_eq!(w.count(10, 2), 13);
}

#[test]
fn a_round_the_store_applied_but_never_answered_counts_once() {
    // The store records each replica's own total per bucket, as the gateway's Redis script does.
    let mut own: std::collections::HashMap<u64, i64> = std::collections::HashMap::new();
    let mut w = Window::new(MIN, 60).unwrap();
    let mut out = Vec::new();
    w.add(0, 5);
    w.take_unsynced(0, &mut out);
    assert_eq!(out, vec![(0, 5)]);
    own.extend(out.drain(..));
    w.apply_shared(0, 0, 5);
    w.add(10, 2);
    w.take_unsynced(10, &mut out);
    assert_eq!(out, vec![(0, 7)]);
    // The store applied the round, but its answer timed out.
    own.extend(out.drain(..));
    w.sync_failed();
    w.add(20, 1);
    w.take_unsynced(20, &mut out);
    assert_eq!(out, vec![(0, 8)]);
    own.extend(out.drain(..));
    w.apply_shared(20, 0, u64::try_from(own[&0]).unwrap());
    // 8 used, 8 counted (sending deltas, the 2 went twice: 10).
    assert_eq!(own[&0], 8);
    assert_eq!(w.count(20, 1), 8);
}

#[test]
fn after_a_failed_round_every_live_bucket_is_written_again() {
    // A store that restarted empty during an outage gets this replica's live use back at the
    // first round, buckets that did not change since included; buckets that left do not.
    let mut w = Window::new(MIN, 60).unwrap();
    let mut out = Vec::new();
    w.add(0, 3);
    w.add(2_000, 4);
    w.take_unsynced(2_000, &mut out);
    assert_eq!(out, vec![(0, 3), (2, 4)]);
    w.apply_shared(2_000, 0, 3);
    w.apply_shared(2_000, 2, 4);
    out.clear();
    // Nothing new: nothing to write.
    w.take_unsynced(3_000, &mut out);
    assert_eq!(out, vec![]);
    w.sync_failed();
    w.add(61_500, 1);
    w.take_unsynced(61_500, &mut out);
    assert_eq!(out, vec![(2, 4), (61, 1)]);
    // Once written back, only changes again.
    w.apply_shared(61_500, 2, 4);
    w.apply_shared(61_500, 61, 1);
    out.clear();
    w.take_unsynced(61_600, &mut out);
    assert_eq!(out, vec![]);
}

#[test]
fn a_refund_gives_back_the_request_and_its_estimate() {
    let mut q = quota(Some(1), Some(100));
    let c = q.admit(0, 1, 80).unwrap();
    assert!(q.admit(10, 1, 1).is_err());
    q.refund(20, c);
    assert_eq!(q.requests().count(20, 1), 0);
    assert_eq!(q.tokens().count(20, 1), 0);
    q.admit(30, 1, 80).unwrap();
}

#[test]
fn a_late_reply_never_overwrites_a_later_bucket() {
    let mut w = Window::new(Duration::from_millis(2_000), 2).unwrap();
    w.add(0, 1);
    // Bucket 2 now holds bucket 0's slot; a reply about bucket 0 read at time 0 arrives late.
    w.add(2_000, 5);
    w.apply_shared(0, 0, 9);
    assert_eq!(w.count(2_000, 1), 5);
}

/// Two replicas hammering one quota of 100 per 2 s window (100 ms buckets) for 20 s; A completes
/// a round every 50 ms, B only every `b_every` ms (a starved or throttled process); B admits
/// nothing when `b_idle`. The most admitted in any window the quota counts (bucket-aligned)
/// after the first, and all admitted in those 16 s.
fn admitted_with_a_late_peer(b_every: u64, b_idle: bool) -> (usize, usize) {
    let window = Duration::from_millis(2_000);
    let limits = Limits {
        requests: Some(100),
        tokens: None,
    };
    let mut a = TenantQuota::new(limits, window, 20).unwrap();
    let mut b = TenantQuota::new(limits, window, 20).unwrap();
    let mut store = Store::default();
    let mut admitted = Vec::new();
    for t in 0..20_000u64 {
        let peers = if b_idle {
            vec![&mut a]
        } else {
            vec![&mut a, &mut b]
        };
        for q in peers {
            if q.admit(t, 2, 0).is_ok() {
                admitted.push(t);
            }
        }
        if t % 50 == 0 {
            store.sync(0, &mut a, t);
        }
        if t % b_every == 25 % b_every {
            store.sync(1, &mut b, t);
        }
    }
    let most = (2_000..18_000u64)
        .step_by(100)
        .map(|from| {
            admitted
                .iter()
                .filter(|&&t| (from..from + 2_000).contains(&t))
                .count()
        })
        .max()
        .unwrap();
    let total = admitted
        .iter()
        .filter(|&&t| (2_000..18_000).contains(&t))
        .count();
    (most, total)
}

#[test]
fn a_peer_whose_rounds_run_late_does_not_let_the_others_over_admit() {
    // Up to a round late (the peer's round every 100 ms for the other's 50): never over the limit,
    // and the fleet still gets its quota (800 in 16 s, less what the sliding window's last
    // bucket holds back).
    for b_every in [50, 100] {
        let (most, total) = admitted_with_a_late_peer(b_every, false);
        println!(
            "peer's rounds every {b_every} ms: at most {most} admitted in a window of 100, \
             {total} in 16 s"
        );
        assert!(most <= 100, "{b_every}: {most}");
        assert!(total >= 760, "{b_every}: {total}");
    }
    // A replica whose peer is idle (and syncs on time) takes the whole quota.
    let (most, total) = admitted_with_a_late_peer(50, true);
    println!("peer idle: at most {most} admitted in a window of 100, {total} in 16 s");
    assert!((95..=100).contains(&most), "{most}");
    assert!(total >= 720, "{total}");
}
