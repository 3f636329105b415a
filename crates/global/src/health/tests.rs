use std::time::{Duration, Instant};

use super::*;

const S: Duration = Duration::from_secs(1);

fn health() -> Health {
    Health::new(3 * S, 2, 10 * S)
}

#[test]
fn unknown_until_the_first_heartbeat_then_full_share_without_a_ramp() {
    let t0 = Instant::now();
    let mut h = health();
    assert_eq!(h.state(t0), State::Drained(DrainReason::Unknown));
    h.observe_ok(t0, true);
    assert_eq!(h.state(t0), State::Up { weight: 1.0 });
}

#[test]
fn failing_fetches_drain_after_the_configured_count() {
    let t0 = Instant::now();
    let mut h = health();
    h.observe_ok(t0, true);
    h.observe_failure(t0 + S);
    assert_eq!(h.state(t0 + S), State::Up { weight: 1.0 });
    h.observe_failure(t0 + 2 * S);
    assert_eq!(h.state(t0 + 2 * S), State::Drained(DrainReason::Failing));
}

#[test]
fn a_heartbeat_older_than_stale_after_drains_and_tick_reports_it_once() {
    let t0 = Instant::now();
    let mut h = health();
    h.observe_ok(t0, true);
    assert_eq!(h.tick(t0 + 3 * S), None);
    assert_eq!(h.state(t0 + 3 * S), State::Up { weight: 1.0 });
    let late = t0 + 3 * S + Duration::from_millis(1);
    assert_eq!(h.state(late), State::Drained(DrainReason::Stale));
    assert_eq!(h.tick(late), Some(DrainReason::Stale));
    assert_eq!(h.tick(late + S), None);
}

#[test]
fn no_ready_pods_is_a_gray_failure() {
    let t0 = Instant::now();
    let mut h = health();
    h.observe_ok(t0, true);
    h.observe_ok(t0 + S, false);
    assert_eq!(h.state(t0 + S), State::Drained(DrainReason::NoReadyPods));
}

#[test]
fn a_returning_cluster_ramps_linearly_over_the_window() {
    let t0 = Instant::now();
    let mut h = health();
    h.observe_ok(t0, true);
    h.observe_failure(t0 + S);
    h.observe_failure(t0 + 2 * S);
    let back = t0 + 20 * S;
    h.observe_ok(back, true);
    assert_eq!(
        h.state(back),
        State::Up {
            weight: MIN_RAMP_WEIGHT
        }
    );
    // Heartbeats keep coming every second.
    for s in 1..=60 {
        h.observe_ok(back + s * S, true);
        let want = (f64::from(s) / 10.0).min(1.0);
        assert_eq!(h.state(back + s * S), State::Up { weight: want }, "{s} s");
    }
}

#[test]
fn a_gray_failure_that_heals_ramps_too() {
    let t0 = Instant::now();
    let mut h = health();
    h.observe_ok(t0, true);
    h.observe_ok(t0 + S, false);
    h.observe_ok(t0 + 2 * S, true);
    h.observe_ok(t0 + 7 * S, true);
    assert_eq!(h.state(t0 + 7 * S), State::Up { weight: 0.5 });
}

#[test]
fn zero_slow_start_returns_at_full_share() {
    let t0 = Instant::now();
    let mut h = Health::new(3 * S, 1, Duration::ZERO);
    h.observe_ok(t0, true);
    h.observe_failure(t0 + S);
    assert_eq!(h.state(t0 + S), State::Drained(DrainReason::Failing));
    h.observe_ok(t0 + 2 * S, true);
    assert_eq!(h.state(t0 + 2 * S), State::Up { weight: 1.0 });
}
