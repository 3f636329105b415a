use std::time::{Duration, Instant};

use super::*;

const S: Duration = Duration::from_secs(1);

fn settings() -> Settings {
    Settings {
        threshold: 5,
        base: 30 * S,
        max: 300 * S,
        max_percent: 50,
        slow_start: 10 * S,
        rate: None,
    }
}

#[test]
fn gateway_failures_count_a_plain_500_and_4xx_do_not() {
    for (status, want) in [
        (200, Verdict::Success),
        (204, Verdict::Success),
        (502, Verdict::Failure),
        (503, Verdict::Failure),
        (504, Verdict::Failure),
        (500, Verdict::Neutral),
        (501, Verdict::Neutral),
        (505, Verdict::Neutral),
        (400, Verdict::Neutral),
        (404, Verdict::Neutral),
        (429, Verdict::Neutral),
        (301, Verdict::Neutral),
    ] {
        assert_eq!(verdict(status, false), want, "{status}");
    }
    // A gateway's own overload 503 is failed over, not held against the cluster; the header on
    // another status changes nothing.
    assert_eq!(verdict(503, true), Verdict::Neutral);
    assert_eq!(verdict(502, true), Verdict::Failure);
    assert_eq!(verdict(200, true), Verdict::Success);
}

#[test]
fn the_nth_failure_in_a_row_trips_and_a_success_starts_again() {
    let c = Consecutive::default();
    for _ in 0..4 {
        assert!(!c.fail(5));
    }
    c.succeed();
    assert_eq!(c.get(), 0);
    for _ in 0..4 {
        assert!(!c.fail(5));
    }
    assert!(c.fail(5));
    // Held back by the cap: tried again after as many failures more, not on each.
    for _ in 0..4 {
        assert!(!c.fail(5));
    }
    assert!(c.fail(5));
    c.reset();
    assert_eq!(c.get(), 0);
    // A threshold of one trips on every failure.
    assert!(c.fail(1) && c.fail(1));
}

#[test]
fn neutral_answers_between_failures_do_not_reset_the_count() {
    // The shell calls neither `fail` nor `succeed` on a neutral answer: 500s and 4xx between
    // 503s leave the count where it was (a client's bad requests keep no failing cluster in).
    let c = Consecutive::default();
    for status in [503, 500, 503, 400, 503, 429, 502, 504] {
        match verdict(status, false) {
            Verdict::Failure => {
                let tripped = c.fail(5);
                assert_eq!(tripped, c.get() == 5, "{status}");
            }
            Verdict::Success => c.succeed(),
            Verdict::Neutral => {}
        }
    }
    assert_eq!(c.get(), 5);
}

#[test]
fn ejections_in_a_row_grow_by_the_base_up_to_the_cap() {
    let t0 = Instant::now();
    let s = settings();
    let mut e = Ejection::default();
    assert!(!e.is_ejected(t0));
    assert_eq!(e.weight(t0, s.slow_start), 1.0);
    let mut at = t0;
    for n in 1..=12u32 {
        let length = e.eject(at, &s);
        assert_eq!(length, (30 * S * n).min(300 * S), "ejection {n}");
        assert_eq!(e.streak(), n);
        assert!(e.is_ejected(at + length - Duration::from_millis(1)));
        assert_eq!(
            e.weight(at + length - Duration::from_millis(1), s.slow_start),
            0.0
        );
        // Fails again one second after each return.
        at += length + S;
        assert!(!e.is_ejected(at));
    }
}

#[test]
fn time_back_in_takes_ejections_off_the_count() {
    let t0 = Instant::now();
    let s = settings();
    let mut e = Ejection::default();
    assert_eq!(e.eject(t0, &s), 30 * S);
    assert_eq!(e.eject(t0 + 31 * S, &s), 60 * S);
    assert_eq!(e.eject(t0 + 92 * S, &s), 90 * S);
    // Back at 182 s; 65 s in (two bases) takes two off: the next is the first again.
    assert_eq!(e.eject(t0 + 247 * S, &s), 60 * S);
    assert_eq!(e.streak(), 2);
    // Back at 307 s; in for an hour: from the base.
    assert_eq!(e.eject(t0 + 3907 * S, &s), 30 * S);
    assert_eq!(e.streak(), 1);
}

#[test]
fn a_readmitted_cluster_ramps_over_the_slow_start_window() {
    let t0 = Instant::now();
    let s = settings();
    let mut e = Ejection::default();
    let length = e.eject(t0, &s);
    let end = t0 + length;
    assert_eq!(e.weight(end, s.slow_start), MIN_RAMP_WEIGHT);
    assert_eq!(e.weight(end + 5 * S, s.slow_start), 0.5);
    assert_eq!(e.weight(end + 10 * S, s.slow_start), 1.0);
    assert_eq!(e.weight(end + 100 * S, s.slow_start), 1.0);
    // Without slow start, back at full share.
    assert_eq!(e.weight(end, Duration::ZERO), 1.0);
    assert_eq!(e.weight(end - S, Duration::ZERO), 0.0);
}

