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