#[test]
fn at_most_the_percent_of_a_models_clusters_is_ejected() {
    // Two clusters serve the model: one of them may go at 50%, not both.
    assert!(may_eject(50, [(2, 0)]));
    assert!(!may_eject(50, [(2, 1)]));
    // Three: one (33%), not two (67%).
    assert!(may_eject(50, [(3, 0)]));
    assert!(!may_eject(50, [(3, 1)]));
    // Four: two.
    assert!(may_eject(50, [(4, 1)]));
    assert!(!may_eject(50, [(4, 2)]));
    // 100% ejects every one.
    assert!(may_eject(100, [(2, 1)]));
    // 10% of three is none.
    assert!(!may_eject(10, [(3, 0)]));
    // Every model counts: the most constrained holds the ejection back.
    assert!(!may_eject(50, [(4, 0), (2, 1)]));
    assert!(may_eject(50, [(4, 0), (2, 0)]));
    // A model only this cluster serves holds nothing back; 0% ejects nothing.
    assert!(may_eject(50, [(1, 0)]));
    assert!(may_eject(50, []));
    assert!(!may_eject(0, [(1, 0)]));
    assert!(!may_eject(0, []));
}

const RATE: Rate = Rate {
    threshold: 50,
    minimum: 10,
    interval: Duration::from_secs(10),
};

/// Half of the requests failing, never five in a row: the consecutive count never trips, the
/// interval does once it is over, judged by the first request after it.
#[test]
fn an_interval_with_half_its_requests_failed_trips_where_runs_do_not() {
    let w = Window::default();
    let c = Consecutive::default();
    let interval = 10_000_000_000;
    let mut t = 1;
    for i in 0..20 {
        let v = if i % 2 == 0 {
            Verdict::Failure
        } else {
            Verdict::Success
        };
        match v {
            Verdict::Failure => assert!(!c.fail(5)),
            _ => c.succeed(),
        }
        assert_eq!(w.record(v, t, interval), None, "request {i}");
        t += 100_000_000;
    }
    // The interval began at 0 (the window's default): the first request 10 s on closes it.
    let closed = w.record(Verdict::Success, interval, interval).unwrap();
    assert_eq!(
        closed,
        Interval {
            successes: 10,
            failures: 10
        }
    );
    assert!(closed.trips(&RATE));
    assert_eq!(closed.failure_percent(), 50.0);
    // The request that closed it is the next interval's first.
    let next = w.record(Verdict::Success, 2 * interval, interval).unwrap();
    assert_eq!(
        next,
        Interval {
            successes: 1,
            failures: 0
        }
    );
    assert!(!next.trips(&RATE));
}

#[test]
fn too_few_requests_or_too_few_failures_do_not_trip() {
    let i = |successes, failures| Interval {
        successes,
        failures,
    };
    // Below minimumRequests, even all failed.
    assert!(!i(0, 9).trips(&RATE));
    assert!(i(0, 10).trips(&RATE));
    // At the threshold trips, below it not.
    assert!(i(5, 5).trips(&RATE));
    assert!(!i(6, 5).trips(&RATE));
    // No requests: nothing, and no division by zero.
    assert!(!i(0, 0).trips(&Rate { minimum: 0, ..RATE }));
    assert_eq!(i(0, 0).failure_percent(), 0.0);
    // Counts near u32::MAX do not overflow the comparison.
    assert!(i(u32::MAX, u32::MAX).trips(&RATE));
}

/// Neutral answers count nothing; a reset forgets the interval and begins a new one then.
#[test]
fn neutral_answers_count_nothing_and_a_reset_starts_over() {
    let w = Window::default();
    let interval = 1_000;
    for _ in 0..5 {
        w.record(Verdict::Neutral, 10, interval);
        w.record(Verdict::Failure, 10, interval);
    }
    w.reset(500);
    // 1,000 ns after the reset, not after 0: nothing closes at 1,200.
    assert_eq!(w.record(Verdict::Failure, 1_200, interval), None);
    assert_eq!(
        w.record(Verdict::Success, 1_500, interval),
        Some(Interval {
            successes: 0,
            failures: 1
        })
    );
}

/// Many threads recording at once across an interval's end: exactly one closes it, and no
/// request is lost or counted twice.
#[test]
fn one_caller_closes_an_interval_and_nothing_is_lost() {
    let w = std::sync::Arc::new(Window::default());
    let interval = 1_000_000;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let w = std::sync::Arc::clone(&w);
            std::thread::spawn(move || {
                let mut closed = Vec::new();
                for i in 0..10_000u64 {
                    // Every thread crosses the end at 1,000,000 ns half way through.
                    if let Some(c) = w.record(Verdict::Failure, i * 200, interval) {
                        closed.push(c);
                    }
                }
                closed
            })
        })
        .collect();
    let closed: Vec<Interval> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let counted: u32 = closed.iter().map(|c| c.failures).sum();
    let open = w.failures.load(Ordering::Relaxed);
    assert_eq!(counted + open, 40_000, "{closed:?}");
    // The new interval began at 1,000,000 ns or later and no time reaches 2,000,000.
    assert_eq!(closed.len(), 1, "{closed:?}");
}
